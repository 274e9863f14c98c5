"""The sampler a run's ``rollout.engine`` asks for (docs/reference/engine.md)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.core.protocols import Sampler
from swarm_runtime.sampling.local import LocalLearner, LocalSampler


def make_sampler(cfg, learner: LocalLearner, run_dir: Path | None, options: dict | None = None, placed=None) -> Sampler:
    """``rollout.engine=local``: in process, over the learner's own modules, or (``cluster.samplers=ray``) in a
    sampler actor holding a copy of them (:mod:`swarm_runtime.cluster.samplers`; ``options``: its Ray actor
    options); ``openai`` / ``vllm``: an inference server (started here for ``vllm``; with ``cluster.samplers=ray``
    by a sampler actor per base, on its node: :mod:`swarm_runtime.cluster.vllm_actors`, whose Ray options are
    ``placed(base, its models)`` when given, else ``options``), each model's weights loaded as a named version.
    ``rollout.engine``'s values are config/validation.py's to check.

    An engine sampler is made once the base is frozen (after the cold start's SFT of a config-built
    base): the server holds that base for the whole run; only the adapters are synced."""
    engine = str(cfg.rollout.engine) if cfg.get("rollout") is not None else "local"
    if engine == "local":
        return local_sampler(cfg, learner, options)
    opts = _engine_options(cfg, engine, options, placed)
    replicas = sampler_replicas(cfg)

    def base_sampler(view, name: str, i: int, models: list[str]) -> Sampler:
        """The sampler of base ``name`` (the ``i``-th of ``model.bases``): one server, or its replicas."""
        if replicas is None:
            return engine_sampler(cfg, view, run_dir, base=name, port_offset=i, options=opts(name, models))

        def each(j: int) -> dict | None:
            return opts(name, models, j)

        return replicated_sampler(cfg, view, run_dir, replicas, base=name, base_index=i, options=each)

    by_base = models_by_base(learner)
    if len(by_base) == 1:
        ((name, models),) = by_base.items()
        return base_sampler(learner, name, 0, models)
    samplers: dict[str, Sampler] = {}
    try:  # one server per base (model.bases), each with the adapters of the roles on it (or replicas of it)
        for i, (name, models) in enumerate(by_base.items()):
            samplers[name] = base_sampler(BaseLearner(learner, models), name, i, models)
    except BaseException:
        for s in samplers.values():
            s.close()
        raise
    return RoutedSampler(samplers, {m: name for name, models in by_base.items() for m in models})


def local_sampler(cfg, learner: LocalLearner, options: dict | None = None) -> Sampler:
    """``rollout.engine=local``: a :class:`LocalSampler` over the learner's policies, or with ``cluster.samplers=ray``
    a :class:`~swarm_runtime.cluster.samplers.RaySampler` (its Ray actor ``options``) holding a copy of them."""
    if not samplers_on_ray(cfg):
        return LocalSampler(learner.policies, learner)
    from swarm_runtime.cluster import restart_wait_s
    from swarm_runtime.cluster.samplers import RaySampler

    c = cfg.cluster
    return RaySampler(
        learner,
        LocalSampler,
        c.address,
        c.get("num_cpus"),
        int(c.get("sampler_restarts", 8)),
        options=options,
        restart_wait_s=restart_wait_s(cfg),
    )


def _engine_options(cfg, engine: str, options: dict | None, placed):
    """``opts(base, models, replica=0)``: the Ray options of engine actor ``replica`` of base ``base``: its placement
    bundle (``placed(base, models, replica)``), or ``options``, with the GPUs its server uses (placement.py,
    ``engine_actor_options``); ``options`` as they are off Ray or without ``vllm``."""

    def opts(name: str, models: list[str], replica: int = 0) -> dict | None:
        if not samplers_on_ray(cfg) or engine != "vllm":
            return options
        from swarm_runtime.cluster.placement import engine_actor_options

        return engine_actor_options(cfg, placed(name, models, replica) if placed is not None else options)

    return opts


def sampler_replicas(cfg) -> int | str | None:
    """``cluster.sampler_replicas`` when it asks for more than one engine sampler per base (an int > 1, or
    ``per_node``: config/validation.py allows it only with ``cluster.samplers=ray`` and ``rollout.engine=vllm``);
    None for one (the sampler of one server per base, as without the key)."""
    c = cfg.get("cluster")
    n = c.get("sampler_replicas", 1) if c is not None else 1
    return None if n == 1 or not samplers_on_ray(cfg) else n


def replicated_sampler(
    cfg, learner, run_dir: Path | None, replicas, base: str = "default", base_index: int = 0, options=None
):
    """A :class:`~swarm_runtime.sampling.replicas.ReplicatedSampler` over ``replicas`` engine sampler actors of one
    base (an int, or ``per_node``: one per alive Ray node that can hold one): the base written and shipped once
    for all (:func:`~swarm_runtime.cluster.vllm_actors.ship_base`), each actor's Ray options
    :func:`~swarm_runtime.cluster.placement.replica_options` of ``options`` (a dict, or ``options(j)``: replica
    ``j``'s, its own bundle of a placement); ``base_index``: the base's place in ``model.bases`` (a fixed
    ``rollout.vllm.port`` gives replica ``j`` of base ``i`` that port + ``i * n + j``)."""
    from loguru import logger

    from swarm_runtime.cluster.base_shipping import ship_base, unship
    from swarm_runtime.cluster.placement import replica_nodes, replica_options
    from swarm_runtime.cluster.ray_helpers import connect, import_ray
    from swarm_runtime.sampling.replicas import ReplicatedSampler

    c = cfg.cluster
    started = connect(c.address, c.get("num_cpus"))  # first: a local Ray is set to loopback before Ray is imported
    ray = import_ray()
    each = options if callable(options) else (lambda j: options)
    nodes: list = []
    if replicas == "per_node":
        o = each(0) or {}
        nodes = replica_nodes(ray.nodes(), float(o.get("num_gpus", 0) or 0), o.get("resources"))
        if not nodes:
            raise ConfigError("cluster.sampler_replicas=per_node: no alive Ray node can hold a sampler replica")
    n = len(nodes) if replicas == "per_node" else int(replicas)
    _, shared = _shared(learner)
    shipped = ship_base(write_base(shared, engine_folder(run_dir, base) / "base"))

    def release() -> None:  # what the replicas shared: the shipped base, and a Ray started here
        unship(shipped)
        if started:
            ray.shutdown()

    try:
        samplers = _replica_samplers(
            cfg,
            learner,
            run_dir,
            base,
            base_index * n,
            n,
            lambda j: replica_options(each(j), nodes[j] if nodes else None),
            shipped,
        )
    except BaseException:
        release()
        raise
    placed = not nodes and not isinstance(replica_options(each(0)).get("scheduling_strategy"), str)
    how = "one per node" if nodes else ("a placement bundle each" if placed else "Ray's SPREAD")
    logger.info("{} sampler replicas of base {} ({})", n, base, how)
    sampler = ReplicatedSampler(samplers, base, seed=int(cfg.get("seed", 0)))
    _close = sampler.close

    def close() -> None:
        if sampler.closed:
            return
        _close()
        release()

    sampler.close = close
    return sampler


def _replica_samplers(
    cfg, learner, run_dir: Path | None, base: str, first_port: int, n: int, options: Callable, shipped: dict
) -> list:
    """The engine samplers of a base's ``n`` replicas: their engine actors started together (replica ``j`` with the
    Ray options ``options(j)``, port offset ``first_port + j``), then each one's sampler made on its started actor.
    On a failure, what was made is closed."""
    from concurrent.futures import ThreadPoolExecutor

    samplers: list = []
    actors: list = [None] * n

    def start(j: int):
        actors[j] = start_engine_actor(cfg, learner, run_dir, base, first_port + j, options(j), shipped, j)

    try:
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="replica-start") as pool:
            for f in [pool.submit(start, j) for j in range(n)]:
                f.result()
        for j in range(n):
            samplers.append(engine_sampler(cfg, learner, run_dir, server=actors[j], base=base))
    except BaseException:
        for s in samplers:
            s.close()
        for a in actors[len(samplers) :]:
            if a is not None:
                a.close()
        raise
    return samplers


def models_by_base(learner) -> dict[str, list[str]]:
    """The learner's models grouped by their shared base (its name: ``default``, or a ``model.bases`` name)."""
    out: dict[str, list[str]] = {}
    for m, p in learner.policies.items():
        shared = getattr(p, "shared_base", None)
        out.setdefault(getattr(shared, "name", "default"), []).append(m)
    return out


