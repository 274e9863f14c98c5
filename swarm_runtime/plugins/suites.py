"""The conformance suites plugins register (``swarm_register_conformance_suites`` in
:mod:`swarm_runtime.plugins.hookspecs`), for :func:`swarm_runtime.conformance.suite.check_domain`."""

from __future__ import annotations

from typing import Any

from swarm_runtime.plugins.manager import build_registry, make_plugin_manager
from swarm_runtime.plugins.registry import ConformanceSuite


def conformance_suites(registry: Any = None) -> list[ConformanceSuite]:
    """The suites in registration order (the core's RLCR suite first): ``registry``'s (one
    :func:`~swarm_runtime.plugins.manager.build_registry` built), or, with no registry or a light one, those of
    the installed plugins (the core's and the ``swarm_runtime`` entry points, as ``SWARM_DISABLE_PLUGINS`` and
    ``SWARM_LOAD_PLUGINS`` allow), collected by calling that hook alone."""
    if registry is None or getattr(registry, "light", False):
        registry = build_registry(make_plugin_manager(), kinds=("conformance_suites",))
    return list(registry.conformance_suites.values())
