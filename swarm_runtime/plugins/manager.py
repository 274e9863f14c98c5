"""Plugin manager: loads every plugin from the ``swarm_runtime`` entry-point group
(built-in domains included, exactly like third-party ones) and owns the registries.

Environment variables:
- ``SWARM_DISABLE_PLUGINS``: comma-separated plugin names to block.
- ``SWARM_LOAD_PLUGINS``: comma-separated allow-list; when set, only these load.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

import pluggy
from loguru import logger

from swarm_runtime.plugins import hookspecs

ENTRY_POINT_GROUP = "swarm_runtime"
#: Core plugins that register core behaviour through the same public hooks.
CORE_PLUGINS = ("swarm_runtime.plugins.builtins",)


class PluginError(RuntimeError):
    """A plugin is broken or registered something twice."""


@dataclass
class Registry:
    """Name -> object registries filled by the registration hooks."""

    domains: dict[str, Any] = field(default_factory=dict)
    policy_backends: dict[str, Callable] = field(default_factory=dict)
    coordinators: dict[str, Callable] = field(default_factory=dict)
    credit_schemes: dict[str, Callable] = field(default_factory=dict)
    algorithms: dict[str, Callable] = field(default_factory=dict)
    experiments: dict[str, Callable] = field(default_factory=dict)
    #: plugin name -> list of "kind:name" it registered (for ``swarm plugins``)
    provenance: dict[str, list[str]] = field(default_factory=dict)

    def get(self, kind: str, name: str) -> Any:
        table = getattr(self, kind)
        if name not in table:
            valid = ", ".join(sorted(table)) or "(none registered)"
            raise KeyError(f"unknown {kind[:-1].replace('_', ' ')} {name!r}; valid: {valid}")
        return table[name]


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


def build_registry(pm: pluggy.PluginManager) -> Registry:
    """Call every registration hook, one plugin at a time so each registration is
    attributed to its plugin; duplicate names are an error naming both plugins."""
    reg = Registry()
    owners: dict[tuple[str, str], str] = {}
    hooks = {
        "domains": "swarm_register_domains",
        "policy_backends": "swarm_register_policy_backends",
        "coordinators": "swarm_register_coordinators",
        "credit_schemes": "swarm_register_credit_schemes",
        "algorithms": "swarm_register_algorithms",
        "experiments": "swarm_register_experiments",
    }
    for plugin_name, plugin in pm.list_name_plugin():
        for kind, hook in hooks.items():
            if not hasattr(plugin, hook):
                continue

            def register(name_or_obj: Any, obj: Any = None, *, _kind=kind, _p=plugin_name) -> None:
                if _kind == "domains":
                    obj, name = name_or_obj, getattr(name_or_obj, "name", "")
                    if not name:
                        raise PluginError(f"plugin {_p!r} registered a domain without a name")
                else:
                    name = name_or_obj
                table = getattr(reg, _kind)
                if name in table:
                    raise PluginError(
                        f"{_kind[:-1]} {name!r} registered twice: by {owners[(_kind, name)]!r} and by {_p!r}"
                    )
                table[name] = obj
                owners[(_kind, name)] = _p
                reg.provenance.setdefault(_p, []).append(f"{_kind[:-1]}:{name}")

            pm.subset_hook_caller(hook, [p for p in pm.get_plugins() if p is not plugin])(register=register)
        reg.provenance.setdefault(plugin_name, [])
    return reg


_CACHE: dict[str, Any] = {}


def get_registry(refresh: bool = False) -> tuple[pluggy.PluginManager, Registry]:
    """The process-wide manager and registry, built lazily on first use."""
    if refresh or "reg" not in _CACHE:
        pm = make_plugin_manager()
        _CACHE["pm"], _CACHE["reg"] = pm, build_registry(pm)
        logger.debug("plugins loaded: {}", [n for n, _ in pm.list_name_plugin()])
    return _CACHE["pm"], _CACHE["reg"]
