"""``swarm experiment NAME [key=value ...]`` and ``swarm experiment --list``: the paper's experiments as commands
(swarm_runtime/experiments/runner.py runs one in a folder of its own; ``resume=true`` continues a killed one)."""

from __future__ import annotations

from swarm_runtime.cli.common import plugin_registry
from swarm_runtime.cli.recipes import expand_recipe
from swarm_runtime.config.errors import ConfigError


def cmd_experiment(args) -> int:
    """``swarm experiment NAME [key=value ...]``: run the experiment (``--list``: name them)."""
    from swarm_runtime.config.load import precheck
    from swarm_runtime.experiments.runner import run_experiment

    args.overrides = expand_recipe(args.overrides)
    precheck(
        [o for o in args.overrides if "=" in o and o.partition("=")[0] not in ("run_dir", "resume")],
        resolve_with_domains=False,
    )

    pm, reg = plugin_registry()
    if args.list or not args.name:
        if not args.list:
            raise ConfigError(f"give an experiment name; valid: {', '.join(sorted(reg.experiments))}")
        for name, fn in reg.experiments.items():
            doc = (fn.__doc__ or "").strip().splitlines()
            print(f"{name}: {doc[0] if doc else ''}".rstrip(": "))
        return 0
    run_experiment(args.name, args.overrides, pm, reg)
    return 0