class BaseLearner:
    """The learner's view of one base's models (what one base's server and its :class:`AdapterSync` see)."""

    def __init__(self, learner, models):
        self.inner = learner
        self.policies = {m: learner.policies[m] for m in models}

    def policy(self, model: str):
        return self.inner.policy(model)

    def models(self) -> list[str]:
        return list(self.policies)

    def version(self, model: str) -> int:
        return self.inner.version(model)

    def bump(self, models, version=None) -> None:
        self.inner.bump(models, version)

    def export(self, model: str, folder: Path) -> Path:
        return self.inner.export(model, folder)


class RoutedSampler:
    """Several bases (``model.bases``), one engine sampler each: every row goes to its model's base's sampler
    (one batch per base, the bases' batches in flight together), and the answers come back in the rows' order."""

    def __init__(self, samplers: dict, route: dict[str, str]):
        self.samplers, self.route = dict(samplers), dict(route)
        self.name = next(iter(self.samplers.values())).name
        self.server = next(iter(self.samplers.values())).server  #: the first base's (``servers``: every base's)
        self.servers = {b: s.server for b, s in self.samplers.items()}
        self.on_ray = any(getattr(s, "on_ray", False) for s in self.samplers.values())

    def _split(self, rows):
        parts: dict[str, list[int]] = {}
        for i, r in enumerate(rows):
            parts.setdefault(self.route[r.model], []).append(i)
        return parts

    def _call(self, method: str, rows) -> list:
        parts = self._split(rows)
        out: list = [None] * len(rows)
        if len(parts) == 1:
            ((base, idx),) = parts.items()
            return getattr(self.samplers[base], method)([rows[i] for i in idx])
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=len(parts), thread_name_prefix="base") as pool:
            futures = {
                b: pool.submit(getattr(self.samplers[b], method), [rows[i] for i in idx]) for b, idx in parts.items()
            }
            for b, idx in parts.items():
                for i, r in zip(idx, futures[b].result()):
                    out[i] = r
        return out

    def bid(self, rows):
        return self._call("bid", rows)

    def act(self, rows):
        return self._call("act", rows)

    def bid_levels(self, model: str):
        return self.samplers[self.route[model]].bid_levels(model)

    def version(self, model: str) -> int:
        return self.samplers[self.route[model]].version(model)

    def sync(self, learner, models) -> None:
        for b, s in self.samplers.items():
            mine = [m for m in models if self.route.get(m) == b]
            if mine:
                s.sync(learner, mine)

    def close(self) -> None:
        for s in self.samplers.values():
            s.close()


