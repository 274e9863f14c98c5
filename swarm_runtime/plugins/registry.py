"""The registry the registration hooks fill (:mod:`swarm_runtime.plugins.hookspecs`), the records of what
plugins register for validation and the conformance kit, and the ``register`` callables handed to each
plugin. Everything registered is recorded as its plugin's: a second registration of a name names both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class PluginError(RuntimeError):
    """A plugin is broken or registered something twice."""


@dataclass(frozen=True)
class PluginRule:
    """A config rule a plugin registered: ``rule`` (a :class:`swarm_runtime.config.rules.Rule` of a
    ``task.*`` key) is checked on the configs of ``domain``."""

    rule: Any
    domain: str
    plugin: str


@dataclass(frozen=True)
class PluginCheck:
    """A cross-key check ``fn(cfg, registry)`` a plugin registered."""

    fn: Callable[[Any, Any], None]
    plugin: str


@dataclass(frozen=True)
class ConformanceSuite:
    """A conformance suite a plugin registered: ``run(domain, task, **kw)``, on the domains for which
    ``applies(domain, task)`` is true (every domain when ``applies`` is None)."""

    name: str
    run: Callable[..., Any]
    applies: Callable[[Any, Any], bool] | None
    plugin: str


@dataclass
class Registry:
    """Name -> object registries filled by the registration hooks."""

    domains: dict[str, Any] = field(default_factory=dict)
    policy_backends: dict[str, Callable] = field(default_factory=dict)
    coordinators: dict[str, Callable] = field(default_factory=dict)
    credit_schemes: dict[str, Callable] = field(default_factory=dict)
    algorithms: dict[str, Callable] = field(default_factory=dict)
    experiments: dict[str, Callable] = field(default_factory=dict)
    #: the plugins' rules of their task keys and their cross-key checks, in registration order
    config_rules: list[PluginRule] = field(default_factory=list)
    config_checks: list[PluginCheck] = field(default_factory=list)
    #: name -> the conformance suites ``check_domain`` runs after its own checks, in registration order
    conformance_suites: dict[str, ConformanceSuite] = field(default_factory=dict)
    #: plugin name -> list of "kind:name" it registered (for ``swarm plugins``)
    provenance: dict[str, list[str]] = field(default_factory=dict)
    #: True for a registry of the domains only (``swarm_runtime.config.load.light_registry``: a precheck)
    light: bool = False
    #: (kind, name) -> the plugin that registered it
    owners: dict[tuple[str, Any], str] = field(default_factory=dict, repr=False)

    def get(self, kind: str, name: str) -> Any:
        table = getattr(self, kind)
        if name not in table:
            valid = ", ".join(sorted(table)) or "(none registered)"
            raise KeyError(f"unknown {kind[:-1].replace('_', ' ')} {name!r}; valid: {valid}")
        return table[name]

    def claim(self, kind: str, key: Any, plugin: str, what: str, listed: str) -> None:
        """Record ``key`` of ``kind`` as ``plugin``'s (``listed`` in its provenance); a key another
        registration holds is a :class:`PluginError` naming ``what`` and both plugins."""
        if (kind, key) in self.owners:
            raise PluginError(f"{what} registered twice: by {self.owners[(kind, key)]!r} and by {plugin!r}")
        self.owners[(kind, key)] = plugin
        self.provenance.setdefault(plugin, []).append(listed)


def registrars(kind: str, reg: Registry, plugin: str) -> dict[str, Callable]:
    """The keyword arguments of the hook that fills ``kind``, for ``plugin``: its ``register`` callables."""
    if kind == "config_rules":
        return {"register": _rule_registrar(reg, plugin), "register_check": _check_registrar(reg, plugin)}
    if kind == "conformance_suites":
        return {"register": _suite_registrar(reg, plugin)}
    return {"register": _named_registrar(reg, kind, plugin)}


def _named_registrar(reg: Registry, kind: str, plugin: str) -> Callable:
    """``register(domain)`` for domains (keyed by ``domain.name``), ``register(name, obj)`` for the others."""

    def register(name_or_obj: Any, obj: Any = None) -> None:
        if kind == "domains":
            obj, name = name_or_obj, getattr(name_or_obj, "name", "")
            if not name:
                raise PluginError(f"plugin {plugin!r} registered a domain without a name")
        else:
            name = name_or_obj
        reg.claim(kind, name, plugin, f"{kind[:-1]} {name!r}", f"{kind[:-1]}:{name}")
        getattr(reg, kind)[name] = obj

    return register


def _rule_registrar(reg: Registry, plugin: str) -> Callable:
    def register(rule: Any, domain: str | None = None) -> None:
        key = getattr(rule, "key", None)
        if not isinstance(key, str) or not callable(getattr(rule, "ok", None)) or not hasattr(rule, "valid"):
            raise PluginError(
                f"plugin {plugin!r} registered {rule!r} as a config rule; valid: a swarm_runtime.config.rules.Rule"
            )
        if not key.startswith("task.") or key == "task.":
            raise PluginError(
                f"plugin {plugin!r} registered a rule of {key!r}; valid: keys of the task section (task.KEY), "
                "the one section a domain owns (every other key is the core's)"
            )
        if not isinstance(domain, str) or not domain:
            raise PluginError(
                f"plugin {plugin!r} registered a rule of {key} for domain {domain!r}; valid: "
                "register(rule, domain='NAME'), the domain whose task has the key"
            )
        what = f"config rule of {key} for domain {domain!r}"
        reg.claim("config_rules", (domain, key), plugin, what, f"config_rule:{key} ({domain})")
        reg.config_rules.append(PluginRule(rule, domain, plugin))

    return register


def _check_registrar(reg: Registry, plugin: str) -> Callable:
    def register_check(fn: Callable) -> Callable:
        if not callable(fn):
            raise PluginError(
                f"plugin {plugin!r} registered {fn!r} as a config check; valid: a function fn(cfg, registry)"
            )
        name = getattr(fn, "__qualname__", repr(fn))
        reg.claim("config_checks", fn, plugin, f"config check {name!r}", f"config_check:{name}")
        reg.config_checks.append(PluginCheck(fn, plugin))
        return fn

    return register_check


def _suite_registrar(reg: Registry, plugin: str) -> Callable:
    def register(name: str, suite: Callable, applies: Callable | None = None) -> None:
        if not isinstance(name, str) or not name or not callable(suite) or not (applies is None or callable(applies)):
            raise PluginError(
                f"plugin {plugin!r} registered conformance suite {name!r} with {suite!r}, applies={applies!r}; "
                "valid: register('NAME', suite(domain, task, **kw), applies=None or applies(domain, task))"
            )
        reg.claim("conformance_suites", name, plugin, f"conformance suite {name!r}", f"conformance_suite:{name}")
        reg.conformance_suites[name] = ConformanceSuite(name, suite, applies, plugin)

    return register
