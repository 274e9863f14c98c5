"""``swarm config [key=value ...] [--plan]``: print the resolved config (secrets redacted), or its memory plan and
placement, and exit; it refuses what ``swarm run`` refuses (the same validation)."""

from __future__ import annotations

from swarm_runtime.cli.common import plugin_registry
from swarm_runtime.cli.recipes import expand_recipe
from swarm_runtime.config.errors import ConfigError


def cmd_config(args) -> int:
    """``swarm config [key=value ...] [--plan]``: the resolved config (or, with ``--plan``, :func:`print_plan`)."""
    from omegaconf import OmegaConf

    from swarm_runtime.config.load import precheck, resolve
    from swarm_runtime.config.secrets import redacted

    args.overrides = expand_recipe(args.overrides)
    precheck(args.overrides)
    _, reg = plugin_registry()
    cfg = resolve(args.overrides, reg)
    if getattr(args, "plan", False):
        return print_plan(cfg, reg)
    print(OmegaConf.to_yaml(redacted(cfg)))
    return 0


def print_plan(cfg, reg) -> int:
    """``swarm config ... --plan``: the memory plan (per device with ``train.engine``/``train.shards`` or
    ``cluster.placement``) and the placement groups beside it; exit 2 when a device does not fit."""
    from swarm_runtime.cluster.placement import plan_and_placement
    from swarm_runtime.models.memory_plan import PlacedPlan

    plan, spec = plan_and_placement(cfg, reg.domains[cfg.domain])
    print(plan.format())
    if spec is not None:
        print(spec.format())
    if isinstance(plan, PlacedPlan) and cfg.train.engine == "local":
        print(
            "note: swarm run trains every role in its own process today (learner groups on Ray come later); "
            "it checks the one-device plan (without cluster.placement)"
        )
    if not plan.fits:
        where = "on the busiest device" if isinstance(plan, PlacedPlan) else "needed"
        raise ConfigError(
            f"does not fit: ~{plan.total / 2**30:.1f} GiB {where}, {plan.budget / 2**30:.1f} GiB on "
            f"hardware {cfg.hardware.name!r}; try {'; or '.join(plan.fixes)}"
        )
    return 0
