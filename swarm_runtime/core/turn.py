"""One auction turn of one episode, as a generator of turn-engine requests (:class:`Auction`): bids,
proposals and their scores, the coordinator's choice, the winner's action and failover; and
:func:`lockstep`, which runs several episodes' turns together so that each request kind goes out as one batch.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from swarm_runtime.core import noise as keyed
from swarm_runtime.core.auction import AuctionResult
from swarm_runtime.core.domain import Event
from swarm_runtime.core.engine import Batch, Rounds, Scores, merge
from swarm_runtime.core.episode import Episode, ForcedTurn, Turn, TurnInfo


def checked_bid(level, parsed: bool, levels) -> tuple[float, bool]:
    """A backend's bid as the auction takes it: a configured level, else (NaN, 5.0, -0.5, a
    string...) 0.0 and counted as unparsed, never a crash or a credit from an impossible bid."""
    if levels is None:
        return level, parsed
    ok = isinstance(level, (int, float)) and not isinstance(level, bool) and any(level == float(b) for b in levels)
    return (level, parsed) if ok else (0.0, False)


def coordinator_rng(noise: int, t: int) -> random.Random:
    """The coordinator's keyed randomness for turn ``t`` of the episode whose noise id is ``noise``
    (common random numbers: the same in process and served)."""
    return random.Random(keyed.key_hash(noise, t, keyed.COORDINATOR))


def accept_bid(episode: Episode, bid, levels) -> float:
    """The level ``bid`` (a :class:`~swarm_runtime.core.protocols.Bid`) enters the auction with
    (:func:`checked_bid`); an unparsed one is counted on ``episode``."""
    level, parsed = checked_bid(bid.level, bid.parsed, levels)
    episode.unparsed_bids += int(not parsed)
    return level


@dataclass
class Decided:
    """What one auction turn decided, before the env steps: the :class:`Turn`, the agents whose bid
    did not come (an answer ``None``), in the order they were asked, and the winners whose action did not
    come, in the order they failed (each withdrawn, the coordinator picked again)."""

    turn: Turn
    missed: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class _At:
    """Where a turn is: its episode's noise id, the turn, the observation and log the prompts are made of,
    and the last actor."""

    noise: int | None
    t: int
    observation: str
    log: list[Event]
    last_actor: int | None

    def key(self, i: int, kind: int):
        """Agent ``i``'s sampler key of ``kind`` this turn (None without noise)."""
        return None if self.noise is None else (self.noise, self.t, i, kind)


class _Bids:
    """A turn's bids, one entry per agent (None: not asked): levels, tokens, sampler log-probs, prompts; and the
    agents whose bid did not come, in the order they were asked."""

    def __init__(self, n: int):
        self.levels: list = [None] * n
        self.tokens: list = [None] * n
        self.logprobs: list = [None] * n
        self.prompts: list = [None] * n
        self.missed: list[int] = []


