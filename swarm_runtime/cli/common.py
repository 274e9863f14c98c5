"""What several commands share: the plugin registry, and the resume picks of a command line."""

from __future__ import annotations

from pathlib import Path


def _registry():
    from swarm_runtime.plugins.manager import get_registry

    return get_registry()


def _resume_picks(overrides: list[str]) -> list[str]:
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
