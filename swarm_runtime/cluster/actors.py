"""What every family of Ray actors shares: :class:`ActorBody` (the actor's side: its process and node) and
:class:`ActorGroup` (the driver's side), as verl's worker groups gather it. The families: env workers
(:mod:`.env_cluster`), the sampler actor (:mod:`.samplers`), learners (:mod:`.learners`, :mod:`.sharded_learners`),
engine sampler actors (:mod:`.vllm_actors`) and serve's agent workers (swarm_runtime/serve/ray_workers.py).

An :class:`ActorGroup` starts or joins Ray and starts its actors (:meth:`ActorGroup.spawn`: no CPU of their own
unless asked, restarted by Ray up to ``max_restarts`` times, no task retried by Ray: the group retries), keeps their
pids and says where they run, knows whether Ray will restart an actor again (:meth:`ActorGroup.spent`), waits for a
restarted one (:meth:`ActorGroup.await_restart`, at most ``cluster.restart_wait_s``) and logs it, makes a call again
after its actor is recovered (:meth:`ActorGroup.dispatch`) and ends its actors (and the Ray it started). What a
restart means stays each family's own: an env worker replays its envs' journals, the sampler actor is loaded with
the synced models, a lost learner makes the run rewind to its checkpoint, an engine actor is adopted with its
adapters.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

from loguru import logger

from swarm_runtime.cluster.ray_helpers import actor_state, connect, import_ray, lost_node, node_here, node_of, nodes_of
from swarm_runtime.config.errors import ConfigError

#: How long a dead actor (env worker, sampler, learner) is waited for by default (Ray restarts its process):
#: ``cluster.restart_wait_s``'s default (config/load.py). A run passes its own value down to each group
#: (:func:`swarm_runtime.cluster.restart_wait_s`), which passes it to each wait.
RESTART_WAIT_S = 120.0


class ActorGone(ConfigError):
    """An actor died and did not come back within ``cluster.restart_wait_s`` (its node lost, say): the run stops with one
    line (a :class:`ConfigError` for the command line's sake: exit 2, no traceback), saying how to resume."""


def wait_restarted(
    ray,
    actor,
    old_pid: int | None,
    timeout_s: float,
    *,
    same_ok=False,
    check=None,
    call=None,
    pid_of=None,
    try_s: float | None = 10.0,
):
    """Block until ``actor`` (whose process, pid ``old_pid``, died: Ray restarts it) answers from a new process;
    returns its answer. What is asked: ``call(actor)``, an object ref (by default ``actor.pid.remote()``), whose
    answer's pid is ``pid_of(answer)`` (by default the answer itself: then the pid is returned). ``same_ok``: an
    answer from ``old_pid`` counts too (the actor was out of reach, not dead); else it is the old process's
    death not seen yet, and the wait goes on. ``check()``, if given, runs before each try (it raises when the
    actor is gone for good). ``try_s``: how long one try waits for its answer (None: until ``timeout_s`` is
    up, for an actor whose constructor takes long). Raises :class:`TimeoutError` saying why when no answer
    comes within ``timeout_s`` (the run's ``cluster.restart_wait_s``), naming what was waited for."""
    timeout_s = float(timeout_s)
    end = time.monotonic() + timeout_s
    while True:
        if check is not None:
            check()
        wait = max(1.0, end - time.monotonic()) if try_s is None else try_s
        try:
            answer = ray.get(actor.pid.remote() if call is None else call(actor), timeout=wait)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            if time.monotonic() > end:
                raise TimeoutError(
                    f"it did not come back within {timeout_s:g} s (cluster.restart_wait_s; {type(exc).__name__}"
                    f"{lost_node(actor)})"
                ) from exc
        else:
            pid = answer if pid_of is None else pid_of(answer)
            if pid != old_pid or same_ok:
                return answer
            if time.monotonic() > end:
                raise TimeoutError(
                    f"it answers from the same process (pid {pid}) after {timeout_s:g} s, but lost a call"
                )
        time.sleep(0.2)


class ActorBody:
    """The actor's side every family's body shares (plain Python: the actor is the body under ``ray.remote``)."""

    def pid(self) -> int:
        """This actor's process: a new one after Ray restarted it."""
        return os.getpid()

    def node(self) -> str:
        """Where this actor runs (:func:`swarm_runtime.cluster.ray_helpers.node_here`)."""
        return node_here()


class ActorGroup:
    """The driver's side of one family of Ray actors (the module's docstring). ``address``: the Ray to join (None:
    a local one started here, stopped by :meth:`close`; ``key``: the setting errors name); ``restart_wait_s``: how
    long a dead actor is waited for; ``max_restarts``: the restarts Ray gives each actor (:meth:`spawn`).
    A family's ``close`` is :meth:`_close`, run once."""

    #: Restarts Ray gives each actor unless the family says otherwise.
    max_restarts = 8

    def __init__(
        self,
        address: str | None = None,
        num_cpus: int | None = None,
        *,
        restart_wait_s: float = RESTART_WAIT_S,
        max_restarts: int | None = None,
        key: str = "cluster.address",
    ):
        self.started = connect(address, num_cpus, key=key)  # first: a local Ray is set to loopback before Ray's import
        self.ray = import_ray()
        self.restart_wait_s = float(restart_wait_s)  #: how long a dead actor is waited for (cluster.restart_wait_s)
        if max_restarts is not None:
            self.max_restarts = int(max_restarts)
        self.closed = False

    # ------------------------------------------------------------------ start and bookkeeping
    def spawn_options(self, extra: dict | None = None) -> dict:
        """The Ray options an actor starts with: no CPU of its own, ``max_restarts`` restarts, no task retried by Ray
        (a call is made again by the group, once its actor is recovered), then ``extra`` (placement: resources, a
        node, a placement group's bundle) over them."""
        return {"num_cpus": 0, "max_restarts": self.max_restarts, "max_task_retries": 0, **(extra or {})}

    def spawn(self, body: type, *args, options: dict | None = None):
        """A new actor: ``body(*args)`` under ``ray.remote``, with :meth:`spawn_options` of ``options``."""
        classes = self.__dict__.setdefault("_classes", {})  # one Ray actor class per body (exported to Ray once)
        if body not in classes:
            classes[body] = self.ray.remote(body)
        return classes[body].options(**self.spawn_options(options)).remote(*args)

    def pids_of(self, actors: Iterable) -> list[int]:
        """Each actor's process (its ``pid`` method), in order."""
        return self.ray.get([a.pid.remote() for a in actors])

    def nodes_of(self, actors: Iterable) -> list[str]:
        """Where each actor runs, as it says (:func:`~swarm_runtime.cluster.ray_helpers.nodes_of`)."""
        return nodes_of(self.ray, list(actors), self.restart_wait_s)

    def node_of(self, actor) -> str:
        """Where one actor runs, for a log line (what Ray's error was instead when it does not answer)."""
        return node_of(self.ray, actor, self.restart_wait_s)

    # ------------------------------------------------------------------ liveness and restarts
    def spent(self, actor) -> bool:
        """Whether Ray will not restart ``actor`` again: its restarts are spent, or it was killed for good (``DEAD``
        in Ray's control store)."""
        return actor_state(actor) == "DEAD"

    def await_restart(self, actor, old_pid, timeout_s: float | None = None, *, gone=None, **how):
        """:func:`wait_restarted` of ``actor``, whose process ``old_pid`` died, within ``timeout_s`` (by default
        ``restart_wait_s``); ``how``: its keywords. ``gone(why)``, if given: the family's error raised when it does not
        come back (else the :class:`TimeoutError`)."""
        wait_s = self.restart_wait_s if timeout_s is None else timeout_s
        try:
            return wait_restarted(self.ray, actor, old_pid, wait_s, **how)
        except TimeoutError as exc:
            if gone is None:
                raise
            raise gone(str(exc)) from exc

    def log_restart(self, who: str, old: int, new: int, actor, tail: str = "") -> None:
        """``<who> restarted: pid <old> -> <new> on node <its node><tail>`` (the line the fault tests read)."""
        logger.warning("{} restarted: pid {} -> {} on node {}{}", who, old, new, self.node_of(actor), tail)

    # ------------------------------------------------------------------ calls
    def dispatch(
        self, attempt: Callable, recover: Callable, tries: int, exhausted: Callable, *, recover_last: bool = True
    ) -> tuple:
        """Make a call until it is answered: ``attempt()`` gives ``(answered, value)``; one not answered (or whose actor
        died: Ray's ``RayActorError``) is followed by ``recover()`` (the family's: wait for the restarted actor and
        bring it back to where the driver is) and made again, ``tries`` times at most; then ``exhausted()`` is raised
        (``recover_last`` False: right after the last try, without recovering first). ``(value, tries made)``."""
        for n in range(1, tries + 1):
            try:
                ok, value = attempt()
            except self.ray.exceptions.RayActorError:
                ok = False
            if ok:
                return value, n
            if n == tries and not recover_last:
                break
            recover()
        raise exhausted()

    # ------------------------------------------------------------------ end
    def kill(self, actors: Iterable) -> None:
        """End ``actors`` for good (Ray restarts none of them)."""
        for a in actors:
            self.ray.kill(a, no_restart=True)

    def stop_ray(self) -> None:
        """Stop Ray if this group started it (a joined cluster, or a Ray another group started, stays)."""
        if self.started:
            self.ray.shutdown()

    def close(self):
        """End the group (:meth:`_close`, the family's), once; what it returns (its stats), ``{}`` when closed already."""
        if self.closed:
            return {}
        self.closed = True
        return self._close()

    def _close(self):
        self.stop_ray()
        return {}
