"""``swarm experiment rlcr_teams``: the seed's comparison of three ways to spend inference compute, at
team sizes ``rlcr.teams`` (default 1, 2, 3, 4 and 6 for the "5-8" bucket), and its three signs of life.

For each team size k: one ``algo=rlcr`` training of a flat team of k (``trainings/rlcr-team<k>/``), then
on the held-out seeds, with that training's final policy:
- the communicating collective of k at ``T_max`` (the training's own held-out evaluation);
- a solo agent with the same output-token budget, working sequentially without a time limit or a cap
  on its turns (its budget is the collective's mean tokens per rollout): the return it reaches and how
  long it takes;
- best-of-k: k independent solo attempts at ``T_max``, the best one selected (by its return, an oracle
  selector: an upper bound on any real selector).
The seed's claims are checked from these numbers and reported whatever they show: larger teams do more
useful work relative to the environment's mean rollout as training goes on; communication rises; the
collective reaches comparable scores sooner than the solo agent with its token budget.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from swarm_runtime.evaluation.heldout import mean_se
from swarm_runtime.learn.rlcr.signs import _plt, plot_latency, team_bucket
from swarm_runtime.learn.rlcr.trainer import SHARED, evaluate_collective, loop_options, make_shared_policy
from swarm_runtime.runs import checkpoint as ckpt
from swarm_runtime.runs.outputs import read_metrics, save_figure


def _halves(values: list[float]) -> tuple[float, float]:
    """Second-half mean minus first-half mean, and its SE (two independent means)."""
    h = len(values) // 2
    if h < 1:
        return float("nan"), float("nan")
    (m1, s1), (m2, s2) = mean_se(values[:h]), mean_se(values[-h:])
    return m2 - m1, math.sqrt(s1**2 + s2**2)


def rlcr_teams(x):
    """RLCR: communicating collectives of 1-8 agents vs a solo agent with the same token budget and best-of-n."""
    from functools import partial

    from swarm_runtime.experiments.context import Report

    teams = [int(k) for k in x.cfg.rlcr.teams]
    x.plan(3 * len(teams))
    seeds = x.eval_seeds()
    runs = int(x.cfg.rlcr.eval_runs or x.cfg.eval.runs)
    t_max = float(x.cfg.rlcr.t_max.end)
    rows, curves, signs = [], {}, {}
    for k in teams:
        run_dir = Path(x.train(f"rlcr-team{k}", ["algo=rlcr", "rlcr.org=flat", f"rlcr.agents={k}"])["run_dir"])
        base = {
            **x.cell(f"baselines-team{k}", partial(_best_of_k, x, k, run_dir, seeds, runs, t_max)),
            **x.cell(f"solo-tokens-team{k}", partial(_solo_same_tokens, x, run_dir, seeds, runs)),
        }
        final = ckpt.load_state(_final(run_dir))["final_eval"]
        signs[k] = [r for r in read_metrics(run_dir) if "signs/useful_work" in r]
        rows.append(_team_row(k, final, base, signs[k]))
        coll, sb = final["collective"], base["solo_budget"]
        curves[f"team {k} at T_max"] = [tuple(p) for p in coll["curve"]]
        if k > 1:
            curves[f"solo, team {k}'s tokens"] = [tuple(p) for p in sb["curve"]]
    rel = _useful_work_rel(teams, signs)
    notes = [
        f"T_max = {t_max / 60:.0f} simulated minutes at evaluation; {x.xcfg.iterations} RLCR updates per team "
        f"size; held-out: {len(seeds)} seeds x {runs} runs (best-of-k: {runs} groups of k attempts per seed).",
        "best-of-k selects the best attempt by its return (an oracle selector, an upper bound on real selection).",
        *(_signs_note(k, rel[k], signs[k]) for k in teams),
    ]
    plots = [
        _plot_signs(x.run_dir / "rlcr_signs.png", teams, rel, signs),
        plot_latency(x.run_dir / "rlcr_latency.png", curves, "held-out anytime return vs simulated time"),
    ]
    return Report(
        "RLCR team sizes: collective vs solo with the same tokens vs best-of-k",
        rows=rows,
        plots=plots,
        notes=notes,
        data={
            "runs_per_seed": runs,
            "useful_work_rel": rel,
            "comm_intensity": {k: [r["signs/comm_intensity"] for r in signs[k]] for k in teams},
        },
    )


def _best_of_k(x, k: int, run_dir: Path, seeds, runs: int, t_max: float) -> dict:
    """Best-of-k at ``T_max``: ``runs * k`` solo attempts per seed with the team's final policy, each group of k
    scored by its best return (an oracle selector); the groups' mean per seed."""
    policy = make_shared_policy(x.ctx, _final(run_dir) / "agents" / SHARED)
    _, attempts = evaluate_collective(
        x.ctx, policy, loop_options(x.cfg, t_max, agents=1), seeds, runs * k, int(x.cfg.seed) + 37
    )
    best: dict[int, list[float]] = {}
    for r in attempts:  # ordered run-major: attempt j of every seed, j = 0 .. runs * k - 1
        best.setdefault(r.seed, []).append(r.progress)
    per_seed = []
    for vals in best.values():
        groups = [max(vals[j * k : (j + 1) * k]) for j in range(runs)]
        per_seed.append(sum(groups) / len(groups))
    bm, bse = mean_se(per_seed)
    return {"best_of_k": {"reward_mean": bm, "reward_se": bse}}


