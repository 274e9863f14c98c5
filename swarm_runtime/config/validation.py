"""Validation of every config key in one place, before anything is written or loaded.

Two parts, both open to extension (a new section registers its own the same way):

- :data:`RULES`: one :class:`Rule` per key (its type, range or choices, and what is valid, for the
  message): ``_rule("key", spec)`` entries in the table, or ``register_rules(Rule(...), ...)``.
- :data:`CHECKS`: cross-key checks, ``fn(cfg, registry)`` raising :class:`ConfigError`, registered with
  ``@register_check`` (``registry`` is None, or a light one of the domains only, when a command line is
  checked before the plugins load; a check that needs more returns).

:func:`validate` runs them all on a resolved (or a loaded run's) config;
:func:`swarm_runtime.config.load.precheck` runs the rules of the keys given on the command line on their own
(:func:`check_key`), before the plugins (torch, transformers) are imported, so a bad value fails in a
fraction of a second. Each error names the key, the bad value and what is valid.

This module imports nothing of the config (:mod:`swarm_runtime.config.load` imports it): a section's defaults,
where a check needs them, are those of the dataclass the config carries (:func:`_schema_default`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, is_dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.config.schemes import BID_REFERENCES, PAIR_WEIGHTS, check_rank

#: Loguru levels (``log_level``).
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")
#: Weight dtypes (``model.dtype``).
DTYPES = ("float32", "float16", "bfloat16")
#: Torch devices the runtime places models on (``model.device``, ``hardware.device``).
DEVICE_RE = re.compile(r"cpu|cuda(:\d+)?|mps")
#: A bound on run lengths: beyond it a value is a typo, not a plan.
MAX_COUNT = 10_000_000
#: Largest run seed: seeds are combined (``seed * 100 + role``, ``seed + 7919``) and must stay a torch seed.
MAX_SEED = 2**31 - 1
#: Most workers per role ``swarm serve`` starts (each a process holding a model).
MAX_REPLICAS = 64


@dataclass(frozen=True)
class Rule:
    """A key's valid values: ``ok(value)`` is True for a valid (non-null) value; ``valid`` says
    what is valid in words; ``nullable``: null is valid too (with ``null_means``); ``lazy``: the
    rule imports something heavy (torch), so :func:`precheck` leaves it to :func:`validate`."""

    key: str
    ok: Callable[[Any], bool]
    valid: str | Callable[[], str]
    nullable: bool = False
    null_means: str = ""
    lazy: bool = False


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def ints(lo: int, hi: int = MAX_COUNT) -> tuple[Callable, str]:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi, f"an integer in [{lo}, {hi}]")


def floats(
    lo: float = -math.inf, hi: float = math.inf, lo_open: bool = False, hi_open: bool = False
) -> tuple[Callable, str]:
    def ok(v):
        if not _num(v) or not math.isfinite(v):
            return False
        return (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)

    lo_s = "" if lo == -math.inf else f"{'>' if lo_open else '>='} {lo:g}"
    hi_s = "" if hi == math.inf else f"{'<' if hi_open else '<='} {hi:g}"
    return ok, "a finite number " + " and ".join(s for s in (lo_s, hi_s) if s)


def choices(*values) -> tuple[Callable, str]:
    return (lambda v: v in values), "one of " + ", ".join(str(v) for v in values)


def lists(item: tuple[Callable, str], nonempty: bool = True) -> tuple[Callable, str]:
    ok, what = item
    return (
        (lambda v: isinstance(v, (list, ListConfig)) and (len(v) > 0 or not nonempty) and all(ok(x) for x in v)),
        f"a {'non-empty ' if nonempty else ''}list, each item {what}",
    )


def at_least(lo: int, hi: int) -> tuple[Callable, str]:
    """:func:`ints`, worded ``at least lo and at most hi``."""
    return ints(lo, hi)[0], f"an integer, at least {lo} and at most {hi}"


def _http(v) -> bool:
    return isinstance(v, str) and v.startswith(("http://", "https://")) and v.partition("://")[2] != ""


def _replicas_ok(v) -> bool:
    one = ints(0, MAX_REPLICAS)[0]
    return one(v) or (isinstance(v, dict) and bool(v) and all(isinstance(k, str) and one(n) for k, n in v.items()))


#: ``model.arch``: the keys the memory plan reads, each a whole number in its range (required / optional).
ARCH_REQUIRED = {"vocab_size": 1 << 24, "hidden_size": 1 << 17, "num_hidden_layers": 1024}
ARCH_OPTIONAL = {
    "intermediate_size": 1 << 20,
    "num_attention_heads": 4096,
    "num_key_value_heads": 4096,
    "head_dim": 1 << 14,
}


def _arch_ok(v) -> bool:
    if not isinstance(v, dict):
        return False
    for k, hi in {**ARCH_REQUIRED, **ARCH_OPTIONAL}.items():
        if (k in ARCH_REQUIRED or v.get(k) is not None) and not ints(1, hi)[0](v.get(k)):
            return False
    return all(isinstance(v[k], bool) for k in ("tie_word_embeddings", "attention_bias") if k in v)


BOOL = ((lambda v: isinstance(v, bool)), "true or false")
STR = ((lambda v: isinstance(v, str) and v != ""), "a non-empty string")
DEVICE = ((lambda v: isinstance(v, str) and DEVICE_RE.fullmatch(v) is not None), "cpu, cuda, cuda:N or mps")


def _rule(key, spec, **kw) -> Rule:
    ok, valid = spec
    return Rule(key, ok, valid, **kw)


def _lazy_ok(registry) -> bool:
    """Whether the lazy rules (which import torch) run: not in a :func:`precheck`."""
    return not getattr(registry, "light", False)


RULES: dict[str, Rule] = {
    r.key: r
    for r in [
        # model
        _rule("model.backend", STR),
        _rule("model.name", STR),
        _rule("model.path", STR, nullable=True, null_means="build the tiny model from this config"),
        _rule("model.hidden_size", ints(1, 1 << 16)),
        _rule("model.intermediate_size", ints(1, 1 << 18)),
        _rule("model.num_layers", ints(1, 1024)),
        _rule("model.num_heads", ints(1, 1024)),
        _rule("model.num_kv_heads", ints(1, 1024)),
        _rule("model.max_positions", ints(2, 1 << 22)),
        _rule("model.bid_mode", choices("logits", "generate")),
        _rule("model.temperature", floats(0.0, 100.0)),
        _rule("model.max_action_tokens", ints(1, 1 << 16)),
        _rule("model.max_bid_tokens", ints(1, 1 << 16)),
        _rule("model.max_prompt_tokens", ints(1, 1 << 22)),
        _rule("model.constrained_actions", BOOL),
        _rule("model.dtype", choices(*DTYPES)),
        _rule("model.device", DEVICE),
        # algo
        _rule("algo.name", STR),
        _rule("algo.coordinator", STR),
        _rule("algo.credit", STR),
        _rule("algo.bid_levels", lists(floats(0.0, 1.0, hi_open=True))),
        _rule("algo.iterations", ints(0)),
        _rule("algo.envs_per_step", ints(1, 1_000_000)),
        _rule("algo.action_steps", ints(1, 1_000_000)),
        _rule("algo.bid_steps", ints(0, 1_000_000)),
        _rule("algo.lr", floats(0.0, 10.0)),  # 0 freezes the action steps (a control)
        _rule("algo.bid_lr", floats(0.0, 10.0), nullable=True, null_means="algo.lr"),
        _rule("algo.weight_decay", floats(0.0, 10.0)),
        _rule("algo.adam_eps", floats(0.0, 1.0, lo_open=True)),
        _rule("algo.grad_clip", floats(0.0, lo_open=True)),
        _rule("algo.warmup_steps", ints(0)),
        _rule("algo.min_lr_ratio", floats(0.0, 1.0)),
        _rule("algo.minibatch", ints(1)),
        _rule("algo.branches_per_episode", ints(1, 1_000_000)),
        _rule("algo.resample_tries", ints(1, 1000)),
        _rule("algo.branch_samples", ints(1, 1000)),
        _rule("algo.branch_horizon", ints(1), nullable=True, null_means="to the end of the episode"),
        _rule("algo.bid_pairs", choices("selected", "both")),
        _rule("algo.kl_coef", floats(0.0)),
        _rule("algo.bid_beta", floats(0.0, lo_open=True)),
        _rule("algo.bid_reference", choices(*BID_REFERENCES)),
        _rule("algo.bid_pair_weight", choices(*PAIR_WEIGHTS)),
        _rule("algo.common_random_numbers", BOOL),
        _rule("algo.reward_scale", floats(0.0, lo_open=True), nullable=True, null_means="task.reward_max"),
        _rule("algo.goa_responders", ints(1, 1000)),
        _rule("algo.sft.demo_episodes", ints(1, 1_000_000)),
        _rule("algo.sft.epochs", ints(1, 100_000)),
        _rule("algo.sft.action_epochs", ints(1, 100_000), nullable=True, null_means="algo.sft.epochs"),
        _rule("algo.sft.lr", floats(0.0, 10.0)),
        _rule("algo.sft.batch_size", ints(1)),
        _rule("algo.sft.owner_bids", lists(floats(0.0, 1.0, hi_open=True))),
        _rule("algo.sft.other_bids", lists(floats(0.0, 1.0, hi_open=True))),
        _rule("algo.sft.match", choices("compute", "data")),
        # hardware, eval
        _rule("hardware.name", STR),
        _rule("hardware.device", DEVICE),
        _rule("hardware.threads", ints(0, 4096)),
        _rule("eval.runs", ints(1, 100_000)),
        _rule("eval.episodes", ints(1), nullable=True, null_means="all held-out seeds"),
        _rule("eval.temperature", floats(0.0, 100.0), nullable=True, null_means="model.temperature"),
        _rule("eval.common_random_numbers", BOOL),
        # experiment
        _rule("experiment.name", STR, nullable=True),
        Rule(
            "experiment.base",
            lambda v: STR[0](v) or lists(STR)[0](v),
            "a run folder, or a list of them (one per experiment.train_seeds)",
            nullable=True,
            null_means="train one",
        ),
        _rule("experiment.train_seeds", lists(ints(0, MAX_SEED)), nullable=True, null_means="the run's seed alone"),
        _rule("eval.split", choices("eval", "dev")),
        _rule("experiment.iterations", ints(0)),
        _rule("experiment.eval_episodes", ints(1), nullable=True),
        _rule("experiment.sft_eval", BOOL),
        _rule("experiment.budget_factor", floats(1.0, 1000.0)),
        _rule("experiment.coordinators", lists(STR)),
        _rule("experiment.replicas", lists(ints(1, 1000))),
        _rule("experiment.pass_k", ints(1, 10_000)),
        _rule("experiment.milestones", lists(STR), nullable=True),
        _rule("experiment.dropout_p", lists(floats(0.0, 1.0, hi_open=True))),
        _rule("experiment.dropout_replicas", lists(ints(1, 1000))),
        _rule("experiment.dropout_per", choices("turn", "episode")),
        _rule("experiment.monolithic_sft", lists(choices("compute", "data"))),
        _rule("experiment.transfer_tasks", lists(STR, nonempty=False)),
        _rule("experiment.transfer_iterations", ints(1)),
        # adapters (model.adapter=lora) and the memory plan
        _rule("model.lora.rank", ints(1, 4096)),
        _rule("model.lora.alpha", floats(0.0, 1e6, lo_open=True)),
        _rule("model.lora.dropout", floats(0.0, 1.0, hi_open=True)),
        _rule("model.lora.lr_scale", floats(0.0, 1000.0, lo_open=True)),
        _rule("model.lora.target_modules", lists(STR)),
        Rule(
            "model.arch",
            _arch_ok,
            "a mapping of the model's config values with vocab_size, hidden_size and "
            "num_hidden_layers (whole numbers >= 1; intermediate_size, num_attention_heads, num_key_value_heads and "
            "head_dim too when given)",
            nullable=True,
            null_means="model.path's config.json or the built model",
        ),
        _rule("hardware.memory_gb", floats(0.0, 1e6, lo_open=True), nullable=True, null_means="not checked"),
        _rule("hardware.micro_batch", ints(1), nullable=True, null_means="algo.minibatch"),
        _rule("hardware.tf32", BOOL),
        _rule("hardware.gradient_checkpointing", BOOL),
        # rlcr (algo=rlcr; refused under the other algorithms: rlcr_only)
        _rule("rlcr.org", choices("flat", "ceo")),
        _rule("rlcr.agents", ints(1, 9)),
        _rule("rlcr.max_hires", ints(0, 8)),
        _rule("rlcr.expert_team", ints(1, 9)),
        _rule("rlcr.seconds_per_token", floats(0.0, 3600.0, lo_open=True)),
        _rule("rlcr.t_max.start", floats(0.0, 1e8, lo_open=True)),
        _rule("rlcr.t_max.end", floats(0.0, 1e8, lo_open=True)),
        _rule("rlcr.t_max.steps", ints(1)),
        _rule("rlcr.latency_penalty", floats(0.0, 1000.0)),
        _rule("rlcr.group_size", ints(2, 1024)),
        _rule("rlcr.instances", ints(1, 100_000)),
        _rule("rlcr.normalize_std", BOOL),
        _rule("rlcr.max_turns_per_agent", ints(1, 1_000_000)),
        _rule("rlcr.window", ints(0, 1000)),
        _rule("rlcr.tick", floats(0.0, 1e8)),
        _rule("rlcr.solo_eval", BOOL),
        _rule("rlcr.teams", lists(ints(1, 9))),
        _rule("rlcr.eval_runs", ints(1, 100_000), nullable=True, null_means="eval.runs"),
        # serve (swarm serve, swarm eval serve.url=...): checked by every command, so swarm run saves none bad
        _rule("serve.host", STR),
        _rule("serve.port", ints(0, 65535)),
        Rule(
            "serve.replicas",
            _replicas_ok,
            f"a whole number >= 0 and at most {MAX_REPLICAS}, or one per role (serve.replicas.ROLE=N)",
        ),
        _rule(
            "serve.agents",
            (
                (
                    lambda v: (
                        isinstance(v, list)
                        and all(isinstance(a, str) and "=" in a and _http(a.partition("=")[2]) for a in v)
                    )
                ),
                "a list of ROLE=URL entries, each URL http(s)",
            ),
        ),
        _rule("serve.bid_deadline_ms", at_least(1, 3_600_000)),
        _rule("serve.action_timeout_ms", at_least(1, 3_600_000)),
        _rule("serve.drop_after_misses", at_least(1, 1_000_000)),
        _rule("serve.probe_interval_ms", at_least(1, 3_600_000)),
        _rule("serve.restart_workers", BOOL),
        _rule("serve.worker_threads", at_least(1, 1024)),
        _rule("serve.max_episodes", at_least(1, 1_000_000)),
        _rule("serve.max_body_bytes", at_least(1, 1 << 30)),
        _rule("serve.concurrency", at_least(1, 10_000)),
        *(
            _rule(f"serve.{k}", floats(0.0, 1e7))
            for k in ("agent_wait_s", "startup_timeout_s", "episode_idle_s", "shutdown_grace_s")
        ),
        Rule(
            "serve.url",
            _http,
            "an http(s) URL (e.g. http://127.0.0.1:8000)",
            nullable=True,
            null_means="evaluate in process",
        ),
        # top level
        _rule("domain", STR),
        _rule("task_name", STR),
        _rule("seed", ints(0, MAX_SEED)),
        _rule("run_dir", STR, nullable=True, null_means="runs/<domain>-<task>-<time>"),
        _rule("resume", BOOL),
        _rule("overwrite", BOOL),
        _rule("checkpoint_every", ints(1)),
        _rule("keep_checkpoints", ints(0, 1_000_000)),
        _rule("skip_sft_eval", BOOL),
        _rule("progress", BOOL),
        _rule("tensorboard", BOOL),
        _rule("log_level", choices(*LOG_LEVELS)),
        # the task keys the core reads (domains check their own in make_env)
        _rule("task.max_decisions", ints(1, 1_000_000)),
        _rule("task.reward_max", floats(0.0, lo_open=True)),
    ]
}

#: Cross-key checks ``fn(cfg, registry)``; see :func:`register_check`.
CHECKS: list[Callable[[DictConfig, Any], None]] = []


def register_rules(*rules: Rule) -> None:
    """Add (or replace) the rules of keys, e.g. a new config section's."""
    for r in rules:
        RULES[r.key] = r