def _shared(learner: LocalLearner):
    first = next(iter(learner.policies.values()))
    shared = getattr(first, "shared_base", None)
    if shared is None:
        raise ConfigError(
            "rollout.engine=openai|vllm samples LoRA adapters on one base; valid: model.adapter=lora, "
            "or rollout.engine=local"
        )
    if any(getattr(p, "shared_base", None) is not shared for p in learner.policies.values()):
        raise ConfigError("rollout.engine=openai|vllm serves one base per server; every model must share it")
    return first, shared


def engine_folder(run_dir: Path | None, base: str = "default") -> Path:
    """``<run_dir>/engine`` (the base, the adapter versions, the server's log; ``engine/NAME`` for another base
    of ``model.bases``); a temporary folder without a run."""
    if run_dir is None:
        return Path(tempfile.mkdtemp(prefix="swarm-engine-"))
    from swarm_runtime.runs.runfiles import claim

    # in the run folder's manifest: overwrite=true deletes it with the run
    return claim(Path(run_dir) / "engine") / ("" if base == "default" else base)


def write_base(shared, folder: Path) -> Path:
    """The Hugging Face folder the server loads: the run's ``model.path`` when the base in memory is that
    checkpoint unchanged, else the in-memory base written once under ``folder`` (a config-built base
    after its SFT; a checkpoint whose vocabulary took the bid tokens). Sets ``shared.engine_fingerprint``."""
    from swarm_runtime.models.adapters import fingerprint

    vocab = int(shared.model.get_input_embeddings().weight.shape[0])
    src = Path(shared.source) if shared.source else None
    if (
        src is not None
        and (src / "config.json").exists()
        and int(json.loads((src / "config.json").read_text()).get("vocab_size", -1)) == vocab
    ):
        shared.engine_fingerprint = shared.source_fingerprint or fingerprint(src)
        return src
    shared.engine_fingerprint = shared.save_base(folder)
    return folder


