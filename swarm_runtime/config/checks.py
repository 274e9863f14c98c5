"""Cross-key checks of the model, the algorithm and the evaluation: ``fn(cfg, registry)``, each raising a
:class:`ConfigError` that names the keys, the bad values and what is valid.

``registry`` is the plugins' registry, or the light one of the domains only when a command line is checked
before the plugins load (:func:`swarm_runtime.config.load.precheck`), or None; a check that needs more returns.
:data:`swarm_runtime.config.validation.CHECKS` lists the checks in the order they run.
"""

from __future__ import annotations

from dataclasses import is_dataclass

from omegaconf import DictConfig, ListConfig, OmegaConf

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.config.rules import DTYPES, check_name, fmt
from swarm_runtime.learn.served import transcript_file


def registered_names(cfg: DictConfig, registry) -> None:
    """Names a plugin registers: coordinator, credit scheme, algorithm, policy backend."""
    if registry is None or getattr(registry, "light", False):
        return
    check_name("algo.coordinator", cfg.algo.coordinator, sorted(registry.coordinators))
    check_name("algo.credit", cfg.algo.credit, sorted(registry.credit_schemes))
    check_name("algo.name", cfg.algo.name, sorted(registry.algorithms))
    check_name("model.backend", cfg.model.backend, sorted(registry.policy_backends))
    for c in cfg.experiment.coordinators:
        check_name("experiment.coordinators", c, sorted(registry.coordinators))


def bid_levels(cfg: DictConfig, registry) -> None:
    """Bid levels include 0 (the pass) and are distinct; SFT's demo bids are among them."""
    levels = [float(b) for b in cfg.algo.bid_levels]
    if 0.0 not in levels:
        raise ConfigError(f"algo.bid_levels={fmt(cfg.algo.bid_levels)} is not valid: must include 0 (the pass)")
    if len(set(levels)) != len(levels):
        raise ConfigError(f"algo.bid_levels={fmt(cfg.algo.bid_levels)} is not valid: levels must be distinct")
    for key in ("owner_bids", "other_bids"):
        bad = [b for b in cfg.algo.sft[key] if float(b) not in levels]
        if bad:
            raise ConfigError(
                f"algo.sft.{key}={fmt(cfg.algo.sft[key])} is not valid: SFT bid targets must be among "
                f"algo.bid_levels {fmt(cfg.algo.bid_levels)} ({', '.join(map(str, bad))} are not); "
                f"set algo.sft.{key} to levels of algo.bid_levels"
            )


def model_shape(cfg: DictConfig, registry) -> None:
    """The tiny model's shape (``model.path`` unset): heads divide the width, KV heads divide the
    heads, and a prompt plus its longest response fits ``max_positions``."""
    m = cfg.model
    if m.get("path") is not None:
        return
    if int(m.hidden_size) % int(m.num_heads):
        raise ConfigError(f"model.num_heads={m.num_heads} is not valid: must divide model.hidden_size={m.hidden_size}")
    if int(m.num_heads) % int(m.num_kv_heads):
        raise ConfigError(
            f"model.num_kv_heads={m.num_kv_heads} is not valid: must divide model.num_heads={m.num_heads}"
        )
    longest = int(m.max_prompt_tokens) + max(int(m.max_action_tokens), int(m.max_bid_tokens))
    if longest > int(m.max_positions):
        raise ConfigError(
            f"model.max_positions={m.max_positions} is not valid: must be at least model.max_prompt_tokens "
            f"+ the longest response (max(model.max_action_tokens, model.max_bid_tokens)) = {longest}"
        )


def eval_split(cfg: DictConfig, registry) -> None:
    """``eval.episodes`` within the task's held-out split (not silently clamped)."""
    task = cfg.get("task")
    if cfg.eval.episodes is None or task is None or "eval_seeds" not in task:
        return
    count = int(task.eval_seeds.count)
    if int(cfg.eval.episodes) > count:
        raise ConfigError(
            f"eval.episodes={cfg.eval.episodes} is not valid: task {cfg.task_name!r} has {count} held-out "
            f"seeds (task.eval_seeds.count); give at most {count} or null (all)"
        )


#: Splits a held-out evaluation may use (``eval.split``): ``eval`` for reported numbers, ``dev`` for tuning.
EVAL_SPLITS = ("eval", "dev")


#: ``model.adapter`` values.
ADAPTERS = ("none", "lora")


#: Attention implementations of a loaded checkpoint (``hardware.attention``).
ATTENTION = ("sdpa", "flash_attention_2", "eager")