def register_check(fn: Callable[[DictConfig, Any], None]) -> Callable:
    """Add a cross-key check ``fn(cfg, registry)`` (usable as a decorator)."""
    CHECKS.append(fn)
    return fn


def _fmt(v) -> str:
    if isinstance(v, (DictConfig, ListConfig)):
        v = OmegaConf.to_container(v)
    return repr(v) if isinstance(v, str) else str(v)


def _value(cfg: DictConfig, key: str):
    """``key``'s value (``KeyError`` when absent), interpolations resolved (an error naming the key)."""
    node, *_ = [cfg]
    parts = key.split(".")
    for p in parts[:-1]:
        if not isinstance(node, DictConfig) or p not in node:
            raise KeyError(key)
        node = node[p]
    if not isinstance(node, DictConfig) or parts[-1] not in node:
        raise KeyError(key)
    if OmegaConf.is_missing(node, parts[-1]):
        raise ConfigError(f"{key} must be set (it has no default here)")
    try:
        return node[parts[-1]]
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{key}: {str(exc).splitlines()[0]}") from exc


def _valid(rule: Rule) -> str:
    return rule.valid() if callable(rule.valid) else rule.valid


def check_rule(rule: Rule, value) -> None:
    if value is None:
        if rule.nullable:
            return
        raise ConfigError(f"{rule.key}=null is not valid: must be {_valid(rule)}")
    if isinstance(value, (ListConfig, DictConfig)):
        value = OmegaConf.to_container(value)
    if not rule.ok(value):
        valid = _valid(rule)
        null = (
            f" (or null: {rule.null_means})"
            if rule.nullable and rule.null_means
            else (" or null" if rule.nullable else "")
        )
        raise ConfigError(f"{rule.key}={_fmt(value)} is not valid: must be {valid}{null}")


