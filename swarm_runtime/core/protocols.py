"""The contracts between the loop and whoever answers it: a :class:`Policy` (one model per agent that both
bids and acts; its :class:`Response` and :class:`Bid`), and the :class:`Sampler` and :class:`Learner` a run
samples and trains through (docs/reference/engine.md).

A :class:`Sampler` answers bid and action requests for a batch of (model, prompt) :class:`Row` objects; every
response carries its tokens, the sampler's per-token log-probabilities and the weight version that produced it.
A :class:`Learner` holds the trainable weights and exports a version of each model after an update, which the
sampler then loads (:meth:`Sampler.sync`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


@dataclass
class Response:
    """A sampled response: its text, the token ids the policy scores it by, the sampler's per-token
    log-probabilities of those tokens (``log softmax(logits / T)`` over the vocabulary, before any
    constraint; ``None`` where the sampler gives none) and the weight version that sampled it."""

    text: str
    tokens: list[int]
    logprobs: list[float] | None = None
    version: int | None = None


@dataclass
class Bid(Response):
    """A sampled bid: the parsed level (0 when unparsable) and whether it parsed."""

    level: float = 0.0
    parsed: bool = True


@runtime_checkable
class Policy(Protocol):
    """What the episode loop and the trainers need from an agent's model."""

    n_params: int
    bid_levels: Sequence[float]

    def bid(self, prompts: list[str]) -> list[Bid]:
        """Sample one sealed bid per prompt. With ``algo.common_random_numbers`` the episode loop
        also passes ``keys=`` (one tuple of ints per prompt): the row's noise must then depend on
        its key alone (:mod:`swarm_runtime.core.noise`)."""

    def act(self, prompts: list[str]) -> list[Response]:
        """Sample one action response per prompt (``keys=`` as in :meth:`bid`)."""

    def logprobs(self, prompts: list[str], responses: list[list[int]]) -> torch.Tensor:
        """``log pi(response | prompt)`` summed over response tokens (differentiable). The RL
        losses call it with ``temperature=T`` when the policy samples at ``T`` != 1
        (:func:`swarm_runtime.learn.logprobs.sampled_logprobs`): score ``softmax(logits / T)`` then. A backend that supports
        ``model.constrained_actions`` has ``constrain_actions(texts)`` and an ``action_trie``, and
        takes ``actions=True`` to score action responses under that constraint."""

    def bid_target(self, level: float) -> list[int]:
        """Token ids of the response that states bid ``level`` (for SFT and counterfactuals)."""

    def action_target(self, text: str) -> list[int]:
        """Token ids of ``text`` as an action response (for SFT demos)."""

    def parameters(self): ...

    def save(self, path: str) -> None:
        """Write a Hugging Face–format checkpoint (``from_pretrained`` can load it)."""


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
    #: the request's seed when whoever split the call drew it (sampling/replicas.py: the one a single sampler's
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
