"""``swarm eval RUN``: held-out evaluation of a run's checkpoint, in process (:func:`cmd_eval`) or against the swarm
a running service serves (``serve.url=``, :func:`cmd_eval_served`); each writes ``eval-<tag>....json`` into the run
folder (:func:`eval_file_name`)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from swarm_runtime.cli.common import (
    check_graded,
    plugin_registry,
    require_domain,
    require_run_folder,
    without_checkpoint,
)
from swarm_runtime.cli.serve import served_run
from swarm_runtime.config.load import load_saved


def eval_file_name(tag: str, overrides: list[str]) -> str:
    """``eval-<tag>.json``, or with other keys ``eval-<tag>--k=v--k=v.json``, so that an evaluation
    under other settings (a temperature, more runs) does not overwrite an earlier one. Secret
    values (``*api_key=``, ``*token=``) are redacted: they never reach a file name."""
    from swarm_runtime.config.secrets import redact_args

    if not overrides:
        return f"eval-{tag}.json"
    overrides = redact_args(overrides)
    slug = "--".join(re.sub(r"[^A-Za-z0-9._=+-]", "_", o) for o in overrides)
    if len(slug) > 100:
        slug = slug[:80] + "--" + hashlib.sha1("\0".join(overrides).encode()).hexdigest()[:10]
    return f"eval-{tag}--{slug}.json"


def result_table(tag: str, res: dict) -> str:
    """The held-out table of one evaluation (``res``, of checkpoint or service ``tag``): the reward and the success,
    SPL and nDTW columns the domain reports, the domain's own figures (``domain_metrics``), then its report."""
    from swarm_runtime.runs.outputs import format_table, table_metrics

    table = format_table([(tag, res)], table_metrics(res))
    return f"{table}\n\n{res['domain_report']}" if res.get("domain_report") else table


def cmd_eval(args) -> int:
    """``swarm eval RUN [checkpoint=TAG] [key=value ...]``: evaluate a checkpoint in process, with the run folder
    locked; ``serve.url=`` evaluates a running service instead (:func:`cmd_eval_served`)."""
    if any(o.startswith("serve.url=") for o in args.overrides):
        return cmd_eval_served(args)
    from swarm_runtime.config.load import precheck
    from swarm_runtime.runs.runlock import RunLock

    run_dir = Path(args.run_dir)
    require_run_folder(run_dir)
    precheck(without_checkpoint(args.overrides), resolve_with_domains=False)
    with RunLock(run_dir, "eval"):  # not while a run writes (and prunes) the checkpoints
        return _eval_locked(args, run_dir)


def _eval_locked(args, run_dir: Path) -> int:
    from swarm_runtime.config.load import override
    from swarm_runtime.config.validation import validate
    from swarm_runtime.runs.checkpoint import CheckpointError, latest_checkpoint
    from swarm_runtime.runs.context import RunContext, check_hardware, check_task
    from swarm_runtime.runs.folder import distrust_saved_endpoints
    from swarm_runtime.runs.runfiles import check_links

    pm, reg = plugin_registry()
    check_links(run_dir)
    cfg = load_saved(run_dir / "config.yaml", reg)
    tag = None
    for item in args.overrides:
        k, _, v = item.partition("=")
        if k == "checkpoint":
            tag = v
        else:
            override(cfg, k, v)
    # eval samples in process: of the saved programs and servers, only the judge's endpoint is used
    chosen = ("task.llm_judge.base_url",)
    distrust_saved_endpoints(cfg, reg, without_checkpoint(args.overrides), run_dir / "config.yaml", chosen=chosen)
    from swarm_runtime.runs.checkpoint import TAG_RE, complete_tags

    tags = complete_tags(run_dir)
    if tag is not None and (not TAG_RE.fullmatch(tag) or tag not in tags):
        raise CheckpointError(f"checkpoint {tag!r} not found in {run_dir}; valid: {', '.join(tags) or '(none)'}")
    ckpt = (run_dir / "checkpoints" / tag) if tag else latest_checkpoint(run_dir)
    if ckpt is None:
        raise CheckpointError(
            f"{run_dir} has no checkpoint yet (no checkpoints/latest); valid: {', '.join(tags) or '(none)'}"
        )
    require_domain(cfg, reg)
    from swarm_runtime.runs.agents_check import check_agents

    check_agents(ckpt)  # the models' files, before anything loads them (eval, export, serve, resume)
    validate(cfg, reg, ray_keys=("cluster.kind",))  # Ray for its env workers only: eval serves nothing
    check_hardware(cfg)
    check_task(reg.domains[cfg.domain], cfg)
    ctx = RunContext(cfg, pm, reg, run_dir)
    from swarm_runtime.cluster import env_workers

    with env_workers(cfg, ctx.domain) as domain:  # cluster.kind=ray: the envs on env workers, closed at the end
        return _eval_checkpoint(args, run_dir, cfg, reg, ctx, ckpt, domain)


