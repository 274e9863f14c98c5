"""The gateway: ``swarm serve RUN_DIR`` — workers, the auction over whoever answers, and the HTTP API.

    GET  /health/live                 200 while the process serves (no key needed, no data)
    GET  /health/ready                200 when every role has an agent up, else 503 (no key needed, no data)
    GET  /health                      status, agents up, episodes running (503 when not ready)
    GET  /metrics                     Prometheus text
    GET  /v1/models                   the agents, in OpenAI's model list shape
    GET  /v1/swarm, /v1/swarm/agents  the population (state, restarts, errors)
    POST /v1/swarm/agents             {role, checkpoint? | url?, name?}: an agent joins (no restart);
                                      neither checkpoint nor url: the checkpoint being served
    DELETE /v1/swarm/agents/{name}    drain an agent: it finishes what it was asked, then leaves
    POST /v1/episodes                 {task?, seed?, split?, noise?, temperature?, stream?}: a whole server-side
                                      episode (JSON, or JSON lines per turn with stream=true);
                                      {"env": "client"}: an episode whose world the client owns
    POST /v1/episodes/{id}/turns      {observation, reward, valid?, done?} -> {agent, role, bid, action}
    GET  /v1/episodes[?status=S]      recent episodes without turns (those a crash interrupted included)
    GET  /v1/episodes/{id}            an episode's state and summary (``interrupted`` after a gateway crash)
    DELETE /v1/episodes/{id}          cancel an episode (its owner only)

Binds 127.0.0.1 by default; any other address needs ``SWARM_API_KEY`` (``Authorization: Bearer KEY``
on every request but the two health probes, compared in constant time, never logged). Bodies over
``serve.max_body_bytes`` get 413. Every body is read by :mod:`swarm_runtime.serve.validate`: a bad field
is a 4xx naming it, errors carry ``detail`` and OpenAI's ``error`` object. Every episode's start and
turns are journaled (:mod:`swarm_runtime.serve.journal`) before the answer leaves.
"""

import asyncio
import hashlib
import hmac
import json
import math
import os
import socket
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from loguru import logger

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.serve.validate import BadRequest, is_loopback, openai_error

LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: Paths a load balancer probes: no key, no data.
PROBES = ("/health/live", "/health/ready")
#: Seed splits a request may name (``any``: any seed in [0, 2**63)).
SEED_SPLITS = ("eval", "dev", "train", "any")


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> dict:
    """The gateway's error: ``detail`` (the message) and OpenAI's ``error`` object."""
    return {"detail": message, **openai_error(message, status, param, code)}


class _TooLarge(Exception):
    pass


class Guard:
    """ASGI middleware: the API key (when one is set; not for the health probes), the request-size
    bound, and the count of answers by status code (``metrics``)."""

    def __init__(self, app, max_bytes: int, api_key: str | None, metrics=None):
        self.app, self.max_bytes, self.metrics = app, int(max_bytes), metrics
        self.key = f"Bearer {api_key}".encode() if api_key else None

    def _count(self, status: int) -> None:
        if self.metrics is not None:
            with self.metrics.lock:
                self.metrics.responses[status] += 1

    async def _reply(self, send, status: int, msg: str) -> None:
        body = json.dumps(error_body(msg, status)).encode()
        self._count(status)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if (
            self.key is not None
            and scope.get("path") not in PROBES
            and not hmac.compare_digest(headers.get(b"authorization", b""), self.key)
        ):
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
            if msg["type"] == "http.response.start":
                started = True
                self._count(int(msg["status"]))
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


def role_folder(checkpoint: Path, role: str) -> Path:
    """The model folder serving ``role`` in ``checkpoint``: ``agents/ROLE``, or ``agents/Shared`` for a run
    that trained one shared policy for every role (``algo=rlcr``)."""
    own = checkpoint / "agents" / role
    shared = checkpoint / "agents" / "Shared"
    return shared if not (own / "config.json").exists() and (shared / "config.json").exists() else own


def client_of(request) -> str:
    """Who is asking, for admission: the API key's hash when one is sent, else the peer address."""
    auth = request.headers.get("authorization")
    if auth:
        return "key:" + hashlib.sha256(auth.encode()).hexdigest()[:12]
    return "addr:" + (request.client.host if request.client else "?")


