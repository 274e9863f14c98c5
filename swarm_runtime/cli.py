"""The ``swarm`` command line.

swarm run domain=minecraft task=iron_pickaxe [key=value ...]
swarm eval RUN_DIR [checkpoint=TAG] [eval.runs=3 ...] [serve.url=http://HOST:PORT]
swarm serve RUN_DIR [checkpoint=TAG] [serve.replicas=K] [serve.port=P ...]
swarm experiment NAME [key=value ...] | swarm experiment --list
swarm domains | swarm plugins | swarm config [key=value ...] [--plan]
swarm export RUN_DIR [checkpoint=TAG] [merged=true]
recipe=NAME (any of run, config, experiment): a shipped recipe's settings (or recipe=PATH.yaml), the command line winning
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

from swarm_runtime.config import GROUPS, RUN_CONTROL, ConfigError, load_saved, presets
from swarm_runtime.errors import Stopped, stop_on_sigterm


def _registry():
    from swarm_runtime.plugins import get_registry

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


def cmd_run(args) -> int:
    from swarm_runtime.config import precheck

    args.overrides = expand_recipe(args.overrides)
    precheck(_resume_picks(args.overrides))  # before the plugins (torch) load: a bad value fails fast
    from swarm_runtime.config import resolve
    from swarm_runtime.run import prepare_run

    pm, reg = _registry()
    cfg = resolve(_resume_picks(args.overrides), reg)
    ctx = prepare_run(cfg, pm, reg, args=args.overrides)
    try:
        trainer = reg.get("algorithms", ctx.cfg.algo.name)(ctx)
        trainer.train()
        from swarm_runtime.provenance import stamp

        stamp(ctx.run_dir / "eval.json")  # library versions and commit beside the figures (issue 18)
    except Stopped as exc:
        exc.run_dir = ctx.run_dir  # the resume line names the folder
        raise
    finally:
        ctx.lock.release()
    return 0


def cmd_config(args) -> int:
    from omegaconf import OmegaConf

    from swarm_runtime.config import precheck, resolve
    from swarm_runtime.secrets import redacted

    args.overrides = expand_recipe(args.overrides)
    precheck(args.overrides)
    _, reg = _registry()
    cfg = resolve(args.overrides, reg)
    if getattr(args, "plan", False):
        return print_plan(cfg, reg)
    print(OmegaConf.to_yaml(redacted(cfg)))
    return 0


# ---------------------------------------------------------------- issue 19: recipes, memory plan, export
def recipe_names() -> list[str]:
    """The shipped recipes' names (``recipe=NAME``)."""
    from importlib.resources import files

    return sorted(f.name[:-5] for f in files("swarm_runtime").joinpath("recipes").iterdir() if f.name.endswith(".yaml"))


def find_recipe(given: str):
    """``recipe=``'s file: a path to a YAML file, or the name of a shipped recipe (``NAME``,
    ``NAME.yaml`` or ``configs/NAME.yaml``, found in the installed package through importlib.resources,
    so it works from a wheel as from a checkout)."""
    from importlib.resources import files

    path = Path(given)
    if path.is_file():
        return path
    name = path.name[:-5] if path.name.endswith(".yaml") else path.name
    if path.parent in (Path("."), Path("configs")):
        shipped = files("swarm_runtime").joinpath("recipes", f"{name}.yaml")
        if shipped.is_file():
            return shipped
    raise ConfigError(
        f"recipe {given!r} is neither a file nor a shipped recipe; shipped recipes: "
        f"{', '.join(recipe_names()) or '(none)'}"
    )


