"""Ray helpers every actor family shares, and nothing else of the cluster package: Ray imported (or the one line
naming the extra), started or joined (:func:`connect`: a local Ray kept on loopback, a head on this machine reached
by a loopback address, this process's SIGTERM handler kept across ``ray.init``), and where an actor runs (its node,
as the logs and the multi-node tests read it) or whether Ray will bring it back (:func:`actor_state`).

Ray is imported inside the functions only: a local Ray must be set to loopback before its first import
(:func:`connect`). The only module of the package it reads is :mod:`swarm_runtime.cluster.actor_env` (the run's
variables a joined cluster's actors get), itself a leaf.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import sys
import threading

from loguru import logger

from swarm_runtime.config.errors import ConfigError

#: Seconds a TCP connect to ``cluster.address`` may take before it counts as unreachable.
CONNECT_TIMEOUT_S = 5.0
RAY_EXTRA = "pip install 'swarm-runtime[ray]'"


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
    (then the caller's ``close`` stops it: :class:`~swarm_runtime.cluster.actors.ActorGroup`). ``key``: the setting errors name.

    A local Ray stays on loopback: Ray 2.60 would replace the 127.0.0.1 asked for with the machine's routable
    address (and listen on every interface) unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (Ray's switch for a
    one-machine Ray) is in the environment when Ray is imported; then it listens on and advertises 127.0.0.1 only
    (measured). It is set here, before the first import (a value the user set is kept; docs/reference/cluster.md,
    "Env workers", Loopback); so is it for a head on this machine that listens on loopback only
    (:func:`_keep_loopback`)."""
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


def actor_state(actor) -> str | None:
    """An actor's state in Ray's control store (``ALIVE``, ``RESTARTING``, ``DEAD``), None if unknown."""
    try:
        from ray._private.state import state as global_state

        info = global_state.actor_table(actor._actor_id.hex())
    except Exception:
        return None
    return (info or {}).get("State") if isinstance(info, dict) else None