def _solo_same_tokens(x, run_dir: Path, seeds, runs: int) -> dict:
    """The solo agent with the collective's mean tokens per rollout, no time limit and no cap on
    its turns (the token budget is its only limit)."""
    policy = make_shared_policy(x.ctx, _final(run_dir) / "agents" / SHARED)
    collective = ckpt.load_state(_final(run_dir))["final_eval"]["collective"]
    budget = max(1, int(round(collective["tokens_mean"])))
    opts = replace(loop_options(x.cfg, math.inf, agents=1, token_budget=budget), max_turns_per_agent=10**9)
    res, _ = evaluate_collective(x.ctx, policy, opts, seeds, runs, int(x.cfg.seed) + 31)
    return {"budget_tokens": budget, "solo_budget": res}


def _team_row(k: int, final: dict, base: dict, signs: list[dict]) -> dict:
    """Team size ``k``'s row: the collective, the solo agent at ``T_max`` and with the same tokens, best-of-k, and
    how its message tokens per minute moved over training."""
    coll, sb = final["collective"], base["solo_budget"]
    solo = final.get("solo") or coll
    comm = [r["signs/comm_intensity"] for r in signs]
    return {
        "label": f"team {k}" + (" (solo)" if k == 1 else ""),
        "collective at T_max": (coll["reward_mean"], coll["reward_se"]),
        "its minutes": (coll["minutes_mean"], coll["minutes_se"]),
        "solo at T_max": (solo["reward_mean"], solo["reward_se"]),
        "solo, same tokens": (sb["reward_mean"], sb["reward_se"]),
        "its minutes ": (sb["minutes_mean"], sb["minutes_se"]),
        "best-of-k at T_max": (base["best_of_k"]["reward_mean"], base["best_of_k"]["reward_se"]),
        "msg tokens / min, first → last update": f"{comm[0]:.2f} → {comm[-1]:.2f}" if comm else "n/a",
    }


def _useful_work_rel(teams: list[int], signs: dict) -> dict[int, list[float]]:
    """Each team size's useful work relative to the environment's mean rollout (over all team sizes), per update."""
    n_up = min(len(v) for v in signs.values()) if signs else 0
    rel: dict[int, list[float]] = {k: [] for k in teams}
    for u in range(n_up):
        env_mean = sum(signs[k][u]["signs/useful_work"] for k in teams) / len(teams)
        for k in teams:
            rel[k].append(signs[k][u]["signs/useful_work"] / env_mean if env_mean > 0 else 0.0)
    return rel


def _signs_note(k: int, rel: list[float], signs: list[dict]) -> str:
    """Team size ``k``'s signs of life: useful work relative to the mean rollout and message intensity, first
    against second half of training."""
    if not rel:
        return f"team {k}: no updates"
    d, se = _halves(rel)
    dc, sec = _halves([r["signs/comm_intensity"] for r in signs])
    return (
        f"team {k} ({team_bucket(k)}): useful work / env mean rollout {rel[0]:.2f} → {rel[-1]:.2f} "
        f"(second-half minus first-half mean {d:+.3f} ± {se:.3f}); message tokens per simulated minute, "
        f"second-half minus first-half {dc:+.3f} ± {sec:.3f}"
    )


