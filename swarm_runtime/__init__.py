"""swarm-runtime: train and deploy swarms of LLM agents with the MPT method.

The core knows no domain by name; domains arrive through :mod:`swarm_runtime.plugins.hookspecs`.

What a plugin author needs, importable from here: ``hookimpl`` (marks a hook implementation), the domain
contracts ``Domain``, ``Role`` and ``Event`` (:mod:`swarm_runtime.core.domain`), the env contracts ``DomainEnv``,
``StepResult`` and ``ExpertStep`` (:mod:`swarm_runtime.core.env`), and ``check_domain``, the conformance kit
with ``ConformanceError``, what its checks and a plugin's conformance suites raise (:mod:`swarm_runtime.conformance`;
both loaded on first use, so ``import swarm_runtime`` stays light: no torch).
"""

from typing import Any

import pluggy

from swarm_runtime.core.domain import Domain, Event, Role
from swarm_runtime.core.env import DomainEnv, ExpertStep, StepResult

__version__ = "0.1.0"

#: Decorator for hook implementations: ``@swarm_runtime.hookimpl``.
hookimpl = pluggy.HookimplMarker("swarm_runtime")

__all__ = [
    "Domain",
    "DomainEnv",
    "Event",
    "ExpertStep",
    "Role",
    "StepResult",
    "ConformanceError",
    "__version__",
    "check_domain",
    "hookimpl",
]


def __getattr__(name: str) -> Any:
    """``check_domain`` and ``ConformanceError`` on first use (the conformance kit imports more than a plugin
    module needs)."""
    if name == "check_domain":
        from swarm_runtime.conformance.suite import check_domain

        return check_domain
    if name == "ConformanceError":
        from swarm_runtime.conformance.probe import ConformanceError

        return ConformanceError
    raise AttributeError(f"module 'swarm_runtime' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
