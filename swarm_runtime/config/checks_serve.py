"""Cross-key checks of the ``serve.*`` settings (``swarm serve``, ``swarm eval ... serve.url=``), ``fn(cfg,
registry)`` as in :mod:`swarm_runtime.config.checks`: the roles they name are the run's. Every command checks them,
so ``swarm run`` saves none bad; each key's own range is its rule's (:mod:`swarm_runtime.config.keys`).
"""

from __future__ import annotations

from omegaconf import DictConfig

from swarm_runtime.config.errors import ConfigError


def serve_roles(cfg: DictConfig, roles: list[str]) -> None:
    """``serve.replicas`` per role and ``serve.agents`` (``ROLE=URL``) name the run's ``roles``."""
    rep = cfg.serve.replicas
    bad = [r for r in rep if r not in roles] if isinstance(rep, (dict, DictConfig)) else []
    if bad:
        raise ConfigError(f"serve.replicas.{bad[0]}: no role {bad[0]!r}; valid: {', '.join(roles)}")
    for spec in cfg.serve.agents or []:
        role, sep, url = str(spec).partition("=")
        if not sep or role not in roles or not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"serve.agents entry {spec!r} is not ROLE=URL with ROLE one of {', '.join(roles)} and an http(s) URL"
            )


def serve(cfg: DictConfig, registry) -> None:
    """``serve.*`` against the domain's roles (:func:`serve_roles`; each key's range is its rule's)."""
    domains = getattr(registry, "domains", None) or {}
    if cfg.get("serve") is not None and cfg.get("domain") in domains:
        serve_roles(cfg, [r.name for r in domains[cfg.domain].roles])


def serve_agent_urls(cfg: DictConfig, registry) -> None:
    """Each ``serve.agents`` entry's URL is an agent server's base URL on a loopback host or one of
    ``serve.allow_hosts``: what ``POST /v1/swarm/agents`` admits (:func:`swarm_runtime.serve.validate.check_agent_url`,
    pure Python)."""
    s = cfg.get("serve")
    if s is None:
        return
    from swarm_runtime.serve.validate import BadRequest, check_agent_url

    for spec in s.get("agents") or []:
        _, _, url = str(spec).partition("=")
        try:
            check_agent_url(url, list(s.get("allow_hosts") or []))
        except BadRequest as exc:
            raise ConfigError(f"serve.agents entry {str(spec)!r}: {exc.message}") from None