def server_settings(cfg, n_models: int, port_offset: int = 0) -> dict:
    """:class:`~swarm_runtime.sampling.vllm_server.VLLMServer`'s keyword arguments from ``rollout.vllm.*`` (all but
    the base, the log and the host) for a server of ``n_models`` models' adapters: the ``port_offset``-th base's
    server asks ``rollout.vllm.port`` + that (a fixed port being one per server)."""
    from swarm_runtime.sampling.sync import lora_slots

    rank = int(cfg.model.lora.rank)  # one vLLM allows: config/validation.py
    v = cfg.rollout.vllm
    max_loras, max_cpu = lora_slots(n_models, int(cfg.rollout.max_staleness))
    return dict(
        port=int(v.port) + port_offset if int(v.port) else 0,
        max_lora_rank=rank,
        max_loras=max_loras,
        max_cpu_loras=max_cpu,
        dtype=str(v.dtype),
        args=list(v.get("args") or []),
        startup_timeout_s=float(v.startup_timeout_s),
    )


def start_vllm_server(cfg, learner: LocalLearner, run_dir: Path | None, base: str = "default", port_offset: int = 0):
    """Write the run's base (``base``: the learner's models' base, of ``model.bases``) and start a vLLM server on
    it (``rollout.vllm.*``: :func:`server_settings`); the started
    :class:`~swarm_runtime.sampling.vllm_server.VLLMServer`. Used by :func:`make_sampler` and by tests that need
    the server a run would start. The server demands a bearer key made here for it (docs/reference/engine.md,
    "Keys"; never logged or on its command line), which :func:`engine_sampler` sends (sampling and adapter sync)."""
    import secrets

    from swarm_runtime.sampling.vllm_server import VLLMServer, check_cpu_shape, probe_python, vllm_python

    v = cfg.rollout.vllm
    python = vllm_python(v.get("python"))
    info = probe_python(python)
    _, shared = _shared(learner)
    folder = engine_folder(run_dir, base)
    model = write_base(shared, folder / "base")
    if info.get("cpu"):
        check_cpu_shape(model)
    settings = server_settings(cfg, len(learner.models()), port_offset)
    key = secrets.token_urlsafe(32)
    server = VLLMServer(python, model, folder / "vllm.log", host=str(v.host), api_key=key, **settings).start()
    from loguru import logger

    logger.info("vLLM server at {} up in {:.1f} s (log: {})", server.url, server.started_s, server.log)
    return server


