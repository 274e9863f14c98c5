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

import contextlib
import importlib.util
import itertools
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from loguru import logger

from swarm_runtime.cluster.env_worker import LOST, EnvWorker, Raised
from swarm_runtime.config.errors import ConfigError

#: How long a dead actor (env worker, sampler, learner) is waited for by default (Ray restarts its process):
#: ``cluster.restart_wait_s``'s default (config/load.py). A run passes its own value down to each actor's wrapper
#: (:class:`EnvCluster`, ``RaySampler``, ``LearnerGroup``), which passes it to each wait.
RESTART_WAIT_S = 120.0
#: Replays of one call before giving up (a worker that dies on every replay is not transient).
MAX_REPLAYS = 5
#: Seconds a TCP connect to ``cluster.address`` may take before it counts as unreachable.
CONNECT_TIMEOUT_S = 5.0
#: Restarts Ray gives each worker actor.
MAX_RESTARTS = 8
RAY_EXTRA = "pip install 'swarm-runtime[ray]'"


class ActorGone(ConfigError):
    """An actor died and did not come back within ``cluster.restart_wait_s`` (its node lost, say): the run stops with one
    line (a :class:`ConfigError` for the command line's sake: exit 2, no traceback), saying how to resume."""


def node_here() -> str:
    """Inside an actor: its Ray node, ``<id, 8 hex> at <the node's address> (<custom resources of the node>)``:
    what the logs and the multi-node tests read."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    return node_label(node, next((n for n in ray.nodes() if n.get("NodeID") == node), {}))


def node_label(node: str, info: dict) -> str:
    """``<id, 8 hex> at <address> (<custom resources>)`` of node ``node`` (``info``: its entry of ``ray.nodes()``)."""
    res = info.get("Resources", {})
    own = sorted(k for k in res if k not in ("CPU", "GPU", "memory", "object_store_memory") and ":" not in k)
    return f"{node[:8]} at {info.get('NodeManagerAddress', '?')} ({', '.join(own) or 'no custom resources'})"


def bundle_nodes(ray, spec) -> str:
    """Where Ray placed each bundle of ``spec``'s reserved placement groups (``placement_group_table``), in bundle
    order: ``Smith: <node_label>; envs: <node_label>, <node_label>`` (what the multi-node tests compare with the
    nodes the actors say they run on)."""
    from ray.util import placement_group_table

    info = {n["NodeID"]: n for n in ray.nodes()}
    parts = []
    for name, pg in spec.pgs.items():
        where = placement_group_table(pg).get("bundles_to_node_id") or {}
        parts.append(f"{name}: " + ", ".join(node_label(where[i], info.get(where[i], {})) for i in sorted(where)))
    return "; ".join(parts)


def nodes_of(ray, actors, timeout_s: float) -> list[str]:
    """:func:`node_here` of each actor (its ``node`` method), in order; within ``timeout_s``."""
    return ray.get([a.node.remote() for a in actors], timeout=timeout_s)


def node_of(ray, actor, timeout_s: float) -> str:
    """:func:`node_here` of one actor for a log line: what Ray's error was instead when it does not answer."""
    try:
        return nodes_of(ray, [actor], timeout_s)[0]
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
        return f"unknown ({type(exc).__name__})"


def lost_node(actor) -> str:
    """``; its node <id> is dead`` when Ray's control store says the node that held ``actor`` is dead (else "")."""
    try:
        import ray
        from ray._private.state import state as global_state

        info = global_state.actor_table(actor._actor_id.hex()) or {}
        node = (info.get("Address") or {}).get("NodeID") or info.get("NodeID")
        dead = {n["NodeID"] for n in ray.nodes() if not n.get("Alive")}
    except Exception:  # a courtesy: the error stands without it
        return ""
    return f"; its node {node[:8]} is dead" if node and node in dead else ""


