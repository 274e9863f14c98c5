"""Experiments that compare trainings at matched FLOPs: ``heldout`` (MPT vs monolithic
REINFORCE), ``arms`` (MPT vs monolithic vs round-robin vs SFT only), ``credit_ablation`` (bucket brigade vs random-bid credit vs round-robin) and
``transfer`` (adapting an MPT swarm and a monolithic model to other tasks)."""

from __future__ import annotations

from pathlib import Path

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.experiments.context import ExperimentContext, Report
from swarm_runtime.experiments.report import metric, plot_curves, reward_at
from swarm_runtime.experiments.training import final_checkpoint


def _row(label: str, s: dict, equal_flops: float | None = None) -> dict:
    ev = s["final_eval"] or {}
    row = {"label": label, "held-out reward": metric(ev, "reward")}
    if "success_mean" in ev:
        row["success"] = metric(ev, "success")
    if s.get("sft_eval"):
        row["after SFT only"] = metric(s["sft_eval"], "reward")
    row["training FLOPs"] = f"{s['flops']:.3g}"
    row["RL updates"] = s["iterations"]
    if equal_flops is not None:
        r = reward_at(s["curve"], equal_flops)
        # one column name whatever the budget, so that tables over training seeds line the seeds up
        row["equal FLOPs"] = f"{equal_flops:.3g}"
        row["rollout reward at equal FLOPs"] = None if r is None else float(r)
    return row


def _finals(runs: dict[str, dict]) -> dict:
    return {
        k: (s["flops"], (s["final_eval"] or {}).get("reward_mean"), (s["final_eval"] or {}).get("reward_se", 0.0))
        for k, s in runs.items()
    }


def _matched_report(x: ExperimentContext, title: str, runs: dict[str, dict], plot: str, notes: list[str]) -> Report:
    equal = min(s["flops"] for s in runs.values())
    rows = [_row(k, s, equal) for k, s in runs.items()]
    path = plot_curves(
        {k: s["curve"] for k, s in runs.items()},
        x.run_dir / plot,
        f"{title}: {x.cfg.domain}/{x.cfg.task_name}",
        _finals(runs),
        equal,
    )
    ref = max(s["flops"] for s in runs.values())
    notes = notes + [
        f"{k} reached its iteration cap ({s['iterations']} updates, experiment.budget_factor x "
        f"experiment.iterations) at {s['flops']:.3g} FLOPs, before the budget of {ref:.3g}"
        for k, s in list(runs.items())[1:]
        if not s["stopped_at_budget"] and s["flops"] < 0.97 * ref
    ]
    notes = notes + [
        f"Equal-FLOPs reading: rollout reward averaged over the updates in the last quarter of "
        f"FLOPs up to {equal:.3g} (the smallest final training FLOPs of the runs); the held-out "
        "column is each run's final checkpoint."
    ]
    seed_rewards = {k: (s["final_eval"] or {}).get("seed_rewards", {}) for k, s in runs.items()}
    return Report(
        title,
        rows,
        plots=[path],
        notes=notes,
        data={"trainings": dict(runs), "equal_flops": equal, "seed_rewards": seed_rewards},
    )


def heldout(x: ExperimentContext) -> Report:
    """MPT vs monolithic REINFORCE at matched training FLOPs (reward-vs-FLOPs curves, held-out results)."""
    matches = list(dict.fromkeys(x.xcfg.monolithic_sft))
    x.plan(1 + len(matches))
    runs = {"MPT": x.swarm_summary()}
    for m in matches:
        # "monolithic" keeps the folder name of runs made before experiment.monolithic_sft existed
        key = "monolithic" if m == "compute" else f"monolithic-{m}"
        label = "monolithic REINFORCE" if matches == ["compute"] else f"monolithic REINFORCE (SFT matched {m})"
        runs[label] = x.train(key, ["algo=monolithic", f"algo.sft.match={m}"], budget=runs["MPT"]["flops"])
    notes = [
        "The monolithic model (one model the size of one agent) stops RL once its training FLOPs "
        "(SFT included) reach the MPT run's. Its SFT is matched to the swarm's in compute (examples x "
        "epochs, the swarm's bid examples included) or, with experiment.monolithic_sft=[data], in data "
        "(the same demos for the same epochs); see docs/guides/experiments.md."
    ]
    return _matched_report(x, "Held-out: MPT vs monolithic REINFORCE", runs, "heldout_reward_vs_flops.png", notes)


#: The round-robin baseline as ``credit_ablation`` and ``arms`` train it: agents act in turn, no bids, each agent's
#: REINFORCE on the team's reward-to-go from its turn.
ROUND_ROBIN = ["algo=mpt", "algo.coordinator=round_robin", "algo.bid_steps=0", "algo.credit=reward_to_go"]


