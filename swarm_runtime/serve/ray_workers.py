"""Agent workers as Ray actors: ``swarm serve RUN serve.cluster=ray`` (docs/guides/serve.md, "Across machines").

Each agent's worker (:mod:`swarm_runtime.serve.worker`: the role's model behind the completions subset) runs
in a Ray actor's process (:class:`AgentActor`), on whichever node Ray places it: the actor loads the model,
binds a free port on its node's address (127.0.0.1 on a local Ray) and serves there from a thread; it answers
:meth:`AgentActor.where` with its URL and pid once it serves. The gateway treats the URL as a joined worker's.

:class:`RayWorker` is the gateway's handle on one actor, with the part of ``subprocess.Popen``'s interface
:class:`~swarm_runtime.serve.population.Population` uses (``pid``, ``poll``, ``terminate``, ``kill``,
``wait``) and :meth:`RayWorker.check`, which never blocks: the population asks it every probe interval and
learns the worker's URL when it first serves, that the worker died (its requests fail meanwhile and the
gateway's failover covers them, as for a dead subprocess), and its new URL and pid once Ray has restarted the
actor (at once, on this node or another; ``max_restarts=-1``: the gateway's ``serve.max_restarts`` within
``serve.restart_window_s`` decides when an agent that keeps dying is ``failed``). ``poll`` reports an exit
only for an actor Ray will not bring back (its constructor raised, or it was killed for good); the population
then restarts it as a new actor, with its backoff, as it restarts a dead subprocess.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from loguru import logger

from swarm_runtime.cluster.actors import ActorGroup

#: Seconds an actor's HTTP server may take to listen once its model is loaded.
LISTEN_TIMEOUT_S = 60.0
#: ``check``'s answer when the actor's process died (Ray restarts it; its URL may change).
LOST = "lost"


class AgentActor:
    """One agent worker in this (a Ray actor's) process. ``argv``: the worker's command line
    (:func:`swarm_runtime.serve.worker.parse_args`; its ``--host``, ``--port`` and ``--parent-pid`` are not
    used: the actor binds ``host``, or this node's address when None, on a free port, and Ray ends it with
    the gateway)."""

    def __init__(self, argv: list[str], threads: int, host: str | None):
        os.environ["OMP_NUM_THREADS"] = str(threads)
        import torch
        import uvicorn

        from swarm_runtime.serve.worker import load_policy, make_app, parse_args

        opts = parse_args(argv)
        torch.set_num_threads(max(1, int(threads)))
        if host is None:
            import ray

            host = ray.util.get_node_ip_address()
        if not (Path(opts.model) / "config.json").exists():
            raise FileNotFoundError(
                f"{opts.model} is not a checkpoint folder on the node at {host}: serve.cluster=ray loads each "
                "agent's model where Ray places it, so the run folder must be at the same path on every node "
                "(a shared filesystem, or a copy)"
            )
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        port = sock.getsockname()[1]
        app = make_app(load_policy(opts), opts)
        config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=300)
        self.server = uvicorn.Server(config)
        threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True).start()
        end = time.monotonic() + LISTEN_TIMEOUT_S
        while not self.server.started:
            if time.monotonic() > end:
                raise RuntimeError(f"agent worker {opts.name}: its server did not listen on {host}:{port}")
            time.sleep(0.02)
        bracketed = f"[{host}]" if ":" in host else host
        self.url = f"http://{bracketed}:{port}"

    def where(self) -> tuple[str, int]:
        """``(url, pid)``: where this worker serves, and its process."""
        return self.url, os.getpid()


class RayWorkers(ActorGroup):
    """Starts agent workers as Ray actors (a ``Population``'s launcher): Ray joined at ``address``
    (``serve.address``), or a local Ray started on 127.0.0.1 (stopped by :meth:`close`).

    On a joined cluster each actor reserves ``threads`` CPUs (its torch threads) and actors are spread over
    the nodes (``SPREAD``); each worker binds its node's address. On a local Ray (one machine: nothing to
    place) they reserve none, so a local Ray runs as many workers as subprocesses would, bound to 127.0.0.1."""

    def __init__(self, address: str | None, restart: bool = True):
        """``restart``: Ray restarts an actor whose process died (``serve.restart_workers``), without end (the
        gateway's ``serve.max_restarts`` decides when an agent that keeps dying is ``failed``)."""
        super().__init__(address, key="serve.address", max_restarts=-1 if restart else 0)
        self.local = address is None
        self.restart = restart

    def __call__(self, argv: list[str], log, threads: int) -> RayWorker:
        """A new worker (``log`` is unused: an actor's output is in Ray's logs on its node)."""
        opts = dict(num_cpus=0 if self.local else max(1, int(threads)), scheduling_strategy="SPREAD")
        host = "127.0.0.1" if self.local else None
        return RayWorker(self.ray, self.spawn(AgentActor, argv, threads, host, options=opts))

    def _close(self) -> None:
        """Stop the local Ray this started (the actors end with it); a joined cluster's actors are killed by
        the population, and the cluster stays."""
        self.stop_ray()


class RayWorker:
    """The gateway's handle on one :class:`AgentActor`."""

    def __init__(self, ray, actor):
        self.ray, self.actor = ray, actor
        self.url: str | None = None  #: where the worker serves (None until it first answers)
        self.pid: int | None = None  #: its process (on its node)
        self.returncode: int | None = None  #: set when the actor is gone for good
        self.error: str | None = None
        self._died = 0  #: ActorDiedError answers in a row
        self._ref = actor.where.remote()

    def check(self):
        """Never blocks. ``(url, pid)`` when the actor answered and either differs from what it answered last
        (its first answer, or Ray restarted it), :data:`LOST` when a call found its process dead, else None."""
        if self.returncode is not None:
            return None
        if self._ref is None:
            self._ref = self.actor.where.remote()
        ready, _ = self.ray.wait([self._ref], timeout=0)
        if not ready:
            return None
        ref, self._ref = self._ref, None
        errors = self.ray.exceptions
        try:
            url, pid = self.ray.get(ref)
        except errors.ActorDiedError as exc:
            # measured (Ray 2.60, max_restarts=-1): after kill -9 the next call is ActorUnavailableError and the
            # one after waits for the restarted actor; ActorDiedError is its constructor raising (at once) or
            # an actor ended for good (on every call; the first may be a call in flight as its process died)
            self._died += 1
            if exc.actor_init_failed or self._died >= 2:
                self.returncode, self.error = 1, _summary(exc)
                logger.warning("agent worker actor is gone for good: {}", self.error)
            return LOST
        except errors.RayActorError:  # ActorUnavailableError: its process died, Ray restarts it
            self._died = 0
            return LOST
        self._died = 0
        if (url, pid) == (self.url, self.pid):
            return None
        self.url, self.pid = url, pid
        return url, pid

    def poll(self):
        return self.returncode

    def terminate(self):
        """End the actor for good (Ray does not restart it)."""
        if self.returncode is None:
            try:
                self.ray.kill(self.actor, no_restart=True)
            except Exception as exc:  # Ray already stopped (the gateway's end)
                logger.debug("ray.kill: {}", exc)
            self.returncode = -9

    kill = terminate

    def wait(self, timeout: float | None = None):
        return self.returncode


def _summary(exc) -> str:
    """One line of an ``ActorDiedError``: the constructor's exception (its message's last line), or its first."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return f"its constructor raised {lines[-1]}" if exc.actor_init_failed else lines[0]