def check_key(cfg: DictConfig, key: str) -> None:
    """``key``'s rule alone on ``cfg`` (a key without a rule, or with a lazy one, passes): the command
    line's keys, each on its own, before the plugins load (:func:`swarm_runtime.config.load.precheck`)."""
    rule = RULES.get(key)
    if rule is not None and not rule.lazy:
        check_rule(rule, _value(cfg, key))


def _resolve_all(cfg: DictConfig, prefix: str = "") -> None:
    """Resolve every interpolation, so an unresolvable one is an error naming its key."""
    for k in list(cfg.keys()):
        key = f"{prefix}{k}"
        if OmegaConf.is_missing(cfg, k):
            continue
        try:
            v = cfg[k]
        except OmegaConfBaseException as exc:
            raise ConfigError(f"{key}: {str(exc).splitlines()[0]}") from exc
        if isinstance(v, DictConfig):
            _resolve_all(v, key + ".")
        elif isinstance(v, ListConfig):
            try:
                OmegaConf.to_container(v, resolve=True)
            except OmegaConfBaseException as exc:
                raise ConfigError(f"{key}: {str(exc).splitlines()[0]}") from exc


#: The settings that put a command's work on Ray when ``ray``: ``cluster.kind`` (the run's env workers, sampler and
#: learner actors: ``swarm run``, and ``swarm eval``'s env workers) and ``serve.cluster`` (``swarm serve``'s agent
#: workers). :func:`validate` asks for Ray only for those of the command (``ray_keys``).
RAY_KEYS = ("cluster.kind", "serve.cluster")


