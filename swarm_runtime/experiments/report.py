"""Experiment outputs: markdown tables, ``results.json``, and the curve / bar plots."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

from swarm_runtime.runs.outputs import save_figure


def fmt(value) -> str:
    """``(mean, se)`` -> ``mean ± se``; floats to 3 significant digits; FLOPs in e-notation."""
    if value is None:
        return "n/a"
    if isinstance(value, (tuple, list)) and len(value) == 2:
        m, se = value
        return "n/a" if m is None else f"{float(m):.3g} ± {float(se):.2g}"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def markdown_table(rows: Sequence[dict], first: str = "label") -> str:
    """Rows of dicts (same keys, ``first`` first) as a markdown table."""
    if not rows:
        return ""
    cols = [first] + [k for k in rows[0] if k != first]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def metric(summary: dict, name: str) -> tuple[float, float] | None:
    """``(mean, se)`` of ``name`` from an :func:`swarm_runtime.evaluation.heldout.summarize` dict."""
    if f"{name}_mean" not in summary:
        return None
    return summary[f"{name}_mean"], summary[f"{name}_se"]


def reward_at(curve: Sequence[Sequence[float]], flops: float, window: float = 0.25) -> float | None:
    """Mean rollout reward of the updates whose cumulative FLOPs lie in ``((1 - window) F, F]``
    (the curve read at equal FLOPs ``F``); the last update before ``F`` if none lies there."""
    pts = [(f, r) for f, r in curve if f <= flops * (1 + 1e-9)]
    if not pts:
        return None
    near = [r for f, r in pts if f > (1 - window) * flops]
    return sum(near) / len(near) if near else pts[-1][1]


def _plt():
    from swarm_runtime.runs.outputs import pyplot

    return pyplot()


def plot_curves(
    curves: dict[str, Sequence[Sequence[float]]],
    path: Path,
    title: str,
    finals: dict[str, tuple] | None = None,
    mark_flops: float | None = None,
) -> Path:
    """Rollout reward against cumulative training FLOPs, one line per run; ``finals``: label ->
    (flops, held-out mean, se) drawn as squares with error bars; ``mark_flops``: the equal-FLOPs line."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, (label, pts) in enumerate(curves.items()):
        color = f"C{i}"
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=label, color=color)
        if finals and label in finals and finals[label][1] is not None:
            f, m, se = finals[label]
            ax.errorbar([f], [m], yerr=[se], fmt="s", color=color, capsize=3)
    if mark_flops:
        ax.axvline(mark_flops, color="k", ls=":", lw=1, label="equal FLOPs")
    ax.set_xlabel("cumulative training FLOPs")
    ax.set_ylabel("episode reward (lines: rollouts; squares: held-out)")
    ax.set_title(textwrap.fill(title, width=int(fig.get_figwidth() * 13)), fontsize=10)  # long titles wrap, never clip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_bars(
    labels: Sequence[str],
    values: Sequence[tuple[float, float]],
    path: Path,
    title: str,
    ylabel: str = "held-out reward",
) -> Path:
    """One bar per condition with its standard error."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(4.5, 1.3 * len(labels)), 4))
    ax.bar(
        range(len(labels)),
        [v[0] for v in values],
        yerr=[v[1] for v in values],
        capsize=4,
        color=[f"C{i}" for i in range(len(labels))],
    )
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=15, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(textwrap.fill(title, width=int(fig.get_figwidth() * 13)), fontsize=10)  # long titles wrap, never clip
    ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, path)
