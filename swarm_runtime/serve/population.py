"""The live population: who can bid now, the worker processes the gateway owns, and their health.

An agent is ``starting`` (its process is loading), ``up`` (asked for bids), ``down`` (it failed or
missed ``drop_after_misses`` bid deadlines in a row: not asked, probed, re-admitted when it answers
again), ``draining`` (``DELETE``: finishes what it was asked, gets nothing new) or ``removed``.
A worker the gateway started and that died is restarted when ``restart_workers`` is on.
Agent indices are never reused, so keyed sampling and transcripts stay attributable.
"""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger

STATUSES = ("starting", "up", "down", "draining", "removed")

#: Modules a worker needs, imported once in the fork server: a new or restarted worker is forked from
#: it and only loads its model (about a second), instead of importing torch and transformers afresh.
PRELOAD = ["torch", "transformers", "transformers.models.qwen2.modeling_qwen2", "fastapi", "uvicorn",
           "swarm_runtime.policy.transformers_backend", "swarm_runtime.serve.worker"]
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
    proc: "WorkerProcess | None" = None
    worker_args: list = field(default_factory=list)
    misses: int = 0  #: bid deadlines missed in a row
    restarts: int = 0
    inflight: int = 0
    since: float = field(default_factory=time.time)

    def public(self) -> dict:
        return {"index": self.index, "name": self.name, "role": self.role, "url": self.url, "status": self.status,
                "model": self.model_id, "checkpoint": self.checkpoint, "restarts": self.restarts,
                "pid": self.proc.pid if self.proc is not None and self.proc.poll() is None else None}


@dataclass
class PopulationOptions:
    max_prompt_tokens: int = 256
    device: str = "cpu"
    worker_threads: int = 1
    restart_workers: bool = True
    probe_interval_s: float = 0.5
    drop_after_misses: int = 3
    log_dir: Path | None = None


class Population:
    def __init__(self, opts: PopulationOptions):
        self.opts = opts
        self.agents: list[AgentHandle] = []

    # ------------------------------------------------------------------ membership
    def by_name(self, name: str) -> AgentHandle | None:
        return next((a for a in self.agents if a.name == name and a.status != "removed"), None)

    def next_name(self, role: str) -> str:
        taken = {a.name for a in self.agents}
        if role not in taken:
            return role
        k = 2
        while f"{role}#{k}" in taken:
            k += 1
        return f"{role}#{k}"

    def bidders(self) -> list[AgentHandle]:
        return [a for a in self.agents if a.status == "up"]

    def add_url(self, role: str, url: str, name: str | None = None, model_id: str | None = None) -> AgentHandle:
        a = AgentHandle(len(self.agents), name or self.next_name(role), role, url.rstrip("/").removesuffix("/v1"),
                        model_id=model_id)
        self.agents.append(a)
        logger.info("agent {} ({}) joins at {}", a.name, role, a.url)
        return a

    def spawn(self, role: str, checkpoint: Path, name: str | None = None, worker_args=()) -> AgentHandle:
        port = free_port()
        a = AgentHandle(len(self.agents), name or self.next_name(role), role, f"http://127.0.0.1:{port}",
                        model_id=None, checkpoint=str(checkpoint), worker_args=list(worker_args))
        self.agents.append(a)
        self._start(a)
        return a

    def _start(self, a: AgentHandle) -> None:
        port = a.url.rsplit(":", 1)[1]
        argv = ["--model", a.checkpoint, "--name", a.name, "--port", port, "--max-prompt-tokens", str(self.opts.max_prompt_tokens), "--device", self.opts.device,
               "--threads", str(self.opts.worker_threads), "--seed", str(a.index), "--parent-pid", str(os.getpid()),
               *a.worker_args]
        log = None
        if self.opts.log_dir is not None:
            self.opts.log_dir.mkdir(parents=True, exist_ok=True)
            log = self.opts.log_dir / f"{a.name.replace('#', '-')}.log"
        a.proc = WorkerProcess(argv, log, self.opts.worker_threads)
        a.status, a.since, a.misses = "starting", time.time(), 0
        logger.info("agent {} ({}): worker pid {} on {}", a.name, a.role, a.proc.pid, a.url)

    # ------------------------------------------------------------------ health
    def mark_down(self, a: AgentHandle, why: str) -> None:
        if a.status == "up":
            a.status, a.since = "down", time.time()
            logger.warning("agent {} dropped: {}", a.name, why)

    def note_miss(self, a: AgentHandle) -> None:
        a.misses += 1
        if a.misses >= self.opts.drop_after_misses:
            self.mark_down(a, f"missed {a.misses} bid deadlines in a row")

    async def probe(self, client, a: AgentHandle, timeout: float = 1.0) -> bool:
        try:
            r = await client.get(f"{a.url}/v1/models", timeout=timeout)
            r.raise_for_status()
            a.model_id = a.model_id or r.json()["data"][0]["id"]
        except Exception:
            return False
        if a.status in ("starting", "down"):
            logger.info("agent {} {}", a.name, "is up" if a.status == "starting" else "answers again: re-admitted")
            a.status, a.since, a.misses = "up", time.time(), 0
        return True

    async def watch(self, client) -> None:
        """Forever: restart dead workers the gateway owns, probe the agents that are not up."""
        while True:
            for a in list(self.agents):
                if a.proc is not None and a.proc.poll() is not None and a.status not in ("draining", "removed"):
                    self.mark_down(a, f"worker exited with {a.proc.returncode}")
                    if self.opts.restart_workers:
                        a.restarts += 1
                        self._start(a)
                        continue
                if a.status in ("starting", "down"):
                    await self.probe(client, a)
            await asyncio.sleep(self.opts.probe_interval_s)

    async def wait_up(self, client, timeout: float) -> None:
        """Until every worker the gateway started is up (raises ``TimeoutError`` naming the ones that are
        not); external agents are probed in the background and join when they answer."""
        end = time.time() + timeout
        while True:
            pending = [a for a in self.agents if a.status != "up" and a.proc is not None]
            for a in pending:
                if a.proc is not None and a.proc.poll() is not None:
                    raise RuntimeError(f"worker {a.name} exited with {a.proc.returncode} while starting; "
                                       f"see {self.opts.log_dir}")
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
        self._stop(a)
        a.status = "removed"
        logger.info("agent {} drained and removed", a.name)

    def _stop(self, a: AgentHandle) -> None:
        if a.proc is not None and a.proc.poll() is None:
            a.proc.terminate()
            try:
                a.proc.wait(5)
            except subprocess.TimeoutExpired:
                a.proc.kill()
                a.proc.wait()

    def stop_all(self) -> None:
        for a in self.agents:
            if a.proc is not None and a.proc.poll() is None:
                a.proc.terminate()
        for a in self.agents:
            if a.proc is not None:
                self._stop(a)