def arms(x: ExperimentContext) -> Report:
    """MPT vs monolithic vs round-robin vs SFT only: the paper's central comparison, one command (any base)."""
    x.plan(3)
    mpt = x.swarm_summary()
    # algo=monolithic trains one full model: on a LoRA swarm (a pretrained base) it fine-tunes the whole base
    lora = (x.cfg.model.get("adapter") or "none") == "lora"
    mono = x.train("monolithic", ["algo=monolithic"] + (["model.adapter=none"] if lora else []), budget=mpt["flops"])
    rr = x.train("round_robin_rtg", ROUND_ROBIN, budget=mpt["flops"])
    notes = [
        "monolithic: one model doing every role (round-robin over one), trained to the MPT run's FLOPs"
        + (
            ", the whole base fine-tuned (algo=monolithic takes no adapters; the swarm trains LoRA adapters)"
            if lora
            else ""
        )
        + ". round-robin: agents act in turn, no bids; each agent's REINFORCE on the team's reward-to-go. "
        "SFT only: the 'after SFT only' column (experiment.sft_eval=true), each training's SFT checkpoint."
    ]
    runs = {"MPT": mpt, "monolithic REINFORCE": mono, "round-robin": rr}
    return _matched_report(x, "MPT vs monolithic vs round-robin vs SFT only", runs, "arms_reward_vs_flops.png", notes)


def credit_ablation(x: ExperimentContext) -> Report:
    """MPT vs random-bid credit vs round-robin training, curves against FLOPs."""
    x.plan(3)
    mpt = x.swarm_summary()
    rnd = x.train("random_bids", ["algo=mpt", "algo.credit=random_bids"], budget=mpt["flops"])
    # round-robin: trained as an independent-learner round-robin MARL baseline would be: each agent's
    # REINFORCE on the team's undiscounted reward-to-go from its turn (algo.credit=reward_to_go; the
    # per-agent mean credit is the baseline), not bucket brigade at bid 0, which would leave each actor
    # only its immediate reward (a myopic learner the paper does not describe)
    rr = x.train("round_robin_rtg", ROUND_ROBIN, budget=mpt["flops"])
    notes = [
        "random credit: bucket brigade with random levels in place of the winning bids; auction and bid "
        "learning unchanged. round-robin: agents act in turn, no bids, no bid steps; each agent's REINFORCE "
        "on the team's reward-to-go from its turn (independent learners on the shared return). Both stop at "
        "the MPT run's training FLOPs."
    ]
    return _matched_report(
        x,
        "Credit ablation",
        {"MPT (bucket brigade)": mpt, "random-bid credit": rnd, "round-robin": rr},
        "credit_reward_vs_flops.png",
        notes,
    )


def transfer(x: ExperimentContext) -> Report:
    """Continue training from this task's checkpoints on experiment.transfer_tasks, swarm vs monolithic."""
    tasks = [str(t) for t in x.xcfg.transfer_tasks or []]
    valid = x.domain.task_names()
    if not tasks:
        raise ConfigError(
            f"experiment.transfer_tasks is empty for {x.cfg.domain}/{x.cfg.task_name}; give the tasks to "
            f"adapt to, e.g. experiment.transfer_tasks=[{','.join(t for t in valid if t != x.cfg.task_name)}]"
            f" (tasks of {x.cfg.domain}: {', '.join(valid)})"
        )
    bad = [t for t in tasks if t not in valid]
    if bad:
        raise ConfigError(f"unknown transfer task(s) {bad} for domain {x.cfg.domain!r}; valid: {', '.join(valid)}")
    x.plan(2 + 2 * len(tasks))
    src = x.swarm_summary()
    src_mono = x.train("monolithic", ["algo=monolithic"], budget=src["flops"])
    n = int(x.xcfg.transfer_iterations)
    rows, curves, finals, data = [], {}, {}, {"source": {"MPT": src, "monolithic": src_mono}, "tasks": {}}
    for task in tasks:
        sw = x.train(
            f"{task}-mpt",
            ["algo=mpt", f"task={task}"],
            iterations=n,
            init_from=final_checkpoint(Path(src["run_dir"])) / "agents",
        )
        mo = x.train(
            f"{task}-monolithic",
            ["algo=monolithic", f"task={task}"],
            iterations=n,
            budget=sw["flops"],
            init_from=final_checkpoint(Path(src_mono["run_dir"])) / "agents",
        )
        data["tasks"][task] = {"MPT": sw, "monolithic": mo}
        for label, s in (("MPT swarm", sw), ("monolithic REINFORCE", mo)):
            row = _row(f"{task}: {label}", s)
            if s.get("sft_eval"):
                row["before adaptation"] = row.pop("after SFT only")
            row["adaptation FLOPs"] = row.pop("training FLOPs")
            rows.append(row)
            curves[f"{task}: {label}"] = s["curve"]
            finals[f"{task}: {label}"] = _finals({"r": s})["r"]
    path = plot_curves(
        curves, x.run_dir / "transfer_reward_vs_flops.png", f"Transfer from {x.cfg.task_name}: {x.cfg.domain}", finals
    )
    notes = [
        f"Sources trained on {x.cfg.task_name}: MPT ({src['flops']:.3g} FLOPs) and monolithic "
        f"({src_mono['flops']:.3g} FLOPs, matched). Adaptation: {n} MPT updates from the MPT source (no SFT, "
        "fresh optimizers); the monolithic adaptation stops at the swarm's adaptation FLOPs."
    ]
    return Report(f"Transfer from {x.cfg.task_name}", rows, plots=[path], notes=notes, data=data)
