"""The gateway: ``swarm serve RUN_DIR`` — workers, the auction over whoever answers, and the HTTP API.

    GET  /health                      status, agents up, episodes running
    GET  /metrics                     Prometheus text
    GET  /v1/swarm/agents             the population
    POST /v1/swarm/agents             {role, checkpoint? | url?, name?}: an agent joins (no restart);
                                      neither checkpoint nor url: the checkpoint being served
    DELETE /v1/swarm/agents/{name}    drain an agent: it finishes what it was asked, then leaves
    POST /v1/episodes                 {task?, seed?, noise?, temperature?, stream?}: a whole server-side
                                      episode (JSON, or JSON lines per turn with stream=true);
                                      {"env": "client"}: an episode whose world the client owns
    POST /v1/episodes/{id}/turns      {observation, reward, valid?, done?} -> {agent, role, bid, action}
    GET  /v1/episodes/{id}            a client-side episode's state and summary

Binds 127.0.0.1 by default; any other address needs ``SWARM_API_KEY`` (``Authorization: Bearer KEY``
on every request, compared in constant time, never logged). Bodies over ``serve.max_body_bytes`` get 413.
"""

import asyncio
import hmac
import json
import os
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from loguru import logger

from swarm_runtime.config import ConfigError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class _TooLarge(Exception):
    pass


class Guard:
    """ASGI middleware: the API key (when one is set) and the request-size bound."""

    def __init__(self, app, max_bytes: int, api_key: str | None):
        self.app, self.max_bytes = app, int(max_bytes)
        self.key = f"Bearer {api_key}".encode() if api_key else None

    async def _reply(self, send, status: int, msg: str) -> None:
        body = json.dumps({"detail": msg}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.key is not None and not hmac.compare_digest(headers.get(b"authorization", b""), self.key):
            return await self._reply(send, 401, "missing or wrong API key: send 'Authorization: Bearer $SWARM_API_KEY'")
        try:
            length = int(headers.get(b"content-length", b"0") or 0)
        except ValueError:
            return await self._reply(send, 400, "bad Content-Length header")
        if length > self.max_bytes:
            return await self._reply(send, 413, f"request body of {length} bytes is over the limit of {self.max_bytes}")
        seen, started = 0, False

        async def limited():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return msg

        async def tracking_send(msg):
            nonlocal started
            started |= msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, limited, tracking_send)
        except _TooLarge:
            if not started:
                await self._reply(send, 413, f"request body is over the limit of {self.max_bytes} bytes")


@dataclass
class GatewaySetup:
    """What ``swarm serve`` resolved: the run, its checkpoint, and the config."""

    run_dir: Path
    checkpoint: Path
    cfg: Any  #: the run's config with the command line's overrides (``cfg.serve`` is the ServeConfig)
    registry: Any
    pm: Any
    api_key: str | None = None