def needs_ray(cfg: DictConfig, keys=RAY_KEYS) -> None:
    """Ray installed (found, not imported) when one of ``keys`` is ``ray`` in ``cfg``; else one line naming the
    setting and the extra."""
    import importlib.util

    for key in keys:
        if OmegaConf.select(cfg, key, default=None) == "ray" and importlib.util.find_spec("ray") is None:
            raise ConfigError(f"{key}=ray needs Ray, which is not installed: pip install 'swarm-runtime[ray]'")


def validate(cfg: DictConfig, registry, ray_keys=RAY_KEYS) -> None:
    """Every rule on ``cfg``'s keys, then every cross-key check, then Ray installed where the command uses it
    (``ray_keys``: of :data:`RAY_KEYS`, those the command acts on; ``swarm eval`` serves nothing, ``swarm serve``
    steps no env); the first error is raised. A config that cannot run is named before the extra it would need:
    installing Ray would not make it valid."""
    _resolve_all(cfg)
    for rule in RULES.values():
        try:
            value = _value(cfg, rule.key)
        except KeyError:
            continue  # a key this config does not have (a section another version adds)
        if rule.lazy and not _lazy_ok(registry):
            continue
        check_rule(rule, value)
    for check in CHECKS:
        check(cfg, registry)
    from swarm_runtime.plugins.rules import run_plugin_rules

    run_plugin_rules(cfg, registry, check_rule)  # the plugins' rules of their task keys, then their checks
    needs_ray(cfg, ray_keys)


# ---------------------------------------------------------------- cross-key checks
def _choice_in(key: str, value, table, what: str = "") -> None:
    if value not in table:
        raise ConfigError(f"unknown {key} {value!r}; valid: {', '.join(sorted(table)) or '(none)'}{what}")


@register_check
def registered_names(cfg: DictConfig, registry) -> None:
    """Names a plugin registers: coordinator, credit scheme, algorithm, policy backend."""
    if registry is None or getattr(registry, "light", False):
        return
    _choice_in("algo.coordinator", cfg.algo.coordinator, registry.coordinators)
    _choice_in("algo.credit", cfg.algo.credit, registry.credit_schemes)
    _choice_in("algo.name", cfg.algo.name, registry.algorithms)
    _choice_in("model.backend", cfg.model.backend, registry.policy_backends)
    for c in cfg.experiment.coordinators:
        _choice_in("experiment.coordinators", c, registry.coordinators)


