"""Plugins: the hook specifications and how the core calls each (:mod:`~swarm_runtime.plugins.hookspecs`), the
manager that loads plugins and calls the registration hooks (:mod:`~swarm_runtime.plugins.manager`), the registry
they fill (:mod:`~swarm_runtime.plugins.registry`), the plugins' config rules and conformance suites as validation
and the conformance kit use them (:mod:`~swarm_runtime.plugins.rules`, :mod:`~swarm_runtime.plugins.suites`), and
the core's own registrations (:mod:`~swarm_runtime.plugins.builtins`)."""
