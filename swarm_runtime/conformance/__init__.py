"""Conformance kit for domains: call :func:`swarm_runtime.conformance.check_domain` from your own tests.

Modules: :mod:`~swarm_runtime.conformance.suite` (``check_domain``: every check, then the plugins' suites),
:mod:`~swarm_runtime.conformance.probe` (the machinery: probes, frozen states, ``ConformanceError``),
:mod:`~swarm_runtime.conformance.env` (the env: snapshots, rare paths, close, the expert, action choices),
:mod:`~swarm_runtime.conformance.task` (seed splits, fresh task configs, prompts),
:mod:`~swarm_runtime.conformance.determinism` (the same trajectories here and in other processes) and
:mod:`~swarm_runtime.conformance.rlcr` (the core's suite for ``algo=rlcr``).
"""

from swarm_runtime.conformance.probe import ConformanceError  # noqa: F401  (what every check raises)
from swarm_runtime.conformance.suite import check_domain  # noqa: F401  (the public entry)