#: Ray's switch for a one-machine Ray (ray/_private/ray_constants.py: ``ENABLE_RAY_CLUSTER``, read at import)
LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


#: Addresses Ray 2.60 replaces with this machine's routable address when clusters are on (services.py:
#: ``resolve_ip_for_localhost``)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def routable_ip() -> str:
    """This machine's address on its default route (a UDP socket "connected" to a public address: no packet is
    sent), as Ray picks a node's address when clusters are on; 127.0.0.1 where there is no route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("8.8.8.8", 80))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _refused(host: str, port) -> Exception | None:
    """Why a TCP connect to ``host:port`` failed within :data:`CONNECT_TIMEOUT_S` (None: something answers)."""
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        return exc
    return None


def _keep_loopback(key: str, address: str, host: str, port: int) -> None:
    """Joining a head on this machine by a loopback address: Ray (clusters on, the default on Linux) dials this
    machine's routable address instead, and where the head listens on loopback only (started with
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, as the runs of this project start theirs) ``ray.init`` retries without
    end (measured: 10 min, "Failed to connect to GCS at address 192.0.2.2:PORT"). So where the routable address does
    not answer, keep the loopback one: clusters off before Ray is imported; if Ray is already imported with clusters
    on, or the user turned them on, say so in one line instead of hanging."""
    there = routable_ip()
    if there == host or _refused(there, port) is None:
        return  # the head listens on every interface (ray start's default): Ray's rewrite reaches it
    clusters = os.environ.get(LOCAL_ONLY)
    if "ray" not in sys.modules and clusters is None:
        os.environ[LOCAL_ONLY] = "0"  # Ray keeps 127.0.0.1 (and this driver's node address is loopback too)
        return
    if "ray" in sys.modules:
        from ray._private import ray_constants

        on = bool(ray_constants.ENABLE_RAY_CLUSTER)
    else:
        on = str(clusters).lower() in ("1", "true")
    if on:
        raise ConfigError(
            f"{key}={address!r}: the head there listens on loopback only, and Ray would dial this "
            f"machine's address {there}:{port} instead (nothing answers there); start this command with "
            f"{LOCAL_ONLY}=0, or start the head without it (it then listens on every interface)"
        )


def import_ray():
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"cluster.kind=ray needs Ray, which is not installed: {RAY_EXTRA}") from exc
    return ray


def connect(address: str | None, num_cpus: int | None = None, key: str = "cluster.address") -> bool:
    """Join the Ray cluster at ``address``, or (None) start a local one. Returns whether this call started Ray
    (then :meth:`EnvCluster.close` stops it). ``key``: the setting errors name.

    A local Ray stays on loopback: Ray 2.60 would replace the 127.0.0.1 asked for with the machine's routable
    address (and listen on every interface) unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (Ray's switch for a
    one-machine Ray) is in the environment when Ray is imported; then it listens on and advertises 127.0.0.1 only
    (measured). It is set here, before the first import (a value the user set is kept; docs/distributed.md,
    "Loopback"); so is it for a head on this machine that listens on loopback only (:func:`_keep_loopback`)."""
    if "ray" in sys.modules and import_ray().is_initialized():
        return False
    if address is not None:
        if importlib.util.find_spec("ray") is None:
            import_ray()  # the message naming the extra, before any probe
        _probe(key, address)  # before Ray is imported: a head on loopback may need Ray's clusters off
    elif "ray" not in sys.modules:
        os.environ.setdefault(LOCAL_ONLY, "0")
    ray = import_ray()
    opts = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    if address is None:
        # "local": a new Ray, never the cluster $RAY_ADDRESS names or the last `ray start` on this machine left in
        # /tmp/ray/ray_current_cluster (ray.init() without an address joins that one: measured, Ray 2.60)
        with _own_sigterm():
            ray.init(address="local", num_cpus=num_cpus, _node_ip_address="127.0.0.1", **opts)
        return True
    from swarm_runtime.cluster import actor_env

    env = actor_env.runtime_env()  # the actors start with the raylet's environment, not this process's
    try:
        with _own_sigterm():
            ray.init(address=address, runtime_env=env or None, **opts)
    except Exception as exc:  # something listens there, but not a Ray head, or a head this process may not join
        first = str(exc).splitlines()[0] if str(exc) else ""
        auth = ""
        if os.environ.get("RAY_AUTH_MODE") != "token":
            # measured with Ray 2.60: `ray start --head` turns token authentication on, and a driver without
            # RAY_AUTH_MODE=token is refused (ray.init says only that it failed to connect)
            auth = (
                "; if the head was started with `ray start --head`, it requires token authentication: run with "
                "RAY_AUTH_MODE=token and the head's token in ~/.ray/auth_token (or RAY_AUTH_TOKEN_PATH)"
            )
        raise ConfigError(_unreachable(key, address, f"{type(exc).__name__}: {first}") + auth) from exc
    logger.info("joined the Ray cluster at {}; the run's variables its actors get: {}", address, actor_env.listed())
    return True


@contextlib.contextmanager
def _own_sigterm():
    """Keep this process's SIGTERM handler across ``ray.init``. Ray 2.60's ``ray.init`` sets a Python handler of its
    own (``sys.exit(15)``, ray/_private/worker.py) and its core worker then installs absl's failure signal handler
    for SIGTERM too (``*** SIGTERM received ***``, a native backtrace, then the process ends with SIGABRT once
    Python's exit has run); the CLI's handler for ``swarm run`` and ``swarm experiment``
    (:func:`~swarm_runtime.config.errors.stop_on_sigterm`), when it was there before, is set again after it, which replaces
    both (``signal.signal`` is a ``sigaction``); any other command keeps what Ray installs, as before. Ray documents
    no option of ``ray.init`` for this; ``RAY_DISABLE_FAILURE_SIGNAL_HANDLER=1`` would drop absl's handler for
    SIGSEGV and the rest too, in every worker the run's own Ray starts (they inherit the environment)."""
    from swarm_runtime.config.errors import stops_on_sigterm

    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and stops_on_sigterm(before):
            signal.signal(signal.SIGTERM, before)


def _unreachable(key: str, address: str, why: str) -> str:
    return (
        f"{key}={address!r}: no Ray cluster answers there ({why}); give the address of a running cluster's head "
        "(ray start --head prints it), or null to start a local Ray"
    )


def _probe(key: str, address: str) -> None:
    """A TCP connect to ``address`` (ray.init waits minutes for an address where nothing listens; this says it at
    once), then :func:`_keep_loopback` for a loopback address."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    exc = _refused(host, port)
    if exc is not None:
        raise ConfigError(_unreachable(key, address, f"{type(exc).__name__}: {exc}")) from exc
    if host in LOOPBACK_HOSTS:
        _keep_loopback(key, address, host, int(port))


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


class EnvCluster:
    """``n`` env worker actors for one domain and task (envs spread over them in turn)."""

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

        from swarm_runtime.cluster import placement as P

        t0 = time.perf_counter()
        self.started = connect(address, num_cpus)  # first: a local Ray is set to loopback before Ray is imported
        self.ray = import_ray()
        self.placement = placement  #: a :class:`~swarm_runtime.cluster.placement.PlacementSpec`, or None
        self.options = dict(options or {})  #: more Ray options of every worker (``cluster.resources.env``: its node)
        self.restart_wait_s = float(restart_wait_s)  #: how long a dead worker is waited for (cluster.restart_wait_s)
        if placement is not None:  # every group reserved before a worker starts (and before anything trains)
            try:
                P.reserve(placement, placement_wait_s)
            except BaseException:
                if self.started:
                    self.ray.shutdown()
                raise
            logger.info("placement bundles on nodes: {}", bundle_nodes(self.ray, placement))
        plain = OmegaConf.to_container(task, resolve=True) if isinstance(task, DictConfig) else dict(task)
        self.workers = self._make_workers(domain, plain, tuple(plugins), int(n))
        self.pids = self.ray.get([w.pid.remote() for w in self.workers])
        self._ids = itertools.count()
        self._next = itertools.count()
        self._queues: dict[int, list] = {w: [] for w in range(len(self.workers))}  #: calls not sent yet, in order
        self._lock = threading.Lock()  #: the queues (a rollout played ahead runs on a thread of its own)
        self._unread: list = []  #: refs of calls whose answer nobody waits for (release_many), read at close
        self.calls = 0  #: remote calls sent (the driver's round trips: benchmarks/env_workers.py)
        self.replayed = 0  #: envs replayed on a restarted worker
        self.restarts = 0  #: worker deaths seen
        self.closed = False
        self.start_s = time.perf_counter() - t0  #: seconds to start (or join) Ray and the workers
        logger.info("env workers on Ray: {} (pids {}), up in {:.1f} s", n, ", ".join(map(str, self.pids)), self.start_s)
        # where each runs (its node's id, address and custom resources), as the worker itself says
        logger.info("env workers on nodes: {}", ", ".join(nodes_of(self.ray, self.workers, self.restart_wait_s)))
        self._check_env()

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

        actor = self.ray.remote(EnvWorker)
        base = dict(num_cpus=0, max_restarts=MAX_RESTARTS, max_task_retries=0, **self.options)

        def options(i: int) -> dict:
            return base if self.placement is None else {**base, **P.actor_options(self.placement, P.ENVS, "env", i)}

        return [actor.options(**options(i)).remote(domain, task, plugins) for i in range(n)]

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
        try:
            pid = wait_restarted(self.ray, self.workers[w], self.pids[w], self.restart_wait_s, same_ok=True)
        except TimeoutError as exc:
            raise ActorGone(f"env worker {w} (pid {self.pids[w]}) was lost: its process died and {exc}") from exc
        if pid != self.pids[w]:
            where = node_of(self.ray, self.workers[w], self.restart_wait_s)
            logger.warning("env worker {} restarted: pid {} -> {} on node {}", w, self.pids[w], pid, where)
            self.pids[w] = pid
            self.restarts += 1

    def close(self) -> dict:
        """Close every worker's envs (``DomainEnv.close()``), end the actors, and stop Ray if it was started
        here. Returns the workers' stats (envs made, in use, free) as they were."""
        if self.closed:
            return {}
        self.closed = True
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
            for w in self.workers:
                ray.kill(w, no_restart=True)
            from swarm_runtime.cluster.placement import release

            release(self.placement)
            if self.started:
                ray.shutdown()
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
        ray = self.cluster.ray
        for _ in range(MAX_REPLAYS):
            try:
                ok, value = answer() if answer is not None else ray.get(self._ref(method, *args))
            except ray.exceptions.RayActorError:
                ok = False
            answer = None
            if ok:
                return value
            self._replay()
        raise RuntimeError(
            f"env worker {self.w}: {method} on env {self.eid} failed {MAX_REPLAYS} times in a row "
            "(its process keeps dying)"
        )

    def _replay(self) -> None:
        """Wait for the worker, make the env again there and bring it back to where the journal says."""
        ray = self.cluster.ray
        for _ in range(MAX_REPLAYS):
            self.cluster.wait_alive(self.w)
            try:
                if self.start is None:
                    calls = [self._ref("open", self.kind)]
                else:
                    calls = [self._ref("begin", self.kind, *self.start)]
                    calls += [self._ref("step", a, r) for a, r in self.steps]
                if all(ok for ok, _ in ray.get(calls)):
                    break
            except ray.exceptions.RayActorError:
                continue
        else:
            raise RuntimeError(f"env worker {self.w}: env {self.eid} could not be replayed")
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
