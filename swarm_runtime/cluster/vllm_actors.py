"""Engine sampler actors on Ray (docs/reference/cluster.md, "An engine server per base", and docs/reference/engine.md):
``cluster.samplers=ray`` with ``rollout.engine=vllm`` runs, per base, a Ray actor that starts the base's vLLM
server ON ITS NODE and keeps it; the trainer's ``OpenAISampler`` speaks HTTP to that server as it does to a
server it started itself.

- :class:`EngineWorker` (the actor's body, plain Python): finds the base on its node (:mod:`.base_shipping`: the
  Hugging Face folder the trainer wrote, used in place when its node sees the same files there, else this run's copy
  in a folder of its node, ``$TMPDIR/swarm-engine-<id>/<base>``, written once from Ray's object store), starts
  :class:`~swarm_runtime.sampling.vllm_server.VLLMServer` on the node's address and holds an
  :class:`~swarm_runtime.sampling.sync.AdapterSync` on it, which loads each version from a path of that node.
  A constructor never raises: a failed start is answered by :meth:`EngineWorker.hello` (one line to the trainer).
- :class:`EngineActor` (the trainer's side): starts the actor, ships the base, and makes every call. Adapter sync:
  the trainer exports each changed adapter (its folder's files, as bytes in the object store) and the actor writes
  and loads them (:class:`RemoteAdapters`, the trainer's stand-in for the actor's ``AdapterSync``).

Faults. A server that dies: the actor restarts it (``VLLMServer.restart``) and reloads every version it holds (the
trainer's ``recover`` hook, called when requests go unanswered, goes through :meth:`EngineWorker.ensure`). An actor
that dies (kill -9): its server gets SIGTERM (``VLLMServer(die_with_parent=True)``) and Ray restarts the actor
(``cluster.sampler_restarts``); the constructor stops any server a dead actor left all the same (its process group,
from the pid file in the node's folder), writes the base again and starts a new server.
Every call names the actor process the trainer knows; a restarted one answers "lost" until the trainer has loaded
it with the last synced versions (the files it keeps in the object store) and taken its URL; the interrupted
requests are sent again (same version names, same seeds). Closing stops the server, then the actor.

Keys. The actor's server listens on its node's address when it is not the trainer's node, where anyone who reaches
that address could sample from it or load and unload adapters. So it demands a bearer key on every route but
``GET /health`` (vLLM's API key, given through ``VLLM_API_KEY``: never on its command line or in a log; vLLM guards
only ``/v1`` and a few more prefixes with it, our middleware the rest, the SageMaker ``/adapters`` and
``/invocations`` among them: :mod:`swarm_runtime.sampling.vllm_server`, docs/reference/engine.md, "Keys"): a
random one the trainer makes per run and base (:class:`EngineActor`), sent by the trainer's sampling client and by the
actor's adapter sync. On the trainer's node too (loopback): one rule, and other users of a shared node are kept out as
well.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

from loguru import logger

from swarm_runtime.cluster.actors import ActorGroup
from swarm_runtime.cluster.base_shipping import fetch_base, place_base, read_folder, ship_base, unship, write_folder
from swarm_runtime.sampling.http import EngineGone

#: Tries of one call (a first try and its retries after the actor restarted).
MAX_TRIES = 4
#: Seconds a restarted actor may take, beyond the server's own ``rollout.vllm.startup_timeout_s``, to answer.
RESTART_SLACK_S = 120.0
LOST = ("lost", None)


class EngineSamplerError(EngineGone):
    """The engine sampler actor is gone for good (its restarts are spent, or it keeps dying): a replica of
    ``cluster.sampler_replicas`` is dropped, the last one stops the run."""


def stop_stale(pidfile: Path, base: Path) -> bool:
    """Stop the server a dead actor left (its process group), when ``pidfile`` names a live process whose command
    names ``base`` (never another process that took the pid); True when one was stopped."""
    try:
        pid = int(Path(pidfile).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (OSError, ValueError):
        return False
    if str(base) not in cmdline:
        return False
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return True
        end = time.monotonic() + 20.0
        while time.monotonic() < end and _running(pid):
            time.sleep(0.2)
        if not _running(pid):
            return True
    return True


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie whose parent has not reaped it is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


class _Shipped:
    """The learner the actor's ``AdapterSync`` exports from: each model's shipped version and its files."""

    def __init__(self, shipped: dict):
        self.shipped = shipped  #: model -> (version, files)

    def version(self, model: str) -> int:
        return int(self.shipped[model][0])

    def export(self, model: str, folder: Path) -> Path:
        return write_folder(self.shipped[model][1], folder)


class EngineWorker:
    """The actor's body (module docstring). ``base``: the base's files; ``python``: vLLM's Python on this node;
    ``settings``: :class:`VLLMServer`'s keyword arguments but the base, log and host; ``keep``: versions kept per
    model; ``token``: the folder's name on the node (the same for a restarted actor); ``name``: the base's name;
    ``host``: the address the server listens on when the actor is on the trainer's node ``driver_node`` (Ray's node
    id; ``rollout.vllm.host``, 127.0.0.1 by default), else the node's address as Ray knows it; ``api_key``: the bearer
    key the server demands (the trainer's, for the whole run: a restarted actor's server takes the same)."""

    def __init__(
        self,
        base: dict,
        python: str,
        settings: dict,
        keep: int,
        token: str,
        name: str,
        timeout_s: float = 120.0,
        host: str = "127.0.0.1",
        driver_node: str | None = None,
        api_key: str | None = None,
    ):
        self.host, self.driver_node, self.api_key = host, driver_node, api_key
        self.error: str | None = None
        self.base_placed: str | None = None  #: how the base came to this node (:func:`place_base`)
        self.server = self.adapters = None
        self.folder = Path(tempfile.gettempdir()) / f"swarm-engine-{token}" / name
        try:
            self._start(base, python, settings, keep, timeout_s)
        except Exception as exc:  # answered by hello(): a constructor that raised would leave Ray's traceback
            self.error = f"{type(exc).__name__}: {exc}"

    def _start(self, base: dict, python: str, settings: dict, keep: int, timeout_s: float) -> None:
        import ray

        from swarm_runtime.sampling.http import Client
        from swarm_runtime.sampling.sync import AdapterSync
        from swarm_runtime.sampling.vllm_server import VLLMServer, check_cpu_shape, probe_python

        self.folder.mkdir(parents=True, exist_ok=True)
        model = self.folder / "base"  # a link to the base's folder: the server's command names this actor's folder
        if stop_stale(self.folder / "server.pid", model):
            logger.warning("stopped the vLLM server a dead sampler actor left on {}", model)
        where, self.base_placed = place_base(base, self.folder, fetch_base)
        _unlink(model)
        model.symlink_to(where, target_is_directory=True)
        if probe_python(python).get("cpu"):
            check_cpu_shape(model)
        here = ray.get_runtime_context().get_node_id() == self.driver_node
        host = self.host if here else ray.util.get_node_ip_address()
        self.server = VLLMServer(
            python, model, self.folder / "vllm.log", host=host, die_with_parent=True, api_key=self.api_key, **settings
        )
        if int(settings.get("port", 0)):
            self.server._wait_port()  # a stale server's port is freed as its process group ends
        self.server.start()
        self._pidfile()
        self.client = Client(self.server.url, timeout=float(timeout_s), api_key=self.api_key)
        self.adapters = AdapterSync(self.client, self.folder / "adapters", keep=keep)

    def _pidfile(self) -> None:
        if self.server is not None and self.server.proc is not None:
            (self.folder / "server.pid").write_text(str(self.server.proc.pid))

    def hello(self) -> dict:
        """This actor's process, its server's URL and log, how long the server took to start, the versions it
        holds, or the one line that says why it has no server."""
        s = self.server
        return {
            "pid": os.getpid(),
            "error": self.error,
            "url": s.url if s is not None and self.error is None else None,
            "log": str(self.folder / "vllm.log"),
            "started_s": getattr(s, "started_s", None),
            "base": self.base_placed,
            "gpus": _gpu_ids(),
            "loaded": {m: list(v) for m, v in (self.adapters.loaded if self.adapters else {}).items()},
        }

    def _mine(self, pid: int) -> bool:
        return int(pid) == os.getpid() and self.error is None

    def sync(self, pid: int, shipped: dict):
        """Write and load each shipped ``model -> (version, ref of its files)`` the server lacks; the versions held."""
        if not self._mine(pid):
            return LOST
        import ray

        refs = {m: ref for m, (_, ref) in shipped.items()}
        files = dict(zip(refs, ray.get(list(refs.values()))))
        learner = _Shipped({m: (v, files[m]) for m, (v, _) in shipped.items()})
        from swarm_runtime.sampling.http import Unreachable

        try:
            self.adapters.sync(learner, list(shipped))
        except Unreachable:  # the server died under the sync: back with the versions it had, then the rest
            if not self._revive():
                return "down", self.hello()["loaded"]  # it did not come back: gone (RemoteAdapters.sync)
            self.adapters.sync(learner, list(shipped))
        return "ok", self.hello()["loaded"]

    def restore(self, pid: int, kept: dict):
        """A restarted actor: load every kept version (``model -> [(version, ref of its files)]``, oldest first), as
        the dead one held them. Answers only to the trainer that adopted this process (``pid``: its own)."""
        if int(pid) != os.getpid():
            return LOST
        for m, versions in kept.items():
            for v, ref in versions:
                out = self.sync(pid, {m: (v, ref)})
                if out[0] != "ok":
                    return out
        return "ok", self.hello()["loaded"]

    def ensure(self, pid: int):
        """The server answers (again): restarted on its port and every version reloaded when it died. ``("ok",
        hello)``, or ``("down", hello)`` when it did not come back."""
        if not self._mine(pid):
            return LOST
        return ("ok" if self._revive() else "down"), self.hello()

    def _revive(self) -> bool:
        """True when the server answers, restarted on its port (every version held loaded again) if it died."""
        if self.server.alive() and self.client.wait_ready(5.0):
            return True
        if not self.server.restart():
            return False
        self._pidfile()
        self.adapters.reload()
        return True

    def stop(self) -> bool:
        """Stop the server; the link to its base, this node's copies of the base and the adapter folder are removed
        (the log stays, beside the pid file's place; a base used in place is the trainer's, left alone)."""
        if self.server is not None:
            self.server.stop()
        (self.folder / "server.pid").unlink(missing_ok=True)
        _unlink(self.folder / "base")
        for path in [self.folder / "adapters", *self.folder.glob("base-*"), *self.folder.glob(".base-*")]:
            _unlink(path)
        return True


def _gpu_ids() -> list[str]:
    """The GPU ids Ray gave this actor (none: it asked for no GPU); Ray sets ``CUDA_VISIBLE_DEVICES`` to them in
    the actor's environment, which its vLLM server inherits (``VLLMServer.env`` copies it)."""
    import ray

    return [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]


