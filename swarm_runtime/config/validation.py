"""Validation of a whole config, before anything is written or loaded: :func:`validate`.

Two parts, both open to extension:

- every key's rule (:data:`swarm_runtime.config.keys.RULES`: its type, range or choices, and what is valid, for
  the message; :func:`~swarm_runtime.config.keys.register_rules` adds more);
- the cross-key checks, :data:`CHECKS` in the order they run, ``fn(cfg, registry)`` raising :class:`ConfigError`
  (:mod:`swarm_runtime.config.checks`: model, algorithm, evaluation; :mod:`~swarm_runtime.config.checks_cluster`:
  Ray, placement and the learner engine; :mod:`~swarm_runtime.config.checks_engine`: engine samplers and bases;
  :mod:`~swarm_runtime.config.checks_serve`: the served roles); :func:`register_check` adds more. ``registry`` is
  None, or a light one of the domains only, when a command line is checked before the plugins load; a check that
  needs more returns.

:func:`swarm_runtime.config.load.precheck` runs the rules of the keys given on the command line on their own
(:func:`~swarm_runtime.config.keys.check_key`), before the plugins (torch, transformers) are imported, so a bad
value fails in a fraction of a second. Each error names the key, the bad value and what is valid.

``swarm config``, ``swarm run``, ``swarm eval``, ``swarm serve`` and ``swarm experiment`` all validate here, so what
one refuses the others refuse too. This module imports nothing of the config's loading
(:mod:`swarm_runtime.config.load` imports it). Callers import from here the ways to extend it (``Rule``,
``register_rules``, :func:`register_check`) and the checks' helpers others use (``server_gpus``, ``key_arg``,
``config_files``, ``config_key``, ``serve_roles``, ``NEEDS_URL``, ``rlcr``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from swarm_runtime.config import checks, checks_cluster, checks_engine, checks_serve
from swarm_runtime.config.checks import rlcr  # noqa: F401
from swarm_runtime.config.checks_engine import NEEDS_URL, config_files, config_key, key_arg, server_gpus  # noqa: F401
from swarm_runtime.config.checks_serve import serve_roles  # noqa: F401
from swarm_runtime.config.errors import ConfigError
from swarm_runtime.config.keys import RULES, Rule, check_key, register_rules  # noqa: F401
from swarm_runtime.config.rules import check_rule, lazy_ok, value_at

#: The cross-key checks, in the order they run (the first error is the one raised); :func:`register_check` adds more.
CHECKS: list[Callable[[DictConfig, Any], None]] = [
    checks.registered_names,
    checks.bid_levels,
    checks.model_shape,
    checks_cluster.cluster_kind,
    checks_cluster.cluster_samplers,
    checks_cluster.cluster_sampler_replicas,
    checks_cluster.cluster_learners,
    checks_cluster.cluster_env_vars,
    checks.eval_split,
    checks.splits,
    checks.adapter,
    checks.rlcr,
    checks_serve.serve,
    checks_serve.serve_agent_urls,
    checks.adapter_algo,
    checks.rlcr_only,
    checks.served,
    checks.bid_steps_need_bids,
    checks.adapter_rates,
    checks_engine.rollout_engine,
    checks_engine.vllm_key_arg,
    checks_engine.vllm_parallel_args,
    checks_engine.model_bases,
    checks_cluster.train_engine,
    checks_cluster.cluster_resources,
    checks_cluster.check_engine_wired,
]


def register_check(fn: Callable[[DictConfig, Any], None]) -> Callable:
    """Add a cross-key check ``fn(cfg, registry)`` (usable as a decorator); it runs after the others."""
    CHECKS.append(fn)
    return fn


#: The settings that put a command's work on Ray when ``ray``: ``cluster.kind`` (the run's env workers, sampler and
#: learner actors: ``swarm run``, and ``swarm eval``'s env workers) and ``serve.cluster`` (``swarm serve``'s agent
#: workers). :func:`validate` asks for Ray only for those of the command (``ray_keys``).
RAY_KEYS = ("cluster.kind", "serve.cluster")


def needs_ray(cfg: DictConfig, keys=RAY_KEYS) -> None:
    """Ray installed (found, not imported) when one of ``keys`` is ``ray`` in ``cfg``; else one line naming the
    setting and the extra."""
    for key in keys:
        if OmegaConf.select(cfg, key, default=None) == "ray" and importlib.util.find_spec("ray") is None:
            raise ConfigError(f"{key}=ray needs Ray, which is not installed: pip install 'swarm-runtime[ray]'")


def validate(cfg: DictConfig, registry, ray_keys=RAY_KEYS) -> None:
    """Every rule on ``cfg``'s keys, then every cross-key check, then Ray installed where the command uses it
    (``ray_keys``: of :data:`RAY_KEYS`, those the command acts on; ``swarm eval`` serves nothing, ``swarm serve``
    steps no env); the first error is raised. A config that cannot run is named before the extra it would need:
    installing Ray would not make it valid."""
    _resolve_all(cfg)
    for r in RULES.values():
        try:
            value = value_at(cfg, r.key)
        except KeyError:
            continue  # a key this config does not have (a section another version adds)
        if r.lazy and not lazy_ok(registry):
            continue
        check_rule(r, value)
    for check in CHECKS:
        check(cfg, registry)
    from swarm_runtime.plugins.rules import run_plugin_rules

    run_plugin_rules(cfg, registry, check_rule)  # the plugins' rules of their task keys, then their checks
    needs_ray(cfg, ray_keys)


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
