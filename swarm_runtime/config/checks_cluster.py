"""Cross-key checks of where the work runs: ``cluster.*`` (env workers, samplers and learners on Ray, placement
groups, node resources, forwarded variables) and ``train.*`` (the learner engine), ``fn(cfg, registry)`` as in
:mod:`swarm_runtime.config.checks`.

:func:`check_engine_wired` is what ``swarm run`` can train with; it is a check of the config like the others, so
``swarm config`` (``--plan`` included) refuses the same engines ``swarm run`` does.
"""

from __future__ import annotations

import re

from omegaconf import DictConfig

from swarm_runtime.config.errors import ConfigError


def cluster_kind(cfg: DictConfig, registry) -> None:
    """``cluster.kind=ray`` (Ray installed: :func:`needs_ray`): ``algo=rlcr`` steps its envs on the workers, but its
    learner and sampler stay in process (``cluster.learners`` / ``cluster.samplers`` ``ray`` are refused, not
    ignored)."""
    c = cfg.get("cluster")
    if c is None or c.kind != "ray":
        return
    for key in ("learners", "samplers"):
        if cfg.algo.name == "rlcr" and c.get(key, "local") == "ray":
            raise ConfigError(
                f"cluster.{key}=ray: algo.name=rlcr keeps its shared policy's {key[:-1]} in process (its envs go "
                f"to the env workers); valid with rlcr: cluster.{key}=local"
            )


def _needs_ray_cluster(c: DictConfig, key: str, why: str, off: str = "local") -> None:
    """``cluster.<key>`` (set to something other than ``off``) runs on the run's Ray: refuse it unless
    ``cluster.kind=ray``, saying ``why`` and both ways on."""
    if c.kind != "ray":
        raise ConfigError(
            f"cluster.{key}={c.get(key)} needs cluster.kind=ray ({why}), not cluster.kind={c.kind}; valid: "
            f"cluster.kind=ray, or cluster.{key}={off}"
        )


def cluster_samplers(cfg: DictConfig, registry) -> None:
    """``cluster.samplers=ray``: on the Ray of ``cluster.kind=ray``, sampling in process policies
    (``rollout.engine=local``) or on a vLLM server a sampler actor starts (``vllm``), in an algorithm whose episodes take their turns through the sampler."""
    c = cfg.get("cluster")
    if c is None or c.get("samplers", "local") != "ray":
        return
    _needs_ray_cluster(c, "samplers", "the sampler actor runs on the run's Ray")
    engine = str(cfg.rollout.engine) if cfg.get("rollout") is not None else "local"
    if engine == "openai":
        raise ConfigError(
            "cluster.samplers=ray with rollout.engine=openai: the server at rollout.url is one you started, not the "
            "run's to place on a node; valid: rollout.engine=vllm (a sampler actor starts the server on its node) or "
            "local with cluster.samplers=ray, or cluster.samplers=local"
        )


def cluster_sampler_replicas(cfg: DictConfig, registry) -> None:
    """``cluster.sampler_replicas`` other than 1: several engine sampler actors per base, which only
    ``cluster.samplers=ray`` with ``rollout.engine=vllm`` starts (refused elsewhere, not ignored)."""
    c = cfg.get("cluster")
    if c is None or c.get("sampler_replicas", 1) == 1:
        return
    engine = str(cfg.rollout.engine) if cfg.get("rollout") is not None else "local"
    if c.get("samplers", "local") != "ray" or engine != "vllm":
        raise ConfigError(
            f"cluster.sampler_replicas={c.sampler_replicas} needs cluster.samplers=ray and rollout.engine=vllm "
            f"(each replica is a sampler actor with its own vLLM server), not cluster.samplers={c.get('samplers')} "
            f"and rollout.engine={engine}; valid: those two, or cluster.sampler_replicas=1"
        )
    if c.sampler_replicas == "per_node" and c.get("placement", "none") != "none":
        raise ConfigError(
            f"cluster.sampler_replicas=per_node with cluster.placement={c.placement}: a placement reserves one "
            "sampler bundle per replica before Ray is asked, and the number of nodes is Ray's; valid: "
            "cluster.placement=none, or an integer number of replicas"
        )


def cluster_learners(cfg: DictConfig, registry) -> None:
    """``cluster.learners=ray``: on the Ray of ``cluster.kind=ray`` (with ``rollout.max_staleness`` > 0 too: the
    actors train while the trainer plays ahead on the engine's weights; a rewind drops the rollouts played ahead:
    ``MPTTrainer._rewind``)."""
    c = cfg.get("cluster")
    if c is None or c.get("learners", "local") != "ray":
        return
    _needs_ray_cluster(c, "learners", "the learners run on the run's Ray")


#: A name an environment variable may have (POSIX: letters, digits, underscores, not starting with a digit).
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def cluster_env_vars(cfg: DictConfig, registry) -> None:
    """``cluster.env_vars`` (a list: the typed config refuses anything else): environment variable names, each set
    in this environment (its value is what the actors get: a name not set would silently reach them as nothing)."""
    import os

    c = cfg.get("cluster")
    given = c.get("env_vars") if c is not None else None
    if not given:
        return
    for name in given:
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise ConfigError(
                f"cluster.env_vars: {name!r} is not an environment variable name (letters, digits, underscores)"
            )
        if name not in os.environ:
            raise ConfigError(
                f"cluster.env_vars: {name} is not set in this environment; set it (export {name}=...) or drop it"
            )