class Auction:
    """One auction turn of one episode as a generator of turn-engine batches (:meth:`turn`): the one auction
    code behind batched rollouts (:class:`AuctionTurns`, a lockstep of these over its slots) and ``swarm
    serve``'s gateway (:class:`swarm_runtime.serve.turns.ServedTurns`).

    How it reaches agent ``i``: ``bid_prompt(i, observation, log)`` and ``action_prompt(i, ...)``;
    ``bid_row(i, prompt, key, last_actor)`` / ``act_row(i, prompt, key)`` the sampler rows (``key``:
    ``(noise, turn, i, kind)``, ``None`` without noise); ``bid_levels(i, last_actor)`` the levels its bid
    is checked against. ``ask_bids``: ask for bids even when the coordinator does not use them (else
    present agents bid 0.0 unasked). ``proposals``: the coordinator's ``uses_proposals`` protocol (and
    ``judge``: ``(j, text) -> (tokens, policy)`` for its ``judge_pairs``); ``wants_info``: ``select``
    gets :class:`TurnInfo`."""

    def __init__(
        self,
        coordinator,
        *,
        bid_prompt: Callable,
        action_prompt: Callable,
        bid_row: Callable,
        act_row: Callable,
        bid_levels: Callable,
        ask_bids: bool = True,
        proposals: bool = False,
        wants_info: bool = False,
        judge: Callable | None = None,
    ):
        self.coordinator = coordinator
        self.bid_prompt, self.action_prompt, self.bid_row, self.act_row = bid_prompt, action_prompt, bid_row, act_row
        self.bid_levels, self.ask_bids, self.proposals, self.wants_info = bid_levels, ask_bids, proposals, wants_info
        self.judge_pairs = getattr(coordinator, "judge_pairs", None) if proposals else None
        self.judge = judge

    def _select(self, bids, rng, at: _At, proposals, scores):
        if self.wants_info:
            info = TurnInfo(at.last_actor, {a: r.text for a, r in proposals.items()}, scores)
            return self.coordinator.select(bids, rng, at.t, info=info)
        return self.coordinator.select(bids, rng, at.t)

    def turn(
        self,
        episode: Episode,
        n: int,
        t: int,
        log: list[Event],
        observation: str,
        *,
        bidders: Sequence[int],
        rng: Callable[[], random.Random],
        last_actor: int | None = None,
        forced: ForcedTurn | None = None,
        snapshot: Callable | None = None,
    ):
        """Decide turn ``t`` of ``episode`` (``n`` agents; ``bidders`` are asked, unless ``forced``): yields
        ``Batch("bid")``, ``Batch("act")`` of the proposals (``proposals``) and :class:`Scores`, then one
        ``Batch("act")`` (empty when the turn is skipped or the action is a proposal) and one more per
        failed winner; returns :class:`Decided`. ``rng()``: the coordinator's randomness (called once
        for the proposers and once for the selection, whose failovers go on drawing from it);
        ``snapshot()``: taken before a contested turn's action. Counts unparsed bids on ``episode``."""
        at = _At(episode.noise, t, observation, log, last_actor)
        bids = yield from self._bids(episode, n, at, bidders, forced)
        proposals = yield from self._proposals(bids.levels, at, rng, forced)
        scores = yield from self._scores(proposals, at)
        if forced is None:
            turn, reselect = self._choose(bids, at, rng(), proposals, scores)
        else:
            turn, reselect = _forced_turn(forced, t, proposals), None
        failed = yield from self._act(turn, at, proposals, reselect, snapshot)
        return Decided(turn, bids.missed, failed)

    def _bids(self, episode: Episode, n: int, at: _At, bidders: Sequence[int], forced: ForcedTurn | None):
        """The bids: ``bidders`` are asked in one ``Batch("bid")`` (nobody when ``forced``; without ``ask_bids``,
        a coordinator that does not use bids gets 0.0 for each, unasked); an answer ``None`` is a missed bid."""
        bids = _Bids(n)
        asked = []
        if forced is None:
            for a in bidders:
                if self.ask_bids or self.coordinator.uses_bids:
                    bids.prompts[a] = self.bid_prompt(a, at.observation, at.log)
                    asked.append(a)
                else:
                    bids.levels[a] = 0.0
        rows = [self.bid_row(a, bids.prompts[a], at.key(a, keyed.BID), at.last_actor) for a in asked]
        answers = yield Batch("bid", rows)
        for a, b in zip(asked, answers):
            if b is None:
                bids.missed.append(a)
                continue
            bids.levels[a] = accept_bid(episode, b, self.bid_levels(a, at.last_actor))
            bids.tokens[a], bids.logprobs[a] = b.tokens, getattr(b, "logprobs", None)
        return bids

    def _proposals(self, levels: list, at: _At, rng: Callable[[], random.Random], forced: ForcedTurn | None):
        """The proposals (``proposals`` coordinators): the agents the coordinator names sample an action first,
        in one ``Batch("act")`` (empty when ``forced``); agent -> its answer."""
        proposals: dict = {}
        if not self.proposals:
            return proposals
        preqs = []
        if forced is None:
            preqs = [
                (a, self.action_prompt(a, at.observation, at.log))
                for a in self.coordinator.proposers(levels, rng(), at.t)
            ]
        answers = yield Batch("act", [self.act_row(a, p, at.key(a, keyed.ACTION)) for a, p in preqs])
        for (a, _), r in zip(preqs, answers):
            proposals[a] = r
        return proposals

    def _scores(self, proposals: dict, at: _At):
        """The proposal scores (coordinators with ``judge_pairs``): the pairs the coordinator names, in one
        :class:`Scores` request; ``(judge, proposer)`` -> score."""
        if self.judge_pairs is None:
            return {}
        prompts = {p: self.action_prompt(p, at.observation, at.log) for p in proposals}
        pairs, entries = self.judge_pairs(sorted(proposals), at.last_actor), []
        for j, p in pairs:
            tokens, policy = self.judge(j, proposals[p].text)
            entries.append(((j, p, prompts[p], tokens), policy))
        values = yield Scores(entries)
        return {(e[0][0], e[0][1]): v for e, v in zip(entries, values)}

    def _choose(self, bids: _Bids, at: _At, rng: random.Random, proposals: dict, scores: dict):
        """The coordinator picks who acts: the :class:`Turn`, and ``reselect(winner)``, which withdraws a winner
        whose action did not come and picks again (on the same ``rng``, its live bids without the withdrawn)."""
        live = list(bids.levels)
        auction = self._select(live, rng, at, proposals, scores)
        turn = Turn(at.t, bids.levels, bids.tokens, bids.prompts, auction, bid_logprobs=bids.logprobs)

        def reselect(winner: int) -> AuctionResult:
            live[winner] = None
            return self._select(live, rng, at, proposals, scores)

        return turn, reselect

    def _act(self, turn: Turn, at: _At, proposals: dict, reselect: Callable | None, snapshot: Callable | None):
        """The winner acts: one ``Batch("act")`` (empty when the turn is skipped or the chosen proposal is the
        action); a winner whose action does not come is withdrawn (``reselect``) and the new winner asked in one
        more. Fills the turn's action; returns the failed winners, in order."""
        failed: list[int] = []
        while turn.winner is not None:
            turn.action_prompt = self.action_prompt(turn.winner, at.observation, at.log)
            if snapshot is not None and turn.auction.contested:
                turn.snapshot = snapshot()
            r = proposals.get(turn.winner)
            if r is not None:  # the chosen proposal (or a forced action) is the action, on the same prompt
                yield Batch("act", [])
            else:
                (r,) = yield Batch(
                    "act", [self.act_row(turn.winner, turn.action_prompt, at.key(turn.winner, keyed.ACTION))]
                )
            if r is not None:
                turn.action_text, turn.action_tokens = r.text, r.tokens
                turn.action_logprobs, turn.action_version = r.logprobs, r.version
                return failed
            failed.append(turn.winner)
            turn.auction = reselect(turn.winner)
            turn.action_prompt = None
        yield Batch("act", [])
        return failed


