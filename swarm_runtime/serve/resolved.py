"""What ``swarm serve`` resolved before the gateway starts (:class:`GatewaySetup`), where a role's model is in a
checkpoint (:func:`role_folder`), and which folder inside the run a request names (:func:`in_run`)."""

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


def in_run(setup: GatewaySetup, name: str, at_tag, found) -> Path | None:
    """The folder ``name`` names inside the run folder (a swap's checkpoint, an added agent's model): ``at_tag(
    checkpoints/TAG)`` when it is a tag (``latest``: the tag that file holds), else the path itself (relative to the
    run folder); the first of the two that ``found`` accepts and that lies inside the run folder once links are
    resolved, or None."""
    ckpts = setup.run_dir / "checkpoints"
    if name == "latest" and (ckpts / "latest").exists():
        name = (ckpts / "latest").read_text().strip()
    run = setup.run_dir.resolve()
    candidates = [] if "/" in name or name in (".", "..") else [at_tag(ckpts / name)]
    candidates.append(Path(name) if Path(name).is_absolute() else setup.run_dir / name)
    for path in candidates:
        path = path.resolve()
        if found(path) and path.is_relative_to(run):
            return path
    return None


def checkpoint_tags(setup: GatewaySetup) -> list[str]:
    """The run's checkpoint tags (the folders of ``checkpoints/`` with ``agents/``), for an error naming them."""
    return sorted(p.name for p in (setup.run_dir / "checkpoints").glob("*") if (p / "agents").is_dir())


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
