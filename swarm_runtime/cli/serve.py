"""``swarm serve``: a trained swarm as a service."""

from __future__ import annotations

from pathlib import Path

from swarm_runtime.cli.common import _registry
from swarm_runtime.config.errors import ConfigError
from swarm_runtime.config.load import load_saved


# ---------------------------------------------------------------------------- swarm serve (issue 20)
def _serve_run(run_dir: Path, overrides: list[str]):
    """A run folder's config with ``overrides`` (``checkpoint=TAG`` and ``serve.replicas.ROLE=N``
    included), its registry and the checkpoint folder; raises ConfigError naming bad values."""
    from swarm_runtime.config.load import override
    from swarm_runtime.config.validation import validate
    from swarm_runtime.runs.checkpoint import latest_checkpoint
    from swarm_runtime.runs.context import check_hardware, check_task
    from swarm_runtime.runs.folder import distrust_saved_endpoints
    from swarm_runtime.runs.runfiles import check_links

    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{str(run_dir)!r} is not a run folder (no config.yaml); give the folder `swarm run` printed")
    check_links(run_dir)
    cfg = load_saved(run_dir / "config.yaml")
    pm, reg = _registry()
    if cfg.domain not in reg.domains:
        raise ConfigError(
            f"run uses domain {cfg.domain!r}, which no loaded plugin provides; loaded: {', '.join(reg.domains)}"
        )
    roles = [r.name for r in reg.domains[cfg.domain].roles]
    tag, per_role = None, {}
    for item in overrides:
        k, sep, v = item.partition("=")
        if not sep:
            raise ConfigError(f"argument {item!r} is not key=value (e.g. serve.replicas=2, checkpoint=final)")
        if k == "checkpoint":
            tag = v
        elif k.startswith("serve.replicas."):
            role = k.removeprefix("serve.replicas.")
            if role not in roles:
                raise ConfigError(f"{k}: no role {role!r}; valid: {', '.join(roles)}")
            try:
                per_role[role] = int(v)
            except ValueError:
                raise ConfigError(f"{k}={v!r} is not a whole number") from None
        else:
            override(cfg, k, v)
    if per_role:
        base = cfg.serve.replicas if isinstance(cfg.serve.replicas, int) else 1
        cfg.serve.replicas = {r: per_role.get(r, base) for r in roles}
    distrust_saved_endpoints(  # first: a saved Ray head is refused as such, whether or not Ray is installed
        cfg, reg, [o for o in overrides if not o.startswith("checkpoint=")], run_dir / "config.yaml", ("serve.address",)
    )
    validate(cfg, reg, ray_keys=("serve.cluster",))  # serve.* too, against the run's roles; Ray for the gateway only
    check_hardware(cfg)
    check_task(reg.domains[cfg.domain], cfg)
    tags = sorted(p.name for p in (run_dir / "checkpoints").glob("*") if (p / "state.json").exists())
    ckpt = (run_dir / "checkpoints" / tag) if tag else latest_checkpoint(run_dir)
    if ckpt is None or not (ckpt / "state.json").exists():
        raise ConfigError(
            f"checkpoint {tag or 'latest'!r} not found in {run_dir}; valid: {', '.join(tags) or '(none)'}"
        )
    return cfg, pm, reg, ckpt


def cmd_serve(args) -> int:
    import os

    from swarm_runtime.learn.monolithic import MONOLITHIC
    from swarm_runtime.serve import require_serve_extra
    from swarm_runtime.serve.gateway import GatewaySetup, check_bind, serve

    require_serve_extra()
    run_dir = Path(args.run_dir)
    cfg, pm, reg, ckpt = _serve_run(run_dir, args.overrides)
    if (ckpt / "agents" / MONOLITHIC).exists():
        raise ConfigError(f"{run_dir} is an algo=monolithic run (one model, no auction); swarm serve serves swarms")
    api_key = os.environ.get("SWARM_API_KEY") or None
    check_bind(str(cfg.serve.host), api_key)
    serve(GatewaySetup(run_dir, ckpt, cfg, reg, pm, api_key))
    return 0
