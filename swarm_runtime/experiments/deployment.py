"""Experiments over one trained MPT swarm (``experiment.base`` or trained here):
``coordination``, ``bid_action_ablation``, ``population``, ``dropout`` and
``participation``. The deployment math (pass@k, dropout masks, participation)
is :mod:`swarm_runtime.evaluation.deploy`'s."""

from __future__ import annotations

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.core.episode import Agent
from swarm_runtime.experiments.context import ExperimentContext, Report
from swarm_runtime.experiments.report import markdown_table, metric, plot_bars
from swarm_runtime.models.split import SplitPolicy


def _eval_row(label: str, cell: dict, **extra) -> dict:
    s = cell["summary"]
    row = {"label": label, "held-out reward": metric(s, "reward")}
    if "success_mean" in s:
        row["success"] = metric(s, "success")
    row.update(extra)
    return row


def _shares(s: dict) -> str:
    return " / ".join(f"{v:.2f}" for v in s["turn_share"].values())


def coordination(x: ExperimentContext) -> Report:
    """Auction vs Graph-of-Agents vs round-robin vs AgentNet over the same trained action policies."""
    names = [str(c) for c in x.xcfg.coordinators]
    bad = [c for c in names if c not in x.registry.coordinators]
    if bad:
        raise ConfigError(
            f"unknown coordinator(s) {bad} in experiment.coordinators; valid: "
            f"{', '.join(sorted(x.registry.coordinators))}"
        )
    x.plan(len(names) + x.trains_swarm)
    run = x.trained_swarm()
    rows, cells = [], {}
    for name in names:
        cells[name] = c = x.evaluate(f"coordination-{name}", lambda: x.load_swarm(run), coordinator=name)
        s = c["summary"]
        rows.append(
            _eval_row(
                name,
                c,
                **{
                    "turn share (" + " / ".join(s["turn_share"]) + ")": _shares(s),
                    "invalid actions / episode": s["invalid_actions"] / max(1, s["episodes"]),
                },
            )
        )
    plot = plot_bars(
        names,
        [(c["summary"]["reward_mean"], c["summary"]["reward_se"]) for c in cells.values()],
        x.run_dir / "coordination.png",
        f"Coordination over the same trained policies: {x.cfg.domain}/{x.cfg.task_name}",
    )
    return Report(
        "Coordination: the same trained action policies under different coordinators",
        rows,
        plots=[plot],
        data={
            "swarm": str(run),
            "cells": cells,
            "seed_rewards": {n: c["summary"].get("seed_rewards", {}) for n, c in cells.items()},
        },
        notes=[
            "Every coordinator drives the same final MPT checkpoint; Graph-of-Agents and AgentNet read no "
            "bid (they route on the action policies' own log-probabilities of their proposals); what "
            "each baseline simplifies is in docs/reference/algorithm.md."
        ],
    )


def bid_action_ablation(x: ExperimentContext) -> Report:
    """Initial (SFT) or trained (MPT) bids crossed with initial or trained actions."""
    x.plan(4 + x.trains_swarm)
    run = x.trained_swarm()

    def swarm(bids: str, actions: str):
        def build():
            # separate model objects for bids and actions even when both come from one checkpoint, so every
            # combination draws bids and actions from the same two seeded random streams
            bid_models, act_models = x.load_swarm(run, bids)[1], x.load_swarm(run, actions)[1]
            agents = [
                Agent(r.name, r.name, SplitPolicy(bid_models[r.name], act_models[r.name])) for r in x.domain.roles
            ]
            return agents, {}

        return build

    label = {"final": "trained", "sft": "initial"}
    rows, cells = [], {}
    for bids, actions in (("final", "final"), ("sft", "final"), ("final", "sft"), ("sft", "sft")):
        key = f"bids-{label[bids]}-actions-{label[actions]}"
        cells[key] = c = x.evaluate(key, swarm(bids, actions))
        rows.append(
            _eval_row(
                f"{label[bids]} bids x {label[actions]} actions",
                c,
                **{"turn share": _shares(c["summary"]), "skipped turns / episode": c["skipped_per_episode"]},
            )
        )
    plot = plot_bars(
        [r["label"] for r in rows],
        [r["held-out reward"] for r in rows],
        x.run_dir / "bid_action_ablation.png",
        f"Bid x action ablation: {x.cfg.domain}/{x.cfg.task_name}",
    )
    return Report(
        "Bid x action ablation (initial = SFT checkpoint, trained = final MPT checkpoint)",
        rows,
        plots=[plot],
        data={"swarm": str(run), "cells": cells},
    )


def _milestones(x: ExperimentContext) -> list[str]:
    if x.xcfg.milestones:
        return [str(m) for m in x.xcfg.milestones]
    ms = x.task.get("milestones")
    if not ms:
        raise ConfigError(
            f"task {x.cfg.task_name!r} of {x.cfg.domain!r} has no milestones; give "
            "experiment.milestones=[...] (names of the episodes' has_<name> metrics)"
        )
    return [str(m) for m in ms]