@register_check
def bid_levels(cfg: DictConfig, registry) -> None:
    """Bid levels include 0 (the pass) and are distinct; SFT's demo bids are among them."""
    levels = [float(b) for b in cfg.algo.bid_levels]
    if 0.0 not in levels:
        raise ConfigError(f"algo.bid_levels={_fmt(cfg.algo.bid_levels)} is not valid: must include 0 (the pass)")
    if len(set(levels)) != len(levels):
        raise ConfigError(f"algo.bid_levels={_fmt(cfg.algo.bid_levels)} is not valid: levels must be distinct")
    for key in ("owner_bids", "other_bids"):
        bad = [b for b in cfg.algo.sft[key] if float(b) not in levels]
        if bad:
            raise ConfigError(
                f"algo.sft.{key}={_fmt(cfg.algo.sft[key])} is not valid: SFT bid targets must be among "
                f"algo.bid_levels {_fmt(cfg.algo.bid_levels)} ({', '.join(map(str, bad))} are not); "
                f"set algo.sft.{key} to levels of algo.bid_levels"
            )


@register_check
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


@register_check
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


@register_check
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


#: ``cluster.sampler_replicas``: engine sampler actors per base (sampling/replicas.py).
SAMPLER_REPLICAS = (
    (lambda v: v == "per_node" or (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1024)),
    "an integer in [1, 1024] or per_node",
)


@register_check
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


@register_check
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


@register_check
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


@register_check
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


@register_check
def splits(cfg: DictConfig, registry) -> None:
    """``eval.split`` (the task must define that split's seeds) and ``experiment.train_seeds``."""
    if cfg.eval.split not in EVAL_SPLITS:
        raise ConfigError(f"unknown eval.split {cfg.eval.split!r}; valid: {', '.join(EVAL_SPLITS)}")
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


@register_check
def adapter(cfg: DictConfig, registry) -> None:
    """``model.adapter``, ``model.lora.*`` and the hardware fields the memory plan and the adapters use
    (issue 19). A ``target_modules`` name the model lacks is refused when the base is built
    (:func:`swarm_runtime.models.adapters.check_targets`), before any training."""
    m, hw = cfg.model, cfg.hardware
    adapter = m.adapter or "none"  # the command line's ``none`` arrives as null
    if adapter not in ADAPTERS:
        raise ConfigError(f"unknown model.adapter {m.adapter!r}; valid: {', '.join(ADAPTERS)}")
    if (hw.local_adapter or "none") not in ADAPTERS:
        raise ConfigError(f"unknown hardware.local_adapter {hw.local_adapter!r}; valid: {', '.join(ADAPTERS)}")
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
        if value is not None and value not in DTYPES:
            raise ConfigError(f"unknown {key} {value!r}; valid: {', '.join(DTYPES)}")


@register_check
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
            f"(its concurrent env is {type(env).__name__}); docs/rlcr.md lists the domains that have one and "
            "how a domain opts in"
        )


def serve_roles(cfg: DictConfig, roles: list[str]) -> None:
    """``serve.replicas`` per role and ``serve.agents`` (``ROLE=URL``) name the run's ``roles``."""
    rep = cfg.serve.replicas
    bad = [r for r in rep if r not in roles] if isinstance(rep, (dict, DictConfig)) else []
    if bad:
        raise ConfigError(f"serve.replicas.{bad[0]}: no role {bad[0]!r}; valid: {', '.join(roles)}")
    for spec in cfg.serve.agents or []:
        role, sep, url = str(spec).partition("=")
        if not sep or role not in roles or not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"serve.agents entry {spec!r} is not ROLE=URL with ROLE one of {', '.join(roles)} and an http(s) URL"
            )


@register_check
def serve(cfg: DictConfig, registry) -> None:
    """``serve.*`` against the domain's roles (:func:`serve_roles`; each key's range is its rule's)."""
    domains = getattr(registry, "domains", None) or {}
    if cfg.get("serve") is not None and cfg.get("domain") in domains:
        serve_roles(cfg, [r.name for r in domains[cfg.domain].roles])


#: Algorithms that train one model and build no per-role swarm, so they cannot honour ``model.adapter=lora``.
ONE_MODEL_ALGOS = ("monolithic", "rlcr")  # one full model (RLCR: one policy shared by every agent)


@register_check
def adapter_algo(cfg: DictConfig, registry) -> None:
    """``model.adapter=lora`` (one adapter per role on a shared base) needs an algorithm that builds
    the per-role swarm; ``algo=monolithic`` and ``algo=rlcr`` train one full model and would silently ignore it."""
    if (cfg.model.get("adapter") or "none") != "none" and cfg.algo.name in ONE_MODEL_ALGOS:
        raise ConfigError(
            f"model.adapter={cfg.model.adapter} is not valid with algo={cfg.algo.name}, which trains one "
            f"full model; valid: model.adapter=lora with algo=mpt, or algo={cfg.algo.name} with "
            "model.adapter=none"
        )


@register_check
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
                f"rlcr.{key}={_fmt(now)} has no effect with algo={cfg.algo.name} (only algo=rlcr reads "
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


@register_check
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


@register_check
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


#: Who samples rollouts (``rollout.engine``; docs/engine.md).
ROLLOUT_ENGINES = ("local", "openai", "vllm")
#: URLs the engine samplers speak to.
HTTP_URL = (
    (lambda v: isinstance(v, str) and re.fullmatch(r"https?://[^\s/]+(/\S*)?", v) is not None),
    "an http(s) URL such as http://127.0.0.1:8000",
)

#: A Ray head's address (``cluster.address``, ``serve.address``).
RAY_ADDRESS = (
    (lambda v: isinstance(v, str) and re.fullmatch(r"(ray://)?[^\s:/]+:\d{1,5}", v) is not None),
    "host:port of a Ray head (or ray://host:port)",
)

