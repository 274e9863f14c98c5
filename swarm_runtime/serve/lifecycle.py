"""The gateway's start and stop (:func:`lifespan`): its agents started (a worker per replica of each role, one
worker per base for a LoRA run, the agents given by URL) and awaited before anything is served; on stop, running
episodes get ``serve.shutdown_grace_s`` to finish, the rest are ``interrupted``, and every worker stops."""

from __future__ import annotations

import asyncio
import os
from contextlib import asynccontextmanager
from pathlib import Path

from loguru import logger

from swarm_runtime.runs.runfiles import clear_serving
from swarm_runtime.serve.episodes import Engine
from swarm_runtime.serve.resolved import role_folder
from swarm_runtime.serve.state import Gateway
from swarm_runtime.serve.transport import AgentClients


def spawn_adapter_hosts(gw: Gateway) -> None:
    """A LoRA run: one worker per base with every role's adapter on it; each role's agents join it by URL."""
    from swarm_runtime.models.adapters import adapter_name
    from swarm_runtime.serve.adapters import base_of

    pop, roles = gw.pop, gw.roles
    folders = {r: role_folder(gw.setup.checkpoint, r) for r in roles}
    if not any(gw.replicas(r) for r in roles):
        return
    on: dict[Path, list[str]] = {}  # one worker per base (model.role_base: roles on other bases)
    for r in roles:
        on.setdefault(base_of(folders[r]), []).append(r)
    for base, members in on.items():
        host = pop.spawn_host(base, [(adapter_name(r), folders[r]) for r in members])
        gw.hosts.update({r: host for r in members})
    gw.versions.adapters = {r: {1: (adapter_name(r), str(folders[r]))} for r in roles}
    for role in roles:
        for _ in range(gw.replicas(role)):
            pop.add_url(role, gw.hosts[role].url, model_id=adapter_name(role)).version = 1


def spawn_agents(gw: Gateway) -> None:
    """Every agent the gateway starts with: workers of the checkpoint's roles, then ``serve.agents`` by URL."""
    if gw.adapter_run:
        spawn_adapter_hosts(gw)
    else:
        for role in gw.roles:
            for _ in range(gw.replicas(role)):
                gw.pop.spawn(role, role_folder(gw.setup.checkpoint, role)).version = 1
    for spec in gw.s.agents or []:
        role, _, url = str(spec).partition("=")
        gw.pop.add_url(role, url)


async def start(gw: Gateway) -> None:
    import httpx

    gw.http = httpx.AsyncClient(limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200))
    gw.agent_clients = AgentClients()
    gw.engine = Engine(
        gw.domain, gw.ctx.coordinator(), gw.pop, gw.agent_clients, gw.opts, gw.metrics, gw.ctx.credit_fn()
    )
    spawn_agents(gw)
    try:
        await gw.pop.wait_up(gw.http, float(gw.s.startup_timeout_s))
    except (TimeoutError, RuntimeError) as exc:
        gw.pop.stop_all()
        raise RuntimeError(f"swarm serve: {exc}") from exc
    for a in gw.pop.agents:  # agents on an adapter host join as soon as it answers
        if a.status == "starting":
            await gw.pop.probe(gw.http, a)
    gw.background = [asyncio.ensure_future(gw.pop.watch(gw.http)), asyncio.ensure_future(gw.sweep())]
    logger.info(
        "swarm serve: {} agents up ({}), checkpoint {}",
        len(gw.pop.bidders()),
        ", ".join(a.name for a in gw.pop.agents),
        gw.setup.checkpoint.name,
    )
    print(f"serving {gw.cfg.domain}/{gw.cfg.task_name} on http://{gw.s.host}:{gw.s.port}", flush=True)


async def interrupt_running(gw: Gateway) -> int:
    """Server-side episodes get ``serve.shutdown_grace_s`` to finish, then are cancelled (``interrupted``);
    client-side ones end ``interrupted`` at once. Returns how many were still running after the grace."""
    grace = float(gw.s.shutdown_grace_s)
    playing = [
        e.runner for e in gw.episodes.values() if e.env is not None and e.runner is not None and not e.runner.done()
    ]
    if playing:
        logger.info("shutting down: waiting up to {}s for {} running episodes", grace, len(playing))
        done, pending = await asyncio.wait(playing, timeout=grace)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)
        logger.info("shutdown: {} episodes finished, {} interrupted", len(done), len(pending))
    running = [e for e in gw.episodes.values() if e.status == "running"]
    loops = [e.runner for e in running if e.env is None and e.runner is not None and not e.runner.done()]
    for t in loops:  # a client-side episode's loop, waiting for its client: it ends itself, interrupted
        t.cancel()
    if loops:
        await asyncio.wait(loops, timeout=5)
    for ep in running:
        if ep.status == "running":
            gw.finish(ep, "interrupted", "the gateway shut down")
    return len(running)


async def stop(gw: Gateway) -> None:
    gw.accepting = False
    interrupted = await interrupt_running(gw)
    for t in gw.background:
        t.cancel()
    gw.pop.stop_all()
    gw.journal.close()
    clear_serving(gw.setup.run_dir, os.getpid())
    await gw.http.aclose()
    await gw.agent_clients.aclose()
    logger.info(
        "swarm serve stopped: {} episodes done, {} interrupted; transcripts in {}",
        gw.metrics.episodes.get("done", 0),
        interrupted,
        gw.transcripts,
    )


@asynccontextmanager
async def lifespan(app):
    gw: Gateway = app.state.gateway
    await start(gw)
    try:
        yield
    finally:
        await stop(gw)
