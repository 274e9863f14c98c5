"""The live population: who can bid now, the worker processes the gateway owns, and their health.

An agent is ``starting`` (its process is loading), ``up`` (asked for bids), ``down`` (it failed or
missed ``drop_after_misses`` bid deadlines in a row: not asked, probed, re-admitted when it answers
again), ``failed`` (it did not answer within ``join_timeout_s`` of joining, or its worker died
``max_restarts`` times within ``restart_window_s``: no longer probed or restarted; ``DELETE`` it),
``draining`` (``DELETE``: finishes what it was asked, gets nothing new) or ``removed``.
A worker the gateway started and that died is restarted when ``restart_workers`` is on, after an
exponential backoff (0.5 s, 1 s, 2 s, ... capped at ``backoff_max_s``).
Workers are forked processes on this host, or (``serve.cluster=ray``, a ``launcher``) Ray actors on any node
(:mod:`swarm_runtime.serve.ray_workers`): their URL is learnt from the actor, and again after Ray restarts it.
Agent indices are never reused, so keyed sampling and transcripts stay attributable.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger

from swarm_runtime.serve.validate import GATEWAY_HEADER

STATUSES = ("starting", "up", "down", "failed", "draining", "removed")
#: seconds a stopped worker has to exit after SIGTERM before it is killed
STOP_GRACE_S = 5.0

#: Modules a worker needs, imported once in the fork server: a new or restarted worker is forked from
#: it and only loads its model (about a second), instead of importing torch and transformers afresh.
PRELOAD = [
    "torch",
    "transformers",
    "transformers.models.qwen2.modeling_qwen2",
    "fastapi",
    "uvicorn",
    "swarm_runtime.models.transformers_backend",
    "swarm_runtime.serve.worker",
]
_MP = None


def _mp():
    global _MP
    if _MP is None:
        import multiprocessing

        _MP = multiprocessing.get_context("forkserver")
        _MP.set_forkserver_preload(PRELOAD)
    return _MP


def _child(argv: list[str], log: str | None, threads: int) -> None:
    """A worker process forked from the fork server: its output to ``log``, then the worker's main."""
    if log:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    from swarm_runtime.serve.worker import main

    raise SystemExit(main(argv))


class WorkerProcess:
    """A forked worker with the part of ``subprocess.Popen``'s interface the population uses."""

    def __init__(self, argv: list[str], log: Path | None, threads: int):
        self.p = _mp().Process(target=_child, args=(argv, str(log) if log else None, threads), daemon=True)
        self.p.start()
        self.pid = self.p.pid

    @property
    def returncode(self):
        return self.p.exitcode

    def poll(self):
        return self.p.exitcode

    def terminate(self):
        self.p.terminate()

    def kill(self):
        self.p.kill()

    def wait(self, timeout: float | None = None):
        self.p.join(timeout)
        if self.p.exitcode is None:
            raise subprocess.TimeoutExpired("worker", timeout)
        return self.p.exitcode


async def _exited(proc, timeout: float, every: float = 0.05) -> bool:
    """Whether ``proc`` exits within ``timeout`` seconds, polled (never waited on) so the event loop runs on."""
    end = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() >= end:
            return False
        await asyncio.sleep(every)
    return True