def make_app(setup: GatewaySetup):
    from typing import Annotated

    import httpx
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, field_validator
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from swarm_runtime.core.domain import Event
    from swarm_runtime.core.env import close_all
    from swarm_runtime.core.loop import make_env
    from swarm_runtime.core.noise import key_hash
    from swarm_runtime.runs.context import RunContext
    from swarm_runtime.serve.episodes import AgentClients, Engine, EngineOptions, NoAgentsLeft, ServedEpisode, new_id
    from swarm_runtime.serve.journal import COMPACT_BYTES, Journal, recover
    from swarm_runtime.serve.metrics import Metrics
    from swarm_runtime.serve.population import Population, PopulationOptions
    from swarm_runtime.serve.validate import check_agent_url, check_name, no_bool, validated

    cfg, s = setup.cfg, setup.cfg.serve
    ctx = RunContext(cfg, setup.pm, setup.registry, setup.run_dir)
    domain = ctx.domain
    roles = [r.name for r in domain.roles]
    serve_dir = setup.run_dir / "serve"
    serve_dir.mkdir(parents=True, exist_ok=True)
    metrics = Metrics()
    #: a model.adapter=lora run: PEFT adapters pointing to one base (swarm_base.json), served by one worker
    adapter_run = (role_folder(setup.checkpoint, roles[0]) / "swarm_base.json").exists()
    launcher = None  # serve.cluster=local: workers forked here
    if str(s.cluster) == "ray":  # each worker a Ray actor (Ray joined or started here, before anything is served)
        if adapter_run:
            raise ConfigError(
                "serve.cluster=ray serves one worker per agent; this run's agents are LoRA adapters on one base "
                "(model.adapter=lora), served by one worker on this host: valid for it: serve.cluster=local"
            )
        from swarm_runtime.serve.ray_workers import RayWorkers

        launcher = RayWorkers(s.address, restart=bool(s.restart_workers))
    pop = Population(
        PopulationOptions(
            max_prompt_tokens=int(cfg.model.max_prompt_tokens),
            device=str(cfg.hardware.device),
            worker_threads=int(s.worker_threads),
            restart_workers=bool(s.restart_workers),
            probe_interval_s=float(s.probe_interval_ms) / 1000,
            drop_after_misses=int(s.drop_after_misses),
            log_dir=serve_dir / "workers",
            join_timeout_s=float(s.startup_timeout_s),
            max_restarts=int(s.max_restarts),
            restart_window_s=float(s.restart_window_s),
            backoff_max_s=float(s.restart_backoff_max_s),
        ),
        launcher,
    )
    temperature = cfg.eval.temperature if cfg.eval.temperature is not None else cfg.model.temperature
    opts = EngineOptions(
        bid_levels=[float(b) for b in cfg.algo.bid_levels],
        bid_mode=str(cfg.model.bid_mode),
        temperature=float(temperature),
        max_action_tokens=int(cfg.model.max_action_tokens),
        max_bid_tokens=int(cfg.model.max_bid_tokens),
        constrained_actions=bool(cfg.model.constrained_actions),
        bid_deadline_s=float(s.bid_deadline_ms) / 1000,
        action_timeout_s=float(s.action_timeout_ms) / 1000,
        agent_wait_s=float(s.agent_wait_s),
    )
    state: dict[str, Any] = {
        "accepting": True,
        "running": {},
        "episodes": {},
        "client": None,
        "engine": None,
        "background": [],
        "past": {},
    }
    transcripts = serve_dir / "episodes.jsonl"
    journal_path = serve_dir / "journal.jsonl"
    seed_sets: dict[tuple[str, str], set] = {}

    def replicas(role: str) -> int:
        r = s.replicas
        return int(r.get(role, 1)) if hasattr(r, "get") else int(r)

    # ------------------------------------------------------------------ episodes that a crash interrupted
    def recover_journal() -> None:
        """Episodes the journal saw start and not end: ``interrupted``, in episodes.jsonl and by id."""
        lost = recover(journal_path)
        with transcripts.open("a") as f:
            for e in lost:
                body = {
                    "id": e["id"],
                    "status": "interrupted",
                    "error": "the gateway stopped (killed or crashed) during this episode; replay it with its "
                    "seed and noise",
                    "task": e["task"],
                    "seed": e["seed"],
                    "noise": e["noise"],
                    "env": e["env"],
                    "decisions": len(e["turns"]),
                    "reward": sum(float(r.get("reward") or 0.0) for r in e["turns"]),
                    "turns": e["turns"],
                    "recovered": True,
                }
                f.write(json.dumps(body) + "\n")
                state["past"][e["id"]] = body
                metrics.episodes["interrupted"] += 1
        tmp = journal_path.with_suffix(".tmp")
        tmp.write_bytes(b"")
        os.replace(tmp, journal_path)  # everything in the old journal has ended now
        if lost:
            logger.warning(
                "{} episodes were interrupted by the gateway's last stop: {} (status interrupted)",
                len(lost),
                ", ".join(e["id"] for e in lost[:8]),
            )

    recover_journal()
    journal = Journal(journal_path)
    journal_limit = int(os.environ.get("SWARM_JOURNAL_COMPACT_BYTES", COMPACT_BYTES))  # tests make it small

    def save_transcript(ep: ServedEpisode) -> None:
        with transcripts.open("a") as f:
            f.write(json.dumps({**state["engine"].summary(ep), "turns": ep.records}, default=float) + "\n")

    def lost_turns(ep: ServedEpisode) -> int:
        """Turns lost to faults, not skipped by the auction's choice: nobody acted because every winner
        failed to act, or because no bid arrived at all (every agent asked missed its deadline)."""
        return sum(1 for r in ep.records if r["agent"] is None and (r["failed"] or (r["missed"] and not r["bids"])))

    def finish(ep: ServedEpisode, status: str, error: str | None = None) -> None:
        if status == "done" and ep.records:
            lost = lost_turns(ep)
            if lost / len(ep.records) > float(s.degraded_share):
                status = "degraded"
                error = (
                    f"{lost} of {len(ep.records)} turns lost to missed bids or failed agents (more than "
                    f"serve.degraded_share={s.degraded_share:g})"
                )
        if ep.status == "running" or status != "done":
            ep.status, ep.error = status, error
        if ep.env is not None:  # a server-side episode's world ends with it (ep.env stays: it marks the kind)
            close_all([ep.env], quiet=True)
        with metrics.lock:
            metrics.episodes[ep.status] += 1
            metrics.episode_duration.observe(time.monotonic() - ep.started)
        save_transcript(ep)
        journal.end(ep.id, ep.status)
        logger.info(
            "episode {} {}: reward {:.2f} in {} decisions{}",
            ep.id,
            ep.status,
            ep.episode.reward,
            ep.t,
            f" ({error})" if error else "",
        )

    def running_count() -> int:
        return sum(1 for e in state["episodes"].values() if e.status == "running")

    async def sweep() -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for eid, ep in list(state["episodes"].items()):
                if (
                    ep.status == "running"
                    and ep.env is None
                    and not ep.lock.locked()  # a turn in progress is not idle
                    and now - ep.last_used > float(s.episode_idle_s)
                ):
                    finish(ep, "expired", f"no turn for more than serve.episode_idle_s={s.episode_idle_s}s")
                if ep.status != "running" and now - ep.last_used > max(60.0, float(s.episode_idle_s)):
                    state["episodes"].pop(eid, None)
            while len(state["past"]) > 10_000:
                state["past"].pop(next(iter(state["past"])))
            if journal.size() > journal_limit:
                live = [e for e in state["episodes"].values() if e.status == "running"]
                journal.compact(
                    [
                        (
                            {
                                **journal.start_event(e, "server" if e.env is not None else "client", e.client),
                                "time": e.started_wall,
                            },
                            e.records,
                        )
                        for e in live
                    ]
                )
                logger.info("journal compacted to the {} running episodes", len(live))

    async def drain() -> None:
        """SIGTERM: refuse new work (503), let running episodes finish within serve.shutdown_grace_s."""
        state["accepting"] = False
        end = time.monotonic() + float(s.shutdown_grace_s)
        logger.info("draining: no new episodes; {} running get up to {}s", running_count(), s.shutdown_grace_s)
        while running_count() and time.monotonic() < end:
            await asyncio.sleep(0.1)

    @asynccontextmanager
    async def lifespan(app):
        client = httpx.AsyncClient(limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200))
        state["client"] = client
        state["agent_clients"] = AgentClients()
        state["engine"] = Engine(domain, ctx.coordinator(), pop, state["agent_clients"], opts, metrics, ctx.credit_fn())
        if adapter_run:  # one worker for the base, every role's adapter on it; agents join it by URL
            from swarm_runtime.models.adapters import adapter_name
            from swarm_runtime.serve.adapters import base_of

            folders = {r: role_folder(setup.checkpoint, r) for r in roles}
            if any(replicas(r) for r in roles):
                on: dict[Path, list[str]] = {}  # one worker per base (model.role_base: roles on other bases)
                for r in roles:
                    on.setdefault(base_of(folders[r]), []).append(r)
                hosts = {}
                for base, members in on.items():
                    host = pop.spawn_host(base, [(adapter_name(r), folders[r]) for r in members])
                    hosts.update({r: host for r in members})
                state["host"], state["hosts"] = hosts[roles[0]], hosts
                for role in roles:
                    for _ in range(replicas(role)):
                        pop.add_url(role, hosts[role].url, model_id=adapter_name(role))
        else:
            for role in roles:
                for _ in range(replicas(role)):
                    pop.spawn(role, role_folder(setup.checkpoint, role))
        for spec in s.agents or []:
            role, _, url = str(spec).partition("=")
            pop.add_url(role, url)
        try:
            await pop.wait_up(client, float(s.startup_timeout_s))
        except (TimeoutError, RuntimeError) as exc:
            pop.stop_all()
            raise RuntimeError(f"swarm serve: {exc}") from exc
        for a in pop.agents:  # agents on an adapter host join as soon as it answers
            if a.status == "starting":
                await pop.probe(client, a)
        state["background"] = [asyncio.ensure_future(pop.watch(client)), asyncio.ensure_future(sweep())]
        logger.info(
            "swarm serve: {} agents up ({}), checkpoint {}",
            len(pop.bidders()),
            ", ".join(a.name for a in pop.agents),
            setup.checkpoint.name,
        )
        print(f"serving {cfg.domain}/{cfg.task_name} on http://{s.host}:{s.port}", flush=True)
        try:
            yield
        finally:
            state["accepting"] = False
            running = [t for t in state["running"].values() if not t.done()]
            if running:
                logger.info(
                    "shutting down: waiting up to {}s for {} running episodes", s.shutdown_grace_s, len(running)
                )
                done, pending = await asyncio.wait(running, timeout=float(s.shutdown_grace_s))
                for t in pending:
                    t.cancel()
                if pending:
                    await asyncio.wait(pending, timeout=5)
                logger.info("shutdown: {} episodes finished, {} interrupted", len(done), len(pending))
            interrupted = 0
            for ep in state["episodes"].values():
                if ep.status == "running":
                    finish(ep, "interrupted", "the gateway shut down")
                    interrupted += 1
            for t in state["background"]:
                t.cancel()
            pop.stop_all()
            journal.close()
            await client.aclose()
            await state["agent_clients"].aclose()
            logger.info(
                "swarm serve stopped: {} episodes done, {} interrupted; transcripts in {}",
                metrics.episodes.get("done", 0),
                interrupted,
                transcripts,
            )

    app = FastAPI(title="swarm serve", lifespan=lifespan)
    app.state.drain = drain
    app.state.swarm = state

    @app.exception_handler(BadRequest)
    async def bad_request(_request, exc: BadRequest):
        return JSONResponse(error_body(exc.message, exc.status, exc.param, exc.code), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request, exc):
        return JSONResponse(
            error_body(str(exc.detail), exc.status_code),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, exc):  # path parameters (bodies are read by validate.validated)
        err = exc.errors()[0]
        return JSONResponse(
            error_body(f"{'.'.join(map(str, err.get('loc', ())))}: {err.get('msg')}", 422), status_code=422
        )

    Number = Annotated[float, BeforeValidator(no_bool)]  # a float, where JSON true/false is refused

    def refuse(status: int, message: str, retry_after: float | None = None, param: str | None = None):
        headers = {"Retry-After": str(max(1, math.ceil(retry_after)))} if retry_after is not None else None
        return HTTPException(status, message, headers=headers)

    class AgentRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        role: str = Field(..., max_length=200)
        checkpoint: str | None = Field(None, max_length=4096)
        url: str | None = Field(None, max_length=4096)
        name: str | None = Field(None, max_length=200)

    class EpisodeRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
        task: str | None = Field(None, max_length=200)
        seed: StrictInt | None = Field(None, ge=0, le=(1 << 63) - 1)
        split: Literal[SEED_SPLITS] | None = None
        noise: StrictInt | str | None = None
        temperature: Number | None = Field(None, ge=0.0, le=100.0)
        stream: StrictBool = False
        env: Literal["server", "client"] = "server"
        max_decisions: StrictInt | None = Field(None, ge=1, le=100_000)

        @field_validator("noise", mode="before")
        @classmethod
        def _noise(cls, v):
            if isinstance(v, bool):
                raise ValueError("an integer (or its decimal string), not a boolean")
            if isinstance(v, str):
                try:
                    v = int(v)
                except ValueError:
                    raise ValueError("an integer (or its decimal string)") from None
            if isinstance(v, int) and not -(1 << 63) <= v < (1 << 64):
                raise ValueError("out of range: a 64-bit integer")
            return v

    class TurnRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
        observation: str = Field(..., max_length=200_000)
        reward: Number = Field(0.0, ge=-1e12, le=1e12)
        valid: StrictBool = True
        done: StrictBool = False

    def ready() -> tuple[bool, list[str]]:
        """Ready: at least one agent of every role up. Also the roles with none."""
        up = {a.role for a in pop.bidders()}
        missing = [r for r in roles if r not in up]
        return state["accepting"] and not missing, missing

    @app.get("/health/live")
    def live():
        return {"status": "live"}

    @app.get("/health/ready")
    def readiness():
        ok, _ = ready()
        return JSONResponse({"status": "ready" if ok else "not_ready"}, status_code=200 if ok else 503)

    @app.get("/health")
    def health():
        up = len(pop.bidders())
        live_agents = [a for a in pop.agents if a.status != "removed"]
        ok, missing = ready()
        status = (
            "no_agents" if not up else "role_missing" if missing else "ok" if up == len(live_agents) else "degraded"
        )
        status = status if state["accepting"] else "shutting_down"
        return JSONResponse(
            {
                "status": status,
                "ready": ok,
                "roles_missing": missing,
                "agents_up": up,
                "agents": len(live_agents),
                "episodes_running": running_count(),
                "domain": cfg.domain,
                "task": cfg.task_name,
                "checkpoint": setup.checkpoint.name,
            },
            status_code=200 if ok else 503,
        )

    @app.get("/metrics")
    def prometheus():
        live_agents = [a for a in pop.agents if a.status != "removed"]
        return PlainTextResponse(
            metrics.render(len(pop.bidders()), len(live_agents), running_count(), pop.agents),
            media_type="text/plain; version=0.0.4",
        )

    @app.get("/v1/models")
    def models():
        return {
            "object": "list",
            "data": [
                {"id": a.name, "object": "model", "owned_by": "swarm-runtime", "role": a.role, "status": a.status}
                for a in pop.agents
                if a.status != "removed"
            ],
        }

    @app.get("/v1/swarm/agents")
    def list_agents():
        return {"agents": [a.public() for a in pop.agents]}

    @app.get("/v1/swarm")
    def swarm_state():
        ok, missing = ready()
        return {
            "ready": ok,
            "roles": roles,
            "roles_missing": missing,
            "accepting": state["accepting"],
            "episodes_running": running_count(),
            "agents": [a.public() for a in pop.agents],
            "adapter_hosts": [h.public() for h in pop.hosts],
            "restart_policy": {
                "max_restarts": int(s.max_restarts),
                "window_s": float(s.restart_window_s),
                "backoff_max_s": float(s.restart_backoff_max_s),
            },
        }

    def checkpoint_folder(req) -> Path:
        """The role folder an added agent serves: a checkpoint tag of the run, or a folder inside the run."""
        tag = req.checkpoint or setup.checkpoint.name
        ckpts = setup.run_dir / "checkpoints"
        if tag == "latest":
            tag = (ckpts / "latest").read_text().strip()
        run = setup.run_dir.resolve()
        candidates = []
        if "/" not in tag and tag not in (".", ".."):
            candidates.append(role_folder(ckpts / tag, req.role))
        candidates.append(Path(tag) if Path(tag).is_absolute() else setup.run_dir / tag)
        for path in candidates:
            path = path.resolve()
            if (path / "config.json").exists() and path.is_relative_to(run):
                return path
        tags = sorted(p.name for p in ckpts.glob("*") if (p / "agents").is_dir())
        raise BadRequest(
            f"checkpoint {req.checkpoint!r} is neither a tag of the run with a {req.role} model nor a "
            f"role folder inside the run folder; tags: {', '.join(tags)}",
            param="checkpoint",
            status=422,
        )

    @app.post("/v1/swarm/agents", status_code=201)
    async def add_agent(request: Request):
        req = validated(AgentRequest, await request.body())
        if req.role not in roles:
            raise BadRequest(f"unknown role {req.role!r}; valid: {', '.join(roles)}", param="role", status=422)
        if req.checkpoint is not None and req.url is not None:
            raise BadRequest(
                "give checkpoint (a tag of the run, or a role folder) or url, not both; "
                "neither: the checkpoint being served",
                param="url",
                status=422,
            )
        if req.name is not None:
            check_name(req.name)
            if any(a.name == req.name for a in pop.agents):
                raise BadRequest(
                    f"an agent named {req.name!r} exists already (names are never reused)", param="name", status=409
                )
        if req.url is not None:
            url = check_agent_url(req.url, list(s.allow_hosts or []))
            a = pop.add_url(req.role, url, req.name)
            await pop.probe(state["client"], a)
            return JSONResponse(a.public(), status_code=201)
        if adapter_run:
            from swarm_runtime.models.adapters import adapter_name

            host = (state.get("hosts") or {}).get(req.role, state.get("host"))
            if req.checkpoint not in (None, setup.checkpoint.name) or host is None or host.status == "failed":
                raise BadRequest(
                    "this run's agents are LoRA adapters on one base, served by one worker: a new agent "
                    "serves its role's adapter of the checkpoint being served (give no checkpoint), or "
                    "join another server by url",
                    param="checkpoint",
                    status=422,
                )
            a = pop.add_url(req.role, host.url, req.name, model_id=adapter_name(req.role))
            await pop.probe(state["client"], a)
            return JSONResponse(a.public(), status_code=201)
        a = pop.spawn(req.role, checkpoint_folder(req), req.name)
        return JSONResponse(a.public(), status_code=201)

    @app.delete("/v1/swarm/agents/{name}")
    async def remove_agent(name: str):
        a = pop.by_name(name)
        if a is None:
            raise HTTPException(
                404, f"no agent {name!r}; agents: {', '.join(x.name for x in pop.agents if x.status != 'removed')}"
            )
        await pop.drain(a)
        if not any(x.url == a.url and x.status != "removed" for x in pop.agents):
            await state["agent_clients"].forget(a.url)
        return a.public()

    def check_seed(req: EpisodeRequest, task_name: str, task) -> int:
        split = req.split or "eval"
        if req.seed is None:
            if split == "any":
                raise BadRequest("split 'any' needs a seed", param="seed", status=422)
            return domain.episode_seeds(task, split)[0]
        if split == "any":
            return int(req.seed)
        key = (task_name, split)
        if key not in seed_sets:
            try:
                seed_sets[key] = set(domain.episode_seeds(task, split))
            except ValueError as exc:
                raise BadRequest(str(exc), param="split", status=422) from None
        if req.seed not in seed_sets[key]:
            seeds = sorted(seed_sets[key])
            span = f"{seeds[0]}-{seeds[-1]}" if seeds else "none"
            raise BadRequest(
                f"seed {req.seed} is not in the {split} split of {task_name} ({span}); held-out "
                'seeds are the default, send "split": "train", "dev" or "any" to play another',
                param="seed",
                status=422,
            )
        return int(req.seed)

    async def admit(req: EpisodeRequest, cid: str) -> None:
        """Admission: shutting down 503; a client's open client-side episodes capped; at serve.max_episodes,
        wait up to serve.queue_wait_s for a slot, then 429. Both with Retry-After."""
        if not state["accepting"]:
            raise refuse(503, "the gateway is shutting down: no new episodes", retry_after=float(s.shutdown_grace_s))
        if req.env == "client":
            mine = [
                e for e in state["episodes"].values() if e.status == "running" and e.env is None and e.client == cid
            ]
            if len(mine) >= int(s.client_episodes):
                now = time.monotonic()
                wait = min(float(s.episode_idle_s) - (now - e.last_used) for e in mine)
                raise refuse(
                    429,
                    f"this client has {len(mine)} client-side episodes open, the limit is "
                    f"serve.client_episodes={s.client_episodes}: end them (done, or DELETE "
                    "/v1/episodes/ID) or let them expire",
                    retry_after=max(1.0, wait),
                )
        end = time.monotonic() + float(s.queue_wait_s)
        while running_count() >= int(s.max_episodes):
            if time.monotonic() >= end or not state["accepting"]:
                raise refuse(
                    429,
                    f"{running_count()} episodes running, the limit is serve.max_episodes="
                    f"{s.max_episodes} (waited serve.queue_wait_s={s.queue_wait_s:g}s for a slot)",
                    retry_after=max(1.0, float(s.queue_wait_s)),
                )
            await asyncio.sleep(0.05)

    async def new_episode(req: EpisodeRequest, cid: str) -> ServedEpisode:
        task_name = req.task or cfg.task_name
        if task_name not in domain.task_names():
            raise BadRequest(
                f"unknown task {task_name!r}; valid: {', '.join(domain.task_names())}", param="task", status=422
            )
        task = cfg.task if task_name == cfg.task_name else domain.task_config(task_name)
        seed = check_seed(req, task_name, task)
        await admit(req, cid)
        noise = (
            key_hash(seed, int.from_bytes(os.urandom(8), "little"))
            if req.noise is None
            else int(req.noise) & ((1 << 64) - 1)
        )
        ep = ServedEpisode(
            new_id(),
            seed,
            noise,
            task_name,
            task,
            int(req.max_decisions or task.max_decisions),
            temperature=req.temperature,
        )
        ep.client = cid
        if req.env == "server":
            try:
                ep.env = make_env(domain, task)
                ep.env.reset(seed)
            except BaseException as exc:
                close_all([ep.env] if ep.env is not None else [], quiet=True)
                if isinstance(exc, ValueError):
                    raise BadRequest(f"seed {seed}: {exc}", param="seed", status=422) from exc
                raise
        state["episodes"][ep.id] = ep
        journal.start(ep, req.env, cid)
        logger.info("episode {} starts: {} seed {} ({} env)", ep.id, task_name, seed, req.env)
        return ep

    async def run_episode(ep: ServedEpisode, on_turn=None) -> None:
        async def journaled(rec):
            journal.turn(ep.id, rec)
            if on_turn is not None:
                await on_turn(rec)

        try:
            await state["engine"].play(ep, journaled)
            finish(ep, "done")
        except NoAgentsLeft as exc:
            finish(ep, "failed", str(exc))
        except asyncio.CancelledError:
            if ep.cancelled:
                finish(ep, "cancelled", ep.cancelled)
            else:
                finish(ep, "interrupted", "the gateway shut down")
                raise
        except Exception as exc:  # an env error: the episode fails, the service does not
            logger.exception("episode {} failed", ep.id)
            finish(ep, "failed", f"{type(exc).__name__}: {exc}")

    def http_status(ep: ServedEpisode) -> int:
        return {"done": 200, "degraded": 200, "cancelled": 409}.get(ep.status, 503)

    @app.post("/v1/episodes")
    async def episodes(request: Request):
        req = validated(EpisodeRequest, await request.body())
        ep = await new_episode(req, client_of(request))
        engine = state["engine"]
        if req.env == "client":
            return {
                "id": ep.id,
                "status": "running",
                "task": ep.task_name,
                "seed": ep.seed,
                "noise": str(ep.noise),
                "agents": [a.name for a in pop.agents],
            }
        if not req.stream:
            task = asyncio.ensure_future(run_episode(ep))
            state["running"][ep.id] = task
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.done():  # this request was cancelled, not the episode
                    raise
            finally:
                state["running"].pop(ep.id, None)
            body = {**engine.summary(ep), "turns": ep.records}
            return JSONResponse(body, status_code=http_status(ep))
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
            raise HTTPException(
                404,
                f"unknown episode {eid!r} (episodes that ended are kept "
                f"{max(60.0, float(s.episode_idle_s)):g}s; every ended episode is in "
                "serve/episodes.jsonl)",
            )
        return ep

    @app.get("/v1/episodes")
    def list_episodes(status: str | None = None):
        """Recent episodes without their turns (``?status=interrupted``: those a crash interrupted)."""
        rows = [{k: v for k, v in b.items() if k != "turns"} for b in state["past"].values()]
        rows += [state["engine"].summary(e) for e in state["episodes"].values()]
        return {"episodes": [r for r in rows if status is None or r["status"] == status]}

    @app.get("/v1/episodes/{eid}")
    def episode_state(eid: str):
        if eid in state["past"] and eid not in state["episodes"]:
            return state["past"][eid]
        ep = get_episode(eid)
        return {**state["engine"].summary(ep), "turns": ep.records}

    @app.delete("/v1/episodes/{eid}")
    async def cancel(eid: str, request: Request):
        ep = get_episode(eid)
        if ep.client != client_of(request):
            raise HTTPException(403, f"episode {eid} belongs to another client")
        if ep.status != "running":
            raise HTTPException(409, f"episode {eid} is {ep.status} already")
        ep.cancelled = "cancelled by its client (DELETE)"
        task = state["running"].get(eid)
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=30)
        else:
            async with ep.lock:
                if ep.status == "running":
                    finish(ep, "cancelled", ep.cancelled)
        return {**state["engine"].summary(ep), "turns": ep.records}

    @app.post("/v1/episodes/{eid}/turns")
    async def turn(eid: str, request: Request):
        req = validated(TurnRequest, await request.body())
        if eid in state["past"] and eid not in state["episodes"]:
            past = state["past"][eid]
            raise HTTPException(
                410, f"episode {eid} is {past['status']}: {past['error']} (seed {past['seed']}, noise {past['noise']})"
            )
        ep = get_episode(eid)
        if ep.env is not None:
            raise HTTPException(409, f"episode {eid} is a server-side episode; its turns are played by the gateway")
        engine = state["engine"]
        async with ep.lock:
            if ep.status != "running":  # 410 Gone: expired for want of turns; 409: finished otherwise
                raise HTTPException(
                    410 if ep.status in ("expired", "interrupted") else 409,
                    f"episode {eid} is {ep.status}" + (f": {ep.error}" if ep.error else ""),
                )
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
                journal.reward(ep.id, ep.records[-1]["t"], last.reward, last.valid)
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
            journal.turn(ep.id, rec)
            return {
                "id": ep.id,
                "t": rec["t"],
                "agent": rec["agent"],
                "role": rec["role"],
                "bid": rec["bid"],
                "action": rec["action"],
                "bids": rec["bids"],
                "missed": rec["missed"],
                "failed": rec["failed"],
            }

    app.add_middleware(Guard, max_bytes=int(s.max_body_bytes), api_key=setup.api_key, metrics=metrics)
    return app