def start_engine_actor(
    cfg,
    learner: LocalLearner,
    run_dir: Path | None,
    base: str = "default",
    port_offset: int = 0,
    options=None,
    shipped: dict | None = None,
    replica: int | None = None,
):
    """``cluster.samplers=ray``: write the run's base as :func:`start_vllm_server` does, and start the base's engine
    actor (:class:`~swarm_runtime.cluster.vllm_actors.EngineActor`), which writes it again on its node and starts the
    vLLM server there (on ``rollout.vllm.host`` on the trainer's node, else on the node's address); ``options``:
    its Ray actor options (placement). ``shipped``: the base already written and shipped for all its replicas
    (:func:`replicated_sampler`; ``replica``: this one's index, in its name ``BASE#j``)."""
    from swarm_runtime.cluster.vllm_actors import EngineActor
    from swarm_runtime.sampling.vllm_server import vllm_python

    c, v = cfg.cluster, cfg.rollout.vllm
    _, shared = _shared(learner)
    if shipped is None:
        model = write_base(shared, engine_folder(run_dir, base) / "base")
    else:
        model = Path(shipped["path"])
    return EngineActor(
        model,
        vllm_python(v.get("python")),
        server_settings(cfg, len(learner.models()), port_offset),
        int(cfg.rollout.max_staleness) + 1,
        name=base if replica is None else f"{base}#{replica}",
        address=c.address,
        num_cpus=c.get("num_cpus"),
        max_restarts=int(c.get("sampler_restarts", 8)),
        options=options,
        timeout_s=float(cfg.rollout.timeout_s),
        host=str(v.host),
        shipped=shipped,
    )


def samplers_on_ray(cfg) -> bool:
    c = cfg.get("cluster")
    return c is not None and c.get("samplers", "local") == "ray"


def engine_sampler(
    cfg,
    learner: LocalLearner,
    run_dir: Path | None,
    server=None,
    base: str = "default",
    port_offset: int = 0,
    options: dict | None = None,
    shipped: dict | None = None,
    replica: int | None = None,
):
    """An :class:`~swarm_runtime.sampling.openai.OpenAISampler` on ``rollout.url`` (``openai``; base ``base``
    of ``model.bases``: ``rollout.urls.NAME``) or on a vLLM server the run starts (``vllm``; ``server``: one
    already started by :func:`start_vllm_server`, or an engine actor started for it, which it then owns; with
    ``cluster.samplers=ray``, one a sampler actor starts on its node: :func:`start_engine_actor`, ``options`` its
    Ray options, ``shipped`` and ``replica`` its base shipped for every replica and its index). The server's base
    is checked against the run's, every model's current version loaded; closing the sampler stops a server it
    started. The URLs and the LoRA rank are config/validation.py's to check."""
    from swarm_runtime.sampling.http import Client
    from swarm_runtime.sampling.openai import OpenAISampler

    r = cfg.rollout
    first, shared = _shared(learner)
    folder = engine_folder(run_dir, base)
    if str(r.engine) == "vllm":
        end = _vllm_endpoint(cfg, learner, run_dir, server, base, port_offset, options, shipped, replica)
    else:
        end = _openai_endpoint(r, shared, base, server)
    key = _api_key(r, end)
    client = Client(end.url, timeout=float(r.timeout_s), api_key=key)
    try:
        _check_base(client, first, int(r.retries), end.describe)
        adapters = _load_adapters(r, client, end, learner, folder)
    except BaseException:
        if end.owned:
            end.server.stop()
        raise
    sampler = OpenAISampler(
        client,
        learner.policies,
        adapters,
        concurrency=int(r.concurrency),
        retries=int(r.retries),
        seed=int(cfg.get("seed", 0)),
        recover=_recovery(end, client, adapters) if end.server is not None else None,
        describe=end.describe,
    )
    sampler.name = str(r.engine)
    sampler.server = end.server
    sampler.on_ray = end.on_ray  #: closed before the run's Ray stops (learn/mpt.py)
    _tie_to_server(sampler, end, float(r.timeout_s), key)
    return sampler


@dataclass
class _Endpoint:
    """The server an engine sampler speaks to: its ``url`` and how messages name it (``describe``); ``server``
    (None: one at ``rollout.url`` that the run does not run), ``owned`` (the sampler stops it when closed) and
    ``on_ray`` (a sampler actor's server: an :class:`~swarm_runtime.cluster.vllm_actors.EngineActor`)."""

    url: str
    describe: str
    server: Any = None
    owned: bool = False
    on_ray: bool = False