def make_app(setup: GatewaySetup):
    import httpx
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from pydantic import BaseModel, ConfigDict, Field

    from swarm_runtime.episode import make_env
    from swarm_runtime.run import RunContext
    from swarm_runtime.serve.engine import AgentClients, Engine, EngineOptions, NoAgentsLeft, ServedEpisode, new_id
    from swarm_runtime.serve.metrics import Metrics
    from swarm_runtime.serve.population import Population, PopulationOptions
    from swarm_runtime.policy.noise import key_hash
    from swarm_runtime.domain import Event

    cfg, s = setup.cfg, setup.cfg.serve
    ctx = RunContext(cfg, setup.pm, setup.registry, setup.run_dir)
    domain = ctx.domain
    roles = [r.name for r in domain.roles]
    serve_dir = setup.run_dir / "serve"
    serve_dir.mkdir(parents=True, exist_ok=True)
    metrics = Metrics()
    pop = Population(PopulationOptions(
        max_prompt_tokens=int(cfg.model.max_prompt_tokens), device=str(cfg.hardware.device),
        worker_threads=int(s.worker_threads), restart_workers=bool(s.restart_workers),
        probe_interval_s=float(s.probe_interval_ms) / 1000, drop_after_misses=int(s.drop_after_misses),
        log_dir=serve_dir / "workers"))
    temperature = cfg.eval.temperature if cfg.eval.temperature is not None else cfg.model.temperature
    opts = EngineOptions(bid_levels=[float(b) for b in cfg.algo.bid_levels], bid_mode=str(cfg.model.bid_mode),
                         temperature=float(temperature), max_action_tokens=int(cfg.model.max_action_tokens),
                         max_bid_tokens=int(cfg.model.max_bid_tokens),
                         constrained_actions=bool(cfg.model.constrained_actions),
                         bid_deadline_s=float(s.bid_deadline_ms) / 1000, action_timeout_s=float(s.action_timeout_ms) / 1000,
                         agent_wait_s=float(s.agent_wait_s))
    state: dict[str, Any] = {"accepting": True, "running": {}, "episodes": {}, "client": None, "engine": None,
                             "background": []}
    transcripts = serve_dir / "episodes.jsonl"

    def replicas(role: str) -> int:
        r = s.replicas
        return int(r.get(role, 1)) if hasattr(r, "get") else int(r)

    def save_transcript(ep: ServedEpisode) -> None:
        with transcripts.open("a") as f:
            f.write(json.dumps({**state["engine"].summary(ep), "turns": ep.records}, default=float) + "\n")

    def finish(ep: ServedEpisode, status: str, error: str | None = None) -> None:
        if ep.status == "running" or status != "done":
            ep.status, ep.error = status, error
        with metrics.lock:
            metrics.episodes[ep.status] += 1
        save_transcript(ep)
        logger.info("episode {} {}: reward {:.2f} in {} decisions{}", ep.id, ep.status, ep.episode.reward, ep.t,
                    f" ({error})" if error else "")

    async def sweep() -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for eid, ep in list(state["episodes"].items()):
                if (ep.status == "running" and ep.env is None and not ep.lock.locked()  # a turn in progress is not idle
                        and now - ep.last_used > float(s.episode_idle_s)):
                    finish(ep, "expired", f"no turn for more than serve.episode_idle_s={s.episode_idle_s}s")
                if ep.status != "running" and now - ep.last_used > max(60.0, float(s.episode_idle_s)):
                    state["episodes"].pop(eid, None)

    @asynccontextmanager
    async def lifespan(app):
        client = httpx.AsyncClient(limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200))
        state["client"] = client
        state["agent_clients"] = AgentClients()
        state["engine"] = Engine(domain, ctx.coordinator(), pop, state["agent_clients"], opts, metrics, ctx.credit_fn())
        for role in roles:
            for _ in range(replicas(role)):
                pop.spawn(role, setup.checkpoint / "agents" / role)
        for spec in s.agents or []:
            role, _, url = str(spec).partition("=")
            pop.add_url(role, url)
        try:
            await pop.wait_up(client, float(s.startup_timeout_s))
        except (TimeoutError, RuntimeError) as exc:
            pop.stop_all()
            raise RuntimeError(f"swarm serve: {exc}") from exc
        state["background"] = [asyncio.ensure_future(pop.watch(client)), asyncio.ensure_future(sweep())]
        logger.info("swarm serve: {} agents up ({}), checkpoint {}", len(pop.bidders()),
                    ", ".join(a.name for a in pop.agents), setup.checkpoint.name)
        print(f"serving {cfg.domain}/{cfg.task_name} on http://{s.host}:{s.port}", flush=True)
        try:
            yield
        finally:
            state["accepting"] = False
            running = [t for t in state["running"].values() if not t.done()]
            if running:
                logger.info("shutting down: waiting up to {}s for {} running episodes", s.shutdown_grace_s, len(running))
                done, pending = await asyncio.wait(running, timeout=float(s.shutdown_grace_s))
                for t in pending:
                    t.cancel()
                logger.info("shutdown: {} episodes finished, {} interrupted", len(done), len(pending))
            interrupted = 0
            for ep in state["episodes"].values():
                if ep.status == "running":
                    finish(ep, "interrupted", "the gateway shut down")
                    interrupted += 1
            for t in state["background"]:
                t.cancel()
            pop.stop_all()
            await client.aclose()
            await state["agent_clients"].aclose()
            logger.info("swarm serve stopped: {} episodes done, {} interrupted; transcripts in {}",
                        metrics.episodes.get("done", 0), interrupted, transcripts)

    app = FastAPI(title="swarm serve", lifespan=lifespan)

    class AgentRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        role: str = Field(..., max_length=200)
        checkpoint: Optional[str] = Field(None, max_length=4096)
        url: Optional[str] = Field(None, max_length=4096)
        name: Optional[str] = Field(None, max_length=200)

    class EpisodeRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        task: Optional[str] = Field(None, max_length=200)
        seed: Optional[int] = None
        noise: Optional[Union[int, str]] = None
        temperature: Optional[float] = Field(None, ge=0.0, le=100.0)
        stream: bool = False
        env: str = "server"
        max_decisions: Optional[int] = Field(None, ge=1, le=100_000)

    class TurnRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        observation: str = Field(..., max_length=200_000)
        reward: float = 0.0
        valid: bool = True
        done: bool = False

    @app.get("/health")
    def health():
        up = len(pop.bidders())
        live = [a for a in pop.agents if a.status != "removed"]
        status = "ok" if up == len(live) else ("degraded" if up else "no_agents")
        return {"status": status if state["accepting"] else "shutting_down", "agents_up": up, "agents": len(live),
                "episodes_running": sum(1 for e in state["episodes"].values() if e.status == "running"),
                "domain": cfg.domain, "task": cfg.task_name, "checkpoint": setup.checkpoint.name}

    @app.get("/metrics")
    def prometheus():
        live = [a for a in pop.agents if a.status != "removed"]
        running = sum(1 for e in state["episodes"].values() if e.status == "running")
        return PlainTextResponse(metrics.render(len(pop.bidders()), len(live), running),
                                 media_type="text/plain; version=0.0.4")

    @app.get("/v1/swarm/agents")
    def list_agents():
        return {"agents": [a.public() for a in pop.agents]}

    @app.post("/v1/swarm/agents", status_code=201)
    async def add_agent(req: AgentRequest):
        if req.role not in roles:
            raise HTTPException(422, f"unknown role {req.role!r}; valid: {', '.join(roles)}")
        if req.checkpoint is not None and req.url is not None:
            raise HTTPException(422, "give checkpoint (a tag of the run, or a role folder) or url, not both; "
                                     "neither: the checkpoint being served")
        if req.name is not None and any(a.name == req.name for a in pop.agents):
            raise HTTPException(409, f"an agent named {req.name!r} exists already")
        if req.url is not None:
            a = pop.add_url(req.role, req.url, req.name)
            await pop.probe(state["client"], a)
            return a.public()
        tag = req.checkpoint or setup.checkpoint.name
        if tag == "latest":
            tag = (setup.run_dir / "checkpoints" / "latest").read_text().strip()
        path = Path(tag)
        if not (path / "config.json").exists():
            path = setup.run_dir / "checkpoints" / tag / "agents" / req.role
        if not (path / "config.json").exists():
            tags = sorted(p.name for p in (setup.run_dir / "checkpoints").glob("*") if (p / "agents").is_dir())
            raise HTTPException(422, f"checkpoint {req.checkpoint!r} is neither a tag of the run with a {req.role} "
                                     f"model nor a role folder; tags: {', '.join(tags)}")
        a = pop.spawn(req.role, path, req.name)
        return a.public()

    @app.delete("/v1/swarm/agents/{name}")
    async def remove_agent(name: str):
        a = pop.by_name(name)
        if a is None:
            raise HTTPException(404, f"no agent {name!r}; agents: {', '.join(x.name for x in pop.agents if x.status != 'removed')}")
        await pop.drain(a)
        if not any(x.url == a.url and x.status != "removed" for x in pop.agents):
            await state["agent_clients"].forget(a.url)
        return a.public()

    def new_episode(req: EpisodeRequest) -> ServedEpisode:
        if not state["accepting"]:
            raise HTTPException(503, "the gateway is shutting down")
        if req.env not in ("server", "client"):
            raise HTTPException(422, f"env {req.env!r} is not one of: server, client")
        running = sum(1 for e in state["episodes"].values() if e.status == "running")
        if running >= int(s.max_episodes):
            raise HTTPException(429, f"{running} episodes running, the limit is serve.max_episodes={s.max_episodes}")
        task_name = req.task or cfg.task_name
        if task_name not in domain.task_names():
            raise HTTPException(422, f"unknown task {task_name!r}; valid: {', '.join(domain.task_names())}")
        task = cfg.task if task_name == cfg.task_name else domain.task_config(task_name)
        seed = int(req.seed) if req.seed is not None else domain.episode_seeds(task, "eval")[0]
        if req.noise is None:
            noise = key_hash(seed, int.from_bytes(os.urandom(8), "little"))
        else:
            try:
                noise = int(req.noise) & ((1 << 64) - 1)
            except ValueError:
                raise HTTPException(422, f"noise {req.noise!r} is not an integer") from None
        ep = ServedEpisode(new_id(), seed, noise, task_name, task,
                           int(req.max_decisions or task.max_decisions), temperature=req.temperature)
        if req.env == "server":
            try:
                ep.env = make_env(domain, task)
                ep.env.reset(seed)
            except ValueError as exc:
                raise HTTPException(422, f"seed {seed}: {exc}") from exc
        state["episodes"][ep.id] = ep
        logger.info("episode {} starts: {} seed {} ({} env)", ep.id, task_name, seed, req.env)
        return ep

    async def run_episode(ep: ServedEpisode, on_turn=None) -> None:
        try:
            await state["engine"].play(ep, on_turn)
            finish(ep, "done")
        except NoAgentsLeft as exc:
            finish(ep, "failed", str(exc))
        except asyncio.CancelledError:
            finish(ep, "interrupted", "the gateway shut down")
            raise
        except Exception as exc:  # an env error: the episode fails, the service does not
            logger.exception("episode {} failed", ep.id)
            finish(ep, "failed", f"{type(exc).__name__}: {exc}")

    @app.post("/v1/episodes")
    async def episodes(req: EpisodeRequest):
        ep = new_episode(req)
        engine = state["engine"]
        if req.env == "client":
            return {"id": ep.id, "status": "running", "task": ep.task_name, "seed": ep.seed, "noise": str(ep.noise),
                    "agents": [a.name for a in pop.agents]}
        if not req.stream:
            task = asyncio.ensure_future(run_episode(ep))
            state["running"][ep.id] = task
            try:
                await asyncio.shield(task)
            finally:
                state["running"].pop(ep.id, None)
            body = {**engine.summary(ep), "turns": ep.records}
            return JSONResponse(body, status_code=200 if ep.status == "done" else 503)
        queue: asyncio.Queue = asyncio.Queue()

        async def on_turn(rec):
            await queue.put(rec)

        async def runner():
            try:
                await run_episode(ep, on_turn)
            finally:
                await queue.put(None)

        task = asyncio.ensure_future(runner())
        state["running"][ep.id] = task

        async def lines():
            try:
                while True:
                    rec = await queue.get()
                    if rec is None:
                        break
                    yield json.dumps({"id": ep.id, **rec}, default=float) + "\n"
                yield json.dumps({**engine.summary(ep), "final": True}, default=float) + "\n"
            finally:
                state["running"].pop(ep.id, None)

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    def get_episode(eid: str) -> ServedEpisode:
        ep = state["episodes"].get(eid)
        if ep is None:
            raise HTTPException(404, f"unknown episode {eid!r} (finished or expired episodes are kept "
                                     f"{max(60.0, float(s.episode_idle_s)):g}s)")
        return ep

    @app.get("/v1/episodes/{eid}")
    def episode_state(eid: str):
        ep = get_episode(eid)
        return {**state["engine"].summary(ep), "turns": ep.records}

    @app.post("/v1/episodes/{eid}/turns")
    async def turn(eid: str, req: TurnRequest):
        ep = get_episode(eid)
        if ep.env is not None:
            raise HTTPException(409, f"episode {eid} is a server-side episode; its turns are played by the gateway")
        engine = state["engine"]
        async with ep.lock:
            if ep.status != "running":  # 410 Gone: expired for want of turns; 409: finished otherwise
                raise HTTPException(410 if ep.status == "expired" else 409,
                                    f"episode {eid} is {ep.status}" + (f": {ep.error}" if ep.error else ""))
            ep.last_used = time.monotonic()
            if ep.episode.turns:  # the reward and validity of the previous action, reported by the client's world
                last = ep.episode.turns[-1]
                last.reward += float(req.reward)
                ep.records[-1]["reward"] = last.reward
                if last.winner is not None:
                    last.valid = bool(req.valid)
                    ep.records[-1]["valid"] = last.valid
                    ep.log[-1].valid, ep.log[-1].reward = last.valid, last.reward
                    ep.episode.invalid_actions += int(not req.valid)
            if req.done or ep.t >= ep.max_decisions:
                ep.episode.reward = sum(t.reward for t in ep.episode.turns)
                finish(ep, "done")
                return engine.summary(ep)
            try:
                t, rec = await engine.decide(ep, req.observation)
            except NoAgentsLeft as exc:
                finish(ep, "failed", str(exc))
                raise HTTPException(503, str(exc)) from None
            if t.winner is not None:
                a = pop.agents[t.winner]
                ep.log.append(Event(ep.t, a.role, t.action_text))
            else:
                ep.log.append(Event(ep.t, None, ""))
            rec.update(reward=0.0, valid=True)
            engine.record(ep, t, rec)
            return {"id": ep.id, "t": rec["t"], "agent": rec["agent"], "role": rec["role"], "bid": rec["bid"],
                    "action": rec["action"], "bids": rec["bids"], "missed": rec["missed"], "failed": rec["failed"]}

    app.add_middleware(Guard, max_bytes=int(s.max_body_bytes), api_key=setup.api_key)
    return app


def serve(setup: GatewaySetup) -> None:
    """Run the gateway in this process until SIGINT/SIGTERM (uvicorn's graceful shutdown)."""
    import sys

    import uvicorn

    s = setup.cfg.serve
    logger.add(setup.run_dir / "serve" / "gateway.log", level="DEBUG")
    app = make_app(setup)
    config = uvicorn.Config(app, host=str(s.host), port=int(s.port), log_level="warning", access_log=False,
                            timeout_graceful_shutdown=int(float(s.shutdown_grace_s)) + 5)
    server = uvicorn.Server(config)
    server.run()
    if not server.started:
        print("swarm: error: the gateway did not start (see the log above)", file=sys.stderr)
        raise SystemExit(1)


def check_bind(host: str, api_key: str | None) -> None:
    if host not in LOOPBACK and not api_key:
        raise ConfigError(f"serve.host={host!r} is not a loopback address: set SWARM_API_KEY (every request must "
                          "then send 'Authorization: Bearer $SWARM_API_KEY'), or bind serve.host=127.0.0.1")