def expand_recipe(overrides: list[str]) -> list[str]:
    """``recipe=NAME`` (a shipped recipe) or ``recipe=PATH`` -> the recipe's ``key: value`` lines as
    ``key=value`` arguments, placed before the rest of the command line (which wins). A recipe is a
    flat YAML mapping of config groups (``domain``, ``task``, ``model``, ``algo``, ``hardware``) and
    dotted keys (``configs/*.yaml``, shipped as ``swarm_runtime/recipes/``)."""
    import yaml

    out, recipes = [], [o for o in overrides if o.startswith("recipe=")]
    if len(recipes) > 1:
        raise ConfigError(f"give one recipe=, got {len(recipes)}")
    for item in recipes:
        given = item.partition("=")[2]
        try:
            data = yaml.safe_load(find_recipe(given).read_text()) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
            raise ConfigError(
                f"recipe {given!r} is not YAML ({first}); a recipe is a YAML mapping of key: value (configs/*.yaml)"
            ) from exc
        if not isinstance(data, dict):
            raise ConfigError(f"recipe {given!r} must be a mapping of key: value")
        control = [str(k) for k in data if str(k) in RUN_CONTROL]
        if control:
            raise ConfigError(
                f"recipe {given!r} sets {control[0]}: {', '.join(RUN_CONTROL)} pick and operate a run "
                f"folder and come from the command line only; remove {control[0]} from the recipe"
            )
        for k, v in data.items():
            if isinstance(v, (dict, list)):
                v = yaml.safe_dump(v, default_flow_style=True).strip()
            out.append(f"{k}={'null' if v is None else v}")
    return out + [o for o in overrides if not o.startswith("recipe=")]


def print_plan(cfg, reg) -> int:
    """``swarm config ... --plan``: the memory plan (per device with ``train.engine``/``train.shards`` or
    ``cluster.placement``) and the placement groups beside it; exit 2 when a device does not fit."""
    from swarm_runtime.cluster.placement import plan_and_placement
    from swarm_runtime.memory_plan import PlacedPlan

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


def cmd_export(args) -> int:
    """``swarm export RUN [checkpoint=TAG] [merged=true] [out=DIR]``: one Hugging Face folder per role."""
    import shutil

    from swarm_runtime.checkpoint import TAG_RE, latest_checkpoint, loading_models
    from swarm_runtime.runfiles import check_link, check_links, claim, inside

    run_dir = Path(args.run_dir)
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{str(run_dir)!r} is not a run folder (no config.yaml); give the folder `swarm run` printed")
    check_links(run_dir)
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
    if opts["checkpoint"] is not None and not TAG_RE.fullmatch(opts["checkpoint"]):
        raise ConfigError(
            f"checkpoint {opts['checkpoint']!r} not found in {run_dir}; valid: {', '.join(tags) or '(none)'}"
        )
    ckpt = run_dir / "checkpoints" / opts["checkpoint"] if opts["checkpoint"] else latest_checkpoint(run_dir)
    if ckpt is None or not (ckpt / "state.json").exists():
        raise ConfigError(
            f"checkpoint {opts['checkpoint'] or 'latest'!r} not found in {run_dir}; valid: "
            f"{', '.join(tags) or '(none)'}"
        )
    if opts["out"] == "":
        raise ConfigError("out= is empty; give a folder (default RUN/export/TAG)")
    check_link(run_dir, run_dir / "export")
    out = Path(opts["out"]) if opts["out"] else claim(run_dir / "export") / ckpt.name
    if inside(run_dir / "checkpoints", out):
        raise ConfigError(
            f"out={str(out)!r} is inside the run's checkpoints ({str(run_dir / 'checkpoints')!r}): swarm "
            "export never writes into or deletes from a checkpoint; give another folder (default "
            "RUN/export/TAG)"
        )
    roles = sorted(p.name for p in (ckpt / "agents").iterdir() if p.is_dir())
    with loading_models(ckpt / "agents"):
        if cfg.model.get("adapter", "none") == "lora":
            from swarm_runtime.policy.adapters import export_adapters

            written = export_adapters(
                ckpt / "agents", out, roles, [float(b) for b in cfg.algo.bid_levels], merged=opts["merged"] == "true"
            )
        else:  # full copies are Hugging Face folders already
            from swarm_runtime.policy.adapters import check_finite

            written = []
            for role in roles:
                check_finite(ckpt / "agents" / role)
                dst = out / role
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(ckpt / "agents" / role, dst, ignore=shutil.ignore_patterns("training_state.pt"))
                written.append(dst)
    kind = "merged Hugging Face folders" if opts["merged"] == "true" or cfg.model.adapter != "lora" else "PEFT adapters"
    print(f"exported {ckpt.name} of {run_dir} ({kind}):\n" + "\n".join(f"  {p}" for p in written))
    return 0


