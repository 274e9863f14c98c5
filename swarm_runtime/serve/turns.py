"""One served turn as a turn-engine strategy (docs/engine.md): :class:`ServedTurns`.

``swarm serve``'s gateway takes every turn of an episode on :class:`~swarm_runtime.rollout.engine.TurnEngine`
(``arun``): this strategy says what to ask, the gateway's answerer (:class:`swarm_runtime.serve.engine.TurnAnswerer`)
asks the agents over HTTP. The strategy never touches the network, a clock or the population's health:

1. the agents that are up bid: one ``Batch("bid", rows)``, a row per agent keyed ``(noise, t, agent index, bid)``
   (the keyed draw the worker is sent as its request ``seed``: :func:`swarm_runtime.serve.protocol.seed_for`);
   an answer ``None`` (missed the deadline, or failed) is an absent bid, as a dropped-out agent in process;
2. the coordinator picks with the turn's keyed randomness (:func:`swarm_runtime.episode.coordinator_rng`,
   the same as in process);
3. the winner acts: ``Batch("act", [row])`` keyed ``(noise, t, winner, action)``; an answer ``None`` (its
   worker failed) withdraws its bid and the coordinator picks again with the same randomness (failover),
   until an action comes or no bid is left (a skipped turn).

Rows carry the agent (``row.context``, whatever the caller passed: the gateway's
:class:`~swarm_runtime.serve.population.AgentHandle`) and its ``model_id`` as ``row.model``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from swarm_runtime.domain import Event
from swarm_runtime.episode import Episode, Turn, accept_bid, coordinator_rng
from swarm_runtime.policy import noise as keyed
from swarm_runtime.rollout.base import Row
from swarm_runtime.rollout.engine import Batch, Rounds


@dataclass
class ServedTurn:
    """What a served turn decided: the core's :class:`~swarm_runtime.episode.Turn` (not yet stepped or
    logged), the agents (indices) whose bid did not come, in the order they were asked, and the
    winners whose action failed, in the order they failed."""

    turn: Turn
    missed: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)


class ServedTurns:
    """The served auction's turn (module docstring). ``agents``: every agent of the population by
    index (``.index``, ``.role``, ``.model_id``); ``up``: those asked to bid this turn."""

    def __init__(self, domain, coordinator, bid_levels: Sequence[float]):
        self.domain, self.coordinator, self.bid_levels = domain, coordinator, list(bid_levels)

    def _row(self, agent: Any, prompt: str, noise: int, t: int, kind: int) -> Row:
        return Row(agent.model_id, prompt, (noise, t, agent.index, kind), context=agent)

    def rounds(self, episode: Episode, noise: int, t: int, log: list[Event], observation: str,
               agents: Sequence[Any], up: Sequence[Any]) -> Rounds:
        """Decide turn ``t`` of ``episode`` (whose public log is ``log``) on ``observation``; returns a
        :class:`ServedTurn`. Unparsed bids are counted on ``episode``; nothing else of it is touched."""
        n = len(agents)
        bids: list = [None] * n
        prompts: list = [None] * n
        for a in up:
            prompts[a.index] = self.domain.bid_prompt(a.role, observation, log)
        answers = yield Batch("bid", [self._row(a, prompts[a.index], noise, t, keyed.BID) for a in up])
        missed = []
        for a, b in zip(up, answers):
            if b is None:
                missed.append(a.index)
            else:
                bids[a.index] = accept_bid(episode, b, self.bid_levels)
        rng = coordinator_rng(noise, t)
        live = list(bids)
        res = self.coordinator.select(live, rng, t)
        failed, action, action_prompt = [], "", None
        while res.winner is not None:
            a = agents[res.winner]
            action_prompt = self.domain.action_prompt(a.role, observation, log)
            (r,) = yield Batch("act", [self._row(a, action_prompt, noise, t, keyed.ACTION)])
            if r is not None:
                action = r.text
                break
            failed.append(res.winner)  # the winner failed mid-action: its bid is withdrawn, the next bidder acts
            live[res.winner] = None
            res = self.coordinator.select(live, rng, t)
            action_prompt = None
        turn = Turn(t, bids, [None] * n, prompts, res, action_prompt=action_prompt, action_text=action)
        return ServedTurn(turn, missed, failed)
