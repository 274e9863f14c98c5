"""What ``swarm serve`` resolved before the gateway starts (:class:`GatewaySetup`), and where a role's model
is in a checkpoint (:func:`role_folder`)."""

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