def _schema_default(node) -> DictConfig | None:
    """The defaults of a config section (its dataclass in :mod:`swarm_runtime.config.load`, which a resolved
    or loaded config carries), or None for a section of no dataclass."""
    kind = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    return OmegaConf.structured(kind) if kind is not None and is_dataclass(kind) else None


def splits(cfg: DictConfig, registry) -> None:
    """``eval.split`` (the task must define that split's seeds) and ``experiment.train_seeds``."""
    check_name("eval.split", cfg.eval.split, EVAL_SPLITS)
    if cfg.get("task") is not None and cfg.task.get(f"{cfg.eval.split}_seeds") is None:
        raise ConfigError(
            f"eval.split={cfg.eval.split}, but task {cfg.task_name!r} of {cfg.domain!r} defines no "
            f"{cfg.eval.split}_seeds; valid here: "
            f"{', '.join(s for s in EVAL_SPLITS if cfg.task.get(f'{s}_seeds') is not None)}"
        )
    seeds = cfg.experiment.train_seeds
    if seeds is not None and (
        not len(seeds) or len(set(int(s) for s in seeds)) != len(seeds) or any(int(s) < 0 for s in seeds)
    ):
        raise ConfigError(
            f"experiment.train_seeds {list(seeds)} must be distinct non-negative integers "
            "(or null: the run's seed alone)"
        )


def adapter(cfg: DictConfig, registry) -> None:
    """``model.adapter``, ``model.lora.*`` and the hardware fields the memory plan and the adapters use. A ``target_modules`` name the model lacks is refused when the base is built
    (:func:`swarm_runtime.models.adapters.check_targets`), before any training."""
    m, hw = cfg.model, cfg.hardware
    adapter = m.adapter or "none"  # the command line's ``none`` arrives as null
    check_name("model.adapter", adapter, ADAPTERS)
    check_name("hardware.local_adapter", hw.local_adapter or "none", ADAPTERS)
    if adapter == "none":
        default = _schema_default(m.lora)
        changed = [f"model.lora.{k}={m.lora[k]}" for k in default or () if m.lora[k] != default[k]]
        if changed:
            raise ConfigError(
                f"{changed[0]} has no effect with model.adapter=none (full copies); set model.adapter=lora "
                f"or drop the model.lora.* options"
            )
    elif m.backend != "transformers":
        raise ConfigError(f"model.adapter={adapter} needs model.backend=transformers (PEFT), got {m.backend!r}")
    if hw.attention is not None and hw.attention not in ATTENTION:
        raise ConfigError(f"unknown hardware.attention {hw.attention!r}; valid: {', '.join(ATTENTION)} (or null)")
    if hw.attention == "flash_attention_2":
        import importlib.util

        if importlib.util.find_spec("flash_attn") is None:
            raise ConfigError(
                "hardware.attention=flash_attention_2 needs the flash-attn package (pip install flash-attn "
                "--no-build-isolation); or set hardware.attention=sdpa"
            )
    for key, value in (("hardware.dtype", hw.dtype), ("model.dtype", m.dtype)):
        if value is not None:
            check_name(key, value, DTYPES)


def adapter_algo(cfg: DictConfig, registry) -> None:
    """``model.adapter=lora`` (one adapter per role on a shared base) needs an algorithm that builds
    the per-role swarm; ``algo=monolithic`` and ``algo=rlcr`` train one full model and would silently ignore it."""
    if (cfg.model.get("adapter") or "none") != "none" and cfg.algo.name in ONE_MODEL_ALGOS:
        raise ConfigError(
            f"model.adapter={cfg.model.adapter} is not valid with algo={cfg.algo.name}, which trains one "
            f"full model; valid: model.adapter=lora with algo=mpt, or algo={cfg.algo.name} with "
            "model.adapter=none"
        )


#: Algorithms that train one model and build no per-role swarm, so they cannot honour ``model.adapter=lora``.
ONE_MODEL_ALGOS = ("monolithic", "rlcr")  # one full model (RLCR: one policy shared by every agent)


def adapter_rates(cfg: DictConfig, registry) -> None:
    """With adapters each learning rate is scaled by ``model.lora.lr_scale``; the scaled rates are held
    to the same bound (10) as the rates themselves."""
    if (cfg.model.get("adapter") or "none") != "lora":
        return
    scale = float(cfg.model.lora.lr_scale)
    for key in ("algo.lr", "algo.bid_lr", "algo.sft.lr"):
        v = OmegaConf.select(cfg, key)
        if v is not None and float(v) * scale > 10.0:
            raise ConfigError(
                f"model.lora.lr_scale={scale:g} trains the adapters at {key} x {scale:g} = "
                f"{float(v) * scale:g}, over 10 (the bound of every learning rate); lower "
                f"model.lora.lr_scale or {key}"
            )


