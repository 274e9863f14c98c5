"""swarm-runtime: train and deploy swarms of LLM agents with the MPT method.

The core knows no domain by name; domains arrive through :mod:`swarm_runtime.plugins.hookspecs`.
"""

import pluggy

__version__ = "0.1.0"

#: Decorator for hook implementations: ``@swarm_runtime.hookimpl``.
hookimpl = pluggy.HookimplMarker("swarm_runtime")

__all__ = ["hookimpl", "__version__"]
