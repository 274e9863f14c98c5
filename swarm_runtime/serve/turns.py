"""The served configuration of the core loop (docs/reference/engine.md): :class:`ServedTurns`, the episode loop every
episode runs (:class:`swarm_runtime.core.loop.AuctionTurns`) over ``swarm serve``'s population.

``swarm serve``'s gateway plays each episode, server-side or client-side, as ``ServedTurns.rounds([slot])`` on
:meth:`TurnEngine.arun <swarm_runtime.core.engine.TurnEngine.arun>`: this strategy says what to ask, the
gateway's answerer (:class:`swarm_runtime.serve.answerer.TurnAnswerer`) asks over HTTP and steps the world.
The strategy never touches the network, a clock or the population's health. Each turn:

1. who bids: one :class:`Bidders` request, answered with the agents that are up (the answerer waits for one
   up to ``serve.agent_wait_s``);
2. the agents that are up bid: one ``Batch("bid", rows)``, a row per agent keyed ``(noise, t, agent index,
   bid)`` (the keyed draw the worker is sent as its request ``seed``:
   :func:`swarm_runtime.serve.protocol.seed_for`); an answer ``None`` (missed the deadline, or failed) is an
   absent bid, as a dropped-out agent in process;
3. the coordinator picks with the turn's keyed randomness (:func:`swarm_runtime.core.turn.coordinator_rng`, the
   same as in process);
4. the winner acts: ``Batch("act", [row])`` keyed ``(noise, t, winner, action)``; an answer ``None`` (its
   worker failed) withdraws its bid and the coordinator picks again with the same randomness (failover),
   until an action comes or no bid is left (a skipped turn);
5. the world steps (one :class:`~swarm_runtime.core.engine.Steps` row: a server-side env, or the client's
   report) and the core settles the turn (:func:`swarm_runtime.core.loop.settle`).

Rows carry the agent (``row.context``: the gateway's :class:`~swarm_runtime.serve.population.AgentHandle`) and
its ``model_id`` as ``row.model``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from swarm_runtime.core.engine import Rounds
from swarm_runtime.core.episode import Slot
from swarm_runtime.core.loop import AuctionTurns
from swarm_runtime.core.protocols import Row
from swarm_runtime.core.turn import Auction, Decided

#: What a served turn decided: the core's :class:`~swarm_runtime.core.episode.Turn` (not yet stepped or logged),
#: the agents (indices) whose bid did not come and the winners whose action failed.
ServedTurn = Decided


@dataclass(frozen=True)
class Bidders:
    """Who bids in a slot's turn: rows of slots, each answered with the agents (``.index``) that are up."""

    rows: list[Slot]
    kind = "bidders"

    def merged(self, rows: list[Slot]) -> Bidders:
        return Bidders(rows)


def served_auction(domain, coordinator, agents: Sequence[Any], bid_levels: Sequence[float]) -> Auction:
    """The auction over ``agents`` (the population by index: ``.role``, ``.model_id``): every agent asked to
    bid bids (whether or not the coordinator uses bids), no proposals, the run's ``bid_levels``; rows carry
    their agent."""
    levels = list(bid_levels)
    return Auction(
        coordinator,
        bid_prompt=lambda a, obs, log: domain.bid_prompt(agents[a].role, obs, log),
        action_prompt=lambda a, obs, log: domain.action_prompt(agents[a].role, obs, log),
        bid_row=lambda a, prompt, key, _last: Row(agents[a].model_id, prompt, key, context=agents[a]),
        act_row=lambda a, prompt, key: Row(agents[a].model_id, prompt, key, context=agents[a]),
        bid_levels=lambda _a, _last: levels,
    )


class ServedTurns(AuctionTurns):
    """The core loop over a served population (module docstring). ``agents``: the population's agents by
    index, a list that grows as agents join (each turn counts those there are when it starts); an agent
    acts on the env and in the log as its role. ``on_turn(live, turns)``: as :class:`AuctionTurns`'s."""

    def __init__(
        self,
        domain,
        coordinator,
        bid_levels: Sequence[float],
        agents: Sequence[Any],
        max_decisions: int,
        on_turn: Callable | None = None,
    ):
        super().__init__(
            served_auction(domain, coordinator, agents, bid_levels),
            len(agents),
            max_decisions,
            random.Random(0),  # unused: a served episode always has noise, its draws are keyed
            roles=lambda i: (agents[i].role, agents[i].role),
            on_turn=on_turn,
        )
        self.agents = agents

    def bidders(self, slot: Slot) -> Rounds:
        """The agents that are up, asked of the driver (:class:`Bidders`); the turn counts every agent there is
        by then."""
        (up,) = yield Bidders([slot])
        self.n = len(self.agents)
        return [a.index for a in up]
