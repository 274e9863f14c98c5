"""Signs of life (seed: "reward curves alone cannot tell whether the collective learned to use parallel
inference compute"): useful work relative to the environment's mean rollout per team size, communication
intensity, return against simulated time, and the performance-latency curve of the collective against
a solo agent. Pure summaries of rollouts, and the PNG plots."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from swarm_runtime.evaluation.heldout import mean_se
from swarm_runtime.runs.outputs import save_figure


def team_bucket(n: int) -> str:
    """The seed's team-size buckets: ``1`` (solo), ``2``, ``3``, ``4``, ``5-8`` (and more)."""
    return str(n) if n <= 4 else "5-8"


def useful_work_relative(rollouts, env_mean: float) -> dict[str, float]:
    """Mean useful work (tokens of env-acting turns) of the rollouts of each team-size bucket, divided
    by ``env_mean``, the environment's mean rollout."""
    by: dict[str, list[int]] = {}
    for r in rollouts:
        by.setdefault(team_bucket(r.team_peak), []).append(r.env_tokens)
    return {b: (sum(v) / len(v)) / env_mean if env_mean > 0 else 0.0 for b, v in by.items()}


def comm_intensity(rollouts) -> float:
    """Message tokens per simulated minute, over the rollouts' summed duration."""
    minutes = sum(r.duration for r in rollouts) / 60.0
    return sum(r.message_tokens for r in rollouts) / minutes if minutes > 0 else 0.0


def rollout_metrics(rollouts) -> dict[str, float]:
    """What every update logs about its rollouts (``charts/...``, ``signs/...``)."""
    n = max(1, len(rollouts))
    m = {
        "charts/return": sum(r.ret for r in rollouts) / n,
        "charts/progress": sum(r.progress for r in rollouts) / n,
        "charts/sim_minutes": sum(r.duration for r in rollouts) / n / 60.0,
        "charts/success": sum(r.success for r in rollouts) / n,
        "charts/turns": sum(len(r.turns) for r in rollouts) / n,
        "charts/team_peak": sum(r.team_peak for r in rollouts) / n,
        "signs/useful_work": sum(r.env_tokens for r in rollouts) / n,
        "signs/message_tokens": sum(r.message_tokens for r in rollouts) / n,
        "signs/comm_intensity": comm_intensity(rollouts),
    }
    for key in ("invalid_actions", "unparsed", "bad_messages", "refused_hires", "hires", "fires", "messages"):
        m[f"charts/{key}"] = sum(r.counts[key] for r in rollouts) / n
    done = [r.duration for r in rollouts if r.done]
    if done:
        m["charts/minutes_to_done"] = sum(done) / len(done) / 60.0
    return m


def summarize_rollouts(rollouts, runs: int) -> dict:
    """Held-out summary: each seed's runs averaged first, then mean ± SE over seeds (as
    :func:`swarm_runtime.evaluation.heldout.summarize`), for the return, success, minutes, useful work and
    message tokens; plus the mean anytime-return curve on a minute grid."""
    per_seed: dict[int, list] = {}
    for r in rollouts:
        per_seed.setdefault(r.seed, []).append(r)
    out: dict = {"seeds": len(per_seed), "runs": runs, "episodes": len(rollouts)}
    fields = {
        "reward": lambda r: r.progress,
        "success": lambda r: r.success,
        "minutes": lambda r: r.duration / 60.0,
        "useful_work": lambda r: float(r.env_tokens),
        "message_tokens": lambda r: float(r.message_tokens),
        "tokens": lambda r: float(r.tokens),
        "team_peak": lambda r: float(r.team_peak),
    }
    for name, f in fields.items():
        vals = [sum(f(r) for r in rs) / len(rs) for rs in per_seed.values()]
        out[f"{name}_mean"], out[f"{name}_se"] = mean_se(vals)
    out["seed_rewards"] = {str(s): sum(r.progress for r in rs) / len(rs) for s, rs in per_seed.items()}
    out["comm_intensity"] = comm_intensity(rollouts)
    t_end = max((r.t_max if r.t_max != float("inf") else r.duration) for r in rollouts) if rollouts else 0.0
    grid = [t_end * i / 20 for i in range(21)]
    out["curve"] = [(t / 60.0, sum(r.progress_at(t) for r in rollouts) / max(1, len(rollouts))) for t in grid]
    return out


def _plt():
    from swarm_runtime.runs.outputs import pyplot

    return pyplot()


def plot_signs(run_dir: Path, rows: Sequence[dict]) -> Path | None:
    """``signs_of_life.png``: return (and T_max), useful work relative to the env's mean rollout per
    team size, communication intensity, each against the RL update; return against simulated time."""
    rows = [r for r in rows if "charts/return" in r]
    if not rows:
        return None
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    steps = [r["step"] for r in rows]
    ax = axes[0][0]
    ax.plot(steps, [r["charts/return"] for r in rows], marker=".", label="return at stop")
    ax.set_xlabel("RL update")
    ax.set_ylabel("collective return (train rollouts)")
    ax2 = ax.twinx()
    ax2.plot(steps, [r["charts/t_max"] / 60 for r in rows], color="gray", ls="--", label="T_max")
    ax2.set_ylabel("T_max (simulated minutes)", color="gray")
    ax = axes[0][1]
    for b in ("1", "2", "3", "4", "5-8"):
        key = f"signs/useful_work_rel_team_{b}"
        pts = [(r["step"], r[key]) for r in rows if key in r]
        if pts:
            ax.plot(*zip(*pts), marker=".", label=f"team {b}")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("RL update")
    ax.set_ylabel("useful work / env mean rollout")
    ax.legend(fontsize=8)
    ax = axes[1][0]
    ax.plot(steps, [r["signs/comm_intensity"] for r in rows], marker=".")
    ax.set_xlabel("RL update")
    ax.set_ylabel("message tokens per simulated minute")
    ax = axes[1][1]
    sc = ax.scatter(
        [r["charts/sim_minutes"] for r in rows], [r["charts/return"] for r in rows], c=steps, cmap="viridis"
    )
    fig.colorbar(sc, ax=ax, label="RL update")
    ax.set_xlabel("mean simulated minutes per rollout")
    ax.set_ylabel("collective return")
    for a in axes.flat:
        a.grid(alpha=0.3)
    fig.suptitle(f"signs of life: {run_dir.name}")
    return save_figure(fig, run_dir / "signs_of_life.png")


def plot_latency(path: Path, curves: dict[str, Sequence[Sequence[float]]], title: str) -> Path:
    """Performance-latency curves: mean anytime return against simulated minutes, one line per label."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, pts in curves.items():
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker=".", label=label, ls="--" if "SFT" in label else "-")
    ax.set_xlabel("simulated minutes")
    ax.set_ylabel("mean return so far (held-out)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
