"""Served episodes on the core loop (docs/reference/engine.md): :class:`Engine` plays each episode, server-side or
client-side, as the core's one episode loop over the served population
(:class:`~swarm_runtime.serve.turns.ServedTurns`, a :class:`~swarm_runtime.core.loop.AuctionTurns`) on
:meth:`TurnEngine.arun <swarm_runtime.core.engine.TurnEngine.arun>`, with the gateway's answerer
(:class:`~swarm_runtime.serve.answerer.TurnAnswerer`) as its transport.

Every agent that is up bids, concurrently; those that answer within ``bid_deadline`` bid, the others are
absent. The run's coordinator picks the winner with the same keyed randomness as in process; a winner whose
action fails is withdrawn and the coordinator picks again (the runner-up). A server-side episode's env steps
as in process; a client-side episode's world is the client's reports
(:class:`~swarm_runtime.serve.client_world.ClientWorld`). The core settles every turn and ends the episode
(:func:`swarm_runtime.core.loop.settle`), and its records are the core's
:class:`~swarm_runtime.core.episode.Episode` / :class:`~swarm_runtime.core.episode.Turn`, so credit and
summaries are computed by the same functions. An episode fails only when no agent is up for ``agent_wait``
seconds (:class:`NoAgentsLeft`).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from swarm_runtime.core.credit import fold_skipped_rewards
from swarm_runtime.core.engine import TurnEngine
from swarm_runtime.core.episode import Episode, Slot, Turn
from swarm_runtime.models.bids import bid_token
from swarm_runtime.serve.answerer import NoAgentsLeft, TurnAnswerer
from swarm_runtime.serve.population import Population
from swarm_runtime.serve.transport import AgentClients
from swarm_runtime.serve.turns import ServedTurns

__all__ = ["AgentClients", "Engine", "EngineOptions", "NoAgentsLeft", "ServedEpisode", "new_id", "versions_of"]


@dataclass
class EngineOptions:
    bid_levels: list
    bid_mode: str = "logits"
    temperature: float = 1.0
    max_action_tokens: int = 12
    max_bid_tokens: int = 6
    constrained_actions: bool = False
    bid_deadline_s: float = 2.0
    action_timeout_s: float = 10.0
    agent_wait_s: float = 10.0
    journal_tokens: bool = True  #: ask every request for its token ids and log-probs (serve/answerer.py)


@dataclass
class ServedEpisode:
    """A running (or finished) episode: the core's record plus what the service needs."""

    id: str
    seed: int
    noise: int
    task_name: str
    task: Any
    max_decisions: int
    env: Any = None  #: the domain's env (server-side episodes); None: the client owns the world
    episode: Episode = None
    log: list = field(default_factory=list)
    status: str = "running"  #: running | done | degraded | failed | expired | cancelled | interrupted
    error: str | None = None
    records: list = field(default_factory=list)
    samples: list = field(default_factory=list)  #: per record: its requests' token ids and log-probs (answerer.sample)
    reward_due: bool = False  #: a client-side episode played to its end whose reward its client posts later
    intercept: bool = False  #: its turns are an external harness's chat calls (serve/routes/intercept.py)
    temperature: float | None = None
    last_used: float = field(default_factory=time.monotonic)
    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    client: str = ""  #: who opened it (admission and cancel: the API key's hash or the peer address)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    world: Any = None  #: a client-side episode's world (:mod:`swarm_runtime.serve.client_world`), its first turn on
    slot: Slot | None = None  #: the core loop's slot, once the episode plays
    pending: Turn | None = None  #: a client-side turn told to the client whose outcome it has not reported yet
    runner: asyncio.Future | None = None  #: the task playing the episode's loop
    stop: tuple[str, str] | None = None  #: (status, why) the episode ends with when its task is cancelled

    def __post_init__(self):
        if self.episode is None:
            self.episode = Episode(self.seed, noise=self.noise)

    @property
    def kind(self) -> str:
        """``server`` (the gateway steps its env), ``client`` (the client's world, the gateway's auction) or
        ``intercept`` (a harness's chat calls, no auction)."""
        return "intercept" if self.intercept else "server" if self.env is not None else "client"

    @property
    def t(self) -> int:
        """Turns settled so far."""
        return self.slot.t if self.slot is not None else 0


