"""Live version swap: ``swarm serve`` moves its agents, one at a time, to a newer checkpoint of the same swarm, and back.

The checkpoint served at start is version 1; each swap to another checkpoint is the next version (``Role@vN``, as
training names its versions, :func:`swarm_runtime.sampling.sync.versioned`); a rollback returns to the version served
before the last swap or rollback (so a second rollback undoes the first). :class:`Versions` holds which checkpoint
each version is, which are current and previous, and the swap running or last run (:class:`SwapJob`).

- **Full copies** (one worker per agent): for each agent in turn a new worker is started on the version's role
  folder while the old one keeps answering; once the new one answers ``GET /v1/models`` the agent's URL and process
  switch to it at once (no await in between), and the old worker is stopped when the requests in flight on it have
  ended (``Population.using``). The agent is up throughout; if its old worker dies meanwhile it is down (absent, not
  failing, as any dead worker) until the switch or its restart.
- **Adapter runs** (``model.adapter=lora``, one base worker holding every role's adapter): the version's adapter is
  loaded onto the base worker under a new name (``Smith@v2``, vLLM's ``/v1/load_lora_adapter``), then each agent
  of the role switches its ``model`` to it; an adapter neither current nor previous, and used by no agent, is
  unloaded once no request on it is in flight: at most two versions of each role stay loaded. The base worker's
  start arguments follow, so a restarted base worker loads the adapters served.
- A swap takes effect at an agent's next request: an episode in flight goes on with the new version from then on
  (none is stopped), and each turn's record names the version that answered each agent (``versions``).
- A swap that fails midway (a new worker that does not start) stops: the agents moved stay moved, the rest stay on
  the version they served (each agent's version is in ``GET /v1/swarm/agents``); the same swap again moves the rest,
  a rollback moves the moved ones back.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger

from swarm_runtime.serve.population import AgentHandle
from swarm_runtime.serve.resolved import role_folder

GONE = ("draining", "removed", "failed")


class SwapFailed(RuntimeError):
    """A swap could not move an agent (its message says which and why)."""


@dataclass
class SwapJob:
    """One swap or rollback: to ``version`` (its checkpoint ``checkpoint``), the agents moved so far and those left."""

    id: int
    kind: str  #: swap | rollback
    version: int
    checkpoint: str
    status: str = "running"  #: running | done | failed
    moved: list = field(default_factory=list)
    pending: list = field(default_factory=list)
    error: str | None = None
    started: float = field(default_factory=time.time)
    ended: float | None = None

    def public(self) -> dict:
        return {
            "id": self.id,
            "kind": self.kind,
            "version": f"v{self.version}",
            "checkpoint": self.checkpoint,
            "status": self.status,
            "moved": list(self.moved),
            "pending": list(self.pending),
            "error": self.error,
            "started": self.started,
            "ended": self.ended,
        }


class Versions:
    """The versions a gateway has served: version N's checkpoint folder, the current and previous ones, each adapter
    run's loaded adapters per role, and the swap running or last run."""

    def __init__(self, checkpoint: Path):
        self.folders: dict[int, Path] = {1: Path(checkpoint).resolve()}
        self.current, self.previous = 1, None
        #: an adapter run: role -> {version: (adapter name on its base worker, adapter folder)}
        self.adapters: dict[str, dict[int, tuple[str, str]]] = {}
        self.job: SwapJob | None = None
        self.jobs = 0

    def running(self) -> bool:
        return self.job is not None and self.job.status == "running"

    def version_of(self, folder: Path) -> int | None:
        folder = Path(folder).resolve()
        return next((n for n, f in self.folders.items() if f == folder), None)

    def adapter_for(self, role: str) -> tuple[int, str]:
        """The version and adapter name a new agent of ``role`` serves: the current one once loaded, else (a swap
        under way) the newest loaded."""
        loaded = self.adapters[role]
        n = self.current if self.current in loaded else max(loaded)
        return n, loaded[n][0]

    def public(self) -> dict:
        return {
            "current": f"v{self.current}",
            "previous": None if self.previous is None else f"v{self.previous}",
            "versions": {f"v{n}": str(f) for n, f in sorted(self.folders.items())},
            "swap": None if self.job is None else self.job.public(),
        }


