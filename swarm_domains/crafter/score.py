"""Crafter's score (Hafner 2021): the geometric mean of the per-achievement success rates, in percent."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence


def crafter_score(rates_percent: Sequence[float]) -> float:
    """``exp(mean(log(1 + rates))) - 1`` with each rate in percent (0-100): the score in percent."""
    if not rates_percent:
        raise ValueError("crafter_score needs at least one success rate")
    return math.exp(sum(math.log(1.0 + r) for r in rates_percent) / len(rates_percent)) - 1.0


def success_rates(unlocks: Sequence[Mapping[str, float]], achievements: Sequence[str]) -> dict[str, float]:
    """Per-achievement success rate in percent: the share of episodes (``unlocks``: each episode's 0/1 per
    achievement) that unlocked it."""
    n = len(unlocks)
    return {a: 100.0 * sum(float(u.get(a, 0.0)) for u in unlocks) / n for a in achievements}


def score_with_se(by_seed: Mapping[int, Sequence[Mapping[str, float]]], achievements: Sequence[str]) -> tuple:
    """The score over all episodes and its jackknife standard error over held-out seeds (leave one seed out;
    0 with one seed)."""
    every = [u for eps in by_seed.values() for u in eps]
    score = crafter_score(list(success_rates(every, achievements).values()))
    seeds = list(by_seed)
    if len(seeds) < 2:
        return score, 0.0
    loo = []
    for s in seeds:
        rest = [u for t in seeds if t != s for u in by_seed[t]]
        loo.append(crafter_score(list(success_rates(rest, achievements).values())))
    mean = sum(loo) / len(loo)
    n = len(seeds)
    return score, math.sqrt((n - 1) / n * sum((x - mean) ** 2 for x in loo))


def episodes_by_seed(episodes: Sequence) -> dict[int, list[dict]]:
    """Each held-out seed's episodes' per-achievement unlocks (the ``ach_<name>`` metrics, keyed by name)."""
    out: dict[int, list[dict]] = defaultdict(list)
    for ep in episodes:
        out[ep.seed].append({k[4:]: v for k, v in ep.metrics.items() if k.startswith("ach_")})
    return dict(out)
