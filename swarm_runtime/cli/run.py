"""``swarm run [key=value ...]``: train a swarm (SFT cold start, then the algorithm's updates, then the held-out
evaluation) in a run folder: fresh, ``overwrite=true`` or ``resume=true`` (swarm_runtime/runs/folder.py)."""

from __future__ import annotations

from swarm_runtime.cli.common import plugin_registry, resume_picks
from swarm_runtime.cli.recipes import expand_recipe
from swarm_runtime.config.errors import Stopped


def cmd_run(args) -> int:
    """``swarm run [key=value ...]``: check the command line and the servers the run samples on (before anything
    trains: ``sampling.factory.preflight``), prepare the run folder, train with the algorithm the config names, and
    stamp the results with the library versions; the folder's lock is released at the end."""
    from swarm_runtime.config.load import precheck

    args.overrides = expand_recipe(args.overrides)
    precheck(resume_picks(args.overrides))  # before the plugins (torch) load: a bad value fails fast
    from swarm_runtime.config.load import resolve
    from swarm_runtime.runs.folder import prepare_run
    from swarm_runtime.sampling.factory import preflight

    pm, reg = plugin_registry()
    cfg = resolve(resume_picks(args.overrides), reg)
    if not cfg.resume:  # the servers the run samples on, before its folder is made (a resume's: its saved config's)
        preflight(cfg)
    ctx = prepare_run(cfg, pm, reg, args=args.overrides)
    try:
        if cfg.resume:
            preflight(ctx.cfg)
        trainer = reg.get("algorithms", ctx.cfg.algo.name)(ctx)
        trainer.train()
        from swarm_runtime.runs.provenance import stamp

        stamp(ctx.run_dir / "eval.json")  # library versions and commit beside the figures
        _check_graded(ctx.run_dir)
    except Stopped as exc:
        exc.run_dir = ctx.run_dir  # the resume line names the folder
        raise
    finally:
        ctx.lock.release()
    return 0


def _check_graded(run_dir) -> None:
    """The run's held-out results (``eval.json``) had their rewards given (:func:`~swarm_runtime.cli.common.check_graded`)."""
    import json

    from swarm_runtime.cli.common import check_graded

    try:
        results = json.loads((run_dir / "eval.json").read_text()).get("results") or {}
    except (OSError, ValueError, AttributeError):
        return
    if isinstance(results, dict):
        check_graded(results, f"evaluate again with swarm eval {run_dir}")
