"""The error a bad setting raises. At the bottom of the core: the config (:mod:`swarm_runtime.config`),
its validation (:mod:`swarm_runtime.validation`) and everything else raise it without importing each
other."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad config value; the CLI prints it and exits with code 2."""