def check_settings(setup: GatewaySetup) -> None:
    """What ``validate_serve`` does not check: the agent URLs given at start and the new limits."""
    from swarm_runtime.serve.validate import check_agent_url

    s = setup.cfg.serve
    for spec in s.agents or []:
        role, _, url = str(spec).partition("=")
        try:
            check_agent_url(url, list(s.allow_hosts or []))
        except BadRequest as exc:
            raise ConfigError(f"serve.agents entry {str(spec)!r}: {exc.message}") from None
    for key in ("client_episodes", "max_restarts"):
        if int(s[key]) < 1:
            raise ConfigError(f"serve.{key}={s[key]} is out of range (at least 1)")
    for key in ("queue_wait_s", "restart_window_s", "restart_backoff_max_s"):
        if not float(s[key]) >= 0:
            raise ConfigError(f"serve.{key}={s[key]} must be >= 0")
    if not 0 <= float(s.degraded_share) <= 1:
        raise ConfigError(f"serve.degraded_share={s.degraded_share} must be within [0, 1]")


def bind(host: str, port: int) -> socket.socket:
    """The gateway's listening socket, bound before any model loads: a port in use is one clear line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        why = "is in use by another process" if exc.errno in (98, 48) else f"cannot be bound ({exc.strerror})"
        raise ConfigError(
            f"serve.port={port}: {host}:{port} {why}; pick another serve.port (0: any free port)"
        ) from None
    return sock


def serve(setup: GatewaySetup) -> None:
    """Run the gateway in this process. SIGTERM/SIGINT drain: new episodes get 503, running ones get
    ``serve.shutdown_grace_s`` to finish, then the process exits (a second signal exits at once)."""
    import sys

    import uvicorn

    s = setup.cfg.serve
    check_settings(setup)
    sock = bind(str(s.host), int(s.port))
    s.port = sock.getsockname()[1]  # serve.port=0: the port the system picked
    logger.add(setup.run_dir / "serve" / "gateway.log", level="DEBUG")
    app = make_app(setup)

    class Draining(uvicorn.Server):
        drain_task = None

        def handle_exit(self, sig, frame):
            loop = getattr(self, "_loop", None)
            if self.drain_task is not None or loop is None or not self.started:
                return super().handle_exit(sig, frame)
            self.drain_task = True

            def start():
                async def go():
                    await app.state.drain()
                    self.should_exit = True

                self.drain_task = asyncio.ensure_future(go())

            loop.call_soon_threadsafe(start)

        async def serve(self, sockets=None):
            self._loop = asyncio.get_running_loop()
            await super().serve(sockets)

    config = uvicorn.Config(
        app, log_level="warning", access_log=False, timeout_graceful_shutdown=int(float(s.shutdown_grace_s)) + 5
    )
    server = Draining(config)
    server.run(sockets=[sock])
    if not server.started:
        print("swarm: error: the gateway did not start (see the log above)", file=sys.stderr)
        raise SystemExit(1)


def check_bind(host: str, api_key: str | None) -> None:
    if not is_loopback(host) and not api_key:
        raise ConfigError(
            f"serve.host={host!r} is not a loopback address: set SWARM_API_KEY (every request must "
            "then send 'Authorization: Bearer $SWARM_API_KEY'), or bind serve.host=127.0.0.1"
        )