def bid_steps_need_bids(cfg: DictConfig, registry) -> None:
    """Bid steps learn from auctions: with a coordinator that asks for no bids (``round_robin``,
    ``graph_of_agents``, ``agentnet``) they would train 0 pairs without a word."""
    if registry is None or getattr(registry, "light", False) or cfg.algo.name in ONE_MODEL_ALGOS:
        return
    coordinator = registry.coordinators.get(cfg.algo.coordinator)
    if coordinator is not None and not getattr(coordinator, "uses_bids", True) and int(cfg.algo.bid_steps) > 0:
        raise ConfigError(
            f"algo.bid_steps={cfg.algo.bid_steps} trains no bid pairs with algo.coordinator="
            f"{cfg.algo.coordinator}, which asks for no bids; set algo.bid_steps=0 or a coordinator "
            "that runs auctions (algo.coordinator=auction)"
        )


def rlcr(cfg: DictConfig, registry) -> None:
    """``rlcr.*`` beyond each key's own range: the limit's schedule grows; under ``algo.name=rlcr`` also
    that the domain's concurrent env has an anytime return (``progress()``)."""
    r = cfg.get("rlcr")
    if r is None:
        return
    t = r.t_max
    if float(t.end) < float(t.start):
        raise ConfigError(f"rlcr.t_max.end must be >= rlcr.t_max.start ({t.start}), got {t.end}")
    if cfg.algo.name != "rlcr" or registry is None or cfg.domain not in registry.domains:
        return
    if cfg.model.constrained_actions:
        raise ConfigError(
            "algo=rlcr: model.constrained_actions=true would forbid the messages (free text); "
            "set model.constrained_actions=false"
        )
    from swarm_runtime.core.env import close_env, has_progress

    domain = registry.domains[cfg.domain]
    try:
        env = domain.concurrent_env(cfg.task)
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"algo=rlcr: {cfg.domain} task {cfg.task_name}: {exc}") from exc
    close_env(env)  # only the check
    if not has_progress(env):
        raise ConfigError(
            f"algo=rlcr needs an anytime return, but domain {cfg.domain!r} has no DomainEnv.progress() "
            f"(its concurrent env is {type(env).__name__}); docs/guides/rlcr.md lists the domains that have one and "
            "how a domain opts in"
        )


def rlcr_only(cfg: DictConfig, registry) -> None:
    """``rlcr.*`` is read by ``algo=rlcr`` alone: a changed ``rlcr.*`` key under another algorithm would
    be silently ignored (as ``model.lora.*`` under ``model.adapter=none``), so it is refused."""
    if cfg.algo.name == "rlcr" or cfg.get("rlcr") is None:
        return
    default = _schema_default(cfg.rlcr)
    for key in _leaf_keys(default) if default is not None else ():
        now, was = OmegaConf.select(cfg.rlcr, key), OmegaConf.select(default, key)
        if _plain(now) != _plain(was):
            raise ConfigError(
                f"rlcr.{key}={fmt(now)} has no effect with algo={cfg.algo.name} (only algo=rlcr reads "
                "rlcr.*); set algo=rlcr or drop the rlcr.* options"
            )


def _plain(v):
    return OmegaConf.to_container(v) if isinstance(v, (DictConfig, ListConfig)) else v


def _leaf_keys(node: DictConfig, prefix: str = "") -> list[str]:
    out = []
    for k in node.keys():
        v = node[k]
        out += _leaf_keys(v, f"{prefix}{k}.") if isinstance(v, DictConfig) else [f"{prefix}{k}"]
    return out


def served(cfg: DictConfig, registry) -> None:
    """``algo.served``: read by ``algo=mpt`` (actions of a swarm with a model per role), each path a served transcript
    or a served run folder; ``algo.served_only`` needs ``algo.served``."""
    a = cfg.algo
    paths = list(a.get("served") or [])
    if a.get("served_only") and not paths:
        raise ConfigError("algo.served_only=true needs algo.served=[RUN/serve/episodes.jsonl, ...] to train on")
    if not paths:
        return
    if a.name != "mpt":
        raise ConfigError(
            f"algo.served is read by algo=mpt only (a model per role, trained on its served actions), not "
            f"algo={a.name}; set algo=mpt or drop algo.served"
        )
    for path in paths:
        transcript_file(path)