def _final(run_dir: Path) -> Path:
    from swarm_runtime.experiments.training import final_checkpoint

    return final_checkpoint(run_dir)


def _plot_signs(path: Path, teams, rel, signs) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for k in teams:
        if rel[k]:
            axes[0].plot(range(1, len(rel[k]) + 1), rel[k], marker=".", label=f"team {k}")
        axes[1].plot(
            [r["step"] for r in signs[k]], [r["signs/comm_intensity"] for r in signs[k]], marker=".", label=f"team {k}"
        )
    axes[0].axhline(1.0, color="gray", lw=0.8)
    axes[0].set_ylabel("useful work / env mean rollout")
    axes[1].set_ylabel("message tokens per simulated minute")
    for a in axes:
        a.set_xlabel("RL update")
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    return save_figure(fig, path)


#: ``swarm experiment rlcr_org``: arm label -> overrides of its RLCR training (``{beta}``: the penalty used).
ORG_ARMS = {
    "flat team of 3": ["rlcr.org=flat", "rlcr.agents=3", "rlcr.latency_penalty=0"],
    "CEO + up to 2 hires": ["rlcr.org=ceo", "rlcr.max_hires=2", "rlcr.expert_team=3", "rlcr.latency_penalty=0"],
    "flat team of 3, latency penalty": ["rlcr.org=flat", "rlcr.agents=3", "rlcr.latency_penalty={beta}"],
}


def rlcr_org(x):
    """RLCR: the CEO organisation and the latency penalty against a flat team of 3 (same budget each)."""
    from swarm_runtime.evaluation.heldout import paired_difference
    from swarm_runtime.experiments.context import Report

    beta = float(x.cfg.rlcr.latency_penalty) or 0.5
    x.plan(len(ORG_ARMS))
    rows, curves, finals = [], {}, {}
    for i, (label, extra) in enumerate(ORG_ARMS.items()):
        tr = x.train(f"rlcr-org{i}", ["algo=rlcr", *(e.format(beta=beta) for e in extra)])
        run_dir = Path(tr["run_dir"])
        final = ckpt.load_state(_final(run_dir))["final_eval"]["collective"]
        finals[label] = final
        metrics = [r for r in read_metrics(run_dir) if "charts/return" in r]
        last = metrics[-1] if metrics else {}
        d = paired_difference(final, finals["flat team of 3"]) if i else (float("nan"), float("nan"), 0)
        rows.append(
            {
                "label": label.replace("latency penalty", f"latency penalty beta={beta:g}"),
                "collective at T_max": (final["reward_mean"], final["reward_se"]),
                "minus flat, paired": (d[0], d[1]) if i else "—",
                "success": (final["success_mean"], final["success_se"]),
                "its minutes": (final["minutes_mean"], final["minutes_se"]),
                "message tokens": (final["message_tokens_mean"], final["message_tokens_se"]),
                "training, last update: team peak / hires / refused hires": (
                    f"{last.get('charts/team_peak', float('nan')):.2f} / {last.get('charts/hires', float('nan')):.2f} / "
                    f"{last.get('charts/refused_hires', float('nan')):.2f}"
                ),
            }
        )
        curves[label] = [tuple(p) for p in final["curve"]]
    seeds = x.eval_seeds()
    runs = int(x.cfg.rlcr.eval_runs or x.cfg.eval.runs)
    notes = [
        f"Each arm: its own SFT (scripted collective of 3: flat peers, or a CEO who hires 2) and "
        f"{x.xcfg.iterations} RLCR updates; held-out at T_max = {float(x.cfg.rlcr.t_max.end) / 60:.0f} simulated "
        f"minutes on {len(seeds)} seeds x {runs} runs; paired = mean ± SE over the seeds of the per-seed "
        "difference against the flat team (the return is the progress at T_max, without the penalty).",
        f"The latency penalty trains on R = progress - {beta:g} * reward_max * mean_pass_rate * T / T_max; evaluation "
        "reports the progress itself, so the arms are comparable.",
    ]
    plots = [plot_latency(x.run_dir / "rlcr_org_latency.png", curves, "held-out anytime return vs simulated time")]
    return Report(
        "RLCR organisation: flat team vs CEO with hires vs latency penalty",
        rows=rows,
        plots=plots,
        notes=notes,
        data={"beta": beta, "runs_per_seed": runs},
    )
