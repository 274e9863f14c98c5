"""The per-achievement success plot of docs/results.md (Crafter section) from a ``swarm experiment heldout
domain=crafter`` folder: each arm's held-out success rate per achievement, mean over training seeds (bars) with the
standard error over them. ``python -m swarm_domains.crafter.plot EXPERIMENT_DIR OUT.png``."""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path


def arm_rates(folder: Path) -> dict[str, list[dict[str, float]]]:
    """Per arm (``SFT only``, the MPT and monolithic trainings' final rows), one dict achievement -> rate (percent)
    per training seed, read from each training's ``eval.json``."""
    out: dict[str, list[dict[str, float]]] = defaultdict(list)
    for ev in sorted(folder.glob("seed-*/trainings/*/eval.json")):
        results = json.loads(ev.read_text())["results"]
        for row, summary in results.items():
            name = row if row != "SFT only" or ev.parent.name == "mpt" else None  # one SFT row: the swarm's
            if name is None:
                continue
            label = f"{ev.parent.name} ({row})" if row != "SFT only" else "SFT only (swarm)"
            rates = {
                k[4:-5]: 100 * float(v) for k, v in summary.items() if k.startswith("ach_") and k.endswith("_mean")
            }
            out[label].append(rates)
    return dict(out)


def arm_figures(folder: Path) -> dict[str, dict[str, list[float]]]:
    """Per arm, each training seed's held-out reward, Crafter score, Crafter return and success (``eval.json``)."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for ev in sorted(folder.glob("seed-*/trainings/*/eval.json")):
        for row, summary in json.loads(ev.read_text())["results"].items():
            if row == "SFT only" and ev.parent.name != "mpt":
                continue
            label = f"{ev.parent.name} ({row})" if row != "SFT only" else "SFT only (swarm)"
            for key in ("reward", "crafter_score", "crafter_return", "success"):
                out[label][key].append(float(summary.get(f"{key}_mean", float("nan"))))
    return out


def table(folder: Path) -> str:
    """Markdown: each arm's figures, mean over training seeds ± the SE over them."""
    keys = ("reward", "crafter_score", "crafter_return", "success")
    lines = ["| arm | " + " | ".join(keys) + " | training seeds |", "|---|" + "---|" * (len(keys) + 1)]
    for arm, figs in arm_figures(folder).items():
        cells = [f"{m:.2f} ± {se:.2f}" for m, se in (mean_se(figs[k]) for k in keys)]
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {len(figs['reward'])} |")
    return "\n".join(lines)


def mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    m = sum(values) / n
    return m, (math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1) / n) if n > 1 else 0.0)


def plot(folder: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = arm_rates(folder)
    names = list(next(iter(arms.values()))[0])
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / max(1, len(arms))
    for i, (arm, seeds) in enumerate(arms.items()):
        stats = [mean_se([s.get(a, 0.0) for s in seeds]) for a in names]
        xs = [j + (i - (len(arms) - 1) / 2) * width for j in range(len(names))]
        ax.bar(xs, [m for m, _ in stats], width, yerr=[se for _, se in stats], label=f"{arm}, {len(seeds)} seeds")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("held-out success rate (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    ax.set_title(f"Crafter, per-achievement success ({folder.name})")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    plot(Path(sys.argv[1]), Path(sys.argv[2]))
    print(table(Path(sys.argv[1])))