def eval_file_name(tag: str, overrides: list[str]) -> str:
    """``eval-<tag>.json``, or with other keys ``eval-<tag>--k=v--k=v.json``, so that an evaluation
    under other settings (a temperature, more runs) does not overwrite an earlier one. Secret
    values (``*api_key=``, ``*token=``) are redacted: they never reach a file name."""
    from swarm_runtime.secrets import redact_args

    if not overrides:
        return f"eval-{tag}.json"
    overrides = redact_args(overrides)
    slug = "--".join(re.sub(r"[^A-Za-z0-9._=+-]", "_", o) for o in overrides)
    if len(slug) > 100:
        slug = slug[:80] + "--" + hashlib.sha1("\0".join(overrides).encode()).hexdigest()[:10]
    return f"eval-{tag}--{slug}.json"


def cmd_eval(args) -> int:
    if any(o.startswith("serve.url=") for o in args.overrides):
        return cmd_eval_served(args)
    from swarm_runtime.config import precheck
    from swarm_runtime.runlock import RunLock

    run_dir = Path(args.run_dir)
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{str(run_dir)!r} is not a run folder (no config.yaml); give the folder `swarm run` printed")
    precheck([o for o in args.overrides if not o.startswith("checkpoint=")], resolve_with_domains=False)
    with RunLock(run_dir, "eval"):  # not while a run writes (and prunes) the checkpoints
        return _eval_locked(args, run_dir)


def _eval_locked(args, run_dir: Path) -> int:
    from swarm_runtime.checkpoint import CheckpointError, latest_checkpoint
    from swarm_runtime.config import override, validate
    from swarm_runtime.run import RunContext, check_hardware, check_task, distrust_saved_endpoints
    from swarm_runtime.runfiles import check_links

    pm, reg = _registry()
    check_links(run_dir)
    cfg = load_saved(run_dir / "config.yaml", reg)
    tag = None
    for item in args.overrides:
        k, _, v = item.partition("=")
        if k == "checkpoint":
            tag = v
        else:
            override(cfg, k, v)
    distrust_saved_endpoints(
        cfg, reg, [o for o in args.overrides if not o.startswith("checkpoint=")], run_dir / "config.yaml"
    )
    from swarm_runtime.checkpoint import TAG_RE, complete_tags

    tags = complete_tags(run_dir)
    if tag is not None and (not TAG_RE.fullmatch(tag) or tag not in tags):
        raise CheckpointError(f"checkpoint {tag!r} not found in {run_dir}; valid: {', '.join(tags) or '(none)'}")
    ckpt = (run_dir / "checkpoints" / tag) if tag else latest_checkpoint(run_dir)
    if ckpt is None:
        raise CheckpointError(
            f"{run_dir} has no checkpoint yet (no checkpoints/latest); valid: {', '.join(tags) or '(none)'}"
        )
    if cfg.domain not in reg.domains:
        raise ConfigError(
            f"run uses domain {cfg.domain!r}, which no loaded plugin provides; loaded: {', '.join(reg.domains)}"
        )
    validate(cfg, reg, ray_keys=("cluster.kind",))  # Ray for its env workers only: eval serves nothing
    check_hardware(cfg)
    check_task(reg.domains[cfg.domain], cfg)
    ctx = RunContext(cfg, pm, reg, run_dir)
    from swarm_runtime.cluster import env_workers

    with env_workers(cfg, ctx.domain) as domain:  # cluster.kind=ray: the envs on env workers, closed at the end
        return _eval_checkpoint(args, run_dir, cfg, reg, ctx, ckpt, domain)