register_rules(
    _rule("model.chat_template", choices("auto", "none")),
    _rule("algo.is_cap", floats(1.0, 1e6), nullable=True, null_means="off: the plain on-policy loss"),
    _rule("rollout.engine", choices(*ROLLOUT_ENGINES)),
    _rule("rollout.url", HTTP_URL, nullable=True, null_means="none (rollout.engine=openai needs one)"),
    _rule("rollout.api_key_env", STR, nullable=True, null_means="no bearer key"),
    _rule("rollout.timeout_s", floats(0.0, 86400.0, lo_open=True)),
    _rule("rollout.concurrency", ints(1, 4096)),
    _rule("rollout.retries", ints(0, 100)),
    _rule("rollout.max_staleness", ints(0, 64)),
    _rule("cluster.kind", choices("local", "ray")),
    _rule(
        "cluster.address",
        RAY_ADDRESS,
        nullable=True,
        null_means="start a local Ray for the run (127.0.0.1)",
    ),
    _rule("cluster.env_workers", ints(1, 1024)),
    _rule("cluster.num_cpus", ints(1, 4096), nullable=True, null_means="Ray's count of this machine's CPUs"),
    _rule("cluster.samplers", choices("local", "ray")),
    _rule("cluster.sampler_restarts", ints(0, 1000)),
    _rule("cluster.sampler_replicas", SAMPLER_REPLICAS),
    _rule("cluster.learners", choices("local", "ray")),
    _rule("cluster.learner_restarts", ints(0, 1000)),
    _rule("rollout.vllm.python", STR, nullable=True, null_means="$SWARM_VLLM_PYTHON, else python3 on PATH"),
    _rule("rollout.vllm.host", choices("127.0.0.1", "localhost", "0.0.0.0", "::1")),
    _rule("rollout.vllm.port", ints(0, 65535)),
    _rule("rollout.vllm.args", lists(STR, nonempty=False)),
    _rule("rollout.vllm.startup_timeout_s", floats(1.0, 86400.0)),
    _rule("rollout.vllm.dtype", choices("float32", "float16", "bfloat16", "auto")),
)


@register_check
def _rollout_engine(cfg: DictConfig, registry) -> None:
    """An engine sampler needs a URL (``openai``) and adapters on one base: after each update the learner loads
    each role's new adapter into the server at run time (vLLM's runtime LoRA endpoints). Full copies would need
    the server restarted with new weights after every update (vLLM's OpenAI server cannot swap base weights at
    run time), so ``model.adapter=none`` is refused rather than silently sampling stale weights."""
    r = cfg.get("rollout")
    if r is None:
        return
    if r.get("engine", "local") == "local":
        if int(r.get("max_staleness", 0) or 0) > 0:
            c = cfg.get("cluster")
            if c is not None and c.get("samplers", "local") == "ray":  # the sampler actor of in-process policies
                raise ConfigError(
                    f"rollout.max_staleness={r.max_staleness} with cluster.samplers=ray and rollout.engine=local is "
                    "not supported: the sampler actor's forwards count into the run's FLOPs under the trainer's phase "
                    "of the moment (a rollout played ahead would count as update or branch FLOPs), and in process "
                    'this engine cannot play ahead, so no run checks it (docs/distributed.md, "Staleness on Ray"); '
                    "valid: rollout.max_staleness=0, or rollout.engine=vllm (a sampler actor runs the server)"
                )
            raise ConfigError(
                f"rollout.max_staleness={r.max_staleness} needs an engine sampler (rollouts played ahead on "
                "the server's weights while this process trains); valid: rollout.max_staleness=0, or "
                "rollout.engine=openai|vllm"
            )
        return
    from swarm_runtime.models import bases as B

    if r.engine == "openai" and not r.get("url") and not B.multi(cfg.model):  # several bases: model_bases checks
        raise ConfigError(NEEDS_URL)
    adapter = cfg.model.get("adapter") or "none"
    if adapter != "lora":
        raise ConfigError(
            f"rollout.engine={r.engine} with model.adapter={adapter}: the engine path trains adapters "
            "(each role's LoRA adapter is reloaded into the server after every update; a full copy "
            "cannot be swapped into a running vLLM server); valid: model.adapter=lora, or "
            "rollout.engine=local"
        )
    check_rank(int(cfg.model.lora.rank))  # vLLM's --max-lora-rank choices
    if cfg.model.get("constrained_actions"):
        raise ConfigError(
            f"rollout.engine={r.engine} with model.constrained_actions=true is not supported yet; "
            "valid: model.constrained_actions=false, or rollout.engine=local"
        )


def key_arg(args) -> str | None:
    """The argument of ``rollout.vllm.args`` that would set vLLM's API key (``--api-key``, ``--api_key``, an
    abbreviation argparse takes, ``=VALUE`` forms), else None."""
    for a in args or []:
        name = str(a).split("=", 1)[0].replace("_", "-")
        if len(name) >= len("--api-k") and "--api-key".startswith(name):
            return str(a).split("=", 1)[0]
    return None


