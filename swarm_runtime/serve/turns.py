"""One served turn as a turn-engine strategy (docs/engine.md): :class:`ServedTurns`, the auction turn
batched rollouts take (:meth:`swarm_runtime.core.turn.Auction.turn`) configured for the gateway.

``swarm serve``'s gateway takes every turn of an episode on :class:`~swarm_runtime.core.engine.TurnEngine`
(``arun``): this strategy says what to ask, the gateway's answerer (:class:`swarm_runtime.serve.episodes.TurnAnswerer`)
asks the agents over HTTP. The strategy never touches the network, a clock or the population's health:

1. the agents that are up bid: one ``Batch("bid", rows)``, a row per agent keyed ``(noise, t, agent index, bid)``
   (the keyed draw the worker is sent as its request ``seed``: :func:`swarm_runtime.serve.protocol.seed_for`);
   an answer ``None`` (missed the deadline, or failed) is an absent bid, as a dropped-out agent in process;
2. the coordinator picks with the turn's keyed randomness (:func:`swarm_runtime.core.turn.coordinator_rng`,
   the same as in process);
3. the winner acts: ``Batch("act", [row])`` keyed ``(noise, t, winner, action)``; an answer ``None`` (its
   worker failed) withdraws its bid and the coordinator picks again with the same randomness (failover),
   until an action comes or no bid is left (a skipped turn).

Rows carry the agent (``row.context``, whatever the caller passed: the gateway's
:class:`~swarm_runtime.serve.population.AgentHandle`) and its ``model_id`` as ``row.model``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from swarm_runtime.core.domain import Event
from swarm_runtime.core.engine import Rounds
from swarm_runtime.core.episode import Episode
from swarm_runtime.core.protocols import Row
from swarm_runtime.core.turn import Auction, Decided, coordinator_rng

#: What a served turn decided: the core's :class:`~swarm_runtime.core.episode.Turn` (not yet stepped or logged),
#: the agents (indices) whose bid did not come and the winners whose action failed.
ServedTurn = Decided


class ServedTurns:
    """The served auction's turn (module docstring): :class:`swarm_runtime.core.turn.Auction`, the auction
    code batched rollouts run too, with every agent that is up asked to bid (whether or not the coordinator
    uses bids), no proposals, and the run's bid levels. ``agents``: every agent of the population by index
    (``.index``, ``.role``, ``.model_id``); ``up``: those asked to bid this turn."""

    def __init__(self, domain, coordinator, bid_levels: Sequence[float]):
        self.domain, self.coordinator, self.bid_levels = domain, coordinator, list(bid_levels)

    def rounds(
        self, episode: Episode, t: int, log: list[Event], observation: str, agents: Sequence[Any], up: Sequence[Any]
    ) -> Rounds:
        """Decide turn ``t`` of ``episode`` (whose public log is ``log``; its ``noise`` keys every draw) on
        ``observation``; returns a :class:`ServedTurn`. Unparsed bids are counted on ``episode``; nothing
        else of it is touched."""
        domain = self.domain
        auction = Auction(
            self.coordinator,
            bid_prompt=lambda a, obs, lg: domain.bid_prompt(agents[a].role, obs, lg),
            action_prompt=lambda a, obs, lg: domain.action_prompt(agents[a].role, obs, lg),
            bid_row=lambda a, prompt, key, _last: Row(agents[a].model_id, prompt, key, context=agents[a]),
            act_row=lambda a, prompt, key: Row(agents[a].model_id, prompt, key, context=agents[a]),
            bid_levels=lambda _a, _last: self.bid_levels,
        )
        return auction.turn(
            episode,
            len(agents),
            t,
            log,
            observation,
            bidders=[a.index for a in up],
            rng=lambda: coordinator_rng(episode.noise, t),
        )