def owned(a: AgentHandle) -> bool:
    """An agent whose version the gateway sets: one of its own workers (or an agent on its adapter worker)."""
    return a.version is not None and a.status not in GONE


def unsteady(gw) -> list[str]:
    """The gateway's own workers that are starting, or down (killed, restarting): a swap waits for them."""
    workers = [a for a in gw.pop.agents + gw.pop.hosts if a.proc is not None]
    return [f"{a.name} ({a.status}: {a.error or 'loading'})" for a in workers if a.status in ("starting", "down")]


# ---------------------------------------------------------------------------------------------- full copies
async def _until_idle(pop, url: str, model: str | None, wait_s: float) -> None:
    end = time.monotonic() + wait_s
    while pop.using[url, model] > 0 and time.monotonic() < end:
        await asyncio.sleep(0.05)


async def _candidate_up(gw, cand: AgentHandle) -> None:
    """Until ``cand``'s new worker answers; :class:`SwapFailed` if it exits or does not answer in time."""
    pop, end = gw.pop, time.time() + float(gw.s.startup_timeout_s)
    while True:
        pop.follow(cand)
        if cand.proc.poll() is not None:
            raise SwapFailed(
                f"{cand.name}: its new worker on {cand.checkpoint} exited with {cand.proc.returncode} while loading "
                f"(see {pop.opts.log_dir})"
            )
        if await pop.probe(gw.http, cand):
            return
        if cand.status == "failed" or time.time() > end:
            raise SwapFailed(f"{cand.name}: its new worker on {cand.checkpoint} did not answer: {cand.error}")
        await asyncio.sleep(0.2)


async def replace_worker(gw, a: AgentHandle, version: int) -> None:
    """Agent ``a`` onto a new worker of ``version``'s checkpoint (module docstring); its old worker stopped after."""
    pop = gw.pop
    folder = role_folder(gw.versions.folders[version], a.role)
    cand = AgentHandle(a.index, a.name, a.role, pop._new_url(), checkpoint=str(folder), worker_args=list(a.worker_args))
    pop._start(cand)
    try:
        await _candidate_up(gw, cand)
    except BaseException:
        await pop.astop(cand)  # SIGTERM at once, even when this task is being cancelled
        raise
    old = AgentHandle(-1, a.name, a.role, a.url, model_id=a.model_id, proc=a.proc)
    a.proc, a.url, a.model_id, a.checkpoint, a.version = cand.proc, cand.url, cand.model_id, cand.checkpoint, version
    a.status, a.since, a.misses, a.error, a.next_start, a.restart_times = "up", time.time(), 0, None, 0.0, []
    logger.info("agent {} now serves {} ({} at {})", a.name, a.label, folder, a.url)
    await _until_idle(pop, old.url, old.model_id, float(gw.s.action_timeout_ms) / 1000 + 5)
    await pop.astop(old)
    if old.url != a.url:
        await gw.agent_clients.forget(old.url)


async def move_workers(gw, job: SwapJob) -> None:
    """Every agent with a worker of its own, one at a time, onto ``job.version`` (agents joining meanwhile too)."""
    while True:
        todo = [a for a in gw.pop.agents if owned(a) and a.proc is not None and a.version != job.version]
        job.pending = [a.name for a in todo]
        if not todo:
            return
        await replace_worker(gw, todo[0], job.version)
        job.moved.append(todo[0].name)


# ---------------------------------------------------------------------------------------------- adapters
def host_args(loaded: dict[str, dict[int, tuple[str, str]]], roles_on: list[str]) -> list[str]:
    """A base worker's ``--lora-modules``: every adapter loaded for ``roles_on``, so a restart loads what is served."""
    return ["--lora-modules", *[f"{name}={path}" for r in roles_on for name, path in loaded[r].values()]]


