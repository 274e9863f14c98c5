"""Run outputs: ``metrics.jsonl``, TensorBoard event files, PNG plots, result tables."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from loguru import logger


def write_json(path: Path, data) -> None:
    """Write ``data`` as JSON atomically (a temporary file renamed into place)."""
    from swarm_runtime.runs.runfiles import claim

    path = claim(Path(path))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=float))
    os.replace(tmp, path)


def parse_rows(path: Path, text: str) -> list[dict]:
    """The JSON rows of a ``metrics.jsonl`` text; a corrupted line is an error naming the file
    and the line (a cut last line, from a kill in the middle of a write, is skipped)."""
    from swarm_runtime.config.errors import ConfigError

    lines = text.split("\n")
    rows = []
    for i, ln in enumerate(lines):
        if not ln.strip():
            continue
        try:
            rows.append(json.loads(ln))
        except json.JSONDecodeError as exc:
            if i == len(lines) - 1:  # no newline after it: a row cut by a kill
                continue
            raise ConfigError(f"{path} line {i + 1} is not a JSON row ({exc.msg}); delete that line") from exc
    return rows


class MetricsWriter:
    """Appends one JSON line per update and mirrors scalars to TensorBoard. Each row carries its
    ``step``; on resume the run folder is first cut back to the rows its checkpoint covers
    (:func:`swarm_runtime.runs.folder.truncate_metrics`), so every row is written exactly once. TensorBoard
    events cannot be cut in place: on resume the new event file starts with ``purge_step`` (the
    step after ``truncate_after``), so TensorBoard hides the earlier files' events from that step
    on and shows each step once, as the resumed run wrote it."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, truncate_after: int | None = None):
        from swarm_runtime.runs.runfiles import check_link, claim

        self.path = claim(run_dir / "metrics.jsonl")
        check_link(run_dir, self.path)
        if truncate_after is not None and self.path.exists():
            # On resume, drop lines written after the checkpoint we continue from.
            keep = [r for r in parse_rows(self.path, self.path.read_text()) if r.get("step", -1) <= truncate_after]
            self.path.write_text("".join(json.dumps(r, default=float) + "\n" for r in keep))
        self.tb = None
        if tensorboard:
            check_link(run_dir, run_dir / "tb")
            try:
                from torch.utils.tensorboard import SummaryWriter

                purge = None if truncate_after is None else int(truncate_after) + 1
                self.tb = SummaryWriter(str(claim(run_dir / "tb")), purge_step=purge)
            except Exception as exc:  # tensorboard missing: keep going, say so once
                logger.warning("TensorBoard disabled: {}", exc)

    def log(self, step: int, metrics: dict) -> None:
        """Append one row; a value that is not a finite number (NaN: a metric with nothing to measure,
        such as the demo accuracy of a role without action demos) is written as ``null``, so every line
        is standard JSON, and is left out of TensorBoard."""
        row = {"step": step, **{k: finite_or_none(v) for k, v in metrics.items()}}
        # never through a link (a metrics.jsonl planted as a link to a user's file is not appended to)
        with os.fdopen(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644), "a") as f:
            f.write(json.dumps(row, default=float, allow_nan=False) + "\n")
        if self.tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def finite_or_none(v):
    """``v``, or None where it is a float (or a 0-d tensor / numpy number) that is NaN or infinite."""
    try:
        if not isinstance(v, (bool, int, str)) and v is not None and not math.isfinite(float(v)):
            return None
    except (TypeError, ValueError):
        pass
    return v


def read_metrics(run_dir: Path) -> list[dict]:
    """The rows of ``metrics.jsonl``, a ``null`` value (a metric that was not a finite number) read as NaN."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [{k: math.nan if v is None else v for k, v in r.items()} for r in parse_rows(path, path.read_text())]


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path) -> Path:
    """Lay out ``fig``, write it to the PNG ``path`` (creating its folder) and close it."""
    from swarm_runtime.runs.runfiles import claim

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    claim(path)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def plot_training(run_dir: Path, agent_names: list[str]) -> list[Path]:
    """reward_vs_flops.png (rollout reward against cumulative training FLOPs) and
    turn_share.png (each agent's share of turns over training)."""
    plt = pyplot()

    rows = [r for r in read_metrics(run_dir) if "charts/episode_reward" in r]
    if not rows:
        return []
    out = []
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["flops/total"] for r in rows], [r["charts/episode_reward"] for r in rows], marker=".")
    evals = [r for r in read_metrics(run_dir) if "eval/reward_mean" in r]
    for r in evals:
        ax.errorbar([r["flops/total"]], [r["eval/reward_mean"]], yerr=[r["eval/reward_se"]], fmt="s", color="k")
    ax.set_xlabel("cumulative training FLOPs")
    ax.set_ylabel("episode reward (train rollouts; squares: held-out)")
    ax.set_title(run_dir.name)
    ax.grid(alpha=0.3)
    out.append(save_figure(fig, run_dir / "reward_vs_flops.png"))
    fig, ax = plt.subplots(figsize=(6, 4))
    steps = [r["step"] for r in rows]
    shares = [[r.get(f"charts/turn_share_{a}", 0.0) for r in rows] for a in agent_names]
    ax.stackplot(steps, shares, labels=agent_names, alpha=0.85)
    ax.set_xlabel("RL update")
    ax.set_ylabel("share of turns")
    ax.set_ylim(0, 1)
    ax.legend(loc="upper right", fontsize=8)
    out.append(save_figure(fig, run_dir / "turn_share.png"))
    return out


def table_metrics(res: dict) -> list[str]:
    """The columns of a held-out table of ``res`` (a summary): the reward, the success, SPL and nDTW the domain
    reports, then the domain's own figures (its ``eval_figures``, listed under ``domain_metrics``)."""
    return (
        ["reward"] + [m for m in ("success", "spl", "ndtw") if f"{m}_mean" in res] + list(res.get("domain_metrics", ()))
    )


def format_table(rows: list[tuple[str, dict]], metrics: list[str]) -> str:
    """A markdown table of ``mean ± se`` for each named result."""
    head = "| checkpoint | " + " | ".join(metrics) + " |"
    sep = "|---|" + "---|" * len(metrics)
    lines = [head, sep]
    for name, res in rows:
        cells = []
        for m in metrics:
            mean, se = res.get(f"{m}_mean"), res.get(f"{m}_se")
            cells.append("n/a" if mean is None else f"{mean:.3g} ± {se:.2g}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
