"""What several commands share: the plugin registry, the resume picks of a command line, and a run folder given on
the command line (``swarm eval``, ``swarm serve``, ``swarm export``): that it is one, the domain its run uses, its
checkpoint by tag."""

from __future__ import annotations

from pathlib import Path

from swarm_runtime.config.errors import ConfigError


def plugin_registry():
    """The plugin manager and the registry of what the installed plugins register (imports them all: torch,
    transformers)."""
    from swarm_runtime.plugins.manager import get_registry

    return get_registry()


def resume_picks(overrides: list[str]) -> list[str]:
    """``resume=true run_dir=DIR`` without ``domain=``/``task=``: the saved run's, so its task keys
    (``task.*``) are checked against its own domain, not the default one."""
    kv = dict(o.partition("=")[::2] for o in overrides if "=" in o)
    if str(kv.get("resume", "")).lower() not in ("true", "1", "yes") or not kv.get("run_dir"):
        return overrides
    saved = Path(kv["run_dir"]) / "config.yaml"
    if not saved.is_file() or ("domain" in kv and "task" in kv):
        return overrides
    import yaml

    try:
        data = yaml.safe_load(saved.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return overrides
    if not isinstance(data, dict):
        return overrides
    extra = [
        f"{k}={data[s]}"
        for k, s in (("domain", "domain"), ("task", "task_name"))
        if k not in kv and isinstance(data.get(s), str)
    ]
    return extra + overrides


def without_checkpoint(overrides: list[str]) -> list[str]:
    """The command line's settings but ``checkpoint=TAG`` (which picks a checkpoint, not a setting)."""
    return [o for o in overrides if not o.startswith("checkpoint=")]


def require_run_folder(run_dir: Path) -> None:
    """``run_dir`` holds a run's ``config.yaml``, else one line saying what to give."""
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{str(run_dir)!r} is not a run folder (no config.yaml); give the folder `swarm run` printed")


def require_domain(cfg, registry) -> None:
    """The domain a saved run uses is one a loaded plugin provides."""
    if cfg.domain not in registry.domains:
        raise ConfigError(
            f"run uses domain {cfg.domain!r}, which no loaded plugin provides; loaded: {', '.join(registry.domains)}"
        )


def find_checkpoint(run_dir: Path, tag: str | None) -> Path:
    """The checkpoint folder of ``tag`` in ``run_dir`` (None: the latest), one with its ``state.json``; a tag that is
    not a checkpoint's folder name, or not there, is refused naming the tags the run has."""
    from swarm_runtime.runs.checkpoint import TAG_RE, latest_checkpoint

    tags = sorted(p.name for p in (run_dir / "checkpoints").glob("*") if (p / "state.json").exists())
    valid = ", ".join(tags) or "(none)"
    if tag is not None and not TAG_RE.fullmatch(tag):
        raise ConfigError(f"checkpoint {tag!r} not found in {run_dir}; valid: {valid}")
    ckpt = run_dir / "checkpoints" / tag if tag else latest_checkpoint(run_dir)
    if ckpt is None or not (ckpt / "state.json").exists():
        raise ConfigError(f"checkpoint {tag or 'latest'!r} not found in {run_dir}; valid: {valid}")
    return ckpt


def check_graded(results: dict, again: str) -> None:
    """Held-out ``results`` (name -> :func:`~swarm_runtime.evaluation.heldout.summarize` output) whose episodes' rewards
    a judge could not give (``reward_missing``: an LLM judge's grades all failed): none graded is an error (the
    reward means mean nothing), one line naming the results and ``again`` (how to evaluate again); some is a warning
    saying how many were left out."""
    from loguru import logger

    for name, res in results.items():
        if not isinstance(res, dict):
            continue
        n, missing = int(res.get("episodes", 0) or 0), int(res.get("reward_missing", 0) or 0)
        if n and missing >= n:
            raise ConfigError(
                f"the judge graded none of the {n} held-out episodes of {name} (every grade failed; the log says "
                f"why): their reward means nothing; fix the judge (task.llm_judge.*, its key) and {again}"
            )
        if missing:
            logger.warning(
                "the judge could not grade {} of the {} held-out episodes of {}: their rewards are left out of its "
                "means (the log says why)",
                missing,
                n,
                name,
            )
