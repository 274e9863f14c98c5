"""The driver's side of env workers on Ray: :class:`EnvCluster` (Ray started or joined, the worker actors,
their end), :class:`RemoteEnv` (one env on a worker, a ``DomainEnv`` that ``ValidatedEnv`` wraps) and
:class:`ClusterDomain` (the run's domain whose ``make_env`` makes remote envs; prompts and everything else
stay the driver's domain's). The auction, credit, branches and the turn engine stay on the driver.

Faults: a worker whose process dies (kill -9) is restarted by Ray (``max_restarts``) with no envs. Each
:class:`RemoteEnv` keeps its episode's journal (the ``reset`` seed or the ``restore`` snapshot, then every
step's action and role); a call that finds its worker dead or its env lost waits for the restarted worker
and replays the journal there (envs are deterministic given the seed and the actions: the DomainEnv
contract), then makes the call again. The episode itself lives on the driver, so nothing is counted twice.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any

from loguru import logger

from swarm_runtime.cluster.actors import RESTART_WAIT_S, ActorGone, ActorGroup
from swarm_runtime.cluster.env_worker import LOST, EnvWorker, Raised
from swarm_runtime.cluster.ray_helpers import bundle_nodes

#: Replays of one call before giving up (a worker that dies on every replay is not transient).
MAX_REPLAYS = 5
#: Restarts Ray gives each worker actor.
MAX_RESTARTS = 8


class EnvCluster(ActorGroup):
    """``n`` env worker actors for one domain and task (envs spread over them in turn), on the Ray at ``address``
    (None: a local one). ``placement``: a :class:`~swarm_runtime.cluster.placement.PlacementSpec` reserved here before
    a worker starts (each worker in its bundle of the ``envs`` group); ``options``: more Ray options of every worker
    (``cluster.resources.env``: its node)."""

    def __init__(
        self,
        domain: str,
        task,
        n: int,
        address: str | None = None,
        num_cpus: int | None = None,
        plugins: tuple[str, ...] = (),
        placement=None,
        placement_wait_s: float = 30.0,
        options: dict | None = None,
        restart_wait_s: float = RESTART_WAIT_S,
    ):
        from omegaconf import DictConfig, OmegaConf

        t0 = time.perf_counter()
        super().__init__(address, num_cpus, restart_wait_s=restart_wait_s, max_restarts=MAX_RESTARTS)
        self.placement = placement  #: a :class:`~swarm_runtime.cluster.placement.PlacementSpec`, or None
        self.options = dict(options or {})  #: more Ray options of every worker (``cluster.resources.env``: its node)
        if placement is not None:  # every group reserved before a worker starts (and before anything trains)
            self._reserve(placement, placement_wait_s)
        plain = OmegaConf.to_container(task, resolve=True) if isinstance(task, DictConfig) else dict(task)
        self.workers = self._make_workers(domain, plain, tuple(plugins), int(n))
        self.pids = self.pids_of(self.workers)
        self._ids = itertools.count()
        self._next = itertools.count()
        self._queues: dict[int, list] = {w: [] for w in range(len(self.workers))}  #: calls not sent yet, in order
        self._lock = threading.Lock()  #: the queues (a rollout played ahead runs on a thread of its own)
        self._unread: list = []  #: refs of calls whose answer nobody waits for (release_many), read at close
        self.calls = 0  #: remote calls sent (the driver's round trips: benchmarks/env_workers.py)
        self.replayed = 0  #: envs replayed on a restarted worker
        self.restarts = 0  #: worker deaths seen
        self.start_s = time.perf_counter() - t0  #: seconds to start (or join) Ray and the workers
        logger.info("env workers on Ray: {} (pids {}), up in {:.1f} s", n, ", ".join(map(str, self.pids)), self.start_s)
        # where each runs (its node's id, address and custom resources), as the worker itself says
        logger.info("env workers on nodes: {}", ", ".join(self.nodes_of(self.workers)))
        self._check_env()

    def _reserve(self, placement, wait_s: float) -> None:
        """Reserve ``placement``'s groups (a Ray this started is stopped again when they cannot be)."""
        from swarm_runtime.cluster.placement import reserve

        try:
            reserve(placement, wait_s)
        except BaseException:
            self.stop_ray()
            raise
        logger.info("placement bundles on nodes: {}", bundle_nodes(self.ray, placement))

    def _check_env(self) -> None:
        """Ask each worker whether the run's forwarded variables (:mod:`.actor_env`) have the run's values there
        (digests only); one that differs is logged as a warning naming the variable and the worker, never a value."""
        from swarm_runtime.cluster import actor_env

        wanted = [n for n in actor_env.names() if n in os.environ]
        if not wanted:
            return
        answers = self.ray.get([w.env_digests.remote(wanted) for w in self.workers], timeout=self.restart_wait_s)
        bad = {i: actor_env.differing(a) for i, a in enumerate(answers)}
        bad = {i: names for i, names in bad.items() if names}
        if not bad:
            logger.info("env workers have the run's {}", ", ".join(wanted))
        for i, names in bad.items():
            logger.warning(
                "env worker {} (pid {}) does not have the run's {}: it reads its node's environment there",
                i,
                self.pids[i],
                ", ".join(names),
            )

    def _make_workers(self, domain: str, task: dict, plugins: tuple[str, ...], n: int) -> list:
        """The ``n`` worker actors (each an :class:`EnvWorker` for ``domain`` and ``task``), in the placement's
        env groups when there is one."""
        from swarm_runtime.cluster import placement as P

        def options(i: int) -> dict:
            if self.placement is None:
                return self.options
            return {**self.options, **P.actor_options(self.placement, P.ENVS, "env", i)}

        return [self.spawn(EnvWorker, domain, task, plugins, options=options(i)) for i in range(n)]

    def submit(self, w: int, method: str, *args):
        """Send ``method(*args)`` to worker ``w`` after every call queued before it; its object ref."""
        with self._lock:
            self._flush()
            self.calls += 1
            return getattr(self.workers[w], method).remote(*args)

    def queue_step(self, env: RemoteEnv, action: str, role: str | None) -> None:
        """A step sent with its worker's other queued steps, in one ``step_many`` call, at the next flush."""
        with self._lock:
            self._queues[env.w].append(("step", env, action, role))

    def queue_release(self, w: int, eid: int) -> None:
        with self._lock:
            self._queues[w].append(("release", eid))

    def flush(self) -> None:
        """Send every queued call now (each worker's runs of steps as one ``step_many``, of releases as one
        ``release_many``), the workers at once."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        for w, queue in self._queues.items():
            while queue:
                kind = queue[0][0]
                run = list(itertools.takewhile(lambda op, kind=kind: op[0] == kind, queue))
                del queue[: len(run)]
                self.calls += 1
                if kind == "release":
                    self._unread.append(self.workers[w].release_many.remote([op[1] for op in run]))
                    continue
                batch = _Batch(self.ray, self.workers[w].step_many.remote([(e.eid, a, r) for _, e, a, r in run]))
                for i, (_, env, _, _) in enumerate(run):
                    env.pending = (env.pending[0], env.pending[1], batch, i)
        if len(self._unread) > 256:
            self._read_unread()

    def _read_unread(self) -> None:
        refs, self._unread = self._unread, []
        try:  # bounded: a worker waiting for a node to hold it again answers nothing
            self.ray.get(refs, timeout=self.restart_wait_s)
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError):
            pass  # a worker that died had lost those envs anyway

    def new_env(self, kind: str = "env") -> RemoteEnv:
        """A remote env on the next worker in turn; ``kind="concurrent"``: the domain's ``concurrent_env``."""
        cls = RemoteConcurrentEnv if kind == "concurrent" else RemoteEnv
        return cls(self, next(self._next) % len(self.workers), next(self._ids))

    def wait_alive(self, w: int) -> None:
        """Block until worker ``w`` answers again (restarted by Ray), at most :attr:`restart_wait_s`."""
        old = self.pids[w]

        def gone(why: str) -> ActorGone:
            return ActorGone(f"env worker {w} (pid {old}) was lost: its process died and {why}")

        pid = self.await_restart(self.workers[w], old, same_ok=True, gone=gone)
        if pid != old:
            self.log_restart(f"env worker {w}", old, pid, self.workers[w])
            self.pids[w] = pid
            self.restarts += 1

    def _close(self) -> dict:
        """Close every worker's envs (``DomainEnv.close()``), end the actors, release the placement and stop Ray if it
        was started here. Returns the workers' stats (envs made, in use, free) as they were."""
        ray = self.ray
        try:
            try:  # bounded: a worker lost with its node (waiting for a node to hold it again) answers nothing
                stats = ray.get(
                    [self.submit(w, "shutdown") for w in range(len(self.workers))], timeout=self.restart_wait_s
                )
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                logger.warning(
                    "env workers: not every worker answered at the end ({}); the envs of a lost one went with it",
                    type(exc).__name__,
                )
                stats = []
            self._read_unread()
        finally:
            self.kill(self.workers)
            from swarm_runtime.cluster.placement import release

            release(self.placement)
            self.stop_ray()
        return {"workers": stats, "replayed": self.replayed, "restarts": self.restarts}


