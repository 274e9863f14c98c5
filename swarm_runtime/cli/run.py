"""``swarm run``: train a swarm (fresh, overwrite or resume), or print its plan."""

from __future__ import annotations

from swarm_runtime.cli.common import _registry, _resume_picks
from swarm_runtime.cli.recipes import expand_recipe
from swarm_runtime.config.errors import ConfigError, Stopped


def cmd_run(args) -> int:
    from swarm_runtime.config.load import precheck

    args.overrides = expand_recipe(args.overrides)
    precheck(_resume_picks(args.overrides))  # before the plugins (torch) load: a bad value fails fast
    from swarm_runtime.config.load import resolve
    from swarm_runtime.runs.folder import prepare_run

    pm, reg = _registry()
    cfg = resolve(_resume_picks(args.overrides), reg)
    ctx = prepare_run(cfg, pm, reg, args=args.overrides)
    try:
        trainer = reg.get("algorithms", ctx.cfg.algo.name)(ctx)
        trainer.train()
        from swarm_runtime.runs.provenance import stamp

        stamp(ctx.run_dir / "eval.json")  # library versions and commit beside the figures (issue 18)
    except Stopped as exc:
        exc.run_dir = ctx.run_dir  # the resume line names the folder
        raise
    finally:
        ctx.lock.release()
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
