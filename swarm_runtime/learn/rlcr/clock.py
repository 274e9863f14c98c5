"""The simulated wall clock: an event queue of agents, the ``T_max`` schedule and the latency penalty
(pure functions and one small class)."""

from __future__ import annotations

import heapq
import math


class EventQueue:
    """Agents keyed by the simulated second they are free next. Ties break by the order the
    agents were pushed (FIFO), so a run is deterministic; :meth:`pop_due` returns every agent free
    at the earliest time, the batch that goes to the model together."""

    def __init__(self):
        self._heap: list[tuple[float, int, str]] = []
        self._seq = 0

    def push(self, t: float, agent: str) -> None:
        if not math.isfinite(t):
            raise ValueError(f"event time must be finite, got {t}")
        heapq.heappush(self._heap, (float(t), self._seq, agent))
        self._seq += 1

    def peek(self) -> float | None:
        """The earliest event time, or ``None`` when the queue is empty."""
        return self._heap[0][0] if self._heap else None

    def pop_due(self) -> tuple[float, list[str]]:
        """``(t, agents)``: every agent free at the earliest time ``t``, in push order."""
        t = self._heap[0][0]
        out = []
        while self._heap and self._heap[0][0] == t:
            out.append(heapq.heappop(self._heap)[2])
        return t, out

    def drop(self, agent: str) -> None:
        """Remove ``agent``'s events (it was fired)."""
        self._heap = [e for e in self._heap if e[2] != agent]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)


def action_seconds(n_tokens: int, seconds_per_token: float, env_seconds: float = 0.0) -> float:
    """Simulated duration of one action: generation time plus the env's own time for it."""
    return n_tokens * seconds_per_token + env_seconds


def t_max_at(step: int, start: float, end: float, steps: int) -> float:
    """``T_max`` at training update ``step``: linear from ``start`` (update 0) to ``end`` (update
    ``steps`` and after), the seed's "2 h at the start, more than 5 h by step 200" shape."""
    if steps <= 0:
        return float(end)
    frac = min(1.0, max(0.0, step / steps))
    return float(start + (end - start) * frac)


def latency_penalized(r_task: float, beta: float, pass_rate: float, t: float, t_max: float) -> float:
    """``R = R_task - beta * mean_pass_rate(q) * T / T_max`` (seed: the explicit latency penalty)."""
    if beta == 0.0:
        return r_task
    return r_task - beta * pass_rate * min(t, t_max) / t_max
