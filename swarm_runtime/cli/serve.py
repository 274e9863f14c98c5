"""``swarm serve RUN``: a trained swarm as a service (agent workers and a gateway running the auction,
swarm_runtime/serve/gateway.py); :func:`served_run` also gives ``swarm eval RUN serve.url=...`` its run."""

from __future__ import annotations

from pathlib import Path

from swarm_runtime.cli.common import (
    find_checkpoint,
    plugin_registry,
    require_domain,
    require_run_folder,
    without_checkpoint,
)
from swarm_runtime.config.errors import ConfigError
from swarm_runtime.config.load import load_saved


def served_run(run_dir: Path, overrides: list[str]):
    """A run folder's config with ``overrides`` (``checkpoint=TAG`` and ``serve.replicas.ROLE=N`` included), its
    plugin manager, its registry and the checkpoint folder; raises ConfigError naming bad values."""
    from swarm_runtime.config.load import override, set_role_replicas
    from swarm_runtime.config.validation import validate
    from swarm_runtime.runs.context import check_hardware, check_task
    from swarm_runtime.runs.folder import distrust_saved_endpoints
    from swarm_runtime.runs.runfiles import check_links

    require_run_folder(run_dir)
    check_links(run_dir)
    cfg = load_saved(run_dir / "config.yaml")
    pm, reg = plugin_registry()
    require_domain(cfg, reg)
    tag, per_role = None, {}
    for item in overrides:
        k, sep, v = item.partition("=")
        if not sep:
            raise ConfigError(f"argument {item!r} is not key=value (e.g. serve.replicas=2, checkpoint=final)")
        if k == "checkpoint":
            tag = v
        elif k.startswith("serve.replicas."):
            per_role[k.removeprefix("serve.replicas.")] = v
        else:
            override(cfg, k, v)
    if per_role:
        set_role_replicas(cfg, per_role, [r.name for r in reg.domains[cfg.domain].roles])
    distrust_saved_endpoints(  # first: a saved Ray head is refused as such, whether or not Ray is installed
        cfg,
        reg,
        without_checkpoint(overrides),
        run_dir / "config.yaml",
        ("serve.address",),
        ("task.llm_judge.base_url",),
    )
    validate(cfg, reg, ray_keys=("serve.cluster",))  # serve.* too, against the run's roles; Ray for the gateway only
    check_hardware(cfg)
    check_task(reg.domains[cfg.domain], cfg)
    ckpt = find_checkpoint(run_dir, tag or None)
    from swarm_runtime.runs.agents_check import check_agents

    check_agents(ckpt)  # the models' files, before anything loads them (eval, export, serve, resume)
    return cfg, pm, reg, ckpt


def cmd_serve(args) -> int:
    """``swarm serve RUN [checkpoint=TAG] [serve.*=...]``: serve the run's swarm until stopped (SWARM_API_KEY:
    the key clients must give; required on a non-loopback address)."""
    import os

    from swarm_runtime.learn.monolithic import MONOLITHIC
    from swarm_runtime.serve import require_serve_extra
    from swarm_runtime.serve.gateway import GatewaySetup, check_bind, serve
    from swarm_runtime.serve.resolved import check_agents_not_gateway

    require_serve_extra()
    run_dir = Path(args.run_dir)
    cfg, pm, reg, ckpt = served_run(run_dir, args.overrides)
    if (ckpt / "agents" / MONOLITHIC).exists():
        raise ConfigError(f"{run_dir} is an algo=monolithic run (one model, no auction); swarm serve serves swarms")
    api_key = os.environ.get("SWARM_API_KEY") or None
    check_bind(str(cfg.serve.host), api_key)
    check_agents_not_gateway(cfg.serve)
    serve(GatewaySetup(run_dir, ckpt, cfg, reg, pm, api_key))
    return 0
