"""The one check of a checkpoint's models before anything loads them (``swarm eval``, ``swarm export``, ``swarm serve``
and ``resume=true``): :func:`check_agents`. A folder damaged or tampered with (a role's adapter copied over
another's, a missing or garbage ``swarm_policy.json``, a deleted adapter or weights file, NaN or infinite weights, a
base whose files are not the ones the adapters were trained on) is a
:class:`~swarm_runtime.runs.checkpoint.CheckpointError`: one line naming the file and what to do, the same for every
command, instead of the error a loader would give halfway (a Hugging Face repo-id error, a sampling error on NaN)."""

from __future__ import annotations

import json
from pathlib import Path

from swarm_runtime.runs.checkpoint import CheckpointError

#: What each kind of model folder must hold: an adapter (``swarm_base.json`` beside it) or a full model.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "swarm_policy.json")
FULL_FILES = ("config.json", "swarm_policy.json")
#: What to do about a damaged checkpoint.
OTHER = "use another checkpoint (checkpoint=TAG), or restore the file"


def check_agents(ckpt: Path, roles=None) -> None:
    """Check every model folder of checkpoint ``ckpt`` (``agents/*``; ``roles``: the folders that must be there, None:
    those that are): its files (:func:`_files`), its ``swarm_policy.json`` (:func:`_policy_file`), an adapter's base
    (:func:`_base`), then every weight finite (:func:`_finite`); the first problem is raised naming its file."""
    agents = Path(ckpt) / "agents"
    names = sorted(p.name for p in agents.iterdir() if p.is_dir()) if agents.is_dir() else []
    missing = [r for r in (roles or ()) if r not in names]
    if not names or missing:
        what = f"no folder for {', '.join(missing)}" if missing else "no model folder"
        raise CheckpointError(f"{agents} has {what}: the checkpoint is incomplete; {OTHER}")
    folders = [agents / n for n in names]
    for folder in folders:
        adapter = (folder / "swarm_base.json").exists()
        _files(folder, adapter)
        _policy_file(folder, adapter)
        if adapter:
            _base(folder)
    for folder in folders:
        _finite(folder)


def _files(folder: Path, adapter: bool) -> None:
    for name in ADAPTER_FILES if adapter else FULL_FILES:
        if not (folder / name).is_file():
            raise CheckpointError(f"{folder / name} is missing: the checkpoint is damaged; {OTHER}")
    if not adapter and not any(folder.glob("*.safetensors")):
        raise CheckpointError(f"{folder} holds no weights (*.safetensors): the checkpoint is damaged; {OTHER}")


def _policy_file(folder: Path, adapter: bool) -> None:
    """``swarm_policy.json``: a JSON object whose ``bid_levels`` (when given) is a list of numbers, and, for an adapter,
    whose ``adapter`` (when given) is the folder's own name: an adapter copied over another role's says whose it is."""
    f = folder / "swarm_policy.json"
    try:
        meta = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{f} is not JSON ({type(exc).__name__}): the checkpoint is damaged; {OTHER}") from exc
    levels = meta.get("bid_levels", []) if isinstance(meta, dict) else None
    if not isinstance(levels, list) or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in levels):
        raise CheckpointError(
            f"{f} is not a policy file (a JSON object with bid_levels, a list of numbers): the checkpoint is "
            f"damaged; {OTHER}"
        )
    owner = meta.get("adapter")
    if adapter and owner is not None and owner != folder.name:
        raise CheckpointError(
            f"{f} belongs to the adapter of {owner!r}, not of {folder.name!r}: {folder.name}'s adapter was replaced "
            f"by another role's; {OTHER}"
        )


def _base(folder: Path) -> None:
    """An adapter's base: the folder its ``swarm_base.json`` names, whose files match the fingerprint recorded
    (:func:`swarm_runtime.models.adapters.check_adapter_base`, the check a run building on the checkpoint and an
    export make too)."""
    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.models.adapters import check_adapter_base

    try:
        check_adapter_base(folder, advice=OTHER)  # a damaged pointer's error says what to do itself
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None


def _finite(folder: Path) -> None:
    """Every floating tensor of the folder's ``*.safetensors`` files is finite."""
    import torch
    from safetensors import safe_open

    for f in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():
                    t = st.get_tensor(name)
                    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                        raise CheckpointError(
                            f"{f}: tensor {name} holds NaN or infinite values (the training diverged or the "
                            f"checkpoint is damaged); {OTHER}"
                        )
        except CheckpointError:
            raise
        except Exception as exc:  # safetensors' errors: a truncated or foreign file
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise CheckpointError(
                f"{f} is not a readable weights file ({first}): the checkpoint is damaged; {OTHER}"
            ) from exc
