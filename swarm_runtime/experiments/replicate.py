"""Replication over training seeds (``experiment.train_seeds``): an experiment runs once per
training seed (every arm trained and evaluated with that run seed, in ``seed-<s>/``), and
:func:`combine` turns the per-seed reports into one.

Statistics (pure functions, docs/guides/experiments.md):

- a row's value is the **mean over training seeds** of the per-seed values; its standard error
  is the standard deviation of the per-seed means over ``sqrt(S)`` (S >= 2 seeds). Each per-seed
  mean already carries its held-out sampling noise, so this SE covers both the training-seed
  spread and the held-out sampling; with one seed it is the held-out SE alone (and says so);
- **paired differences** between arms that share training seeds: ``d_s = m_arm,s - m_ref,s`` per
  seed, mean ± ``sd(d_s) / sqrt(S)``. With one seed the pairing is over the shared held-out
  seeds instead (when the report carries per-seed rewards), marked as such.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from swarm_runtime.evaluation.heldout import mean_se
from swarm_runtime.experiments.context import Report
from swarm_runtime.experiments.report import markdown_table, plot_bars

#: The column a paired difference is taken on (the first ``(mean, se)`` column when absent).
MAIN_COLUMN = "held-out reward"


def seed_notes(by_seed: dict) -> list[str]:
    """The notes of each training seed's report, once: a note every seed wrote as is, one that only
    some seeds wrote (a per-seed measurement) prefixed with its seed, so readers can tell them apart."""
    seeds = list(by_seed)
    out = []
    for note in dict.fromkeys(n for notes in by_seed.values() for n in notes):
        having = [s for s in seeds if note in by_seed[s]]
        out.append(
            note
            if len(having) == len(seeds) or len(seeds) == 1
            else f"training seed{'s' if len(having) > 1 else ''} {', '.join(map(str, having))}: {note}"
        )
    return out


def _pair(v) -> bool:
    return isinstance(v, (tuple, list)) and len(v) == 2 and (v[0] is None or isinstance(v[0], (int, float)))


def across_seeds(values: Sequence) -> tuple[float, float] | float | str | None:
    """One cell over training seeds: ``(mean, se)`` pairs -> mean of means ± SE over seeds (one
    seed: its own SE); numbers -> their mean; anything else -> the value if all seeds agree, else
    the values joined by ``; `` (per seed, in order)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    if all(_pair(v) for v in vals):
        means = [float(v[0]) for v in vals if v[0] is not None and math.isfinite(float(v[0]))]
        if not means:
            return None
        if len(means) == 1:
            return means[0], float(vals[0][1])
        return mean_se(means)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        return sum(float(v) for v in vals) / len(vals)
    texts = [str(v) for v in vals]
    return texts[0] if len(set(texts)) == 1 else "; ".join(texts)  # no "|": it would split a table cell


def paired_over_seeds(arm: Sequence[float], ref: Sequence[float]) -> tuple[float, float, int]:
    """Mean ± SE over training seeds of ``arm - ref`` (the same seeds, in the same order)."""
    d = [float(a) - float(b) for a, b in zip(arm, ref)]
    m, se = mean_se(d)
    return m, se, len(d)


def main_column(rows: Sequence[dict]) -> str | None:
    """:data:`MAIN_COLUMN` if the rows have it, else their first ``(mean, se)`` column."""
    if not rows:
        return None
    if MAIN_COLUMN in rows[0]:
        return MAIN_COLUMN
    return next((k for k, v in rows[0].items() if _pair(v)), None)