def _forced_turn(forced: ForcedTurn, t: int, proposals: dict) -> Turn:
    """A replayed turn (counterfactual branches): its bids and winner as forced; a forced action joins
    ``proposals`` as the winner's, so it is the action."""
    res = AuctionResult(forced.winner, None, float(forced.bids[forced.winner] or 0.0), 0.0)
    if forced.action is not None:
        proposals[forced.winner] = forced.action
    return Turn(t, list(forced.bids), list(forced.bid_tokens), list(forced.bid_prompts), res)


def lockstep(turns: list) -> Rounds:
    """Run per-episode turn generators (:meth:`Auction.turn`, or a loop's turn of one slot) together: each step,
    their requests of one kind go out as one request (rows in the generators' order;
    :func:`~swarm_runtime.core.engine.merge`); returns their results in order."""
    results: list = [None] * len(turns)
    pending = {}
    for i, g in enumerate(turns):
        pending[i] = g.send(None)
    while pending:
        answers: dict[int, Any] = {}
        groups: dict = {}
        for i, req in pending.items():
            groups.setdefault(req.kind, []).append(i)
        for idx in groups.values():
            flat = yield merge([pending[i] for i in idx])
            at = 0
            for i in idx:
                k = len(pending[i].rows)
                answers[i], at = flat[at : at + k], at + k
        for i in list(pending):
            try:
                pending[i] = turns[i].send(answers[i])
            except StopIteration as stop:
                results[i] = stop.value
                del pending[i]
    return results