def _eval_checkpoint(args, run_dir: Path, cfg, reg, ctx, ckpt: Path, domain) -> int:
    """Evaluate ``ckpt`` with the envs ``domain`` makes and write its eval file (``swarm eval``)."""
    from swarm_runtime.config.secrets import redact_args
    from swarm_runtime.evaluation.heldout import evaluate
    from swarm_runtime.runs.checkpoint import loading_models
    from swarm_runtime.runs.outputs import write_json
    from swarm_runtime.runs.provenance import versions, versions_line

    algorithm = reg.algorithms.get(cfg.algo.name)  # its class: it may evaluate its checkpoints its own way
    own_eval = getattr(algorithm, "evaluate_checkpoint", None)
    if own_eval is not None:  # algo=rlcr: one shared policy acting as a collective (docs/guides/rlcr.md)
        res, table = own_eval(ctx, ckpt, domain)
        out = run_dir / eval_file_name(ckpt.name, without_checkpoint(args.overrides))
        write_json(out, {**res, "overrides": redact_args(args.overrides), "versions": versions()})
        print(
            f"{cfg.domain}/{cfg.task_name} (algo={cfg.algo.name}), checkpoint {ckpt.name}, "
            f"{getattr(algorithm, 'eval_measure', 'results')}\n{table}\n{versions_line()}\nsaved {out}"
        )
        return 0
    from swarm_runtime.learn.monolithic import MONOLITHIC, build_monolithic

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
    table = result_table(ckpt.name, res)
    out = run_dir / eval_file_name(ckpt.name, without_checkpoint(args.overrides))
    res["overrides"] = redact_args(args.overrides)  # what produced this file
    res["eval_split"], res["versions"] = str(cfg.eval.split), versions()
    write_json(out, res)
    print(
        f"{cfg.domain}/{cfg.task_name}, checkpoint {ckpt.name}, {res['seeds']} held-out seeds ({cfg.eval.split} split) "
        f"x {res['runs']} runs\n{table}\n{versions_line()}\nsaved {out}"
    )
    check_graded({f"checkpoint {ckpt.name}": res}, "evaluate again")
    return 0


def cmd_eval_served(args) -> int:
    """``swarm eval RUN serve.url=URL``: the held-out table of the swarm a running service serves."""
    from swarm_runtime.config.secrets import redact_args
    from swarm_runtime.runs.context import RunContext
    from swarm_runtime.runs.outputs import write_json
    from swarm_runtime.runs.provenance import versions, versions_line
    from swarm_runtime.serve import require_serve_extra
    from swarm_runtime.serve.client import SwarmClient, check_serves, evaluate_served, run_against

    require_serve_extra()
    run_dir = Path(args.run_dir)
    cfg, pm, reg, _ = served_run(run_dir, without_checkpoint(args.overrides))
    url = str(cfg.serve.url)
    ctx = RunContext(cfg, pm, reg, run_dir)

    async def go():
        async with SwarmClient(url) as c:
            health = await check_serves(c, url, cfg.domain, cfg.task_name)
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

    health, res = run_against(url, go())
    tag = f"served-{health['checkpoint']}"
    table = result_table(tag, res)
    out = run_dir / eval_file_name(tag, [o for o in args.overrides if not o.startswith(("checkpoint=", "serve.url="))])
    res["overrides"], res["served_by"], res["versions"] = redact_args(args.overrides), url, versions()
    write_json(out, res)
    print(
        f"{cfg.domain}/{cfg.task_name}, served checkpoint {health['checkpoint']} at {url}, {res['seeds']} held-out "
        f"seeds x {res['runs']} runs\n{table}\n{versions_line()}\nsaved {out}"
    )
    check_graded({f"the service at {url}": res}, "evaluate again")
    return 0