def config_files(args) -> list[str]:
    """The files ``rollout.vllm.args`` names with ``--config FILE`` or ``--config=FILE`` (vLLM reads a YAML file's
    keys as more arguments: ``FlexibleArgumentParser.load_config_file``, ``key: value`` -> ``--key value``)."""
    args = [str(a) for a in args or []]
    out = [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
    return out + [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"]


def config_key(path: str) -> tuple[str | None, str]:
    """``(key, "")``: the key of vLLM config file ``path`` that would set the API key (:func:`key_arg` on the
    arguments vLLM makes of its keys), or None; ``(None, why)`` when the file cannot be read as a YAML mapping."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return None, f"cannot be read as YAML ({type(exc).__name__}: {str(exc).strip().splitlines()[0][:120]})"
    if not isinstance(data, dict):
        return None, f"holds {type(data).__name__}, not a YAML mapping of vLLM's arguments"
    bad = key_arg([f"--{k}" for k in data])
    return (bad[2:] if bad else None), ""


@register_check
def _vllm_key_arg(cfg: DictConfig, registry) -> None:
    """Every vLLM server a run starts demands a key the run makes for it (docs/engine.md, "Keys"), given through
    ``VLLM_API_KEY``; vLLM takes an ``--api-key`` of the command line over it, so the run's own client would get
    401 on every request: refused before anything is written (and a key on a command line is one ``ps`` shows)."""
    r = cfg.get("rollout")
    if r is None or r.get("engine") != "vllm" or r.get("vllm") is None:
        return
    why = (
        "the run gives each vLLM server it starts a random key of its own (through VLLM_API_KEY, sent by its client; "
        'docs/engine.md, "Keys"), and vLLM would take yours over it'
    )
    bad = key_arg(r.vllm.get("args"))
    if bad is not None:
        raise ConfigError(f"rollout.vllm.args gives {bad}: {why}; valid: rollout.vllm.args without {bad}")
    for path in config_files(r.vllm.get("args")):  # its keys are arguments too: read it before anything is written
        key, unread = config_key(path)
        if unread:
            raise ConfigError(
                f"rollout.vllm.args gives --config {path}, which {unread}; the run reads it to check that it does "
                "not set vLLM's API key: give a readable YAML file (vLLM's --config), or leave --config out"
            )
        if key is not None:
            raise ConfigError(
                f"rollout.vllm.args gives --config {path}, whose key {key!r} sets vLLM's API key: {why}; valid: "
                f"a --config file without {key!r}"
            )


#: vLLM's flags (and short forms) whose product is the GPUs one server uses (its world size).
PARALLEL_FLAGS = (
    ("--tensor-parallel-size", "-tp"),
    ("--pipeline-parallel-size", "-pp"),
    ("--data-parallel-size", "-dp"),
)


def server_gpus(args) -> int:
    """The GPUs a vLLM server started with ``args`` (``rollout.vllm.args``) uses: its tensor-, pipeline- and
    data-parallel sizes multiplied (vLLM's defaults: 1 each), as ``--flag N``, ``--flag=N`` or the short ``-tp N``; a
    value that is not a positive integer is a :class:`ConfigError` naming it."""
    args = [str(a) for a in (args or [])]
    out = 1
    for names in PARALLEL_FLAGS:
        value = None
        for i, a in enumerate(args):
            name, eq, rest = a.partition("=")
            if name in names:
                value = rest if eq else (args[i + 1] if i + 1 < len(args) else "")
        if value is None:
            continue
        if not value.isdigit() or int(value) < 1:
            raise ConfigError(
                f"rollout.vllm.args: {names[0]} ({names[1]}) {value!r} is not valid; valid: a positive integer"
            )
        out *= int(value)
    return out


@register_check
def _vllm_parallel_args(cfg: DictConfig, registry) -> None:
    """The parallel sizes of ``rollout.vllm.args`` (tensor, pipeline, data) are the GPUs an engine sampler actor
    asks Ray for (:func:`server_gpus`, cluster/placement.py): a value that is not a positive integer is refused here,
    before anything is written."""
    r = cfg.get("rollout")
    if r is None or r.get("engine") != "vllm" or r.get("vllm") is None:
        return
    server_gpus(r.vllm.get("args"))


#: ``model.bases``, ``model.role_base``, ``rollout.urls``: mappings whose keys the user names (README, "A base per role").
MAPPING = ((lambda v: isinstance(v, dict)), "a mapping of NAME: value (set one entry as model.bases.NAME.KEY=VALUE)")

register_rules(
    Rule(
        "model.bases",
        MAPPING[0],
        "a mapping NAME -> model settings (model.bases.NAME.path=..., model.bases.NAME.hidden_size=...)",
    ),
    Rule(
        "model.role_base",
        (lambda v: isinstance(v, dict) and all(isinstance(n, str) for n in v.values())),
        "a mapping ROLE -> base name (model.role_base.ROLE=NAME)",
    ),
    Rule(
        "rollout.urls",
        (lambda v: isinstance(v, dict) and all(HTTP_URL[0](u) for u in v.values())),
        "a mapping base NAME -> http(s) URL (rollout.urls.NAME=http://host:port)",
    ),
)


#: rollout.engine=openai with a role on the default base (``model.*``) and no server for it.
NEEDS_URL = "rollout.engine=openai needs rollout.url (the server's base URL, e.g. http://127.0.0.1:8000)"


@register_check
def model_bases(cfg: DictConfig, registry) -> None:
    """``model.bases`` / ``model.role_base`` (a base per role): names, each base's keys and values (the rules of
    the ``model.*`` keys they replace), the roles (against the domain's), an algorithm that builds a swarm; and
    ``rollout.urls`` (one server per base)."""
    from dataclasses import replace

    from swarm_runtime.models import bases as B

    domains = getattr(registry, "domains", {}) if registry is not None else {}
    domain = domains.get(cfg.get("domain")) if isinstance(cfg.get("domain"), str) else None
    roles = [r.name for r in domain.roles] if domain is not None else None
    B.check(cfg.model, roles)
    for name, keys in B.bases_of(cfg.model).items():
        for k, v in keys.items():
            rule = RULES.get(f"model.{k}")
            if rule is not None and not (rule.lazy and not _lazy_ok(registry)):
                check_rule(replace(rule, key=f"model.bases.{name}.{k}"), v)
        try:  # its shape, as model.*'s
            model_shape(OmegaConf.create({"model": B.base_cfg(cfg.model, name)}), registry)
        except ConfigError as exc:
            raise ConfigError(f"the base {name!r} (model.* with model.bases.{name}.*): {exc}") from None
    if B.multi(cfg.model) and cfg.algo.name in ONE_MODEL_ALGOS:
        raise ConfigError(
            f"model.role_base gives roles their own bases, but algo={cfg.algo.name} trains one model; "
            f"valid: algo=mpt, or drop model.role_base"
        )
    r = cfg.get("rollout")
    urls = dict(r.get("urls") or {}) if r is not None else {}
    if urls and r.get("engine") != "openai":
        raise ConfigError(
            f"rollout.urls is read by rollout.engine=openai only (got rollout.engine={r.get('engine')}); "
            "drop rollout.urls"
        )
    valid = list(B.bases_of(cfg.model))
    bad = [n for n in urls if n not in valid]
    if bad:
        raise ConfigError(
            f"rollout.urls.{bad[0]}: no base {bad[0]!r} in model.bases; valid: "
            f"{', '.join(valid) or '(none: declare model.bases.NAME first)'} (rollout.url serves the "
            "default base)"
        )
    if r is None or r.get("engine") != "openai":
        return
    used = B.groups(cfg.model, roles) if roles is not None else {n: [] for n in B.role_bases(cfg.model).values()}
    missing = [n for n in used if n != B.DEFAULT and n not in urls]
    if missing:
        raise ConfigError(
            f"rollout.engine=openai with several bases needs one server per base: give "
            f"rollout.urls.{missing[0]}=http://host:port (rollout.url serves the default base)"
        )
    if not r.get("url") and B.DEFAULT in used:  # every role on a named base: rollout.url serves none
        raise ConfigError(f"{NEEDS_URL}: {', '.join(used[B.DEFAULT])} sit on the default base (model.*)")


# ---------------------------------------------------------------- train.* and cluster placement (issue 28)
register_rules(
    _rule("train.engine", choices("local", "fsdp", "deepspeed")),
    _rule("train.shards", ints(1, 1024)),
    _rule("cluster.placement", choices("none", "colocated", "split")),
    _rule("cluster.cpus_per_bundle", ints(1, 1024)),
    _rule("cluster.placement_wait_s", floats(0.0, 3600.0, lo_open=True)),
)


@register_check
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


# ---------------------------------------------------------------------------- serve.cluster (agent workers on Ray)
register_rules(
    _rule("serve.cluster", choices("local", "ray")),
    _rule("serve.address", RAY_ADDRESS, nullable=True, null_means="start a local Ray for the gateway (127.0.0.1)"),
)


# ---- serve: the gateway's limits and the agents it admits at start (``swarm serve``; ``swarm config`` the same)
register_rules(
    _rule("serve.allow_hosts", lists(STR, nonempty=False)),
    _rule("serve.client_episodes", at_least(1, 1_000_000)),
    _rule("serve.max_restarts", at_least(1, 1_000_000)),
    *(_rule(f"serve.{k}", floats(0.0, 1e7)) for k in ("queue_wait_s", "restart_window_s", "restart_backoff_max_s")),
    _rule("serve.degraded_share", floats(0.0, 1.0)),
)


@register_check
def serve_agent_urls(cfg: DictConfig, registry) -> None:
    """Each ``serve.agents`` entry's URL is an agent server's base URL on a loopback host or one of
    ``serve.allow_hosts``: what ``POST /v1/swarm/agents`` admits (:func:`swarm_runtime.serve.validate.check_agent_url`,
    pure Python)."""
    s = cfg.get("serve")
    if s is None:
        return
    from swarm_runtime.serve.validate import BadRequest, check_agent_url

    for spec in s.get("agents") or []:
        _, _, url = str(spec).partition("=")
        try:
            check_agent_url(url, list(s.get("allow_hosts") or []))
        except BadRequest as exc:
            raise ConfigError(f"serve.agents entry {str(spec)!r}: {exc.message}") from None


# ---- end serve


# ---------------------------------------------------------------- cluster.resources: actors pinned to nodes (issue 28)
#: The actor kinds ``cluster.resources`` names.
RESOURCE_KINDS = ("env", "learner", "sampler")
#: Resources Ray counts itself (asked with ``num_cpus`` / ``num_gpus`` or a placement, not ``resources``).
RAY_OWN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def _node_resources_ok(v) -> bool:
    return isinstance(v, dict) and all(
        k in RESOURCE_KINDS
        and isinstance(r, dict)
        and all(isinstance(n, str) and n and n not in RAY_OWN_RESOURCES and _positive(a) for n, a in r.items())
        for k, r in v.items()
    )


def _positive(a) -> bool:
    return isinstance(a, (int, float)) and not isinstance(a, bool) and 0 < a <= 1e6


register_rules(
    Rule(
        "cluster.resources",
        _node_resources_ok,
        f"a mapping KIND -> {{NAME: amount > 0}}, KIND one of {', '.join(RESOURCE_KINDS)}, NAME a custom resource "
        f"of a node (ray start --resources='{{\"NAME\": 1}}'; not {', '.join(RAY_OWN_RESOURCES)}), e.g. "
        "cluster.resources.env={nodeB: 0.01}",
    ),
    _rule("cluster.restart_wait_s", floats(0.0, 86400.0, lo_open=True)),
)


@register_check
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