def _eval_checkpoint(args, run_dir: Path, cfg, reg, ctx, ckpt: Path, domain) -> int:
    """Evaluate ``ckpt`` with the envs ``domain`` makes and write its eval file (``swarm eval``)."""
    from swarm_runtime.checkpoint import loading_models
    from swarm_runtime.evaluate import evaluate
    from swarm_runtime.outputs import format_table, write_json
    from swarm_runtime.provenance import versions, versions_line
    from swarm_runtime.secrets import redact_args

    algorithm = reg.algorithms.get(cfg.algo.name)  # its class: it may evaluate its checkpoints its own way
    own_eval = getattr(algorithm, "evaluate_checkpoint", None)
    if own_eval is not None:  # algo=rlcr: one shared policy acting as a collective (docs/rlcr.md)
        res, table = own_eval(ctx, ckpt, domain)
        out = run_dir / eval_file_name(ckpt.name, [o for o in args.overrides if not o.startswith("checkpoint=")])
        write_json(out, {**res, "overrides": redact_args(args.overrides), "versions": versions()})
        print(
            f"{cfg.domain}/{cfg.task_name} (algo={cfg.algo.name}), checkpoint {ckpt.name}, "
            f"{getattr(algorithm, 'eval_measure', 'results')}\n{table}\n{versions_line()}\nsaved {out}"
        )
        return 0
    from swarm_runtime.train.monolithic import MONOLITHIC, build_monolithic

    if (ckpt / "agents" / MONOLITHIC).exists():  # an `algo=monolithic` run: one model, acting every turn
        agents, _ = build_monolithic(ctx, ckpt / "agents")
        coordinator = ctx.coordinator("round_robin")
    else:
        with loading_models(ckpt / "agents"):
            agents, _ = ctx.build_swarm(ckpt / "agents")
        coordinator = ctx.coordinator()
    res, _ = evaluate(
        agents,
        coordinator,
        domain,
        ctx.task,
        ctx.seeds("eval"),
        int(cfg.eval.runs),
        int(cfg.seed) + 7919,
        cfg.eval.temperature,
        common_random_numbers=bool(cfg.eval.common_random_numbers),
    )
    table = format_table([(ckpt.name, res)], ["reward"] + [m for m in ("success", "spl", "ndtw") if f"{m}_mean" in res])
    out = run_dir / eval_file_name(ckpt.name, [o for o in args.overrides if not o.startswith("checkpoint=")])
    res["overrides"] = redact_args(args.overrides)  # what produced this file
    res["eval_split"], res["versions"] = str(cfg.eval.split), versions()
    write_json(out, res)
    print(
        f"{cfg.domain}/{cfg.task_name}, checkpoint {ckpt.name}, {res['seeds']} held-out seeds ({cfg.eval.split} split) "
        f"x {res['runs']} runs\n{table}\n{versions_line()}\nsaved {out}"
    )
    return 0


# ---------------------------------------------------------------------------- swarm serve (issue 20)
def _serve_run(run_dir: Path, overrides: list[str]):
    """A run folder's config with ``overrides`` (``checkpoint=TAG`` and ``serve.replicas.ROLE=N``
    included), its registry and the checkpoint folder; raises ConfigError naming bad values."""
    from swarm_runtime.checkpoint import latest_checkpoint
    from swarm_runtime.config import override, validate
    from swarm_runtime.run import check_hardware, check_task, distrust_saved_endpoints
    from swarm_runtime.runfiles import check_links

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

    from swarm_runtime.serve import require_serve_extra
    from swarm_runtime.serve.gateway import GatewaySetup, check_bind, serve
    from swarm_runtime.train.monolithic import MONOLITHIC

    require_serve_extra()
    run_dir = Path(args.run_dir)
    cfg, pm, reg, ckpt = _serve_run(run_dir, args.overrides)
    if (ckpt / "agents" / MONOLITHIC).exists():
        raise ConfigError(f"{run_dir} is an algo=monolithic run (one model, no auction); swarm serve serves swarms")
    api_key = os.environ.get("SWARM_API_KEY") or None
    check_bind(str(cfg.serve.host), api_key)
    serve(GatewaySetup(run_dir, ckpt, cfg, reg, pm, api_key))
    return 0


