"""Configuration: documented dataclasses turned into OmegaConf structured configs,
plus group resolution for ``domain=``, ``task=``, ``model=``, ``algo=``, ``hardware=``.

Resolution order (later wins): dataclass defaults -> ``swarm_runtime/configs/<group>/<name>.yaml``
presets -> the task YAML's ``overrides:`` block -> ``key=value`` arguments.
"""

from __future__ import annotations

import re
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.config.keys import RULES, check_key
from swarm_runtime.config.rules import check_name
from swarm_runtime.config.schema import CONFIG_DIR, CONFIG_VERSION, GROUPS, HardwareConfig, RunConfig
from swarm_runtime.config.validation import validate
from swarm_runtime.core.domain import REQUIRED_TASK_KEYS


def presets(group: str) -> list[str]:
    d = CONFIG_DIR / group
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def _valid_keys(node: DictConfig) -> str:
    return ", ".join(sorted(str(k) for k in node.keys()))


def parse_overrides(args: list[str]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Split ``key=value`` arguments into group choices and dotted overrides."""
    groups: dict[str, str] = {}
    dotted: list[tuple[str, str]] = []
    for a in args:
        if "=" not in a:
            raise ConfigError(
                f"argument {a!r} is not key=value (groups: {', '.join(GROUPS)}; or dotted keys like algo.lr=1e-4)"
            )
        k, v = a.split("=", 1)
        (groups.__setitem__(k, v) if k in GROUPS else dotted.append((k, v)))
    return groups, dotted


#: Sections whose keys the user names (``model.bases.big.path``, ``model.role_base.Smith``, ``rollout.urls.big``):
#: ``_set`` creates a key there; validation checks the names and values.
OPEN_SECTIONS = ("model.bases", "model.role_base", "rollout.urls", "cluster.resources")


def _set(cfg: DictConfig, key: str, value: str, literal: bool = False) -> None:
    """Set ``key`` to ``value`` (YAML-typed, :func:`_parse`; ``literal``: a command-line value, whose control
    characters are kept); a section given a value is refused (:func:`section_given_a_value`)."""
    parts = key.split(".")
    section = next((s for s in OPEN_SECTIONS if key.startswith(s + ".") and OmegaConf.select(cfg, s) is not None), None)
    if section is not None:  # a key of an open section: created, not looked up
        OmegaConf.set_struct(cfg, False)
        try:
            OmegaConf.update(cfg, key, _parse(value), merge=True, force_add=True)
        except Exception as exc:
            raise ConfigError(f"bad value {value!r} for {key!r}: {str(exc).splitlines()[0]}") from exc
        finally:
            OmegaConf.set_struct(cfg, True)
        return
    node = cfg
    for i, p in enumerate(parts):
        if not isinstance(node, DictConfig) or p not in node:
            where = ".".join(parts[:i]) or "the top level"
            valid = _valid_keys(node) if isinstance(node, DictConfig) else "(not a section)"
            raise ConfigError(f"unknown config key {key!r}: {p!r} is not in {where}; valid: {valid}")
        if i < len(parts) - 1:
            node = node[p]
    parsed = _parse(value, literal)
    target = node._get_node(parts[-1])
    if parsed is None and value.strip().lower() == "none" and _literal_none(target):
        parsed = "none"  # the word of a string setting (model.chat_template=none, cluster.placement=none), not null
    if isinstance(target, DictConfig) and not isinstance(parsed, dict) and (parsed is not None or _typed(target)):
        raise section_given_a_value(key, target, parsed, value)
    merge = isinstance(target, DictConfig) and isinstance(parsed, dict) and _typed(target)
    unknown = [str(k) for k in (parsed if merge else ()) if str(k) not in target]
    if unknown:
        raise ConfigError(
            f"unknown config key '{key}.{unknown[0]}': {unknown[0]!r} is not in {key}; valid: {_valid_keys(target)}"
        )
    try:  # a schema section given a mapping (cluster={kind: ray}, a recipe's section): its keys set, each checked
        OmegaConf.update(cfg, key, parsed, merge=merge)
    except Exception as exc:  # omegaconf validation error: wrong type
        raise ConfigError(f"bad value {value!r} for {key!r}: {exc}") from exc


def _literal_none(target) -> bool:
    """Whether ``target`` (a config node) is a string setting that may not be null: ``none`` given to it is the word
    (its valid values say ``none``), not YAML's null."""
    from omegaconf import ValueNode

    return isinstance(target, ValueNode) and not target._is_optional() and isinstance(target._value(), str)


def _typed(node: DictConfig) -> bool:
    """A section of the schema (a dataclass), not a task's mapping or a mapping key (``model.bases``)."""
    return is_dataclass(node._metadata.object_type)


def section_given_a_value(key: str, node: DictConfig, value, given: str) -> ConfigError:
    """The one line for ``KEY=VALUE`` where ``KEY`` is a section (``cluster=ray``) or a mapping (``model.bases=x``):
    the keys of the section whose choices include ``VALUE`` (``did you mean cluster.kind=ray?``), else how to set its
    keys. ``given``: the value as typed."""
    if key.startswith("task.") and not node._is_none():  # a section of the domain's task file
        keys = ", ".join(str(k) for k in node.keys())
        return ConfigError(
            f"{key}={given} is not valid: {key} is a section (keys: {keys}); set its keys, {key}.KEY=VALUE"
        )
    if not _typed(node):
        return ConfigError(
            f"{key}={given} is not valid: {key} is a mapping; give its entries ({key}.NAME=VALUE) or a mapping "
            f"({key}={{NAME: VALUE}})"
        )
    names = [str(k) for k in node.keys()]
    takes = [f"{key}.{k}={given}" for k in names if _a_choice_of(RULES.get(f"{key}.{k}"), value)]
    if takes:
        hint = f"did you mean {takes[0]}?" + (f" (also valid: {', '.join(takes[1:])})" if takes[1:] else "")
    else:
        hint = f"set its keys, {key}.KEY=VALUE"
    return ConfigError(
        f"{key}={given} is not valid: {key} is a section, not a value; {hint}; keys of {key}: {', '.join(names)}"
    )


def _a_choice_of(r, value) -> bool:
    """``value`` is a string rule ``r`` takes, and ``r`` is a choice among names (it refuses other strings); None:
    no rule."""
    if r is None or not isinstance(value, str):
        return False
    try:
        return bool(r.ok(value)) and not r.ok(value + "\0")
    except Exception:  # a rule's check on a value of another type
        return False


#: Control characters (a newline, a tab, ...): YAML folds a newline of a plain value into a space.
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def _parse(value: str, literal: bool = False):
    """A command-line value, YAML-typed: 16 -> int, 1e-4 -> float, [0, 0.5] -> list, null/none -> None.
    ``literal``: a value with control characters that YAML would read as another string (a newline folded into
    a space) stays as given, for the key's rule to judge."""
    try:
        parsed = yaml.safe_load(value) if value != "" else ""
    except yaml.YAMLError:
        parsed = value
    if literal and isinstance(parsed, str) and parsed != value and CONTROL_CHARS.search(value):
        return value
    if isinstance(parsed, str) and parsed.lower() == "none":
        parsed = None
    if isinstance(parsed, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", parsed):
        parsed = float(parsed)  # YAML 1.1 reads 1e-4 as a string
    return parsed


#: Keys that pick or operate a run folder rather than configure the run: a saved config may lack them.
FOLDER_KEYS = ("run_dir", "resume", "overwrite", "config_version")


#: Of those, the ones only the command line gives (never a recipe, a task file or a saved run folder).
RUN_CONTROL = ("overwrite", "resume", "run_dir")


#: Keys each version added (a key ending in ``.`` stands for its whole section), with the value that reproduces
#: the earlier versions' behaviour where it is not the default: a run folder written by an earlier version lacks
#: them and gets these values; a file of this version that lacks a key is truncated (an error).
ADDED_KEYS: dict[int, dict[str, Any]] = {
    2: {
        "experiment.train_seeds": None,  # earlier experiments trained on the run's seed alone
        "eval.split": "eval",
        "model.adapter": "none",
        "model.arch": None,
        "model.lora.": None,
        "hardware.attention": None,
        "hardware.dtype": None,
        "hardware.gradient_checkpointing": False,
        "hardware.local_adapter": "none",
        "hardware.memory_gb": None,
        "hardware.micro_batch": None,
        "hardware.tf32": False,
        "rlcr.": None,
        "serve.": None,
        "task.dev_seeds.": None,
    },  # an earlier run has no dev split (eval.split=dev is refused for it)
    3: {
        "task.dev_seeds.": None,
        "task.dev_seeds": None,  # openresearcher's dev split: an earlier
        # openresearcher run has none (task=embedded: a {start, count} section; task=local: null, opt-in)
        "task.habitat.dev_split": None,
    },  # vln_ce sim=habitat: the split behind dev seeds (default val_seen)
    4: {"model.lora.lr_scale": 1.0},  # adapters trained at the algorithm's learning rates
    5: {
        "rollout.": None,
        "algo.is_cap": None,  # samplers and learners (docs/reference/engine.md): in process, no IS weights
        "model.chat_template": "none",
    },  # earlier runs prompted every model with the raw prompt
    6: {"cluster.": None},  # env workers (docs/guides/ray.md): earlier runs stepped their envs in process
    7: {
        "train.": None,  # the learner engine (docs/guides/sharded-learners.md): earlier runs trained in process
        "cluster.placement": "none",  # no placement groups
        "cluster.cpus_per_bundle": 1,
        "cluster.placement_wait_s": 30.0,
    },
    8: {
        "cluster.resources": {},  # actors anywhere
        "cluster.restart_wait_s": 120.0,  # the restart wait as it was
        "cluster.sampler_replicas": 1,  # one engine sampler per base
    },
    9: {"cluster.env_vars": None},  # no more variables for the actors of a joined cluster (the default, [])
    10: {
        "algo.served": [],  # no served traffic
        "algo.served_only": False,
        "algo.served_per_step": None,
        "experiment.parallel": 1,  # one training seed after another
    },
}


def _legacy_values(saved: DictConfig, missing: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Split ``missing`` into the keys a file of its ``config_version`` may lack (with their legacy values,
    None = the default) and the rest (which only a truncated file lacks)."""
    version = saved.get("config_version", 1)
    allowed = {
        k: v for ver, keys in ADDED_KEYS.items() if isinstance(version, int) and ver > version for k, v in keys.items()
    }
    legacy, rest = {}, []
    for key in missing:
        hit = next((a for a in allowed if key == a or (a.endswith(".") and key.startswith(a))), None)
        if hit is None:
            rest.append(key)
        elif allowed[hit] is not None or key == hit:
            legacy[key] = allowed[hit]
    return rest, legacy


def _leaf_keys(node: DictConfig, prefix: str = "") -> list[str]:
    out = []
    for k in node.keys():
        child = node._get_node(k)
        if isinstance(child, DictConfig) and not child._is_none():
            out += _leaf_keys(child, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}")
    return out


def load_saved(path, registry=None) -> DictConfig:
    """A run folder's ``config.yaml``, checked against this version's keys: a key it lacks (a
    truncated file, or a run written before the key existed) is an error naming the keys, never a
    silent default, so an evaluation or a resume runs exactly as the run was configured. With
    ``registry``, the task section is checked against the domain's task YAML too."""
    from swarm_runtime.config.secrets import unredact

    path = Path(path)
    try:
        saved = OmegaConf.load(path)
    except FileNotFoundError as exc:
        raise ConfigError(f"{str(path)!r} is missing; give the folder `swarm run` printed") from exc
    except Exception as exc:  # YAML syntax, unreadable bytes
        raise ConfigError(f"{str(path)!r} is not a readable config ({str(exc).splitlines()[0][:160]})") from exc
    if not isinstance(saved, DictConfig):
        raise ConfigError(f"{str(path)!r} is not a run config (a YAML mapping)")
    defaults = OmegaConf.structured(RunConfig)
    # serve.* are deployment settings (swarm serve's command line), not the run's: a run saved before a key
    # existed is served with its default
    missing = [
        k
        for k in _leaf_keys(defaults)
        if k not in FOLDER_KEYS
        and not k.startswith("serve.")
        and OmegaConf.select(saved, k, default="\0missing") == "\0missing"
    ]
    task = saved.get("task") if "task" in saved else None
    if isinstance(task, DictConfig):
        missing += [f"task.{k}" for k in REQUIRED_TASK_KEYS if k not in task]
        domains = getattr(registry, "domains", {}) if registry is not None else {}
        domain = domains.get(saved.get("domain")) if isinstance(saved.get("domain"), str) else None
        if domain is not None and saved.get("task_name") in domain.task_names():
            ref = domain.task_config(saved.task_name)
            ref.pop("overrides", None)
            missing += [
                f"task.{k}"
                for k in _leaf_keys(ref)
                if f"task.{k}" not in missing and OmegaConf.select(task, k, default="\0missing") == "\0missing"
            ]
    elif "task" not in missing:
        missing.append("task")
    missing, legacy = _legacy_values(saved, missing)
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise ConfigError(
            f"{str(path)!r} lacks {shown}: it is truncated, or was written by a version without "
            "these keys; restore the file (add each key with the value the run used)"
        )
    try:
        merged = OmegaConf.merge(defaults, saved)
        for key, value in legacy.items():  # an earlier version's run: its behaviour, not this version's default
            if value is not None or OmegaConf.select(defaults, key) is not None:
                OmegaConf.update(merged, key, value, merge=False)
        merged.config_version = CONFIG_VERSION
        # what the folder says about running it is not a setting: the command line picks and operates a run
        merged.overwrite, merged.resume, merged.run_dir = False, False, str(path.parent)
    except Exception as exc:  # a key this version no longer has, or a value of the wrong type
        raise ConfigError(f"{str(path)!r} does not fit this version's config: {str(exc).splitlines()[0]}") from exc
    from swarm_runtime.models.pretrained import resolve_path

    resolve_path(merged.model, saved=True)  # model=smollm2 whose converted folder is gone: converted again
    if legacy:
        from loguru import logger

        logger.info(
            "{} was written by config version {}: {} keys added since take the values of that version's behaviour ({})",
            path,
            saved.get("config_version", 1),
            len(legacy),
            ", ".join(sorted(legacy)[:6]) + (" ..." if len(legacy) > 6 else ""),
        )
    from swarm_runtime.config.secrets import note_saved_endpoints

    # every endpoint the file names gets no key until the command line gives it (runs/folder.py:
    # distrust_saved_endpoints) or a program trusts it (secrets.trust_endpoint)
    note_saved_endpoints(merged, None, (), path)
    return unredact(merged)


def resolve(args: list[str], registry) -> DictConfig:
    """Build the run config from CLI arguments; raises :class:`ConfigError` on bad input."""
    groups, dotted = parse_overrides(args)
    cfg = OmegaConf.structured(RunConfig)
    for group in ("model", "algo", "hardware"):
        name = groups.get(group, getattr(RunConfig(), group).name if group != "algo" else "mpt")
        check_name(group, name, presets(group))
        cfg[group] = OmegaConf.merge(cfg[group], OmegaConf.load(CONFIG_DIR / group / f"{name}.yaml"))
    domain_name = groups.get("domain", cfg.domain)
    check_name("domain", domain_name, sorted(registry.domains))
    domain = registry.domains[domain_name]
    tasks = domain.task_names()
    task_name = groups.get("task", tasks[0] if "task" not in groups and cfg.task_name not in tasks else cfg.task_name)
    check_name("task", task_name, tasks, f" for domain {domain_name!r}")
    task = domain.task_config(task_name)
    missing = [k for k in REQUIRED_TASK_KEYS if k not in task]
    if missing:
        raise ConfigError(f"task {task_name!r} of {domain_name!r} lacks required keys {missing}")
    overrides = task.pop("overrides", None)
    cfg.domain, cfg.task_name = domain_name, task_name
    OmegaConf.set_struct(cfg, False)
    cfg.task = task
    OmegaConf.set_struct(cfg, True)
    if overrides is not None:
        for key, value in _flatten(OmegaConf.to_container(overrides)):
            if key in RUN_CONTROL:
                raise ConfigError(
                    f"task {task_name!r} of {domain_name!r} sets {key} in its overrides: "
                    f"{', '.join(RUN_CONTROL)} pick and operate a run folder and come from the command "
                    "line only; remove it from the task file"
                )
            if not isinstance(value, str):
                value = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...")
            _set(cfg, key, value)
    for key, value in dotted:
        override(cfg, key, value)
    from swarm_runtime.models.pretrained import resolve_path

    resolve_path(cfg.model)  # model=smollm2: its converted folder (converted on first use)
    if cfg.model.name == "local" and not any(k == "model.adapter" for k, _ in dotted):
        cfg.model.adapter = cfg.hardware.local_adapter  # the machine's default for real checkpoints
    validate(cfg, registry)
    return cfg


def override(cfg: DictConfig, key: str, value: str) -> None:
    """Set ``key=value`` from the command line; a bare key of the task YAML (``sim=habitat``,
    ``judge=llm``) means ``task.<key>``; ``hardware=NAME`` loads that preset (the machine, which
    a saved run may change when it is evaluated or resumed elsewhere)."""
    if key == "hardware":
        check_name("hardware", value, presets("hardware"))
        cfg.hardware = OmegaConf.merge(
            OmegaConf.structured(HardwareConfig), OmegaConf.load(CONFIG_DIR / "hardware" / f"{value}.yaml")
        )
        return
    if "." not in key and key not in cfg and cfg.get("task") is not None and key in cfg.task:
        key = f"task.{key}"
    _set(cfg, key, value, literal=True)


def set_role_replicas(cfg: DictConfig, given: dict[str, str], roles: list[str]) -> None:
    """``serve.replicas.ROLE=N`` arguments (``given``: ROLE -> N as typed): ``serve.replicas`` becomes one count per
    role of ``roles``, the given ones and, for the others, ``serve.replicas``'s number (1 when it is per role
    already). A count that is not a whole number is refused here; a role the run lacks, and a count out of range, by
    validation (:func:`swarm_runtime.config.checks_serve.serve_roles`, the rule of ``serve.replicas``)."""
    counts = {}
    for role, value in given.items():
        try:
            counts[role] = int(value)
        except ValueError:
            raise ConfigError(f"serve.replicas.{role}={value!r} is not a whole number") from None
    base = cfg.serve.replicas if isinstance(cfg.serve.replicas, int) else 1
    cfg.serve.replicas = {**{r: base for r in roles}, **counts}


def _flatten(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flatten(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def light_registry():
    """A registry of the plugins' domains only: the registration hooks that import torch and
    transformers (policy backends, algorithms) are not called. For :func:`precheck`."""
    from swarm_runtime.plugins.manager import Registry, make_plugin_manager

    reg = Registry()
    make_plugin_manager().hook.swarm_register_domains(register=lambda d: reg.domains.setdefault(d.name, d))
    reg.light = True
    return reg


def precheck(args, resolve_with_domains: bool = True) -> None:
    """Check a command line before the heavy plugins load: first the core keys given as
    ``key=value``, each on its own (:func:`swarm_runtime.config.keys.check_key`); then
    (``resolve_with_domains``) the whole config resolved with the domains only (task keys and
    cross-key checks), so a bad value fails in about a second instead of after importing torch and
    transformers."""
    cfg = OmegaConf.structured(RunConfig)
    for a in args or ():
        k, eq, v = str(a).partition("=")
        if not eq or k in GROUPS or k in ("checkpoint",) or k.startswith("task.") or "${" in v:
            continue
        if "." not in k and k not in cfg:
            continue  # a bare task key (sim=habitat): the domain's
        override(cfg, k, v)
        check_key(cfg, k)
    if resolve_with_domains:
        resolve(list(args), light_registry())