def population(x: ExperimentContext) -> Report:
    """Replicas 1..4 per role at inference (shared weights): pass@k of the task's milestones."""
    from swarm_runtime.evaluation.deploy import milestone_pass_at_k, plot_population

    reps = [int(r) for r in x.xcfg.replicas]
    if not reps or min(reps) < 1:
        raise ConfigError(f"experiment.replicas {reps} must be positive integers")
    k = int(x.xcfg.pass_k)
    runs = max(int(x.cfg.eval.runs), k)
    milestones = _milestones(x)
    x.plan(len(reps) + x.trains_swarm)
    run = x.trained_swarm()
    n_roles = len(x.domain.roles)
    rows, cells, bars = [], {}, {}
    for r in reps:

        def extra(episodes, agents):
            return {"pass_at_k": {m: list(v) for m, v in milestone_pass_at_k(episodes, milestones, k).items()}}

        c = x.evaluate(f"population-{r}", lambda r=r: x.load_swarm(run, replicas=r), runs=runs, extra=extra)
        label = f"{n_roles * r} agents ({r} per role)"
        cells[label] = c
        bars[label] = {m: tuple(v) for m, v in c["pass_at_k"].items()}
        rows.append(_eval_row(label, c, **{f"pass@{k} {m}": tuple(v) for m, v in c["pass_at_k"].items()}))
    plot = plot_population(
        bars, x.run_dir / "population.png", f"Population scaling: {x.cfg.domain}/{x.cfg.task_name}", ylabel=f"pass@{k}"
    )
    return Report(
        f"Population scaling (replicas share one model per role), pass@{k} over {runs} runs per seed",
        rows,
        plots=[plot],
        data={"swarm": str(run), "cells": cells, "k": k, "runs_per_seed": runs},
        notes=["Peak memory with 12 vs 3 agents is measured by benchmarks/population_memory.py (docs/benchmarks.md)."],
    )


def dropout(x: ExperimentContext) -> Report:
    """Each agent absent from a turn's auction with probability p, for 3 and 12 agents."""
    from swarm_runtime.evaluation.deploy import dropout_presence, plot_dropout

    ps = [float(p) for p in x.xcfg.dropout_p]
    reps = [int(r) for r in x.xcfg.dropout_replicas]
    per = str(x.xcfg.dropout_per)
    n_roles = len(x.domain.roles)
    for r in reps:  # bad p / per fail here, before any work
        for p in ps:
            dropout_presence(p, n_roles * r, per=per, seed=int(x.cfg.seed))
    x.plan(len(ps) * len(reps) + x.trains_swarm)
    run = x.trained_swarm()
    rows, cells, curves = [], {}, {}
    for r in reps:
        n = n_roles * r
        curves[f"{n} agents"] = {}
        for p in ps:
            presence = dropout_presence(p, n, per=per, seed=int(x.cfg.seed))
            c = x.evaluate(f"dropout-{n}agents-p{p:g}", lambda r=r: x.load_swarm(run, replicas=r), presence=presence)
            cells[f"{n} agents, p={p:g}"] = c
            curves[f"{n} agents"][p] = (c["summary"]["reward_mean"], c["summary"]["reward_se"])
            rows.append(_eval_row(f"{n} agents, p={p:g}", c, **{"skipped turns / episode": c["skipped_per_episode"]}))
    plot = plot_dropout(curves, x.run_dir / "dropout.png", f"Dropout (per {per}): {x.cfg.domain}/{x.cfg.task_name}")
    return Report(
        f"Dropout: each agent absent with probability p (drawn per {per})",
        rows,
        plots=[plot],
        data={"swarm": str(run), "cells": cells, "per": per},
    )


def participation(x: ExperimentContext) -> Report:
    """Each role's share of turns by decision index, after SFT vs after MPT (the paper's Figure 6)."""
    from swarm_runtime.evaluation.deploy import participation_by_decision, plot_participation

    x.plan(2 + x.trains_swarm)
    run = x.trained_swarm()
    T = int(x.task.max_decisions)

    def extra(episodes, agents):
        return {"participation": participation_by_decision(episodes, agents, T)}

    series, cells = {}, {}
    for tag, label in (("sft", "after SFT"), ("final", "after MPT")):
        cells[label] = c = x.evaluate(f"participation-{tag}", lambda tag=tag: x.load_swarm(run, tag), extra=extra)
        series[label] = c["participation"]
    plot = plot_participation(
        series, x.run_dir / "participation.png", f"Share of turns by decision index: {x.cfg.domain}/{x.cfg.task_name}"
    )
    points = sorted({0, T // 4, T // 2, (3 * T) // 4, T - 1})
    tables = {}
    for label, shares in series.items():
        rows = [{"role": role, **{f"t={t}": float(v[t]) for t in points}} for role, v in shares.items()]
        tables[f"Share of turns {label}, by decision index"] = markdown_table(rows, "role")
    rows = [
        _eval_row(label, c, **{"turn share (" + " / ".join(c["summary"]["turn_share"]) + ")": _shares(c["summary"])})
        for label, c in cells.items()
    ]
    return Report(
        "Participation before and after RL",
        rows,
        tables=tables,
        plots=[plot],
        data={"swarm": str(run), "cells": cells},
        notes=["Shares at decision t are over the episodes still running at t; 'skipped' = nobody acted."],
    )
