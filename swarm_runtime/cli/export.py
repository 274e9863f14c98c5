"""``swarm export``: a run's checkpoint as plain Hugging Face folders."""

from __future__ import annotations

from pathlib import Path

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.config.load import load_saved


def cmd_export(args) -> int:
    """``swarm export RUN [checkpoint=TAG] [merged=true] [out=DIR]``: one Hugging Face folder per role."""
    import shutil

    from swarm_runtime.runs.checkpoint import TAG_RE, latest_checkpoint, loading_models
    from swarm_runtime.runs.runfiles import check_link, check_links, claim, inside

    run_dir = Path(args.run_dir)
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{str(run_dir)!r} is not a run folder (no config.yaml); give the folder `swarm run` printed")
    check_links(run_dir)
    cfg = load_saved(run_dir / "config.yaml")
    opts = {"checkpoint": None, "merged": "true", "out": None}
    for item in args.overrides:
        k, _, v = item.partition("=")
        if k not in opts:
            raise ConfigError(f"unknown export option {k!r}; valid: {', '.join(opts)}")
        opts[k] = v
    if opts["merged"] not in ("true", "false"):
        raise ConfigError(f"merged={opts['merged']!r} is not valid; valid: true, false")
    tags = sorted(p.name for p in (run_dir / "checkpoints").glob("*") if (p / "state.json").exists())
    if opts["checkpoint"] is not None and not TAG_RE.fullmatch(opts["checkpoint"]):
        raise ConfigError(
            f"checkpoint {opts['checkpoint']!r} not found in {run_dir}; valid: {', '.join(tags) or '(none)'}"
        )
    ckpt = run_dir / "checkpoints" / opts["checkpoint"] if opts["checkpoint"] else latest_checkpoint(run_dir)
    if ckpt is None or not (ckpt / "state.json").exists():
        raise ConfigError(
            f"checkpoint {opts['checkpoint'] or 'latest'!r} not found in {run_dir}; valid: "
            f"{', '.join(tags) or '(none)'}"
        )
    if opts["out"] == "":
        raise ConfigError("out= is empty; give a folder (default RUN/export/TAG)")
    check_link(run_dir, run_dir / "export")
    out = Path(opts["out"]) if opts["out"] else claim(run_dir / "export") / ckpt.name
    if inside(run_dir / "checkpoints", out):
        raise ConfigError(
            f"out={str(out)!r} is inside the run's checkpoints ({str(run_dir / 'checkpoints')!r}): swarm "
            "export never writes into or deletes from a checkpoint; give another folder (default "
            "RUN/export/TAG)"
        )
    roles = sorted(p.name for p in (ckpt / "agents").iterdir() if p.is_dir())
    with loading_models(ckpt / "agents"):
        if cfg.model.get("adapter", "none") == "lora":
            from swarm_runtime.models.adapters import export_adapters

            written = export_adapters(
                ckpt / "agents", out, roles, [float(b) for b in cfg.algo.bid_levels], merged=opts["merged"] == "true"
            )
        else:  # full copies are Hugging Face folders already
            from swarm_runtime.models.adapters import check_finite

            written = []
            for role in roles:
                check_finite(ckpt / "agents" / role)
                dst = out / role
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(ckpt / "agents" / role, dst, ignore=shutil.ignore_patterns("training_state.pt"))
                written.append(dst)
    kind = "merged Hugging Face folders" if opts["merged"] == "true" or cfg.model.adapter != "lora" else "PEFT adapters"
    print(f"exported {ckpt.name} of {run_dir} ({kind}):\n" + "\n".join(f"  {p}" for p in written))
    return 0