def cmd_eval_served(args) -> int:
    """``swarm eval RUN serve.url=URL``: the held-out table of the swarm a running service serves."""
    import asyncio

    from swarm_runtime.outputs import format_table, write_json
    from swarm_runtime.provenance import versions, versions_line
    from swarm_runtime.run import RunContext
    from swarm_runtime.secrets import redact_args
    from swarm_runtime.serve import require_serve_extra
    from swarm_runtime.serve.client import ServeError, SwarmClient, evaluate_served

    require_serve_extra()
    run_dir = Path(args.run_dir)
    cfg, pm, reg, _ = _serve_run(run_dir, [o for o in args.overrides if not o.startswith("checkpoint=")])
    url = str(cfg.serve.url)
    ctx = RunContext(cfg, pm, reg, run_dir)

    async def go():
        async with SwarmClient(url) as c:
            health = await c.health()
        if (health.get("domain"), health.get("task")) != (cfg.domain, cfg.task_name):
            raise ConfigError(
                f"the service at {url} serves {health.get('domain')}/{health.get('task')}, "
                f"this run is {cfg.domain}/{cfg.task_name}"
            )
        res, _, _ = await evaluate_served(
            url,
            ctx.seeds("eval"),
            int(cfg.eval.runs),
            int(cfg.seed) + 7919,
            cfg.eval.temperature,
            None,
            int(cfg.serve.concurrency),
        )
        return health, res

    try:
        health, res = asyncio.run(go())
    except ServeError as exc:
        raise ConfigError(str(exc)) from exc
    except OSError as exc:
        raise ConfigError(f"cannot reach the service at {url}: {exc}") from exc
    except Exception as exc:  # httpx transport errors
        if type(exc).__module__.startswith("httpx"):
            raise ConfigError(f"cannot reach the service at {url}: {type(exc).__name__}: {exc}") from exc
        raise
    tag = f"served-{health['checkpoint']}"
    table = format_table([(tag, res)], ["reward"] + [m for m in ("success", "spl", "ndtw") if f"{m}_mean" in res])
    out = run_dir / eval_file_name(tag, [o for o in args.overrides if not o.startswith(("checkpoint=", "serve.url="))])
    res["overrides"], res["served_by"], res["versions"] = redact_args(args.overrides), url, versions()
    write_json(out, res)
    print(
        f"{cfg.domain}/{cfg.task_name}, served checkpoint {health['checkpoint']} at {url}, {res['seeds']} held-out "
        f"seeds x {res['runs']} runs\n{table}\n{versions_line()}\nsaved {out}"
    )
    return 0


def cmd_experiment(args) -> int:
    from swarm_runtime.config import precheck
    from swarm_runtime.experiments.runner import run_experiment

    args.overrides = expand_recipe(args.overrides)
    precheck(
        [o for o in args.overrides if "=" in o and o.partition("=")[0] not in ("run_dir", "resume")],
        resolve_with_domains=False,
    )

    pm, reg = _registry()
    if args.list or not args.name:
        if not args.list:
            raise ConfigError(f"give an experiment name; valid: {', '.join(sorted(reg.experiments))}")
        for name, fn in reg.experiments.items():
            doc = (fn.__doc__ or "").strip().splitlines()
            print(f"{name}: {doc[0] if doc else ''}".rstrip(": "))
        return 0
    run_experiment(args.name, args.overrides, pm, reg)
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
    epilog = (
        f"config groups: {', '.join(GROUPS)}; presets: model={'|'.join(presets('model'))}, "
        f"algo={'|'.join(presets('algo'))}, hardware={'|'.join(presets('hardware'))}. "
        "Any config key can be set with dotted key=value (see `swarm config`)."
    )
    p = argparse.ArgumentParser(prog="swarm", description="Train and deploy swarms of LLM agents (MPT).", epilog=epilog)
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="SFT cold start + MPT training + held-out evaluation", epilog=epilog)
    r.add_argument(
        "overrides", nargs="*", help="domain=NAME task=NAME model=NAME algo=NAME hardware=NAME key=value ..."
    )
    r.set_defaults(func=cmd_run)
    c = sub.add_parser("config", help="print the resolved config without running")
    c.add_argument("overrides", nargs="*")
    c.add_argument(
        "--plan",
        action="store_true",
        help="print the memory plan (weights, adapters, optimizer "
        "states, activations, KV cache) against hardware.memory_gb instead",
    )
    c.set_defaults(func=cmd_config)
    e = sub.add_parser("eval", help="evaluate a run's checkpoint on the held-out seeds")
    e.add_argument("run_dir", help="a run folder written by `swarm run`")
    e.add_argument("overrides", nargs="*", help="checkpoint=TAG (default latest), eval.runs=N, eval.episodes=N ...")
    e.set_defaults(func=cmd_eval)
    sv = sub.add_parser("serve", help="serve a trained swarm: agent workers + a gateway running the auction")
    sv.add_argument("run_dir", help="a run folder written by `swarm run`")
    sv.add_argument(
        "overrides",
        nargs="*",
        help="checkpoint=TAG (default latest), serve.replicas=K or "
        "serve.replicas.ROLE=K, serve.port=P, serve.host=ADDR (needs SWARM_API_KEY), serve.* (docs/deploy.md)",
    )
    sv.set_defaults(func=cmd_serve)
    x = sub.add_parser("experiment", help="run one of the paper's experiments (see --list)", epilog=epilog)
    x.add_argument("name", nargs="?", help="experiment name (swarm experiment --list)")
    x.add_argument(
        "overrides",
        nargs="*",
        help="same config as `swarm run` (domain=, task=, key=value), plus "
        "experiment.* keys; resume=true run_dir=DIR continues a killed experiment",
    )
    x.add_argument("--list", action="store_true", help="list the registered experiments")
    x.set_defaults(func=cmd_experiment)
    ex = sub.add_parser("export", help="write one Hugging Face folder per role of a run's checkpoint")
    ex.add_argument("run_dir", help="a run folder written by `swarm run`")
    ex.add_argument(
        "overrides",
        nargs="*",
        help="checkpoint=TAG (default latest), merged=true|false (adapter runs: "
        "the base with each adapter folded in, or the PEFT adapters), out=DIR (default RUN/export/TAG)",
    )
    ex.set_defaults(func=cmd_export)
    sub.add_parser("domains", help="list domains, their roles and tasks").set_defaults(func=cmd_domains)
    sub.add_parser("plugins", help="list loaded plugins and what each registered").set_defaults(func=cmd_plugins)
    return p


