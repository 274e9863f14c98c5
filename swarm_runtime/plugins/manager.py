"""Plugin manager: loads every plugin from the ``swarm_runtime`` entry-point group
(built-in domains included, exactly like third-party ones) and fills the registry
(:mod:`swarm_runtime.plugins.registry`) by calling the registration hooks.

Environment variables:
- ``SWARM_DISABLE_PLUGINS``: comma-separated plugin names to block.
- ``SWARM_LOAD_PLUGINS``: comma-separated allow-list; when set, only these load.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from importlib.metadata import entry_points
from typing import Any

import pluggy
from loguru import logger

from swarm_runtime.plugins import hookspecs
from swarm_runtime.plugins.registry import PluginError, Registry, registrars

__all__ = ["PluginError", "Registry", "build_registry", "get_registry", "make_plugin_manager"]

ENTRY_POINT_GROUP = "swarm_runtime"
#: Core plugins that register core behaviour through the same public hooks.
CORE_PLUGINS = ("swarm_runtime.plugins.builtins",)


def _names(var: str) -> set[str]:
    return {n.strip() for n in os.environ.get(var, "").split(",") if n.strip()}


def make_plugin_manager(extra_plugins: list[tuple[Any, str]] | None = None) -> pluggy.PluginManager:
    """Build a manager with core plugins, entry-point plugins and ``extra_plugins``
    (``(object, name)`` pairs, used by tests); honours the allow/block env vars."""
    pm = pluggy.PluginManager("swarm_runtime")
    pm.add_hookspecs(hookspecs)
    blocked, allowed = _names("SWARM_DISABLE_PLUGINS"), _names("SWARM_LOAD_PLUGINS")

    def wanted(name: str) -> bool:
        return name not in blocked and (not allowed or name in allowed)

    import importlib

    for modname in CORE_PLUGINS:
        pm.register(importlib.import_module(modname), name=modname.rsplit(".", 1)[-1])
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if not wanted(ep.name) or pm.has_plugin(ep.name):
            continue
        try:
            pm.register(ep.load(), name=ep.name)
        except Exception as exc:  # a broken plugin must say who it is
            raise PluginError(
                f"plugin {ep.name!r} ({ep.value}) failed to load: {exc}; skip it with "
                f"SWARM_DISABLE_PLUGINS={ep.name} (comma-separated names)"
            ) from exc
    for obj, name in extra_plugins or []:
        if wanted(name):
            pm.register(obj, name=name)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"{exc} (valid hooks: {', '.join(sorted(_hook_names()))})") from exc
    return pm


def _hook_names() -> list[str]:
    return [n for n in dir(hookspecs) if n.startswith("swarm_")]


#: Registry table -> the registration hook that fills it, called in this order for each plugin
#: (``config_rules``' hook fills ``config_checks`` too).
HOOKS = {
    "domains": "swarm_register_domains",
    "policy_backends": "swarm_register_policy_backends",
    "coordinators": "swarm_register_coordinators",
    "credit_schemes": "swarm_register_credit_schemes",
    "algorithms": "swarm_register_algorithms",
    "experiments": "swarm_register_experiments",
    "config_rules": "swarm_register_config_rules",
    "conformance_suites": "swarm_register_conformance_suites",
}


def build_registry(pm: pluggy.PluginManager, kinds: Iterable[str] | None = None) -> Registry:
    """Call every registration hook (of ``kinds``, tables of :data:`HOOKS`; default all), one plugin at a time
    in registration order, so each registration is attributed to its plugin; duplicate names are an error
    naming both plugins, an exception inside a hook one naming the plugin and the hook."""
    reg = Registry()
    wanted = HOOKS if kinds is None else {k: HOOKS[k] for k in kinds}
    for plugin_name, plugin in pm.list_name_plugin():
        for kind, hook in wanted.items():
            if hasattr(plugin, hook):
                _call_one(pm, plugin, plugin_name, hook, registrars(kind, reg, plugin_name))
        reg.provenance.setdefault(plugin_name, [])
    return reg


def _call_one(pm: pluggy.PluginManager, plugin: Any, name: str, hook: str, kwargs: dict) -> None:
    """``hook`` of ``plugin`` alone, with ``kwargs``."""
    try:
        pm.subset_hook_caller(hook, [p for p in pm.get_plugins() if p is not plugin])(**kwargs)
    except PluginError:
        raise
    except Exception as exc:  # a broken plugin must say who it is
        raise PluginError(f"plugin {name!r} failed in {hook}: {type(exc).__name__}: {exc}") from exc


_CACHE: dict[str, Any] = {}


def get_registry(refresh: bool = False) -> tuple[pluggy.PluginManager, Registry]:
    """The process-wide manager and registry, built lazily on first use."""
    if refresh or "reg" not in _CACHE:
        pm = make_plugin_manager()
        _CACHE["pm"], _CACHE["reg"] = pm, build_registry(pm)
        logger.debug("plugins loaded: {}", [n for n, _ in pm.list_name_plugin()])
    return _CACHE["pm"], _CACHE["reg"]
