"""What ``swarm serve`` resolved before the gateway starts (:class:`GatewaySetup`), where a role's model is in a
checkpoint (:func:`role_folder`), and that the weights its workers will load are whole (:func:`check_weights`)."""

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


def check_weights(checkpoint: Path, roles: list[str]) -> None:
    """The weights files (``*.safetensors``) of the model folders serving ``roles`` (and of an adapter's base) can be
    opened: each header whole and the file as long as it says. A truncated or foreign file is a
    :class:`~swarm_runtime.runs.checkpoint.CheckpointError` naming it (the CLI: one line, exit 2), before any worker
    starts, as ``swarm eval`` refuses that checkpoint. Reads headers only (the tensors are mapped, not loaded)."""
    from safetensors import safe_open

    from swarm_runtime.runs.checkpoint import CheckpointError
    from swarm_runtime.serve.adapters import base_of

    folders = {role_folder(checkpoint, r) for r in roles}
    for f in list(folders):
        if (f / "swarm_base.json").exists():  # an adapter (LoRA runs): its base too
            try:
                folders.add(base_of(f))
            except (OSError, ValueError, KeyError, TypeError):  # a damaged pointer: the checkpoint check names it
                pass
    for folder in sorted(folders):
        for path in sorted(folder.rglob("*.safetensors")):
            try:
                with safe_open(str(path), framework="pt"):
                    pass
            except Exception as exc:  # SafetensorError, OSError: truncated, foreign or unreadable
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
                raise CheckpointError(
                    f"the models in {checkpoint / 'agents'} cannot be loaded ({path}: {type(exc).__name__}: {first}); "
                    "serve another checkpoint (checkpoint=TAG)"
                ) from exc


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
