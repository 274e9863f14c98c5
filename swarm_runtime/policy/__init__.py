"""Policies: the :class:`~swarm_runtime.policy.base.Policy` protocol and its backends."""