async def _host_post(gw, host: AgentHandle, path: str, body: dict) -> None:
    if host.status != "up":
        raise SwapFailed(f"the adapter worker {host.name} is {host.status} ({host.error}); retry when it is up")
    try:
        r = await gw.http.post(f"{host.url}{path}", json=body, timeout=float(gw.s.startup_timeout_s))
    except Exception as exc:
        raise SwapFailed(f"the adapter worker {host.name}: {path} failed ({type(exc).__name__}: {exc})") from None
    if r.status_code >= 400:
        raise SwapFailed(f"the adapter worker {host.name}: {path} answered {r.status_code}: {r.text[:300]}")


def _sync_host_args(gw, host: AgentHandle) -> None:
    host.worker_args = host_args(gw.versions.adapters, [r for r in gw.roles if gw.hosts.get(r) is host])


async def move_adapters(gw, job: SwapJob) -> None:
    """Role by role: the version's adapter loaded onto the base worker (once), then each agent of the role onto it."""
    from swarm_runtime.models.adapters import adapter_name

    v = gw.versions
    for role in [r for r in gw.roles if r in gw.hosts]:
        host, loaded = gw.hosts[role], v.adapters[role]
        if job.version not in loaded:
            name, folder = f"{adapter_name(role)}@v{job.version}", role_folder(v.folders[job.version], role)
            await _host_post(gw, host, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
            loaded[job.version] = (name, str(folder))
            _sync_host_args(gw, host)
        for a in gw.pop.agents:
            if owned(a) and a.role == role and a.url == host.url and a.version != job.version:
                a.model_id, a.version = loaded[job.version][0], job.version
                job.moved.append(a.name)
        job.pending = [a.name for a in gw.pop.agents if owned(a) and a.version != job.version]


async def retire_adapters(gw) -> None:
    """Unload each adapter neither current nor previous that no agent serves, once no request on it is in flight."""
    v = gw.versions
    for role, loaded in v.adapters.items():
        host = gw.hosts[role]
        for n in [n for n in loaded if n not in (v.current, v.previous)]:
            if any(a.version == n and a.role == role and a.status not in GONE for a in gw.pop.agents):
                continue
            name = loaded[n][0]
            await _until_idle(gw.pop, host.url, name, float(gw.s.action_timeout_ms) / 1000 + 5)
            try:
                await _host_post(gw, host, "/v1/unload_lora_adapter", {"lora_name": name})
            except SwapFailed as exc:  # a restarted worker loads only what is served: it is gone there anyway
                logger.warning("could not unload adapter {}: {}", name, exc)
            del loaded[n]
            _sync_host_args(gw, host)
            logger.info("adapter {} unloaded from {}", name, host.name)


# ---------------------------------------------------------------------------------------------- a job
async def run_job(gw, job: SwapJob) -> None:
    """Play ``job`` to its end: ``done``, or ``failed`` with the reason (module docstring)."""
    logger.info("{} to v{} ({}) begins", job.kind, job.version, job.checkpoint)
    try:
        await (move_adapters(gw, job) if gw.adapter_run else move_workers(gw, job))
        job.status = "done"
    except SwapFailed as exc:
        job.status, job.error = "failed", str(exc)
    except asyncio.CancelledError:
        job.status, job.error = "failed", "the gateway shut down"
        raise
    except Exception as exc:  # a bug must not leave the job running forever
        logger.exception("{} to v{} failed", job.kind, job.version)
        job.status, job.error = "failed", f"{type(exc).__name__}: {exc}"
    finally:
        job.ended = time.time()
        logger.info("{} to v{}: {} (moved {}){}", job.kind, job.version, job.status, job.moved, job.error or "")
    if gw.adapter_run:
        await retire_adapters(gw)


def begin(gw, kind: str, version: int) -> SwapJob:
    """Start a swap (or rollback) to ``version`` in the background; the job (its state) is returned at once."""
    v = gw.versions
    v.jobs += 1
    v.job = SwapJob(v.jobs, kind, version, str(v.folders[version]))
    v.job.pending = [a.name for a in gw.pop.agents if owned(a) and a.version != version]
    gw.setup.checkpoint = v.folders[version]  # agents added from now on serve it
    gw.background.append(asyncio.ensure_future(run_job(gw, v.job)))
    return v.job