class _Batch:
    """One ``step_many`` call: its answers, read once for all of its envs."""

    def __init__(self, ray, ref):
        self.ray, self.ref, self.answers = ray, ref, None

    def answer(self, i: int) -> tuple:
        if self.answers is None:
            try:
                self.answers = self.ray.get(self.ref)
            except self.ray.exceptions.RayActorError:
                self.answers = ()  # the worker died: each env replays (RemoteEnv._get)
        answer = self.answers[i] if i < len(self.answers) else LOST
        if isinstance(answer, Raised):  # this env's step raised on the worker: its error, as in process
            raise answer.exc
        return answer


class RemoteEnv:
    """One env on worker ``w`` of ``cluster`` (a duck-typed ``DomainEnv``). The observation comes back with
    every reset, step and restore and the metrics with every step, and are kept here. :meth:`prefetch_step`
    queues a step; the first :meth:`step` that collects one sends every queued step, one ``step_many`` call per
    worker (a turn's steps across envs and workers run at once); :meth:`step` with the same action collects it.
    An env is opened on its worker with its episode's start (``begin``), and given back with the worker's next
    call (``release_many``)."""

    kind = "env"  #: what the worker makes: ``domain.make_env``

    def __init__(self, cluster: EnvCluster, w: int, eid: int):
        self.cluster, self.w, self.eid = cluster, w, eid
        self.start: tuple | None = None  #: ("reset", seed) or ("restore", snapshot): where the journal starts
        self.steps: list[tuple[str, str | None]] = []  #: the steps since, replayed after a worker died
        self.obs: str | None = None
        self._metrics: dict | None = None  #: the env's metrics after the last step (None: ask the worker)
        self.pending = None  #: (action, role, _Batch or None while queued, index) of a prefetched step
        self.released = False

    def _ref(self, method: str, *args):
        return self.cluster.submit(self.w, method, self.eid, *args)

    def _get(self, method: str, *args, answer=None):
        """``method``'s value on this env (``answer``: a function giving the ``(ok, value)`` of a call already
        sent); a lost env or a dead worker: replay the journal on the restarted worker and call again."""
        sent = [answer]

        def attempt() -> tuple:
            first, sent[0] = sent[0], None
            return first() if first is not None else self.cluster.ray.get(self._ref(method, *args))

        def exhausted() -> RuntimeError:
            return RuntimeError(
                f"env worker {self.w}: {method} on env {self.eid} failed {MAX_REPLAYS} times in a row "
                "(its process keeps dying)"
            )

        return self.cluster.dispatch(attempt, self._replay, MAX_REPLAYS, exhausted)[0]

    def _replay(self) -> None:
        """Wait for the worker, make the env again there and bring it back to where the journal says."""

        def attempt() -> tuple:
            self.cluster.wait_alive(self.w)
            if self.start is None:
                calls = [self._ref("open", self.kind)]
            else:
                calls = [self._ref("begin", self.kind, *self.start)]
                calls += [self._ref("step", a, r) for a, r in self.steps]
            return all(ok for ok, _ in self.cluster.ray.get(calls)), None

        def exhausted() -> RuntimeError:
            return RuntimeError(f"env worker {self.w}: env {self.eid} could not be replayed")

        self.cluster.dispatch(attempt, lambda: None, MAX_REPLAYS, exhausted)
        self.cluster.replayed += 1
        logger.warning(
            "env worker {}: env {} replayed on the restarted worker ({} from {} + {} steps)",
            self.w,
            self.eid,
            "nothing" if self.start is None else self.start[0],
            "" if self.start is None else self.start[1] if self.start[0] == "reset" else "a snapshot",
            len(self.steps),
        )

    def reset(self, seed: int) -> str:
        self.start, self.steps, self._metrics = ("reset", int(seed)), [], None
        self.obs = self._get("begin", self.kind, "reset", int(seed))
        return self.obs

    def prefetch_step(self, action: str, role: str | None = None) -> None:
        self.pending = (action, role, None, None)
        self.cluster.queue_step(self, action, role)

    def step(self, action: str, role: str | None = None):
        answer = None
        if self.pending is not None:
            a, r, batch, i = self.pending
            if batch is None:  # still queued: send every worker's queued steps now
                self.cluster.flush()
                a, r, batch, i = self.pending
            self.pending = None
            if (a, r) != (action, role):
                raise RuntimeError(f"RemoteEnv.step({action!r}, {role!r}) after prefetch_step({a!r}, {r!r})")
            answer = lambda: batch.answer(i)  # noqa: E731
        res, self._metrics = self._get("step", action, role, answer=answer)
        self.steps.append((action, role))
        self.obs = res.observation
        return res

    def observation(self) -> str:
        return self.obs if self.obs is not None else self._get("observation")

    def snapshot(self) -> Any:
        return self._get("snapshot")

    def restore(self, snapshot: Any) -> None:
        self.start, self.steps, self._metrics = ("restore", snapshot), [], None
        self.obs = self._get("begin", self.kind, "restore", snapshot)

    def metrics(self) -> dict[str, float]:
        if self._metrics is None:
            self._metrics = self._get("metrics")
        return dict(self._metrics)

    def expert_action(self):
        return self._get("call", "expert_action")

    def close(self) -> None:
        """Give the env back to its worker's pool (the worker closes it at the end of the run); sent with the
        worker's next call."""
        if not self.released and not self.cluster.closed:
            self.released = True
            self.cluster.queue_release(self.w, self.eid)


class RemoteConcurrentEnv(RemoteEnv):
    """A remote ``domain.concurrent_env`` (``algo=rlcr``): also the methods the concurrent loop asks."""

    kind = "concurrent"

    def progress(self) -> float:
        return self._get("call", "progress")

    def action_seconds(self, action: str, role: str | None = None) -> float:
        return self._get("call", "action_seconds", action, role)

    def concurrent_expert(self, agent: str, busy: dict[str, str]) -> str | None:
        return self._get("call", "concurrent_expert", agent, dict(busy))


class ClusterDomain:
    """The run's domain, with envs made on the cluster's workers; every other attribute is the domain's."""

    def __init__(self, domain, cluster: EnvCluster):
        self._domain, self.cluster = domain, cluster

    def make_env(self, task) -> RemoteEnv:
        return self.cluster.new_env()

    def concurrent_env(self, task) -> RemoteConcurrentEnv:
        return self.cluster.new_env("concurrent")

    def __getattr__(self, name: str):
        return getattr(self._domain, name)