def combine(reports: dict[int, Report], run_dir: Path) -> Report:
    """One report from the per-seed ``reports`` (training seed -> report, same experiment)."""
    seeds = list(reports)
    first = reports[seeds[0]]
    labels = list(dict.fromkeys(r["label"] for rep in reports.values() for r in rep.rows))
    by_seed = {s: {r["label"]: r for r in rep.rows} for s, rep in reports.items()}
    cols = list(dict.fromkeys(k for rep in reports.values() for r in rep.rows for k in r if k != "label"))
    rows = []
    for label in labels:
        present = [s for s in seeds if label in by_seed[s]]
        row = {"label": label}
        for c in cols:
            row[c] = across_seeds([by_seed[s][label].get(c) for s in present])
        row["training seeds"] = len(present)
        rows.append(row)
    col = main_column(first.rows)
    tables, paired = {}, {}
    if col is not None:
        per_seed = [{"label": lb, **{f"seed {s}": by_seed[s].get(lb, {}).get(col) for s in seeds}} for lb in labels]
        tables[f"Per training seed: {col}"] = markdown_table(per_seed)
        paired, prow = paired_arms(reports, by_seed, labels, col)
        if prow:
            tables[f"Paired differences against {labels[0]}"] = markdown_table(prow)
    plots = [p for rep in reports.values() for p in rep.plots]
    if col is not None and all(r.get(col) is not None for r in rows):
        plots.insert(
            0,
            plot_bars(
                labels,
                [r[col] for r in rows],
                run_dir / "train_seeds.png",
                f"{first.title}: mean over training seeds {seeds}",
                ylabel=col,
            ),
        )
    for title in dict.fromkeys(t for rep in reports.values() for t in rep.tables):
        for s in seeds:
            if title in reports[s].tables:
                tables[f"{title} (training seed {s})"] = reports[s].tables[title]
    data = {
        "train_seeds": seeds,
        "paired": paired,
        "main_column": col,
        "per_seed": {str(s): {"rows": rep.rows, **rep.data} for s, rep in reports.items()},
    }
    if "runs_per_seed" in first.data:  # an experiment whose evaluation is not eval.runs runs per held-out seed
        data["runs_per_seed"] = first.data["runs_per_seed"]
    notes = [_se_note(seeds)] + seed_notes({s: rep.notes for s, rep in reports.items()})
    return Report(first.title, rows, tables=tables, plots=plots, data=data, notes=notes)


def paired_arms(reports: dict[int, Report], by_seed: dict, labels: list[str], col: str) -> tuple[dict, list[dict]]:
    """Each arm against the first (``labels[0]``) on column ``col``: over the training seeds both have (two or
    more), else over their shared held-out seeds (one training seed), else unpaired. The differences (label ->
    mean, se, n, how, per seed) and their table's rows."""
    ref, seeds = labels[0], list(reports)
    paired, prow = {}, []
    for lb in labels[1:]:
        shared = [s for s in seeds if _has(by_seed[s], lb, col) and _has(by_seed[s], ref, col)]
        if len(shared) >= 2:
            m, se, n = paired_over_seeds(
                [by_seed[s][lb][col][0] for s in shared], [by_seed[s][ref][col][0] for s in shared]
            )
            how = f"over {n} training seeds"
        elif len(shared) == 1:
            m, se, n = _paired_heldout(reports[shared[0]], lb, ref)
            how = f"over {n} shared held-out seeds (one training seed)" if n else "unpaired (one training seed)"
            if not n:
                a, b = by_seed[shared[0]][lb][col], by_seed[shared[0]][ref][col]
                m, se = float(a[0]) - float(b[0]), math.hypot(float(a[1]), float(b[1]))
        else:
            continue
        paired[lb] = {
            "mean": m,
            "se": se,
            "n": n,
            "how": how,
            "per_seed": {str(s): by_seed[s][lb][col][0] - by_seed[s][ref][col][0] for s in shared},
        }
        prow.append(
            {
                "label": f"{lb} - {ref}",
                f"{col} difference": (m, se),
                "paired": how,
                "per training seed": " / ".join(f"{paired[lb]['per_seed'][str(s)]:+.3g}" for s in shared),
            }
        )
    return paired, prow


def _se_note(seeds: list[int]) -> str:
    """What a combined row's standard error covers."""
    if len(seeds) > 1:
        return (
            f"Each row: mean over training seeds {seeds} ± standard error over those seeds (sd of the per-seed "
            "means / sqrt(S)), which includes training-seed spread and held-out sampling; per-seed values below."
        )
    return f"One training seed ({seeds[0]}): standard errors cover held-out sampling only, not training-seed spread."


def _has(rows: dict, label: str, col: str) -> bool:
    v = rows.get(label, {}).get(col)
    return _pair(v) and v[0] is not None


def _paired_heldout(rep: Report, label: str, ref: str) -> tuple[float, float, int]:
    """Paired difference over the shared held-out seeds, from ``rep.data['seed_rewards']`` (label ->
    {eval seed: reward}); ``(nan, nan, 0)`` when the report has none."""
    sr = rep.data.get("seed_rewards") or {}
    a, b = sr.get(label) or {}, sr.get(ref) or {}
    shared = [k for k in a if k in b]
    if not shared:
        return float("nan"), float("nan"), 0
    m, se = mean_se([a[k] - b[k] for k in shared])
    return m, se, len(shared)