async def _reaped(name: str, proc, grace_s: float) -> None:
    """Until agent ``name``'s worker ``proc``, sent SIGTERM, has exited: SIGKILL after ``grace_s`` (a warning
    if it outlives even that by ``grace_s``)."""
    if await _exited(proc, grace_s):
        return
    logger.warning("agent {}: its worker did not exit {:g}s after SIGTERM: killed", name, grace_s)
    proc.kill()
    if not await _exited(proc, grace_s):
        logger.warning("agent {}: its worker (pid {}) has not exited after SIGKILL", name, proc.pid)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class AgentHandle:
    """One member of the served swarm."""

    index: int
    name: str
    role: str
    url: str  #: the worker's base URL (``http://127.0.0.1:PORT``; an external server's, e.g. ``vllm serve``)
    model_id: str | None = None  #: the id ``/v1/models`` gives (the ``model`` of every request)
    status: str = "starting"
    checkpoint: str | None = None  #: the role folder a worker the gateway owns was started on
    proc: WorkerProcess | None = None
    worker_args: list = field(default_factory=list)
    misses: int = 0  #: bid deadlines missed in a row
    restarts: int = 0
    inflight: int = 0
    since: float = field(default_factory=time.time)
    error: str | None = None  #: why it is down or failed
    restart_times: list = field(default_factory=list)  #: monotonic times of its recent restarts
    next_start: float = 0.0  #: monotonic time its dead worker may be restarted (the backoff)
    version: int | None = None  #: the served swarm version it answers as (``Role@vN``); None: joined by URL

    @property
    def label(self) -> str | None:
        """``Role@vN``: the version it serves (:mod:`swarm_runtime.serve.swap`); None for an agent joined by URL."""
        return None if self.version is None else f"{self.role}@v{self.version}"

    def public(self) -> dict:
        wait = max(0.0, self.next_start - time.monotonic()) if self.status == "down" and self.proc is not None else 0.0
        return {
            "index": self.index,
            "name": self.name,
            "role": self.role,
            "url": self.url,
            "status": self.status,
            "model": self.model_id,
            "checkpoint": self.checkpoint,
            "version": self.label,
            "restarts": self.restarts,
            "error": self.error,
            "restart_in_s": round(wait, 3),
            "pid": self.proc.pid if self.proc is not None and self.proc.poll() is None else None,
        }


@dataclass
class PopulationOptions:
    max_prompt_tokens: int = 256
    device: str = "cpu"
    worker_threads: int = 1
    restart_workers: bool = True
    probe_interval_s: float = 0.5
    drop_after_misses: int = 3
    log_dir: Path | None = None
    join_timeout_s: float = 300.0  #: an agent not answering this long after it joined (or restarted) is failed
    max_restarts: int = 5  #: restarts within ``restart_window_s`` before a worker is failed for good
    restart_window_s: float = 60.0
    backoff_base_s: float = 0.5  #: wait before the first restart; doubled for each recent one
    backoff_max_s: float = 30.0
    gateway_id: str | None = None  #: this gateway's id: an agent whose answer carries it is the gateway itself


