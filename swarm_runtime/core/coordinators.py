"""Baseline coordinators over the same trained action policies (docs/reference/algorithm.md, "The baselines and
what they simplify"): a Graph-of-Agents-style one and an AgentNet-style one, registered through the public
``swarm_register_coordinators`` hook like any plugin's.

Neither reads any signal MPT trains: no bid prompt is built, no bid head is
sampled (``uses_bids = False``). What they use instead is what their methods
use, from the fixed action policies themselves:

- **proposals**: every present agent samples an action on its own action
  prompt (``uses_proposals``; its role description is the prompt's
  ``you are <role>``);
- **scores** (``judge_pairs``): the episode loop scores proposal ``p`` with
  agent ``j``'s *action* model, as the mean per-token log-probability of ``p``'s
  text on ``p``'s own action prompt (role + state + log), unconstrained and
  without gradients. ``scores[(p, p)]`` is the proposer's confidence in its own
  move on the current state; ``scores[(j, p)]`` is peer ``j``'s judgement of
  how plausible that move is for that role now.

The choice rules are pure functions, tested on hand-made inputs.

What they simplify from their papers:

- **Graph-of-Agents** (node sampling by relevance, edges from
  agents evaluating each other's responses, max pooling): relevance is each
  agent's confidence in its own proposal (the paper uses a meta-LLM reading
  model cards); the ``algo.goa_responders`` most relevant agents form the
  graph; each responder's proposal is scored by the other responders (the
  edge weights), and the proposal with the highest mean peer score acts (max
  pooling), ties to the more relevant proposer. No message passing rounds, no
  LLM summariser (an env action must be one agent's text). With one responder
  the most confident agent acts. It never skips a turn.
- **AgentNet** (the agent holding the task executes it or
  routes it to a peer it judges more capable): the agent that acted last is the
  router; it scores every present agent's proposal (its own included) with its
  own model, and the best-scored agent acts (keeping the turn is allowed).
  Before anyone acted (or when the router is absent) the most confident agent
  acts. No capability memory, no evolving agent graph, no retrieval of past
  trajectories; it never skips a turn.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from swarm_runtime.core.auction import AuctionResult

Scores = dict  # (judge index, proposer index) -> mean per-token log-probability


def _best(candidates: Sequence[tuple[float, int]], rng: random.Random) -> int:
    """Index with the highest score; ties broken uniformly with ``rng``."""
    top = max(b for b, _ in candidates)
    tied = [i for b, i in candidates if b == top]
    return tied[rng.randrange(len(tied))] if len(tied) > 1 else tied[0]


def present(bids: Sequence[float | None]) -> list[int]:
    """Indices of the agents present this turn (``None`` marks an absent one)."""
    return [i for i, b in enumerate(bids) if b is not None]


def most_relevant(confidence: dict[int, float], k: int, rng: random.Random) -> list[int]:
    """The ``k`` agents with the highest self-confidence (ties in random order), most relevant first."""
    order = list(confidence)
    rng.shuffle(order)  # random tie order, then a stable sort by relevance
    return sorted(order, key=lambda i: -confidence[i])[: max(1, int(k))]


def goa_choice(scores: Scores, proposers: Sequence[int], k: int, rng: random.Random) -> int | None:
    """Graph-of-Agents' pick: the ``k`` most self-confident proposers respond; each response's
    score is the mean of the *other* responders' scores of it; the best wins, ties to the more
    relevant (self-confident) proposer, then random. One responder: the most confident acts."""
    if not proposers:
        return None
    confidence = {p: float(scores[(p, p)]) for p in proposers}
    responders = most_relevant(confidence, k, rng)
    if len(responders) == 1:
        return responders[0]
    rank = {p: i for i, p in enumerate(responders)}
    peer = {p: sum(float(scores[(j, p)]) for j in responders if j != p) / (len(responders) - 1) for p in responders}
    top = max(peer.values())
    tied = [p for p in responders if peer[p] == top]
    return min(tied, key=lambda p: rank[p])


def agentnet_choice(scores: Scores, proposers: Sequence[int], router: int | None, rng: random.Random) -> int | None:
    """AgentNet's pick: the router's best-scored proposal (its own included), ties random; without
    a present router, the most self-confident proposer."""
    if not proposers:
        return None
    if router is None or router not in proposers:
        return _best([(float(scores[(p, p)]), p) for p in proposers], rng)
    return _best([(float(scores[(router, p)]), p) for p in proposers], rng)


class GraphOfAgentsCoordinator:
    """Graph-of-Agents-style: the most confident agents respond, peer review picks the action."""

    uses_bids = False
    uses_proposals = True
    wants_info = True

    def __init__(self, cfg=None):
        self.cfg = cfg
        self.k = int(cfg.algo.goa_responders) if cfg is not None else 2

    def proposers(self, bids, rng, turn) -> list[int]:
        return present(bids)

    @staticmethod
    def judge_pairs(proposers: Sequence[int], last_actor: int | None) -> list[tuple[int, int]]:
        """Every proposer scores every proposal (its own: its confidence; the others': the edges)."""
        return [(j, p) for j in proposers for p in proposers]

    def select(self, bids, rng, turn, info=None) -> AuctionResult:
        proposals = info.proposals if info is not None else {}
        winner = goa_choice(info.scores if info is not None else {}, sorted(proposals), self.k, rng)
        return AuctionResult(winner, None)


class AgentNetCoordinator:
    """AgentNet-style: the last actor routes the turn to the proposal its own model rates best."""

    uses_bids = False
    uses_proposals = True
    wants_info = True

    def __init__(self, cfg=None):
        self.cfg = cfg

    def proposers(self, bids, rng, turn) -> list[int]:
        return present(bids)

    @staticmethod
    def judge_pairs(proposers: Sequence[int], last_actor: int | None) -> list[tuple[int, int]]:
        """The router scores every proposal; without a present router, each proposer its own."""
        if last_actor is None or last_actor not in proposers:
            return [(p, p) for p in proposers]
        return [(last_actor, p) for p in proposers]

    def select(self, bids, rng, turn, info=None) -> AuctionResult:
        proposals = info.proposals if info is not None else {}
        winner = agentnet_choice(
            info.scores if info is not None else {},
            sorted(proposals),
            info.last_actor if info is not None else None,
            rng,
        )
        return AuctionResult(winner, None)