def _unlink(path: Path) -> None:
    """Remove ``path``: a link (never what it points to), a file or a folder; nothing if it is not there."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


class EngineActor(ActorGroup):
    """The trainer's side of one base's engine actor (module docstring): what ``OpenAISampler``'s factory holds as
    its ``server`` (``url``, ``log``, ``started_s``, ``stop``). ``base_folder``: the base the trainer wrote;
    ``shipped``: its :func:`ship_base` record when several actors share it (the replicas of a base: its caller ends
    it), else this actor ships the base and ends it at close; ``options``: Ray actor options (placement) over the
    defaults. ``on_url(url)`` is called when a restarted actor's server answers on another URL."""

    on_ray = True  #: a server on Ray (``engine_sampler`` given one speaks to it through :class:`RemoteAdapters`)

    def __init__(
        self,
        base_folder: Path,
        python: str,
        settings: dict,
        keep: int,
        name: str = "default",
        address: str | None = None,
        num_cpus: int | None = None,
        max_restarts: int = 8,
        options: dict | None = None,
        timeout_s: float = 120.0,
        host: str = "127.0.0.1",
        shipped: dict | None = None,
    ):
        t0 = time.perf_counter()
        super().__init__(address, num_cpus, max_restarts=max_restarts)
        self.name = name
        self.startup_timeout_s = float(settings.get("startup_timeout_s", 600.0))
        #: the base's path, content hash and the actor that puts its files in the object store when first asked, for
        #: the whole run (a restarted actor's constructor asks it, on a node that has neither the trainer's folder
        #: nor its own copy)
        self._own_base = shipped is None
        self._base = ship_base(base_folder) if shipped is None else shipped
        #: the bearer key of the actor's server (module docstring, "Keys"): made here for this run, never logged
        self.api_key = secrets.token_urlsafe(32)
        here = self.ray.get_runtime_context().get_node_id()
        token = uuid.uuid4().hex[:12]
        worker_args = (self._base, python, dict(settings), int(keep), token, name, float(timeout_s), host, here)
        self.actor = self.spawn(EngineWorker, *worker_args, self.api_key, options=options)
        self.kept: dict[str, list] = {}  #: model -> [(version, ref of its files)] the server holds, oldest first
        self.on_url = None
        self.restarts = self.calls = 0
        hello = self._hello(self.startup_timeout_s + RESTART_SLACK_S)
        self._take(hello)
        self.start_s = time.perf_counter() - t0
        logger.info(
            "vLLM sampler actor on Ray ({}): pid {}, server {} up in {:.1f} s ({:.1f} s in all; base {}; GPUs {}; "
            "log on its node: {})",
            name,
            self.pid,
            self.url,
            hello["started_s"] or 0.0,
            self.start_s,
            hello["base"],
            ",".join(self.gpus) or "none",
            self.log,
        )

    # ------------------------------------------------------------------ what the sampler's factory reads
    def _take(self, hello: dict, restarted: bool = False) -> None:
        """Take the actor's process and server; one that has no server is closed, and the error says why: at the
        first start a plain one (the run stops: a setting to fix), after a restart (``restarted``) an
        :class:`EngineSamplerError` (gone for good: a replica is dropped, the last one stops the run, resumable)."""
        if hello["error"]:
            self.close()
            from swarm_runtime.config.errors import ConfigError
            from swarm_runtime.sampling.http import EngineError

            why = hello["error"].split(": ", 1)[-1].strip().splitlines()[0]
            if restarted:
                raise EngineSamplerError(
                    f"the restarted sampler actor of base {self.name!r} could not start its vLLM server: {why}; "
                    "the run can go on from its last checkpoint with resume=true"
                )
            kind = ConfigError if hello["error"].startswith("ConfigError") else EngineError
            raise kind(
                f"the sampler actor of base {self.name!r} could not start its vLLM server: "
                f"{hello['error'].split(': ', 1)[-1]}"
            )
        self.pid, self.url, self.log, self.started_s = hello["pid"], hello["url"], hello["log"], hello["started_s"]
        self.gpus = hello.get("gpus") or []  #: the GPU ids Ray gave the actor (its server's CUDA_VISIBLE_DEVICES)

    def _hello(self, wait_s: float) -> dict:
        """The actor's :meth:`EngineWorker.hello` once it answers (its constructor started the server), from any
        process (:meth:`_adopt` compares it with the one the trainer knows)."""

        def gone(why: str) -> EngineSamplerError:
            return EngineSamplerError(
                f"the engine sampler actor of base {self.name!r} did not answer: {why}; the run can go on from its "
                "last checkpoint with resume=true"
            )

        return self.await_restart(
            self.actor,
            None,
            wait_s,
            gone=gone,
            same_ok=True,
            check=self._alive,
            call=lambda actor: actor.hello.remote(),
            pid_of=lambda hello: hello["pid"],
            try_s=None,
        )

    def _alive(self) -> None:
        """Raise :class:`EngineSamplerError` if Ray will not restart the actor again (its restarts are spent)."""
        if self.spent(self.actor):
            raise EngineSamplerError(
                f"the engine sampler actor of base {self.name!r} died and its restarts are spent "
                f"(cluster.sampler_restarts={self.max_restarts}); the run can go on from its last checkpoint "
                "with resume=true"
            )

    def call(self, method: str, *args):
        """``method`` on the actor with the process the trainer knows; a restarted actor is adopted first (loaded
        with the kept versions, its URL taken) and the call made again."""

        def attempt() -> tuple:
            status, value = self.ray.get(getattr(self.actor, method).remote(self.pid, *args))
            return status != "lost", (status, value)

        def exhausted() -> EngineSamplerError:
            return EngineSamplerError(
                f"the engine sampler actor of base {self.name!r} failed {MAX_TRIES} calls in a row (its process keeps "
                "dying); the run can go on from its last checkpoint with resume=true"
            )

        answer, _ = self.dispatch(attempt, self._adopt, MAX_TRIES, exhausted)
        self.calls += 1
        return answer

    def _adopt(self) -> None:
        """A restarted actor (a new process and server): load it with every kept version and take its URL."""
        hello = self._hello(self.startup_timeout_s + RESTART_SLACK_S)
        if hello["pid"] == self.pid:
            return  # the same process: a call that failed on the way (it answers again)
        old, old_url = self.pid, self.url
        self._take(hello, restarted=True)
        ray = self.ray
        try:
            status, _ = ray.get(self.actor.restore.remote(self.pid, self.kept))
        except ray.exceptions.RayActorError:
            return  # it died again: the next try adopts its successor
        if status != "ok":
            return
        self.restarts += 1
        logger.warning(
            "sampler actor of base {} restarted: pid {} -> {}, server {} -> {}; base {}; {} versions loaded again",
            self.name,
            old,
            self.pid,
            old_url,
            self.url,
            hello["base"],
            sum(len(v) for v in self.kept.values()),
        )
        if self.url != old_url and self.on_url is not None:
            self.on_url(self.url)

    def ensure(self) -> bool:
        """The trainer's ``recover``: the server answers again (restarted by the actor, or by a restarted actor)."""
        status, _ = self.call("ensure")
        return status == "ok"

    def alive(self) -> bool:
        return not self.closed

    def stop(self) -> None:
        self.close()

    def _close(self) -> dict:
        ray = self.ray
        if ray.is_initialized():
            try:
                ray.get(self.actor.stop.remote(), timeout=60)
            except Exception:  # already dead (its server is stopped by its successor's constructor, or by nobody)
                pass
            self.kill([self.actor])
            if self._own_base:
                unship(self._base)
            self.stop_ray()
        stats = {"calls": self.calls, "restarts": self.restarts}
        logger.info("vLLM sampler actor of base {} closed: {}", self.name, stats)
        return stats