def versions_of(records: list[dict]) -> dict[str, list[str]]:
    """Each agent's versions (``Role@vN``) that answered in ``records`` (turn records), in the order they first did:
    one per agent unless a swap came mid-episode. Agents joined by URL (no version) are left out."""
    out: dict[str, list[str]] = {}
    for rec in records:
        for name, label in (rec.get("versions") or {}).items():
            if label is not None and label not in out.setdefault(name, []):
                out[name].append(label)
    return {k: v for k, v in out.items() if v}


def new_id() -> str:
    return f"ep-{uuid.uuid4().hex[:16]}"


class Engine:
    """The gateway's episodes: each the :class:`~swarm_runtime.serve.turns.ServedTurns` loop run by
    :attr:`turns` (a :class:`~swarm_runtime.core.engine.TurnEngine`) with a
    :class:`~swarm_runtime.serve.answerer.TurnAnswerer`."""

    def __init__(
        self, domain, coordinator, population: Population, client, opts: EngineOptions, metrics, credit_fn: Callable
    ):
        """``client``: the :class:`~swarm_runtime.serve.transport.AgentClients` the agents' requests go through."""
        self.domain, self.coordinator, self.pop, self.client = domain, coordinator, population, client
        self.opts, self.metrics, self.credit_fn = opts, metrics, credit_fn
        self.bid_texts = [bid_token(b) for b in opts.bid_levels]
        self.turns = TurnEngine()  #: counts the batches (and rows) every served turn asked for

    async def play(
        self, ep: ServedEpisode, on_turn: Callable | None = None, on_reward: Callable | None = None
    ) -> ServedEpisode:
        """Play ``ep`` to the end (its world done, or ``max_decisions``) on the core loop: its world is its env
        (server-side) or its :attr:`ServedEpisode.world` (client-side). ``on_turn(record)``: a turn's record
        joined ``ep.records``; ``on_reward(record)``: a client-side turn's outcome came
        (:class:`~swarm_runtime.serve.answerer.TurnAnswerer`)."""
        ep.slot = Slot(ep.env if ep.env is not None else ep.world, ep.episode, ep.log)
        answerer = TurnAnswerer(self, ep, on_turn, on_reward)
        loop = ServedTurns(
            self.domain, self.coordinator, self.opts.bid_levels, self.pop.agents, ep.max_decisions, answerer.settled
        )
        await self.turns.arun(loop.rounds([ep.slot]), answerer)
        if not ep.reward_due:  # else it runs on until its client posts its reward
            ep.status = "done"
        return ep

    def summary(self, ep: ServedEpisode) -> dict:
        """The episode's outcome: return, metrics, each agent's credit (the run's credit scheme over
        the acted turns, as the trainer computes it), missed bids and failovers. A client-side episode's
        turns include the one told to the client whose outcome has not come (reward 0 so far), and its
        return is its turns' rewards so far."""
        e = ep.episode
        turns = e.turns + ([ep.pending] if ep.pending is not None else [])
        acted = [t for t in turns if t.winner is not None]
        rewards = fold_skipped_rewards([t.reward for t in turns], [t.winner is not None for t in turns])
        credit: dict[str, float] = {}
        if acted:
            for turn, c in zip(
                acted, self.credit_fn(rewards, [t.auction.winning_bid for t in acted], random.Random(ep.noise))
            ):
                name = self.pop.agents[turn.winner].name
                credit[name] = credit.get(name, 0.0) + float(c)
        return {
            "id": ep.id,
            "status": ep.status,
            "error": ep.error,
            "task": ep.task_name,
            "seed": ep.seed,
            "noise": str(ep.noise),
            "reward": e.reward if ep.env is not None else sum(t.reward for t in turns),
            "metrics": e.metrics,
            "decisions": len(turns),
            "credit": credit,
            "missed_bids": sum(len(r["missed"]) for r in ep.records),
            "failovers": sum(len(r["failed"]) for r in ep.records),
            "unparsed_bids": e.unparsed_bids,
            "invalid_actions": e.invalid_actions,
            "reward_missing": e.reward_missing,
            "agents": [a.name for a in self.pop.agents],
            "versions": versions_of(ep.records),
            **({"reward_due": True} if ep.reward_due else {}),
        }
