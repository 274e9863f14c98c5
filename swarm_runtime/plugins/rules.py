"""The config rules and cross-key checks plugins register (``swarm_register_config_rules`` in
:mod:`swarm_runtime.plugins.hookspecs`), run by :func:`swarm_runtime.config.validation.validate` after the core's
own. An error they raise names its plugin: ``task.length=0 is not valid: must be ... (rule of plugin 'colors' for
domain 'colors')``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from omegaconf import DictConfig

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.plugins.manager import build_registry, make_plugin_manager
from swarm_runtime.plugins.registry import PluginCheck, PluginError, PluginRule


def plugin_rules(registry: Any) -> tuple[list[PluginRule], list[PluginCheck]]:
    """The plugins' rules and checks: ``registry``'s (one :func:`~swarm_runtime.plugins.manager.build_registry`
    built); for a light registry (a precheck's, domains only) those of the installed plugins, collected by
    calling that hook alone; none for ``registry=None`` (no plugin loaded)."""
    if registry is None:
        return [], []
    if getattr(registry, "light", False):
        registry = build_registry(make_plugin_manager(), kinds=("config_rules",))
    return list(getattr(registry, "config_rules", ())), list(getattr(registry, "config_checks", ()))


def run_plugin_rules(cfg: DictConfig, registry: Any, check_rule: Callable[[Any, Any], None]) -> None:
    """Each plugin rule of ``cfg``'s domain on its key, when ``cfg`` has it (``check_rule(rule, value)``:
    validation's, which raises :class:`ConfigError`; a ``lazy`` rule waits for a full registry), then every
    plugin check ``fn(cfg, registry)``, in registration order; the first error is raised with its plugin named.
    ``cfg``'s interpolations must be resolved already (``validate`` does it first)."""
    rules, checks = plugin_rules(registry)
    light = getattr(registry, "light", False)
    for owned in rules:
        found, value = _lookup(cfg, owned.rule.key)
        if not found or owned.domain != cfg.get("domain") or (getattr(owned.rule, "lazy", False) and light):
            continue
        with _naming(f"rule of plugin {owned.plugin!r} for domain {owned.domain!r}"):
            check_rule(owned.rule, value)
    for owned in checks:
        with _naming(f"check {getattr(owned.fn, '__qualname__', owned.fn)!r} of plugin {owned.plugin!r}"):
            owned.fn(cfg, registry)


def _lookup(cfg: DictConfig, key: str) -> tuple[bool, Any]:
    """``(True, value)`` for a key ``cfg`` has (dotted), else ``(False, None)``."""
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return False, None
        node = node[part]
    return True, node


@contextmanager
def _naming(whose: str) -> Iterator[None]:
    """A :class:`ConfigError` raised inside gets `` (whose)`` at its end; any other exception (the plugin's
    own bug) becomes a :class:`PluginError` naming ``whose``."""
    try:
        yield
    except ConfigError as exc:
        raise ConfigError(f"{exc} ({whose})") from exc
    except PluginError:
        raise
    except Exception as exc:
        raise PluginError(f"the {whose} raised {type(exc).__name__}: {exc}") from exc
