"""Conformance kit for domains: call :func:`swarm_runtime.conformance.check_domain` from your own tests."""

from swarm_runtime.conformance.suite import check_domain  # noqa: F401  (the public entry)