def _debug(argv: list[str]) -> bool:
    return "--debug" in argv or any(a.replace(" ", "").lower() in ("log_level=debug", "log_level=trace") for a in argv)


def main(argv: list[str] | None = None) -> int:
    """Run a command. Every error ends with one line on stderr and exit code 2 (130 when
    interrupted, 143 when stopped by SIGTERM); the traceback only with ``--debug`` or ``log_level=DEBUG``."""
    from loguru import logger

    from swarm_runtime.secrets import install_log_scrubber, note_args, scrub

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _debug(argv)
    argv = [a for a in argv if a != "--debug"]
    note_args(argv)
    install_log_scrubber()
    logger.remove()
    logger.add(sys.stderr, level="INFO", format="<green>{time:HH:mm:ss}</green> <level>{level: <7}</level> {message}")
    args = build_parser().parse_args(argv)
    if args.command in RESUMABLE:  # `swarm serve` drains on SIGTERM (uvicorn's handler), the rest end at once
        stop_on_sigterm()
    try:
        return args.func(args)
    except Stopped as exc:
        print(f"swarm: stopped by SIGTERM{_resume_hint(args, exc.run_dir)}", file=sys.stderr)
        return 128 + 15  # the shell's code for a process SIGTERM ended
    except KeyboardInterrupt:
        print("swarm: interrupted; continue with resume=true", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `swarm domains | head`: the reader is gone; say nothing more
        try:
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 0
    except Exception as exc:
        if debug:
            raise
        print(scrub(_one_line(exc)), file=sys.stderr)
        try:  # the traceback goes to the run's log (when one is open), never to the console
            logger.remove()
            logger.opt(exception=exc).debug("swarm: {}", type(exc).__name__)
        except Exception:
            pass
        return 2


#: The commands SIGTERM stops with one line saying how to resume (:class:`~swarm_runtime.errors.Stopped`).
RESUMABLE = ("run", "experiment")


def _resume_hint(args, run_dir) -> str:
    """``; continue with: swarm run resume=true run_dir=DIR`` for a stopped ``run`` or ``experiment`` (the folder when
    the command had opened one)."""
    return f"; continue with: swarm {args.command} resume=true" + (f" run_dir={run_dir}" if run_dir is not None else "")


def _one_line(exc: Exception) -> str:
    from omegaconf.errors import OmegaConfBaseException

    from swarm_runtime.plugins import PluginError

    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ConfigError):
        return f"swarm: error: {text}"
    if isinstance(exc, PluginError):
        return f"swarm: plugin error: {text}"
    if isinstance(exc, OmegaConfBaseException):
        return f"swarm: error: bad config: {str(exc).splitlines()[0]}"
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        return f"swarm: error: {exc.strerror or text}{where}"
    return f"swarm: error: {type(exc).__name__}: {text[:300]} (run again with --debug for the traceback)"


if __name__ == "__main__":
    sys.exit(main())