def _vllm_endpoint(cfg, learner, run_dir, server, base, port_offset, options, shipped, replica) -> _Endpoint:
    """``rollout.engine=vllm``: ``server`` when given (an engine actor's is then the sampler's own), else the one
    started here: by a sampler actor on its node (``cluster.samplers=ray``) or in this process."""
    owned = on_ray = False
    if server is None and samplers_on_ray(cfg):
        server = start_engine_actor(cfg, learner, run_dir, base, port_offset, options, shipped, replica)
        owned = on_ray = True
    elif getattr(server, "on_ray", False):  # an engine actor started for this sampler (a replica's): its own
        owned = on_ray = True
    elif server is None:
        server, owned = start_vllm_server(cfg, learner, run_dir, base, port_offset), True
    where = "the vLLM server of the sampler actor" if on_ray else "the vLLM server"
    return _Endpoint(server.url, f"{where} at {server.url} (log: {server.log})", server, owned, on_ray)


def _openai_endpoint(r, shared, base: str, server=None) -> _Endpoint:
    """``rollout.engine=openai``: the server at ``rollout.url`` (the default base) or ``rollout.urls.NAME`` (base
    ``NAME``), ``server`` when its process is known (to restart it: tests); a base loaded from a checkpoint is
    taken to be the server's as it is."""
    if shared.source is not None and getattr(shared, "engine_fingerprint", None) is None:
        shared.engine_fingerprint = shared.source_fingerprint
    if base == "default":
        return _Endpoint(str(r.url), f"rollout.url={r.url}", server)
    url = (r.get("urls") or {}).get(base)
    return _Endpoint(str(url), f"rollout.urls.{base}={url}", server)


def _api_key(r, end: _Endpoint) -> str | None:
    """The bearer key the sampler sends: its server's own (one started with a key: cluster/vllm_actors.py,
    "Keys"), else ``$rollout.api_key_env``, checked against the URL it would go to."""
    key = os.environ.get(str(r.api_key_env)) if r.get("api_key_env") else None
    if getattr(end.server, "api_key", None):
        return end.server.api_key
    if key:  # a rollout.url a run folder from elsewhere saved gets no key unless the command line gives it
        from swarm_runtime.config.secrets import check_endpoint

        check_endpoint(end.url, f"the key in ${r.api_key_env}")
    return key


def _check_base(client, first, retries: int, describe: str) -> None:
    """Check the server's base against the run's, retrying (backing off) while the server does not answer."""
    from swarm_runtime.sampling.http import EngineError, NotOpenAI, Unreachable
    from swarm_runtime.sampling.sync import check_base

    for attempt in range(retries + 1):
        try:
            check_base(client, first)
            return
        except NotOpenAI as exc:  # named by the setting that holds the URL
            raise NotOpenAI(str(exc).replace(f"the server at {client.url}", describe)) from None
        except Unreachable as exc:
            if attempt == retries:
                raise EngineError(
                    f"{describe} does not answer after {attempt} retries ({exc}); start the server, "
                    "or give rollout.url of one that runs"
                ) from None
            time.sleep(min(0.5 * 2**attempt, 4.0))


def _load_adapters(r, client, end: _Endpoint, learner, folder: Path):
    """Every model's current adapter loaded on the server (an engine actor's: exported here, written and loaded by
    the actor on its node); a server this run did not just start loses the adapters it holds that are not ours."""
    from swarm_runtime.sampling.sync import AdapterSync

    if end.on_ray:
        from swarm_runtime.cluster.vllm_actors import RemoteAdapters

        adapters = RemoteAdapters(end.server, folder / "adapters")
    else:
        adapters = AdapterSync(client, folder / "adapters", keep=int(r.max_staleness) + 1)
    adapters.sync(learner, learner.models())
    if not end.on_ray:  # an actor's server is one it just started: nothing of an earlier run is on it
        adapters.drop_strays(learner.models())
    return adapters


