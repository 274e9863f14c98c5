"""What ``swarm serve`` resolved before the gateway starts (:class:`GatewaySetup`), where a role's model is in a
checkpoint (:func:`role_folder`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class GatewaySetup:
    """What ``swarm serve`` resolved: the run, its checkpoint, and the config."""

    run_dir: Path
    checkpoint: Path
    cfg: Any  #: the run's config with the command line's overrides (``cfg.serve`` is the ServeConfig)
    registry: Any
    pm: Any
    api_key: str | None = None


def role_folder(checkpoint: Path, role: str) -> Path:
    """The model folder serving ``role`` in ``checkpoint``: ``agents/ROLE``, or ``agents/Shared`` for a run
    that trained one shared policy for every role (``algo=rlcr``)."""
    own = checkpoint / "agents" / role
    shared = checkpoint / "agents" / "Shared"
    return shared if not (own / "config.json").exists() and (shared / "config.json").exists() else own


def check_agents_not_gateway(serve) -> None:
    """No ``serve.agents`` entry is the gateway's own address, ``serve.host:serve.port`` (with ``serve.port=0``, any free
    port, the gateway's probe finds one that is): one line naming the entry (the CLI: exit 2). Only ``swarm serve``
    asks: the port is a deployment setting, which another command's config need not match."""
    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.serve.validate import BadRequest, check_agent_url

    if int(serve.port) <= 0:
        return
    for spec in serve.agents or []:
        _, _, url = str(spec).partition("=")
        try:
            check_agent_url(url, list(serve.allow_hosts or []), gateway=(str(serve.host), int(serve.port)))
        except BadRequest as exc:
            raise ConfigError(f"serve.agents entry {str(spec)!r}: {exc.message}") from None
