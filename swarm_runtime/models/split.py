"""A policy that answers bid prompts with one model and action prompts with another
(the bid x action ablation: initial or trained bids crossed with initial or trained actions).

Evaluation only: ``logprobs`` and ``action_target`` go to the action model,
``bid_target`` to the bid model, and ``parameters`` lists both.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from swarm_runtime.core.protocols import Bid, Response


class _PairedGenerator:
    """``manual_seed`` reseeds both models' generators (evaluation reseeds ``policy.gen``)."""

    def __init__(self, a: torch.Generator, b: torch.Generator):
        self.a, self.b = a, b

    def manual_seed(self, seed: int):
        self.a.manual_seed(int(seed))
        if self.b is not self.a:
            self.b.manual_seed(int(seed) + 1)
        return self


class SplitPolicy:
    """``bid()`` from ``bid_policy``, ``act()`` from ``action_policy``."""

    def __init__(self, bid_policy, action_policy):
        self.bid_policy, self.action_policy = bid_policy, action_policy
        self.n_params = action_policy.n_params
        self.bid_levels: Sequence[float] = bid_policy.bid_levels
        self.gen = _PairedGenerator(bid_policy.gen, action_policy.gen)

    def bid(self, prompts: list[str], keys=None) -> list[Bid]:
        return self.bid_policy.bid(prompts) if keys is None else self.bid_policy.bid(prompts, keys=keys)

    def act(self, prompts: list[str], keys=None) -> list[Response]:
        return self.action_policy.act(prompts) if keys is None else self.action_policy.act(prompts, keys=keys)

    def logprobs(self, prompts, responses, **kw) -> torch.Tensor:
        return self.action_policy.logprobs(prompts, responses, **kw)

    @property
    def action_trie(self):
        """The action model's constraint (``model.constrained_actions``), if any."""
        return getattr(self.action_policy, "action_trie", None)

    def bid_target(self, level: float) -> list[int]:
        return self.bid_policy.bid_target(level)

    def action_target(self, text: str) -> list[int]:
        return self.action_policy.action_target(text)

    def parameters(self):
        seen = {id(p): p for m in (self.bid_policy, self.action_policy) for p in m.parameters()}
        return iter(seen.values())

    @property
    def temperature(self) -> float:
        return self.action_policy.temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        self.bid_policy.temperature = value
        self.action_policy.temperature = value

    def rng_state(self):
        return (self.bid_policy.rng_state(), self.action_policy.rng_state())

    def set_rng_state(self, state) -> None:
        self.bid_policy.set_rng_state(state[0])
        self.action_policy.set_rng_state(state[1])

    def train(self, mode: bool = True):
        self.bid_policy.train(mode)
        self.action_policy.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def save(self, path) -> None:
        """Save both models: ``path/bid`` (answers bid prompts) and ``path/action`` (answers action prompts)."""
        from pathlib import Path

        self.bid_policy.save(Path(path) / "bid")
        self.action_policy.save(Path(path) / "action")