def _recovery(end: _Endpoint, client, adapters) -> Callable[[], bool]:
    """``recover()``: bring the server back; True when it answers (again), with every version loaded."""
    server = end.server

    def recover() -> bool:
        if end.on_ray:  # the actor restarts its server, or Ray the actor (then its new server's URL is taken)
            return server.ensure()
        if server.alive() and client.wait_ready(5.0):
            return True  # a passing failure: it answers
        if not server.restart():
            return False
        adapters.reload()
        return True

    return recover


def _tie_to_server(sampler, end: _Endpoint, timeout_s: float, key: str | None) -> None:
    """An engine actor's sampler follows its server to the new URL of a restarted actor; a sampler that owns its
    server stops it when closed."""
    from swarm_runtime.sampling.http import Client

    server = end.server
    if end.on_ray:

        def moved(new_url: str) -> None:  # a restarted actor's server
            sampler.client = Client(new_url, timeout=timeout_s, api_key=key)
            sampler.describe = f"the vLLM server of the sampler actor at {new_url} (log: {server.log})"

        server.on_url = moved
    if end.owned:
        _close = sampler.close

        def close() -> None:
            _close()
            server.stop()

        sampler.close = close


# ---------------------------------------------------------------- checks before anything trains
def preflight(cfg) -> None:
    """Before anything trains (``swarm run``, ahead of the SFT cold start): each server ``rollout.engine=openai`` samples
    on answers ``GET /v1/models`` as an OpenAI-compatible server (:func:`check_server`), and the Python
    ``rollout.engine=vllm`` would start its servers with has vLLM
    (:func:`~swarm_runtime.sampling.vllm_server.probe_python`; a sampler actor's, on its own node, is checked there).
    Each failure is one line naming the setting; ``local``: nothing to check."""
    r = cfg.get("rollout")
    engine = str(r.get("engine", "local")) if r is not None else "local"
    if engine == "vllm" and not samplers_on_ray(cfg):
        from swarm_runtime.sampling.vllm_server import probe_python, vllm_python

        probe_python(vllm_python(r.vllm.get("python")))
    elif engine == "openai":
        timeout = min(float(r.timeout_s), 30.0)
        urls = {"rollout.url": r.get("url"), **{f"rollout.urls.{b}": u for b, u in (r.get("urls") or {}).items()}}
        key = os.environ.get(str(r.api_key_env)) if r.get("api_key_env") else None
        for name, url in urls.items():
            if url:
                check_server(str(url), name, timeout, key, r.get("api_key_env"))


def check_server(url: str, name: str, timeout: float, key: str | None = None, key_env: str | None = None) -> None:
    """``GET /v1/models`` of the server at ``url`` (the setting ``name`` holds it) answers an OpenAI model list within
    ``timeout`` seconds; else one line naming ``name=url``, what came back (nothing, an HTML page, other JSON, an
    error status) and what was expected. ``key`` (from ``$key_env``) is sent only where
    ``secrets.check_endpoint`` allows."""
    from swarm_runtime.sampling.http import Client, EngineError, HTTPStatusError, Unreachable, model_list

    if key:
        from swarm_runtime.config.secrets import check_endpoint

        check_endpoint(url, f"the key in ${key_env}")
    where = f"{name}={url}"
    try:
        model_list(Client(url, timeout=timeout, api_key=key).get("/v1/models"), where)
    except Unreachable as exc:
        raise Unreachable(
            f"{where} does not answer GET /v1/models within {timeout:g} s ({str(exc).split(': ', 1)[-1]}); start the "
            f"server, or give {name} of an OpenAI-compatible completions server that runs"
        ) from None
    except HTTPStatusError as exc:
        raise EngineError(
            f"{where} answered GET /v1/models with HTTP {exc.status} ({exc.detail}); expected an OpenAI-compatible "
            f"completions server's model list" + (f" (is ${key_env} its key?)" if exc.status in (401, 403) else "")
        ) from None
