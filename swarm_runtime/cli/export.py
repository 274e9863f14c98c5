"""``swarm export RUN [checkpoint=TAG] [merged=true|false] [out=DIR]``: a run's checkpoint as plain Hugging Face
folders, one per role (adapter runs: the base with each adapter folded in, or the PEFT adapters)."""

from __future__ import annotations

import shutil
from pathlib import Path

from swarm_runtime.cli.common import find_checkpoint, require_run_folder
from swarm_runtime.config.errors import ConfigError
from swarm_runtime.config.load import load_saved

#: ``swarm export``'s options and their defaults (``checkpoint`` None: the latest; ``out`` None: RUN/export/TAG).
OPTIONS = {"checkpoint": None, "merged": "true", "out": None}


def cmd_export(args) -> int:
    """``swarm export RUN [checkpoint=TAG] [merged=true] [out=DIR]``: one Hugging Face folder per role."""
    from swarm_runtime.runs.runfiles import check_links

    run_dir = Path(args.run_dir)
    require_run_folder(run_dir)
    check_links(run_dir)
    cfg = load_saved(run_dir / "config.yaml")
    opts = export_options(args.overrides)
    ckpt = find_checkpoint(run_dir, opts["checkpoint"])
    from swarm_runtime.runs.agents_check import check_agents

    check_agents(ckpt)  # the models' files, before anything loads them (eval, export, serve, resume)
    out = _out_folder(run_dir, ckpt, opts["out"])
    written = _export(cfg, ckpt, out, merged=opts["merged"] == "true")
    kind = "merged Hugging Face folders" if opts["merged"] == "true" or cfg.model.adapter != "lora" else "PEFT adapters"
    print(f"exported {ckpt.name} of {run_dir} ({kind}):\n" + "\n".join(f"  {p}" for p in written))
    return 0


def export_options(overrides: list[str]) -> dict:
    """The ``key=value`` options of ``swarm export`` (:data:`OPTIONS`), each checked."""
    opts = dict(OPTIONS)
    for item in overrides:
        k, _, v = item.partition("=")
        if k not in opts:
            raise ConfigError(f"unknown export option {k!r}; valid: {', '.join(opts)}")
        opts[k] = v
    if opts["merged"] not in ("true", "false"):
        raise ConfigError(f"merged={opts['merged']!r} is not valid; valid: true, false")
    return opts


def _out_folder(run_dir: Path, ckpt: Path, given: str | None) -> Path:
    """The folder to export into: ``given`` (``out=``), else RUN/export/TAG; never a file or under one, never inside
    the run's checkpoints."""
    from swarm_runtime.runs.runfiles import check_link, claim, inside

    if given == "":
        raise ConfigError("out= is empty; give a folder (default RUN/export/TAG)")
    check_link(run_dir, run_dir / "export")
    out = Path(given) if given else claim(run_dir / "export") / ckpt.name
    not_folder = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if not_folder is not None:
        what = "is a file" if not_folder == out else f"is inside {str(not_folder)!r}, a file"
        raise ConfigError(
            f"out={str(out)!r} {what}, not a folder; give a folder to export into (default RUN/export/TAG)"
        )
    if inside(run_dir / "checkpoints", out):
        raise ConfigError(
            f"out={str(out)!r} is inside the run's checkpoints ({str(run_dir / 'checkpoints')!r}): swarm "
            "export never writes into or deletes from a checkpoint; give another folder (default "
            "RUN/export/TAG)"
        )
    return out


def _export(cfg, ckpt: Path, out: Path, merged: bool) -> list[Path]:
    """Write ``ckpt``'s roles into ``out``: adapters through PEFT (``merged``: folded into the base), full copies as
    they are (their training state left out); returns the folders written."""
    from swarm_runtime.runs.checkpoint import loading_models

    roles = sorted(p.name for p in (ckpt / "agents").iterdir() if p.is_dir())
    with loading_models(ckpt / "agents"):
        if cfg.model.get("adapter", "none") == "lora":
            from swarm_runtime.models.adapters import export_adapters

            bids = [float(b) for b in cfg.algo.bid_levels]
            return export_adapters(ckpt / "agents", out, roles, bids, merged=merged)
        from swarm_runtime.models.adapters import check_finite  # full copies are Hugging Face folders already

        written = []
        for role in roles:
            check_finite(ckpt / "agents" / role)
            dst = out / role
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(ckpt / "agents" / role, dst, ignore=shutil.ignore_patterns("training_state.pt"))
            written.append(dst)
        return written
