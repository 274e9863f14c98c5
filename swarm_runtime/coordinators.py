"""Baseline coordinators over the same trained action policies (docs/experiments.md):
a Graph-of-Agents-style one and an AgentNet-style one, registered through the
public ``swarm_register_coordinators`` hook like any plugin's.

Both use the optional coordinator capabilities of the episode loop
(``episode.play``): ``uses_proposals`` / ``proposers`` (agents propose an action
before the choice), ``wants_info`` (``select`` receives ``info=TurnInfo``) and
``bid_scorer`` (whose model scores an agent's bid prompt). The choice rules are
pure functions, tested on hand-made inputs.

What they simplify from their papers:

- **Graph-of-Agents** (relevance-based selection, then aggregation): relevance
  is each agent's own bid (its model's score of "should I act now"), not an
  LLM-judged relevance graph; the ``algo.goa_responders`` most relevant present
  agents each propose an action on their own action prompt; aggregation is a
  majority vote over the proposals' texts (no message passing between agents,
  no LLM summariser), ties between equally voted texts going to the most
  relevant proposer. It never skips a turn.
- **AgentNet** (the acting agent routes the task to a peer): the agent that
  acted last routes the next turn; its *own* model scores every present
  agent's bid prompt ("how much should this agent act now", read by the
  router), and the best-scored agent acts (itself included: keeping the turn
  is allowed). The first turn, before anyone acted, goes to the highest own
  bid. No capability descriptions, no evolving agent graph, no retrieval of
  past trajectories; it never skips a turn.
"""
from __future__ import annotations

import random
from collections import Counter
from typing import Sequence

from swarm_runtime.auction import AuctionResult


def _best(candidates: Sequence[tuple[float, int]], rng: random.Random) -> int:
    """Index with the highest score; ties broken uniformly with ``rng``."""
    top = max(b for b, _ in candidates)
    tied = [i for b, i in candidates if b == top]
    return tied[rng.randrange(len(tied))] if len(tied) > 1 else tied[0]


def most_relevant(bids: Sequence[float | None], k: int, rng: random.Random) -> list[int]:
    """The ``k`` present agents with the highest bids (ties in random order), most relevant first."""
    present = [(b, i) for i, b in enumerate(bids) if b is not None]
    order = [i for _, i in present]
    rng.shuffle(order)  # random tie order, then a stable sort by relevance
    rank = {i: b for b, i in present}
    return sorted(order, key=lambda i: -rank[i])[:max(1, int(k))]


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def vote(bids: Sequence[float | None], proposals: dict[int, str], rng: random.Random) -> int | None:
    """Majority vote over the proposals' texts; among equally voted texts, the one whose best
    proposer is the most relevant (highest bid, ties random). Returns the chosen proposer."""
    if not proposals:
        return None
    counts = Counter(_norm(t) for t in proposals.values())
    top = max(counts.values())
    voters = [(float(bids[a] or 0.0), a) for a, t in proposals.items() if counts[_norm(t)] == top]
    return _best(voters, rng)


def route(bids: Sequence[float | None], rng: random.Random) -> int | None:
    """The present agent with the highest (router-scored) bid; never skips while someone is present."""
    present = [(b, i) for i, b in enumerate(bids) if b is not None]
    return _best(present, rng) if present else None


class GraphOfAgentsCoordinator:
    """Graph-of-Agents-style: the most relevant agents propose, a vote picks the action."""

    uses_bids = True
    uses_proposals = True
    wants_info = True

    def __init__(self, cfg=None):
        self.cfg = cfg
        self.k = int(cfg.algo.goa_responders) if cfg is not None else 2

    def proposers(self, bids, rng, turn) -> list[int]:
        if all(b is None for b in bids):
            return []
        return most_relevant(bids, self.k, rng)

    def select(self, bids, rng, turn, info=None) -> AuctionResult:
        proposals = info.proposals if info is not None else {}
        winner = vote(bids, proposals, rng)
        if winner is None:
            return AuctionResult(None, None)
        return AuctionResult(winner, None, float(bids[winner] or 0.0), 0.0)


class AgentNetCoordinator:
    """AgentNet-style: the last actor's model scores everyone's bid prompt and routes the turn."""

    uses_bids = True
    wants_info = True

    def __init__(self, cfg=None):
        self.cfg = cfg

    @staticmethod
    def bid_scorer(agent: int, last_actor: int | None) -> int:
        """The router (last actor) reads every agent's bid prompt; before anyone acted, each its own."""
        return agent if last_actor is None else last_actor

    def select(self, bids, rng, turn, info=None) -> AuctionResult:
        winner = route(bids, rng)
        if winner is None:
            return AuctionResult(None, None)
        return AuctionResult(winner, None, float(bids[winner] or 0.0), 0.0)
