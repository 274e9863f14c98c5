"""``swarm config``: print the resolved config (or the memory plan) and exit."""

from __future__ import annotations

from swarm_runtime.cli.common import _registry
from swarm_runtime.cli.recipes import expand_recipe
from swarm_runtime.cli.run import print_plan


def cmd_config(args) -> int:
    from omegaconf import OmegaConf

    from swarm_runtime.config.load import precheck, resolve
    from swarm_runtime.config.secrets import redacted

    args.overrides = expand_recipe(args.overrides)
    precheck(args.overrides)
    _, reg = _registry()
    cfg = resolve(args.overrides, reg)
    if getattr(args, "plan", False):
        return print_plan(cfg, reg)
    print(OmegaConf.to_yaml(redacted(cfg)))
    return 0
