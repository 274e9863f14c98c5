"""The turn engine (docs/engine.md): one driver for every way the swarm takes turns.

How turns are taken is a **strategy**: a generator that plays its episodes and, whenever it needs
the models, yields a :class:`Batch` of requests (all the bids of a turn across every live episode,
or all the actions) and is sent back the answers in the rows' order. The strategy never calls a
model, so the same strategy runs over any sampler (in process, an OpenAI-compatible server, vLLM)
and any driver: :meth:`TurnEngine.run` answers each batch with one sampler call;
:meth:`TurnEngine.arun` awaits an async answerer (``swarm serve``'s gateway asking its agents over HTTP:
:class:`swarm_runtime.serve.engine.TurnAnswerer`).

Strategies: the auction (:class:`swarm_runtime.episode.AuctionTurns`: every turn all present agents
bid, the coordinator picks, the winner acts; training rollouts, counterfactual branches and held-out
evaluation), the served auction (:class:`swarm_runtime.serve.turns.ServedTurns`: one turn of one
episode of ``swarm serve``, the agents that are up bid, a failed winner's bid is withdrawn and the
coordinator picks again) and the wall clock (:class:`swarm_runtime.rlcr.loop.ClockTurns`: every agent
acts as soon as its last action completed, against simulated time; ``algo=rlcr``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any

from swarm_runtime.rollout.base import Row, Sampler

#: The kinds of request a strategy yields.
KINDS = ("bid", "act")


@dataclass(frozen=True)
class Batch:
    """One batch of requests a strategy needs answered: ``kind`` ``bid`` or ``act``, and its rows."""

    kind: str
    rows: list[Row]

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"batch kind {self.kind!r} is not one of: {', '.join(KINDS)}")


#: A strategy's rounds: yields batches, is sent their answers, returns its result.
Rounds = Generator[Batch, list, Any]


class TurnEngine:
    """Drives a strategy's rounds over a sampler (:meth:`run`) or an async answerer (:meth:`arun`; no
    sampler needed)."""

    def __init__(self, sampler: Sampler | None = None):
        self.sampler = sampler
        self.batches = 0  #: batches answered (model calls, per kind and sampler)
        self.rows = 0  #: rows answered

    def _counted(self, batch: Batch, answers) -> list:
        """``answers`` to ``batch`` as a list, counted; one answer per row, or an error naming both counts."""
        answers = list(answers)
        if len(answers) != len(batch.rows):
            raise RuntimeError(f"the answerer gave {len(answers)} answers to {len(batch.rows)} {batch.kind} rows")
        self.batches += 1
        self.rows += len(batch.rows)
        return answers

    def answer(self, batch: Batch) -> list:
        """The sampler's answers to one batch (no call for an empty one)."""
        if not batch.rows:
            return []
        return self._counted(
            batch, self.sampler.bid(batch.rows) if batch.kind == "bid" else self.sampler.act(batch.rows)
        )

    def run(self, rounds: Rounds):
        """Run ``rounds`` to the end and return what the strategy returns."""
        answers = None
        while True:
            try:
                batch = rounds.send(answers)
            except StopIteration as stop:
                return stop.value
            answers = self.answer(batch)

    async def arun(self, rounds: Rounds, answer: Callable[[Batch], Awaitable[list]]):
        """:meth:`run` with an async ``answer(batch)`` (rows it could not answer come back as None),
        counted as :meth:`answer` counts."""
        answers = None
        while True:
            try:
                batch = rounds.send(answers)
            except StopIteration as stop:
                return stop.value
            answers = self._counted(batch, await answer(batch)) if batch.rows else []