class Population:
    def __init__(self, opts: PopulationOptions, launcher=None):
        """``launcher(argv, log, threads)``: starts a worker and returns its handle (default: a forked
        :class:`WorkerProcess`; :class:`~swarm_runtime.serve.ray_workers.RayWorkers`: a Ray actor)."""
        self.opts = opts
        self.launcher = launcher
        #: workers being stopped in the background (:meth:`mark_failed` on the event loop): held until done
        self.stopping: set[asyncio.Task] = set()
        self.agents: list[AgentHandle] = []
        #: adapter hosts: one worker per base holding every role's adapter (their agents are URL agents on it)
        self.hosts: list[AgentHandle] = []
        #: requests in flight per ``(url, model)``: a swapped-out worker or adapter is stopped once its count is 0
        self.using: Counter = Counter()

    # ------------------------------------------------------------------ membership
    def by_name(self, name: str) -> AgentHandle | None:
        return next((a for a in self.agents if a.name == name and a.status != "removed"), None)

    def next_name(self, role: str) -> str:
        """``ROLE``, then ``ROLE@2``, ``ROLE@3``, ...: names that need no escaping in a URL path."""
        taken = {a.name for a in self.agents}
        if role not in taken:
            return role
        k = 2
        while f"{role}@{k}" in taken:
            k += 1
        return f"{role}@{k}"

    def bidders(self) -> list[AgentHandle]:
        return [a for a in self.agents if a.status == "up"]

    def add_url(self, role: str, url: str, name: str | None = None, model_id: str | None = None) -> AgentHandle:
        a = AgentHandle(
            len(self.agents), name or self.next_name(role), role, url.rstrip("/").removesuffix("/v1"), model_id=model_id
        )
        self.agents.append(a)
        logger.info("agent {} ({}) joins at {}", a.name, role, a.url)
        return a

    def _new_url(self) -> str:
        """A forked worker's URL (a free port here); a Ray actor's is learnt when it serves (:meth:`follow`)."""
        return "" if self.launcher is not None else f"http://127.0.0.1:{free_port()}"

    def spawn(self, role: str, checkpoint: Path, name: str | None = None, worker_args=()) -> AgentHandle:
        a = AgentHandle(
            len(self.agents),
            name or self.next_name(role),
            role,
            self._new_url(),
            model_id=None,
            checkpoint=str(checkpoint),
            worker_args=list(worker_args),
        )
        self.agents.append(a)
        self._start(a)
        return a

    def spawn_host(self, base: Path, adapters: list[tuple[str, Path]]) -> AgentHandle:
        """One worker serving ``base`` with each ``(name, adapter folder)`` loaded (a ``model.adapter=lora``
        run); agents join it by URL with their adapter's name as ``model``. Restarted as workers are."""
        h = AgentHandle(
            -1,
            f"base-{len(self.hosts) + 1}",
            "",
            self._new_url(),
            checkpoint=str(base),
            worker_args=["--lora-modules", *[f"{n}={p}" for n, p in adapters]],
        )
        self.hosts.append(h)
        self._start(h)
        return h

    def _start(self, a: AgentHandle) -> None:
        if self.launcher is not None:
            a.url = ""  # a new actor: its URL when it serves
        port = a.url.rsplit(":", 1)[1] if a.url else "0"
        argv = [
            "--model",
            a.checkpoint,
            "--name",
            a.name,
            "--port",
            port,
            "--max-prompt-tokens",
            str(self.opts.max_prompt_tokens),
            "--device",
            self.opts.device,
            "--threads",
            str(self.opts.worker_threads),
            "--seed",
            str(a.index),
            "--parent-pid",
            str(os.getpid()),
            *a.worker_args,
        ]
        log = None
        if self.opts.log_dir is not None:
            self.opts.log_dir.mkdir(parents=True, exist_ok=True)
            log = self.log_path(a.name)
        a.proc = (self.launcher or WorkerProcess)(argv, log, self.opts.worker_threads)
        a.status, a.since, a.misses = "starting", time.time(), 0
        if self.launcher is None:
            logger.info("agent {} ({}): worker pid {} on {}", a.name, a.role, a.proc.pid, a.url)
        else:
            logger.info("agent {} ({}): worker actor started on Ray", a.name, a.role)

    def log_path(self, name: str) -> Path:
        """The worker log of agent ``name``: always a file directly inside ``log_dir``."""
        base = self.opts.log_dir.resolve()
        path = (base / f"{name}.log").resolve()
        if path.parent != base:
            raise ValueError(f"agent name {name!r} would put its log outside {base}")
        return path

    # ------------------------------------------------------------------ health
    def mark_down(self, a: AgentHandle, why: str) -> None:
        if a.status == "up":
            a.status, a.since, a.error = "down", time.time(), why
            logger.warning("agent {} dropped: {}", a.name, why)

    def mark_failed(self, a: AgentHandle, why: str) -> None:
        if a.status not in ("draining", "removed", "failed"):
            a.status, a.since, a.error = "failed", time.time(), why
            logger.error("agent {} failed: {}", a.name, why)
            self._stop_soon(a)

    def _restart(self, a: AgentHandle) -> None:
        """Restart ``a``'s dead worker once its backoff has passed; fail it after too many restarts."""
        now = time.monotonic()
        if a.next_start == 0.0:  # just found dead: schedule
            a.restart_times = [t for t in a.restart_times if now - t < self.opts.restart_window_s]
            if len(a.restart_times) >= self.opts.max_restarts:
                self.mark_failed(
                    a,
                    f"worker exited with {a.proc.returncode}; {len(a.restart_times)} restarts in "
                    f"{self.opts.restart_window_s:g}s (serve.max_restarts={self.opts.max_restarts})",
                )
                return
            delay = min(self.opts.backoff_max_s, self.opts.backoff_base_s * 2 ** len(a.restart_times))
            a.next_start = now + delay
            logger.info("agent {}: restarting its worker in {:.1f}s", a.name, delay)
        if now >= a.next_start:
            a.restart_times.append(now)
            a.restarts += 1
            a.next_start = 0.0
            self._start(a)

    def follow(self, a: AgentHandle) -> None:
        """A worker in a Ray actor (a handle with ``check``): learn its URL when it first serves; mark it down
        when its process died (Ray restarts it); take its new URL and pid when Ray restarted it (counted as a
        restart: too many within ``restart_window_s`` and it is failed, as a subprocess that keeps dying)."""
        check = getattr(a.proc, "check", None)
        if check is None or a.status in ("draining", "removed", "failed"):
            return
        news = check()
        if news is None:
            return
        if isinstance(news, str):  # its process died: not asked until the restarted worker answers
            if a.status == "up":
                a.status, a.since, a.error = "down", time.time(), "its worker's Ray actor died; Ray restarts it"
                logger.warning("agent {} dropped: {}", a.name, a.error)
            return
        url, pid = news
        if a.url:  # it served before: Ray restarted the actor
            now = time.monotonic()
            a.restart_times = [t for t in a.restart_times if now - t < self.opts.restart_window_s] + [now]
            a.restarts += 1
            logger.warning("agent {}: worker restarted by Ray, now pid {} at {} (was {})", a.name, pid, url, a.url)
            if len(a.restart_times) > self.opts.max_restarts:
                a.url = url
                self.mark_failed(
                    a,
                    f"its worker's Ray actor died {len(a.restart_times)} times in {self.opts.restart_window_s:g}s "
                    f"(serve.max_restarts={self.opts.max_restarts})",
                )
                return
            if a.status == "up":  # not asked until it answers at its new address
                a.status, a.since, a.error = "down", time.time(), "restarted by Ray"
        else:
            logger.info("agent {} ({}): worker pid {} on {} (a Ray actor)", a.name, a.role, pid, url)
        a.url = url

    def note_miss(self, a: AgentHandle) -> None:
        a.misses += 1
        if a.misses >= self.opts.drop_after_misses:
            self.mark_down(a, f"missed {a.misses} bid deadlines in a row")

    async def probe(self, client, a: AgentHandle, timeout: float = 1.0) -> bool:
        try:
            if not a.url:
                raise ConnectionError("its Ray actor has not said where it serves yet")
            r = await client.get(f"{a.url}/v1/models", timeout=timeout)
            if self.is_this_gateway(r):
                self.mark_failed(a, f"{a.url} is this gateway itself, not an agent's server")
                return False
            r.raise_for_status()
            if a.model_id is None:  # a server of several models (a base with adapters): the one named as the role
                ids = [m["id"] for m in r.json()["data"]]
                a.model_id = next((i for i in ids if i in (a.role, a.role.replace(".", "_"))), ids[0])
        except Exception as exc:
            if a.status == "starting" and time.time() - a.since > self.opts.join_timeout_s:
                self.mark_failed(
                    a,
                    f"no answer from {a.url}/v1/models within {self.opts.join_timeout_s:g}s "
                    f"of joining ({type(exc).__name__})",
                )
            return False
        if a.status in ("starting", "down"):
            logger.info("agent {} {}", a.name, "is up" if a.status == "starting" else "answers again: re-admitted")
            a.status, a.since, a.misses, a.error = "up", time.time(), 0, None
        return True

    def is_this_gateway(self, response) -> bool:
        """``response`` (of an agent URL) came from this gateway: it carries the gateway's id."""
        return self.opts.gateway_id is not None and response.headers.get(GATEWAY_HEADER) == self.opts.gateway_id

    async def reaches_this_gateway(self, client, url: str, timeout: float = 5.0) -> bool:
        """``url``'s ``/v1/models`` is answered by this gateway (another name of its address); False when it answers
        otherwise or not at all (the probes judge that)."""
        try:
            return self.is_this_gateway(await client.get(f"{url.rstrip('/')}/v1/models", timeout=timeout))
        except Exception:  # no answer: not this gateway, which answers
            return False

    async def watch(self, client) -> None:
        """Forever: restart dead workers the gateway owns (with backoff), probe the agents that are not up."""
        while True:
            for a in list(self.agents) + self.hosts:
                self.follow(a)
                if (
                    a.proc is not None
                    and a.proc.poll() is not None
                    and a.status not in ("draining", "removed", "failed")
                ):
                    if a.status != "down":
                        a.status, a.since = "down", time.time()
                        why = getattr(a.proc, "error", None)  # a Ray actor's: why it is gone
                        a.error = f"worker exited with {a.proc.returncode}" + (f": {why}" if why else "")
                        logger.warning("agent {} dropped: {}", a.name, a.error)
                    if self.opts.restart_workers:
                        self._restart(a)
                    continue
                if a.status in ("starting", "down"):
                    await self.probe(client, a)
            await asyncio.sleep(self.opts.probe_interval_s)

    async def wait_up(self, client, timeout: float) -> None:
        """Until every worker the gateway started is up (raises ``TimeoutError`` naming the ones that are
        not); external agents are probed in the background and join when they answer."""
        end = time.time() + timeout
        while True:
            pending = [a for a in self.agents + self.hosts if a.status != "up" and a.proc is not None]
            for a in pending:
                self.follow(a)
                if a.proc is not None and a.proc.poll() is not None:
                    where = getattr(a.proc, "error", None) or f"see {self.opts.log_dir}"
                    raise RuntimeError(f"worker {a.name} exited with {a.proc.returncode} while starting; {where}")
                await self.probe(client, a)
            if not [a for a in pending if a.status != "up"]:
                return
            if time.time() > end:
                raise TimeoutError(f"agents not up after {timeout:.0f}s: {', '.join(a.name for a in pending)}")
            await asyncio.sleep(0.2)

    async def drain(self, a: AgentHandle, timeout: float = 30.0) -> None:
        a.status = "draining"
        end = time.time() + timeout
        while a.inflight and time.time() < end:
            await asyncio.sleep(0.05)
        await self.astop(a)
        a.status = "removed"
        logger.info("agent {} drained and removed", a.name)

    def _stop(self, a: AgentHandle) -> None:
        """Stop ``a``'s worker: SIGTERM, SIGKILL after :data:`STOP_GRACE_S`; returns once it exited. It blocks:
        for code off the event loop (:meth:`stop_all`); the gateway's coroutines use :meth:`astop`."""
        if a.proc is not None and a.proc.poll() is None:
            a.proc.terminate()
            try:
                a.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                a.proc.kill()
                a.proc.wait()

    async def astop(self, a: AgentHandle, grace_s: float = STOP_GRACE_S) -> None:
        """:meth:`_stop` without blocking the event loop: SIGTERM now, then its exit polled between sleeps
        (:func:`_reaped`); returns once it exited."""
        if a.proc is not None and a.proc.poll() is None:
            a.proc.terminate()
            await _reaped(a.name, a.proc, grace_s)

    def _stop_soon(self, a: AgentHandle) -> None:
        """Stop ``a``'s worker from synchronous code: on the event loop (a probe or the watch found it failed)
        SIGTERM now and the rest of :meth:`astop` in the background; off it, :meth:`_stop`."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._stop(a)
            return
        if a.proc is not None and a.proc.poll() is None:
            a.proc.terminate()
            task = asyncio.ensure_future(_reaped(a.name, a.proc, STOP_GRACE_S))
            self.stopping.add(task)
            task.add_done_callback(self.stopping.discard)

    def stop_all(self) -> None:
        for a in self.agents + self.hosts:
            if a.proc is not None and a.proc.poll() is None:
                a.proc.terminate()
        for a in self.agents + self.hosts:
            if a.proc is not None:
                self._stop(a)
        close = getattr(self.launcher, "close", None)
        if close is not None:
            close()
