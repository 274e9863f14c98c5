"""One served episode, turn by turn, on the core's turn engine (docs/engine.md) with agents behind HTTP.

Each turn is the :class:`~swarm_runtime.serve.turns.ServedTurns` strategy run by
:meth:`TurnEngine.arun <swarm_runtime.core.engine.TurnEngine.arun>`; this module is its transport,
the async answerer :class:`TurnAnswerer`. Every agent that is up gets its bid prompt (the domain's),
concurrently; those that answer within ``bid_deadline`` bid, the others are absent (``None``, as a
dropped-out agent in process). The run's coordinator picks the winner with the same keyed randomness
as in process; the winner's action prompt goes to its worker; if that fails, its bid is withdrawn and
the coordinator picks again (the runner-up). A server-side episode's env steps as in process
(:func:`swarm_runtime.core.loop.step_turn`). The records are the core's
:class:`~swarm_runtime.core.episode.Episode` / :class:`~swarm_runtime.core.episode.Turn`, so credit and summaries
are computed by the same functions. An episode fails only when no agent is up for ``agent_wait``
seconds (:class:`NoAgentsLeft`).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from swarm_runtime.core.credit import fold_skipped_rewards
from swarm_runtime.core.engine import Batch, TurnEngine
from swarm_runtime.core.episode import Episode, Turn
from swarm_runtime.core.loop import finish_episode, step_turn
from swarm_runtime.core.protocols import Bid, Response, Row
from swarm_runtime.models.tokenizer import bid_token
from swarm_runtime.models.transformers_backend import parse_bid
from swarm_runtime.serve.population import AgentHandle, Population
from swarm_runtime.serve.protocol import seed_for
from swarm_runtime.serve.turns import ServedTurn, ServedTurns


class NoAgentsLeft(RuntimeError):
    """Every agent of the population is down, draining or removed."""


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
    t: int = 0
    status: str = "running"  #: running | done | degraded | failed | expired | cancelled | interrupted
    error: str | None = None
    records: list = field(default_factory=list)
    temperature: float | None = None
    last_used: float = field(default_factory=time.monotonic)
    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    client: str = ""  #: who opened it (admission and cancel: the API key's hash or the peer address)
    cancelled: str | None = None  #: why it was cancelled, once it is
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self):
        if self.episode is None:
            self.episode = Episode(self.seed, noise=self.noise)


def choice(texts: list[str]) -> dict:
    """A constrained choice in both of vLLM's spellings: ``guided_choice`` (before 0.12, and our worker)
    and ``structured_outputs.choice`` (0.10.2 on; 0.12 dropped the old field and ignores it silently)."""
    return {"guided_choice": list(texts), "structured_outputs": {"choice": list(texts)}}


def new_id() -> str:
    return f"ep-{uuid.uuid4().hex[:16]}"


class WorkerError(RuntimeError):
    """A worker answered with an HTTP error status."""


class AgentClients:
    """The gateway's requests to its agents: one connection pool per agent URL, on httpcore (the
    HTTP engine under httpx) directly.

    Measured (docs/benchmarks.md): httpx's client layer (request building, cookies, auth and redirect
    handling) costs the gateway more CPU per request than the HTTP exchange itself, and one pool shared
    by every agent examines every connection it holds, and every request waiting for one, each time a
    request starts or ends. Agents are plain OpenAI-compatible servers, so the gateway needs none of that
    layer: a JSON body out, a JSON body back, with the same timeouts."""

    def __init__(self, max_connections: int = 256):
        self.max_connections = max_connections
        self._pools: dict[str, Any] = {}

    def pool(self, url: str):
        import httpcore

        p = self._pools.get(url)
        if p is None:
            p = self._pools[url] = httpcore.AsyncConnectionPool(
                max_connections=self.max_connections, max_keepalive_connections=self.max_connections
            )
        return p

    async def post_json(self, url: str, path: str, body: dict, timeout: float) -> tuple[dict, dict]:
        """POST ``body`` to ``url + path``; the JSON answer and its headers. Raises httpcore's
        exceptions (``ConnectError``, ``ReadTimeout``, ...) or :class:`WorkerError` for a status >= 400."""
        import httpcore

        data = json.dumps(body).encode()
        ext = {"timeout": {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}}
        for attempt in (0, 1):  # a keep-alive connection the worker closed meanwhile: once more, on a new one
            try:
                r = await self.pool(url).request(
                    "POST", url + path, content=data, extensions=ext, headers=[(b"content-type", b"application/json")]
                )
                break
            except (httpcore.RemoteProtocolError, httpcore.ReadError, httpcore.WriteError):
                if attempt:  # keyed draws make the retry's answer the same as the first one's
                    raise
        if r.status >= 400:
            raise WorkerError(f"HTTP {r.status} from {url}{path}: {r.content[:300].decode(errors='replace')}")
        return json.loads(r.content), {k.decode().lower(): v.decode() for k, v in r.headers}

    async def forget(self, url: str) -> None:
        """Close the pool of an agent that left."""
        p = self._pools.pop(url, None)
        if p is not None:
            await p.aclose()

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            await p.aclose()


class TurnAnswerer:
    """The async answerer of one served turn's batches (:meth:`TurnEngine.arun
    <swarm_runtime.core.engine.TurnEngine.arun>`): each row goes to its agent's worker
    (``row.context``) as an OpenAI completion with the row's keyed ``seed``.

    Bids: every row at once; those not answered within ``bid_deadline`` are cancelled and answered
    ``None`` (a missed bid: counted, and the agent marked down after ``drop_after_misses`` in a row), as
    are those whose request failed (counted as a failure, the agent marked down). Actions: a failed
    request is ``None`` (counted as a failure and a failover, the agent marked down). Keeps the
    workers' reported compute on the critical path: the slowest answered bid plus the action."""

    def __init__(self, engine: Engine, ep: ServedEpisode):
        self.engine, self.ep = engine, ep
        #: the episode's own sampling temperature, else the run's
        self.temperature = float(engine.opts.temperature if ep.temperature is None else ep.temperature)
        self.bid_compute = 0.0  #: seconds: the slowest answered bid's compute
        self.act_compute = 0.0  #: seconds: the answered action's compute

    async def __call__(self, batch: Batch) -> list:
        return await (self.bids(batch.rows) if batch.kind == "bid" else self.acts(batch.rows))

    async def _post(self, row: Row, body: dict, timeout: float) -> tuple[str, float]:
        a: AgentHandle = row.context
        body = {
            "model": a.model_id,
            "prompt": row.prompt,
            "temperature": self.temperature,
            "seed": seed_for(*row.key),
            **body,
        }
        a.inflight += 1
        try:
            answer, headers = await self.engine.client.post_json(a.url, "/v1/completions", body, timeout)
            ms = float(headers.get("x-swarm-compute-ms", 0.0))
            return answer["choices"][0]["text"], ms / 1000
        finally:
            a.inflight -= 1

    async def _bid(self, row: Row) -> tuple[Bid, float]:
        opts = self.engine.opts
        if opts.bid_mode == "logits":
            body = {"max_tokens": 1, **choice(self.engine.bid_texts)}
        else:
            body = {"max_tokens": opts.max_bid_tokens, "swarm_kind": "bid"}
        text, compute = await self._post(row, body, opts.bid_deadline_s)
        level, parsed = parse_bid(text, opts.bid_levels)
        return Bid(text, None, level=level, parsed=parsed), compute

    async def bids(self, rows: list[Row]) -> list[Bid | None]:
        eng = self.engine
        tasks = [asyncio.ensure_future(self._bid(row)) for row in rows]
        done, pending = await asyncio.wait(tasks, timeout=eng.opts.bid_deadline_s)
        for task in pending:
            task.cancel()
        answers: list[Bid | None] = []
        for task, row in zip(tasks, rows):
            a: AgentHandle = row.context
            if task in done and task.exception() is None:
                bid, compute = task.result()
                answers.append(bid)
                self.bid_compute = max(self.bid_compute, compute)
                a.misses = 0
                continue
            answers.append(None)
            with eng.metrics.lock:
                eng.metrics.missed_bids[a.name] += 1
            if task in pending:
                eng.pop.note_miss(a)
            else:
                with eng.metrics.lock:
                    eng.metrics.failures[(a.name, "bid")] += 1
                eng.pop.mark_down(a, f"bid request failed: {type(task.exception()).__name__}: {task.exception()}")
        return answers

    async def acts(self, rows: list[Row]) -> list[Response | None]:
        return [await self._act(row) for row in rows]

    async def _act(self, row: Row) -> Response | None:
        eng, a = self.engine, row.context
        body = {"max_tokens": eng.opts.max_action_tokens}
        if eng.opts.constrained_actions:
            choices = eng.domain.action_choices(self.ep.task, a.role)
            if choices:
                body.update(choice(list(choices)))
        try:
            text, self.act_compute = await self._post(row, body, eng.opts.action_timeout_s)
            return Response(text, None)
        except Exception as exc:  # the winner failed mid-action: the strategy hands the turn to the next bidder
            with eng.metrics.lock:
                eng.metrics.failures[(a.name, "action")] += 1
                eng.metrics.failovers += 1
            eng.pop.mark_down(a, f"action request failed: {type(exc).__name__}: {exc}")
            logger.warning(
                "episode {} turn {}: {} failed to act ({}); next bidder",
                self.ep.id,
                self.ep.t,
                a.name,
                type(exc).__name__,
            )
            return None


class Engine:
    """The gateway's episodes: each turn is the :class:`~swarm_runtime.serve.turns.ServedTurns` strategy
    run by :attr:`turns` (a :class:`~swarm_runtime.core.engine.TurnEngine`) with a :class:`TurnAnswerer`."""

    def __init__(
        self, domain, coordinator, population: Population, client, opts: EngineOptions, metrics, credit_fn: Callable
    ):
        """``client``: the :class:`AgentClients` the agents' requests go through."""
        self.domain, self.coordinator, self.pop, self.client = domain, coordinator, population, client
        self.opts, self.metrics, self.credit_fn = opts, metrics, credit_fn
        self.bid_texts = [bid_token(b) for b in opts.bid_levels]
        self.strategy = ServedTurns(domain, coordinator, opts.bid_levels)
        self.turns = TurnEngine()  #: counts the batches (and rows) every served turn asked for

    # ------------------------------------------------------------------ one turn
    async def _bidders(self) -> list[AgentHandle]:
        end = time.monotonic() + self.opts.agent_wait_s
        while True:
            up = self.pop.bidders()
            if up:
                return up
            if time.monotonic() >= end:
                states = ", ".join(f"{a.name} {a.status}" for a in self.pop.agents) or "none registered"
                raise NoAgentsLeft(
                    f"no agent left to bid: every agent has been down for {self.opts.agent_wait_s:g}s ({states})"
                )
            await asyncio.sleep(0.05)

    async def decide(self, ep: ServedEpisode, observation: str) -> tuple[Turn, dict]:
        """Bids, auction and the winner's action for ``ep``'s turn ``ep.t`` (the log is not touched): the
        :class:`~swarm_runtime.serve.turns.ServedTurns` strategy on the turn engine, answered over HTTP."""
        up = await self._bidders()
        t0 = time.perf_counter()
        answerer = TurnAnswerer(self, ep)
        rounds = self.strategy.rounds(ep.episode, ep.t, ep.log, observation, list(self.pop.agents), up)
        out: ServedTurn = await self.turns.arun(rounds, answerer)
        latency = time.perf_counter() - t0
        turn, res = out.turn, out.turn.auction
        agents = self.pop.agents
        winner = agents[res.winner] if res.winner is not None else None
        compute = answerer.bid_compute + answerer.act_compute
        record = {
            "t": ep.t,
            "bids": {agents[i].name: b for i, b in enumerate(turn.bids) if b is not None},
            "missed": [agents[i].name for i in out.missed],
            "failed": [agents[i].name for i in out.failed],
            "agent": winner.name if winner else None,
            "role": winner.role if winner else None,
            "bid": res.winning_bid if winner else None,
            "action": turn.action_text if winner else None,
            "latency_ms": round(latency * 1000, 3),
            "compute_ms": round(compute * 1000, 3),
        }
        with self.metrics.lock:
            self.metrics.turns += 1
            self.metrics.skipped_turns += int(winner is None)
            self.metrics.turn_latency.observe(latency)
            self.metrics.overhead.observe(max(0.0, latency - compute))
        return turn, record

    # ------------------------------------------------------------------ bookkeeping
    def record(self, ep: ServedEpisode, turn: Turn, rec: dict) -> None:
        ep.episode.turns.append(turn)
        ep.records.append(rec)
        ep.t += 1
        ep.last_used = time.monotonic()

    async def play(self, ep: ServedEpisode, on_turn: Callable | None = None) -> ServedEpisode:
        """Play a server-side episode to the end (env done or ``max_decisions``): each turn decided on the
        turn engine, then settled as in process (:func:`swarm_runtime.core.loop.step_turn`)."""
        env = ep.env
        while True:
            turn, rec = await self.decide(ep, env.observation())
            role = self.pop.agents[turn.winner].role if turn.winner is not None else None
            step_turn(env, ep.episode, ep.log, turn, role, role)
            rec.update(reward=turn.reward, valid=turn.valid)
            self.record(ep, turn, rec)
            if on_turn is not None:
                await on_turn(rec)
            if env.done or ep.t >= ep.max_decisions:
                finish_episode(ep.episode, env)
                ep.status = "done"
                return ep

    def summary(self, ep: ServedEpisode) -> dict:
        """The episode's outcome: return, metrics, each agent's credit (the run's credit scheme over
        the acted turns, as the trainer computes it), missed bids and failovers."""
        e = ep.episode
        acted = e.acted
        rewards = fold_skipped_rewards([t.reward for t in e.turns], [t.winner is not None for t in e.turns])
        credit: dict[str, float] = {}
        if acted:
            for turn, c in zip(
                acted, self.credit_fn(rewards, [t.auction.winning_bid for t in acted], random.Random(ep.noise))
            ):
                name = self.pop.agents[turn.winner].name
                credit[name] = credit.get(name, 0.0) + float(c)
        if ep.status == "running" and ep.env is None:
            e.reward = sum(t.reward for t in e.turns)
        return {
            "id": ep.id,
            "status": ep.status,
            "error": ep.error,
            "task": ep.task_name,
            "seed": ep.seed,
            "noise": str(ep.noise),
            "reward": e.reward,
            "metrics": e.metrics,
            "decisions": len(e.turns),
            "credit": credit,
            "missed_bids": sum(len(r["missed"]) for r in ep.records),
            "failovers": sum(len(r["failed"]) for r in ep.records),
            "unparsed_bids": e.unparsed_bids,
            "invalid_actions": e.invalid_actions,
            "reward_missing": e.reward_missing,
            "agents": [a.name for a in self.pop.agents],
        }