def train_engine(cfg: DictConfig, registry) -> None:
    """``train.shards`` > 1 needs a sharding engine; a placement (Ray placement groups) needs ``cluster.kind=ray``."""
    t, c = cfg.get("train"), cfg.get("cluster")
    if t is not None and t.engine == "local" and int(t.shards) > 1:
        raise ConfigError(
            f"train.shards={t.shards} shards a learner group over processes, which train.engine=local does not "
            "(one process); valid: train.engine=fsdp or deepspeed, or train.shards=1"
        )
    if c is not None and c.get("placement", "none") != "none":
        _needs_ray_cluster(c, "placement", "it reserves Ray placement groups", off="none")


def cluster_resources(cfg: DictConfig, registry) -> None:
    """``cluster.resources`` pins actors to the nodes that hold a custom resource: on Ray (``cluster.kind=ray``), and not
    with a placement (a placement group's bundles hold CPUs and GPUs only: an actor in one asking another resource
    would never start)."""
    c = cfg.get("cluster")
    if c is None or not c.get("resources"):
        return
    _needs_ray_cluster(c, "resources", "it pins Ray actors to nodes", off="{}")
    if c.get("placement", "none") != "none":
        raise ConfigError(
            f"cluster.resources with cluster.placement={c.placement}: the placement groups' bundles hold CPUs (and "
            "GPUs) only, so an actor in one that asks a custom resource never starts; valid: cluster.placement=none "
            "with cluster.resources, or cluster.resources={}"
        )


def check_engine_wired(cfg: DictConfig, registry=None) -> None:
    """What ``swarm run`` can train with, one line per refusal: ``train.engine=local``, or ``fsdp`` on learner
    actors (``cluster.learners=ray``: each learner ``train.shards`` Ray actors, swarm_runtime/cluster/shards.py) for
    a role's full copy (fp32, or bf16/fp16: fp32 masters sharded, computing in the low dtype), or a base (fp32, or
    bf16/fp16 frozen as it is) with its roles' fp32 LoRA adapters (``model.adapter=lora``); or ``deepspeed`` on
    learner actors too (ZeRO-3, swarm_runtime/cluster/deepspeed_shards.py) for full copies in fp32 or bf16 (fp32
    masters in ZeRO's partition, computing in bf16), where the package imports (:func:`_check_deepspeed`).
    ``swarm config ... --plan`` sizes only what passes, as ``swarm run`` runs only what passes."""
    t = cfg.get("train")
    if t is None or str(t.engine) == "local":
        return
    engine = str(t.engine)  # fsdp or deepspeed (config/keys.py: the choices)
    c = cfg.get("cluster")
    learners = "local" if c is None else str(c.get("learners", "local"))
    if learners != "ray":
        raise ConfigError(
            f"train.engine={engine} shards each learner over train.shards Ray actors, so it needs cluster.learners=ray "
            f"(and cluster.kind=ray); got cluster.learners={learners}. Valid: cluster.learners=ray with it, or "
            "train.engine=local"
        )
    dtype = str(cfg.hardware.get("dtype") or cfg.model.get("dtype") or "float32")
    adapter = str(cfg.model.get("adapter") or "none")
    if engine == "deepspeed":
        _check_deepspeed(adapter, dtype)


def _check_deepspeed(adapter: str, dtype: str) -> None:
    """``train.engine=deepspeed``'s own limits: full copies in fp32 or bf16 (fp32 masters in ZeRO's partition,
    computing in bf16; its LoRA and fp16 modes are not wired, for the reasons the messages give; fsdp has both), and
    the package present."""
    import importlib.util

    if adapter != "none":
        raise ConfigError(
            f"train.engine=deepspeed with model.adapter={adapter}: a ZeRO-3 engine owns its module (one per base) and "
            "steps the whole fp32 partition of its optimizer at each step, but each role trains only its own adapter "
            f"with its own optimizers (not wired); valid: model.adapter=none with train.engine=deepspeed, or "
            f"train.engine=fsdp (it shards LoRA bases) or local"
        )
    if dtype not in ("float32", "bfloat16"):
        raise ConfigError(
            f"train.engine=deepspeed with {dtype} weights: DeepSpeed's fp16 mode scales the loss and skips a step whose "
            "gradients overflow, which the in-process update does not (and CPU ranks may lack fp16); valid: "
            "hardware.dtype=float32 or bfloat16 (model.dtype) with it, or train.engine=fsdp (fp32 masters computing "
            "in fp16) or local"
        )
    if importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(
            "train.engine=deepspeed needs the deepspeed package where the learners run: pip install -e "
            "'.[deepspeed]' (on a machine without a GPU the learner ranks set DS_ACCELERATOR=cpu themselves); "
            "valid without it: train.engine=fsdp or local"
        )
