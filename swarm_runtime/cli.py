"""The ``swarm`` command line.

    swarm run domain=minecraft task=iron_pickaxe [key=value ...]
    swarm eval RUN_DIR [checkpoint=TAG] [eval.runs=3 ...]
    swarm experiment NAME [key=value ...] | swarm experiment --list
    swarm domains | swarm plugins | swarm config [key=value ...] [--plan]
    swarm export RUN_DIR [checkpoint=TAG] [merged=true]
    recipe=configs/NAME.yaml (any of run, config, experiment): a recipe's settings, the command line winning
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

from swarm_runtime.config import GROUPS, ConfigError, load_saved, presets


def _registry():
    from swarm_runtime.plugins import get_registry

    return get_registry()


def cmd_run(args) -> int:
    from swarm_runtime.config import resolve
    from swarm_runtime.run import prepare_run

    pm, reg = _registry()
    args.overrides = expand_recipe(args.overrides)
    cfg = resolve(args.overrides, reg)
    ctx = prepare_run(cfg, pm, reg, args=args.overrides)
    trainer = reg.get("algorithms", cfg.algo.name)(ctx)
    trainer.train()
    return 0


def cmd_config(args) -> int:
    from omegaconf import OmegaConf

    from swarm_runtime.config import resolve

    _, reg = _registry()
    cfg = resolve(expand_recipe(args.overrides), reg)
    if getattr(args, "plan", False):
        return print_plan(cfg, reg)
    print(OmegaConf.to_yaml(cfg))
    return 0


# ---------------------------------------------------------------- issue 19: recipes, memory plan, export
def expand_recipe(overrides: list[str]) -> list[str]:
    """``recipe=PATH`` -> the recipe's ``key: value`` lines as ``key=value`` arguments, placed before
    the rest of the command line (which wins). A recipe is a flat YAML mapping of config groups
    (``domain``, ``task``, ``model``, ``algo``, ``hardware``) and dotted keys (``configs/*.yaml``)."""
    import yaml

    out, recipes = [], [o for o in overrides if o.startswith("recipe=")]
    if len(recipes) > 1:
        raise ConfigError(f"give one recipe=, got {len(recipes)}")
    for item in recipes:
        path = Path(item.partition("=")[2])
        if not path.is_file():
            found = sorted(p.name for p in Path("configs").glob("*.yaml")) if Path("configs").is_dir() else []
            raise ConfigError(f"recipe {str(path)!r} is not a file; recipes here: {', '.join(found) or '(none in ./configs)'}")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"recipe {str(path)!r} must be a mapping of key: value")
        for k, v in data.items():
            if isinstance(v, (dict, list)):
                v = yaml.safe_dump(v, default_flow_style=True).strip()
            out.append(f"{k}={'null' if v is None else v}")
    return out + [o for o in overrides if not o.startswith("recipe=")]


def print_plan(cfg, reg) -> int:
    """``swarm config ... --plan``: the memory plan alone; exit 2 when it does not fit."""
    from swarm_runtime.memory_plan import make_plan

    domain = reg.domains[cfg.domain]
    roles = len(domain.roles)
    vocab = None
    if cfg.model.get("arch") is None and cfg.model.get("path") is None:  # the built model: its vocabulary
        vocab = len(domain.all_words(cfg.task)) + 16
    plan = make_plan(cfg, roles, roles, vocab)
    print(plan.format())
    if not plan.fits:
        raise ConfigError(f"does not fit: ~{plan.total / 2 ** 30:.1f} GiB needed, {plan.budget / 2 ** 30:.1f} GiB on "
                          f"hardware {cfg.hardware.name!r}; try {'; or '.join(plan.fixes)}")
    return 0


def cmd_export(args) -> int:
    """``swarm export RUN [checkpoint=TAG] [merged=true] [out=DIR]``: one Hugging Face folder per role."""
    import shutil

    from swarm_runtime.checkpoint import latest_checkpoint

    run_dir = Path(args.run_dir)
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{str(run_dir)!r} is not a run folder (no config.yaml); give the folder `swarm run` printed")
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
    ckpt = run_dir / "checkpoints" / opts["checkpoint"] if opts["checkpoint"] else latest_checkpoint(run_dir)
    if ckpt is None or not (ckpt / "state.json").exists():
        raise ConfigError(f"checkpoint {opts['checkpoint'] or 'latest'!r} not found in {run_dir}; valid: "
                          f"{', '.join(tags) or '(none)'}")
    out = Path(opts["out"]) if opts["out"] else run_dir / "export" / ckpt.name
    roles = sorted(p.name for p in (ckpt / "agents").iterdir() if p.is_dir())
    if cfg.model.get("adapter", "none") == "lora":
        from swarm_runtime.policy.adapters import export_adapters

        written = export_adapters(ckpt / "agents", out, roles, [float(b) for b in cfg.algo.bid_levels],
                                  merged=opts["merged"] == "true")
    else:  # full copies are Hugging Face folders already
        written = []
        for role in roles:
            dst = out / role
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(ckpt / "agents" / role, dst, ignore=shutil.ignore_patterns("training_state.pt"))
            written.append(dst)
    kind = "merged Hugging Face folders" if opts["merged"] == "true" or cfg.model.adapter != "lora" else "PEFT adapters"
    print(f"exported {ckpt.name} of {run_dir} ({kind}):\n" + "\n".join(f"  {p}" for p in written))
    return 0


def eval_file_name(tag: str, overrides: list[str]) -> str:
    """``eval-<tag>.json``, or with other keys ``eval-<tag>--k=v--k=v.json``, so that an evaluation
    under other settings (a temperature, more runs) does not overwrite an earlier one."""
    if not overrides:
        return f"eval-{tag}.json"
    slug = "--".join(re.sub(r"[^A-Za-z0-9._=+-]", "_", o) for o in overrides)
    if len(slug) > 100:
        slug = slug[:80] + "--" + hashlib.sha1("\0".join(overrides).encode()).hexdigest()[:10]
    return f"eval-{tag}--{slug}.json"


def cmd_eval(args) -> int:
    from swarm_runtime.checkpoint import latest_checkpoint
    from swarm_runtime.config import override, validate
    from swarm_runtime.evaluate import evaluate
    from swarm_runtime.outputs import format_table
    from swarm_runtime.run import RunContext, check_hardware, check_task

    run_dir = Path(args.run_dir)
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{str(run_dir)!r} is not a run folder (no config.yaml); give the folder `swarm run` printed")
    cfg = load_saved(run_dir / "config.yaml")
    tag = None
    for item in args.overrides:
        k, _, v = item.partition("=")
        if k == "checkpoint":
            tag = v
        else:
            override(cfg, k, v)
    tags = sorted(p.name for p in (run_dir / "checkpoints").glob("*") if (p / "state.json").exists())
    ckpt = (run_dir / "checkpoints" / tag) if tag else latest_checkpoint(run_dir)
    if ckpt is None or not (ckpt / "state.json").exists():
        raise ConfigError(f"checkpoint {tag or 'latest'!r} not found in {run_dir}; valid: {', '.join(tags) or '(none)'}")
    pm, reg = _registry()
    if cfg.domain not in reg.domains:
        raise ConfigError(f"run uses domain {cfg.domain!r}, which no loaded plugin provides; loaded: {', '.join(reg.domains)}")
    validate(cfg, reg)
    check_hardware(cfg)
    check_task(reg.domains[cfg.domain], cfg)
    ctx = RunContext(cfg, pm, reg, run_dir)
    from swarm_runtime.train.monolithic import MONOLITHIC, build_monolithic

    if (ckpt / "agents" / MONOLITHIC).exists():  # an `algo=monolithic` run: one model, acting every turn
        agents, _ = build_monolithic(ctx, ckpt / "agents")
        coordinator = ctx.coordinator("round_robin")
    else:
        agents, _ = ctx.build_swarm(ckpt / "agents")
        coordinator = ctx.coordinator()
    res, _ = evaluate(agents, coordinator, ctx.domain, ctx.task, ctx.seeds("eval"), int(cfg.eval.runs),
                      int(cfg.seed) + 7919, cfg.eval.temperature,
                      common_random_numbers=bool(cfg.eval.common_random_numbers))
    table = format_table([(ckpt.name, res)], ["reward"] + [m for m in ("success", "spl", "ndtw") if f"{m}_mean" in res])
    out = run_dir / eval_file_name(ckpt.name, [o for o in args.overrides if not o.startswith("checkpoint=")])
    res["overrides"] = list(args.overrides)  # what produced this file
    out.write_text(json.dumps(res, indent=1, default=float))
    print(f"{cfg.domain}/{cfg.task_name}, checkpoint {ckpt.name}, {res['seeds']} held-out seeds x {res['runs']} runs\n{table}\nsaved {out}")
    return 0


def cmd_experiment(args) -> int:
    from swarm_runtime.experiments.runner import run_experiment

    pm, reg = _registry()
    if args.list or not args.name:
        if not args.list:
            raise ConfigError(f"give an experiment name; valid: {', '.join(sorted(reg.experiments))}")
        for name, fn in reg.experiments.items():
            doc = (fn.__doc__ or "").strip().splitlines()
            print(f"{name}: {doc[0] if doc else ''}".rstrip(": "))
        return 0
    run_experiment(args.name, expand_recipe(args.overrides), pm, reg)
    return 0


def cmd_domains(args) -> int:
    _, reg = _registry()
    for name, d in sorted(reg.domains.items()):
        print(f"{name}: {d.description}".rstrip(": "))
        print(f"  roles: {', '.join(r.name for r in d.roles)}")
        print(f"  tasks: {', '.join(d.task_names())}")
    return 0


def cmd_plugins(args) -> int:
    pm, reg = _registry()
    for name, items in reg.provenance.items():
        print(f"{name}")
        for it in items:
            print(f"  {it}")
        hooks = sorted(h.name for h in pm.get_hookcallers(pm.get_plugin(name)) or [])
        print(f"  hooks: {', '.join(hooks) or '(none)'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    epilog = (f"config groups: {', '.join(GROUPS)}; presets: model={'|'.join(presets('model'))}, "
              f"algo={'|'.join(presets('algo'))}, hardware={'|'.join(presets('hardware'))}. "
              "Any config key can be set with dotted key=value (see `swarm config`).")
    p = argparse.ArgumentParser(prog="swarm", description="Train and deploy swarms of LLM agents (MPT).", epilog=epilog)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="SFT cold start + MPT training + held-out evaluation", epilog=epilog)
    r.add_argument("overrides", nargs="*", help="domain=NAME task=NAME model=NAME algo=NAME hardware=NAME key=value ...")
    r.set_defaults(func=cmd_run)
    c = sub.add_parser("config", help="print the resolved config without running")
    c.add_argument("overrides", nargs="*")
    c.add_argument("--plan", action="store_true", help="print the memory plan (weights, adapters, optimizer "
                   "states, activations, KV cache) against hardware.memory_gb instead")
    c.set_defaults(func=cmd_config)
    e = sub.add_parser("eval", help="evaluate a run's checkpoint on the held-out seeds")
    e.add_argument("run_dir", help="a run folder written by `swarm run`")
    e.add_argument("overrides", nargs="*", help="checkpoint=TAG (default latest), eval.runs=N, eval.episodes=N ...")
    e.set_defaults(func=cmd_eval)
    x = sub.add_parser("experiment", help="run one of the paper's experiments (see --list)", epilog=epilog)
    x.add_argument("name", nargs="?", help="experiment name (swarm experiment --list)")
    x.add_argument("overrides", nargs="*", help="same config as `swarm run` (domain=, task=, key=value), plus "
                   "experiment.* keys; resume=true run_dir=DIR continues a killed experiment")
    x.add_argument("--list", action="store_true", help="list the registered experiments")
    x.set_defaults(func=cmd_experiment)
    ex = sub.add_parser("export", help="write one Hugging Face folder per role of a run's checkpoint")
    ex.add_argument("run_dir", help="a run folder written by `swarm run`")
    ex.add_argument("overrides", nargs="*", help="checkpoint=TAG (default latest), merged=true|false (adapter runs: "
                    "the base with each adapter folded in, or the PEFT adapters), out=DIR (default RUN/export/TAG)")
    ex.set_defaults(func=cmd_export)
    sub.add_parser("domains", help="list domains, their roles and tasks").set_defaults(func=cmd_domains)
    sub.add_parser("plugins", help="list loaded plugins and what each registered").set_defaults(func=cmd_plugins)
    return p


def main(argv: list[str] | None = None) -> int:
    from loguru import logger

    from swarm_runtime.plugins import PluginError

    logger.remove()
    logger.add(sys.stderr, level="INFO", format="<green>{time:HH:mm:ss}</green> <level>{level: <7}</level> {message}")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"swarm: error: {exc}", file=sys.stderr)
        return 2
    except PluginError as exc:
        print(f"swarm: plugin error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("swarm: interrupted; continue with resume=true", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
