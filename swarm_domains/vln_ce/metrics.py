"""VLN-CE metrics and the shaped reward, as pure functions.

Definitions follow VLN-CE (Krantz et al. 2020) / habitat-lab:

- ``success``: the agent called stop within ``success_distance`` (3 m) of the goal.
- ``spl``: success * l / max(p, l), with l the shortest-path (geodesic) distance
  from start to goal and p the length of the path the agent walked.
- ``ndtw``: exp(-DTW(P, R) / (|R| * d_th)) with P the agent's positions, R the
  reference path's points, Euclidean point distance and d_th = success_distance
  (Ilharco et al. 2019, "Effective and General Evaluation for Instruction
  Conditioned Navigation using Dynamic Time Warping").
- ``oracle_success``: some position on the path was within ``success_distance``.
- ``distance_to_goal`` (geodesic) and ``path_length`` (metres walked).

Reward (documented in docs/domains/vln_ce.md): a potential-based progress term
plus a success bonus. With d0 the start distance and d the current geodesic
distance, the potential is ``phi(d) = 1 - min(d, 2 d0) / d0`` (in [-1, 1],
phi(d0) = 0); each step earns ``phi(d_after) - phi(d_before)``, plus
``success_bonus`` on a successful stop. The episode reward therefore equals
``phi(d_final) + success_bonus * success``, bounded by [-1, 1 + success_bonus].
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Point = tuple[float, float]

SUCCESS_DISTANCE = 3.0  #: metres (VLN-CE ``SUCCESS_DISTANCE``)


def dist(a: Sequence[float], b: Sequence[float]) -> float:
    """Euclidean distance of two points (2-D or 3-D)."""
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))


def path_length(path: Sequence[Sequence[float]]) -> float:
    """Total length of a polyline."""
    return sum(dist(path[i], path[i + 1]) for i in range(len(path) - 1))


def is_success(stopped: bool, distance_to_goal: float, success_distance: float = SUCCESS_DISTANCE) -> bool:
    """VLN-CE success: stop was called within ``success_distance`` of the goal."""
    return bool(stopped) and distance_to_goal <= success_distance


def spl(success: bool, shortest: float, walked: float) -> float:
    """Success weighted by (normalised inverse) path length."""
    if not success:
        return 0.0
    return shortest / max(walked, shortest, 1e-9)


def dtw(path: Sequence[Sequence[float]], ref: Sequence[Sequence[float]]) -> float:
    """Exact dynamic-time-warping distance with Euclidean point cost."""
    n, m = len(path), len(ref)
    if n == 0 or m == 0:
        return math.inf
    inf = math.inf
    prev = [inf] * (m + 1)
    prev[0] = 0.0
    for i in range(1, n + 1):
        cur = [inf] * (m + 1)
        p = path[i - 1]
        for j in range(1, m + 1):
            best = min(prev[j], cur[j - 1], prev[j - 1])
            cur[j] = dist(p, ref[j - 1]) + best
        prev = cur
    return prev[m]


def ndtw(
    path: Sequence[Sequence[float]], ref: Sequence[Sequence[float]], success_distance: float = SUCCESS_DISTANCE
) -> float:
    """Normalised DTW in (0, 1]: exp(-DTW / (|ref| * success_distance))."""
    if not path or not ref:
        return 0.0
    return math.exp(-dtw(path, ref) / (len(ref) * success_distance))


def dedup(path: Sequence[Point]) -> list[Point]:
    """Drop consecutive repeated positions (VLN-CE records a location only when it changes)."""
    out: list[Point] = []
    for p in path:
        if not out or dist(out[-1], p) > 1e-9:
            out.append(p)
    return out


def resample(polyline: Sequence[Sequence[float]], step: float = 0.25) -> list[tuple[float, ...]]:
    """Points every ``step`` metres along ``polyline`` (both ends included; any dimension),
    like VLN-CE's dense ground-truth locations."""
    if not polyline:
        return []
    out = [tuple(polyline[0])]
    carry = 0.0
    for a, b in zip(polyline, polyline[1:]):
        seg = dist(a, b)
        if seg <= 1e-12:
            continue
        t = step - carry
        while t <= seg + 1e-9:
            out.append(tuple(x + (y - x) * t / seg for x, y in zip(a, b)))
            t += step
        carry = seg - (t - step)
    if dist(out[-1], polyline[-1]) > 1e-6:
        out.append(tuple(polyline[-1]))
    return out


def potential(d: float, d0: float) -> float:
    """Progress potential phi(d) = 1 - min(d, 2 d0) / d0, in [-1, 1]."""
    return 1.0 - min(d, 2.0 * d0) / d0


def step_reward(d_before: float, d_after: float, d0: float, success_now: bool, success_bonus: float) -> float:
    """Shaped reward of one step: progress in potential plus the bonus on a successful stop."""
    return potential(d_after, d0) - potential(d_before, d0) + (success_bonus if success_now else 0.0)


def reward_bounds(success_bonus: float, invalid_penalty: float = 0.0, max_decisions: int = 0) -> tuple[float, float]:
    """The bounds of an episode's total reward under :func:`step_reward`, with at most
    ``max_decisions`` invalid actions charged ``invalid_penalty`` each."""
    return -1.0 - max_decisions * invalid_penalty, 1.0 + success_bonus
