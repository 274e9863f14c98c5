"""The sampler and learner protocols (docs/engine.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from swarm_runtime.policy.base import Bid, Policy, Response


@dataclass(frozen=True)
class Row:
    """One request to a sampler: which model's weights answer it, on what prompt.

    ``model`` names a set of weights the learner trains and exports: a role (its LoRA adapter on a shared
    base, or its full copy); replicas of a role share it. ``key``: the row's common-random-numbers key
    ``(noise, turn, agent, kind)`` (``None``: the sampler's own generator)."""

    model: str
    prompt: str
    key: tuple[int, ...] | None = None
    #: what the strategy knows about the row beyond its prompt (a scripted expert reads the live state)
    context: Any = field(default=None, compare=False, repr=False)
    #: the request's seed when whoever split the call drew it (rollout/replicas.py: the one a single sampler's
    #: generator would give this unkeyed row); None: from ``key``, else the sampler's own generator
    seed: int | None = field(default=None, compare=False, repr=False)


@runtime_checkable
class Sampler(Protocol):
    """Draws bids and actions. Responses come back in the rows' order, each with ``logprobs`` (the
    sampler's log-probability of each response token, at the sampling temperature before any
    constraint) and ``version`` (the weight version of ``row.model`` that produced it)."""

    name: str

    def bid(self, rows: Sequence[Row]) -> list[Bid]:
        """One sealed bid per row."""

    def act(self, rows: Sequence[Row]) -> list[Response]:
        """One action response per row."""

    def version(self, model: str) -> int:
        """The weight version of ``model`` that answers new rows."""

    def sync(self, learner: Learner, models: Sequence[str]) -> None:
        """After an update: take the learner's current weights of ``models`` (those it changed)."""

    def close(self) -> None:
        """Release what the sampler started (servers, connections)."""


@runtime_checkable
class Learner(Protocol):
    """Holds the trainable weights: scores responses with gradients (through :meth:`policy`), steps
    (the trainers' optimizers), and exports a version of a model's weights for a sampler."""

    def policy(self, model: str) -> Policy:
        """The trainable policy of ``model`` (its ``logprobs`` carry gradients)."""

    def models(self) -> list[str]:
        """Every model the learner holds."""

    def version(self, model: str) -> int:
        """How many updates ``model`` has taken since the run started (0: as loaded or after SFT)."""

    def bump(self, models: Sequence[str]) -> None:
        """Record that ``models`` took an update."""

    def export(self, model: str, folder: Path) -> Path:
        """Write ``model``'s current weights to ``folder`` in the format a sampler loads (a PEFT adapter
        folder for adapters, a Hugging Face folder for full copies) and return it."""