class RemoteAdapters:
    """The trainer's stand-in for the actor's :class:`~swarm_runtime.sampling.sync.AdapterSync` (what
    ``OpenAISampler`` asks: ``version``, ``served``, ``sync``): each changed model's adapter is exported here, its
    files put in the object store and loaded by the actor; the versions the server holds come back. The files of
    every version held stay in the object store (``engine.kept``): a restarted actor is loaded with them. Replicas of
    one base share each version's object (``learner.put``: :class:`~swarm_runtime.sampling.replicas.ExportOnce`)."""

    def __init__(self, engine: EngineActor, folder: Path):
        self.engine, self.folder = engine, Path(folder)
        self.loaded: dict[str, list[int]] = {}

    def version(self, model: str) -> int:
        return self.loaded[model][-1]

    def served(self, model: str) -> str:
        from swarm_runtime.sampling.http import EngineError
        from swarm_runtime.sampling.sync import version_name

        if model not in self.loaded:
            raise EngineError(f"no version of {model!r} is loaded on {self.engine.url}; sync it first")
        return version_name(model, self.loaded[model][-1])

    def sync(self, learner, models) -> list[str]:
        from swarm_runtime.sampling.sync import version_name

        ray = self.engine.ray
        shipped, refs = {}, {}
        for m in models:
            v = int(learner.version(m))
            if self.loaded.get(m) and self.loaded[m][-1] == v:
                continue
            if hasattr(learner, "put"):  # replicas of a base: one object for all (sampling/replicas.py, ExportOnce)
                v, refs[m] = learner.put(m, ray)
            else:
                with tempfile.TemporaryDirectory(prefix="swarm-export-") as tmp:
                    files = read_folder(learner.export(m, Path(tmp) / version_name(m, v)))
                refs[m] = ray.put(files)
            shipped[m] = (v, refs[m])
        if not shipped:
            return []
        status, loaded = self.engine.call("sync", shipped)
        if status != "ok":  # its server died under the sync and did not come back
            raise EngineSamplerError(
                f"the vLLM server of the sampler actor of base {self.engine.name!r} died while loading "
                f"{', '.join(sorted(shipped))} and did not come back; the run can go on from its last checkpoint "
                "with resume=true"
            )
        self._held(loaded, {(m, v): ref for m, (v, ref) in shipped.items()})
        return [version_name(m, v) for m, (v, _) in shipped.items()]

    def _held(self, loaded: dict, new: dict) -> None:
        """Take the actor's versions held; keep the files of exactly those."""
        old = {(m, v): ref for m, vs in self.engine.kept.items() for v, ref in vs}
        old.update(new)
        self.loaded = {m: list(vs) for m, vs in loaded.items()}
        self.engine.kept = {m: [(v, old[(m, v)]) for v in vs if (m, v) in old] for m, vs in self.loaded.items()}
