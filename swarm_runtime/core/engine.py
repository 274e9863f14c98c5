"""The turn engine (docs/reference/engine.md): one driver for every way the swarm takes turns.

How turns are taken is a **strategy**: a generator that plays its episodes and, whenever it needs
something from outside, yields a **request** and is sent back the answers in the request's rows' order:

- :class:`Batch` ``bid`` / ``act``: prompts for the models (all the bids of a turn across every live
  episode, or all the actions);
- :class:`Scores`: proposals for judging models to score (coordinators with ``judge_pairs``);
- :class:`Steps`: the decided turns for their worlds to play (an env in process or on an env worker,
  or a client's own world behind ``swarm serve``).

The strategy never calls a model or steps a world, so the same strategy runs over any sampler (in process,
an OpenAI-compatible server, vLLM) and any world: :meth:`TurnEngine.run` answers each request in process
(a batch with one sampler call, scores with its ``scorer``, steps on the envs); :meth:`TurnEngine.arun`
awaits an async answerer (``swarm serve``'s episodes: agents asked over HTTP, a client's world awaited).

Strategies: the auction (:class:`swarm_runtime.core.loop.AuctionTurns`: every turn all present agents bid,
the coordinator picks, the winner acts, the world steps; training rollouts, counterfactual branches,
held-out evaluation and served episodes) and the wall clock (:class:`swarm_runtime.learn.rlcr.loop.ClockTurns`:
every agent acts as soon as its last action completed, against simulated time; ``algo=rlcr``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any

from swarm_runtime.core.protocols import Row, Sampler

#: The kinds of model request a strategy yields.
KINDS = ("bid", "act")


@dataclass(frozen=True)
class Batch:
    """One batch of model requests: ``kind`` ``bid`` or ``act``, and its rows."""

    kind: str
    rows: list[Row]

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"batch kind {self.kind!r} is not one of: {', '.join(KINDS)}")

    def merged(self, rows: list[Row]) -> Batch:
        """The batch of several strategies' rows: keyed only if every row is."""
        if any(r.key is None for r in rows):
            rows = [Row(r.model, r.prompt, None, r.context) for r in rows]
        return Batch(self.kind, rows)


@dataclass(frozen=True)
class Scores:
    """Proposal scores (``judge_pairs`` coordinators): rows ``((judge, proposer, prompt, tokens), policy)``,
    each answered with the judge's mean per-token log-probability of the proposal on the proposer's prompt."""

    rows: list
    kind = "score"

    def merged(self, rows: list) -> Scores:
        return Scores(rows)


@dataclass(frozen=True)
class Step:
    """One decided turn for its world: ``env`` steps with the turn's action as ``role`` (a skipped turn,
    ``turn.winner`` None, is not played in process). ``decided``: the turn's
    :class:`~swarm_runtime.core.turn.Decided` (who missed, who failed), for drivers that report it."""

    env: Any
    turn: Any
    role: str | None
    decided: Any = None

    @property
    def acts(self) -> bool:
        return self.turn.winner is not None


@dataclass(frozen=True)
class Steps:
    """The worlds' steps of a turn: rows of :class:`Step`, each answered with the step's
    :class:`~swarm_runtime.core.env.StepResult` (None for a skipped turn played in process)."""

    rows: list[Step]
    kind = "step"

    def merged(self, rows: list[Step]) -> Steps:
        return Steps(rows)


def merge(requests: list):
    """One request of the kind of ``requests`` (all of one kind) with every row of them, in order."""
    return requests[0].merged([r for q in requests for r in q.rows])


def prefetch_steps(steps: list[tuple[Any, str, str | None]]) -> None:
    """Send each ``(env, action, role)`` step to envs that take it ahead (``prefetch_step``: an env worker's
    remote env, :mod:`swarm_runtime.cluster.env_cluster`), so that they run concurrently; ``env.step`` collects it."""
    for env, action, role in steps:
        prefetch = getattr(getattr(env, "env", env), "prefetch_step", None)
        if prefetch is not None and not getattr(env, "closed", False) and not env.done:
            prefetch(action, role)


def play_steps(steps: list[Step]) -> list:
    """Play decided turns on their envs: every step sent first to envs that take it ahead (remote ones run
    concurrently), then each collected in order; a skipped turn's answer is None."""
    prefetch_steps([(s.env, s.turn.action_text, s.role) for s in steps if s.acts])
    return [s.env.step(s.turn.action_text, s.role) if s.acts else None for s in steps]


#: A strategy's rounds: yields requests, is sent their answers, returns its result.
Rounds = Generator[Any, list, Any]


class TurnEngine:
    """Drives a strategy's rounds in process (:meth:`run`: model batches to ``sampler``, scores to ``scorer``,
    steps on the envs) or over an async answerer (:meth:`arun`: every request to it)."""

    def __init__(self, sampler: Sampler | None = None, scorer: Callable[[list], list] | None = None):
        self.sampler, self.scorer = sampler, scorer
        self.batches = 0  #: model batches answered (model calls, per kind and sampler)
        self.rows = 0  #: model rows answered

    def _counted(self, request, answers) -> list:
        """``answers`` to ``request`` as a list, one per row (or an error naming both counts); model batches
        counted."""
        answers = list(answers)
        if len(answers) != len(request.rows):
            raise RuntimeError(f"the answerer gave {len(answers)} answers to {len(request.rows)} {request.kind} rows")
        if isinstance(request, Batch):
            self.batches += 1
            self.rows += len(request.rows)
        return answers

    def answer(self, request) -> list:
        """The in-process answers to one request (no call for an empty one)."""
        if not request.rows:
            return []
        if isinstance(request, Batch):
            call = self.sampler.bid if request.kind == "bid" else self.sampler.act
            return self._counted(request, call(request.rows))
        if isinstance(request, Scores):
            if self.scorer is None:
                raise RuntimeError("the coordinator scores proposals (judge_pairs); this turn engine has no scorer")
            return self._counted(request, self.scorer(request.rows))
        if isinstance(request, Steps):
            return self._counted(request, play_steps(request.rows))
        raise TypeError(f"the turn engine cannot answer a {type(request).__name__} request in process")

    def run(self, rounds: Rounds):
        """Run ``rounds`` to the end and return what the strategy returns."""
        answers = None
        while True:
            try:
                request = rounds.send(answers)
            except StopIteration as stop:
                return stop.value
            answers = self.answer(request)

    async def arun(self, rounds: Rounds, answer: Callable[[Any], Awaitable[list]]):
        """:meth:`run` with an async ``answer(request)`` (model rows it could not answer come back as None),
        counted as :meth:`answer` counts."""
        answers = None
        while True:
            try:
                request = rounds.send(answers)
            except StopIteration as stop:
                return stop.value
            answers = self._counted(request, await answer(request)) if request.rows else []
