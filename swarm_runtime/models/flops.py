"""FLOPs accounting: a first-class metric, since every comparison is at matched FLOPs.

Dense-transformer estimate (Kaplan et al.): a forward pass costs ``2 N`` FLOPs per
token and a training step (forward + backward) ``6 N``, with N the parameter count.

With a frozen part (``model.adapter=lora``: N = N_base + N_adapter, the base frozen) the
backward pass still carries the activation gradients through the base (``2 N_base``) but
computes weight gradients only for the adapter, so a training token costs
``2 N`` (forward) ``+ 2 N_base`` (activation gradients through the base)
``+ 4 N_adapter`` (activation and weight gradients of the adapter)
``= 4 N_base + 6 N_adapter``. Gradient checkpointing recomputes the forward pass once more in
the backward pass (``+ 2 N``); it is not counted (the same learning, more wall time).
"""

from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = ("sft", "rollout", "branch", "update", "eval")


def train_flops(n_params: int, tokens: int, frozen: int = 0) -> float:
    """FLOPs of a training step (module docstring): ``6 N T``, or ``(4 N_frozen + 6 (N - N_frozen)) T``."""
    if not frozen:
        return 6.0 * n_params * tokens
    return (4.0 * frozen + 6.0 * (n_params - frozen)) * tokens


@dataclass
class FlopCounter:
    by_category: dict[str, float] = field(default_factory=lambda: {c: 0.0 for c in CATEGORIES})
    category: str = "rollout"

    def forward(self, n_params: int, tokens: int) -> None:
        self.by_category[self.category] = self.by_category.get(self.category, 0.0) + 2.0 * n_params * tokens

    def train(self, n_params: int, tokens: int, frozen: int = 0) -> None:
        """A training forward + backward over ``tokens`` tokens of a model of ``n_params``
        parameters, ``frozen`` of which get no gradient: ``6 N`` per token, ``4 N_frozen +
        6 (N - N_frozen)`` with a frozen base."""
        key = "sft" if self.category == "sft" else "update"
        self.by_category[key] = self.by_category.get(key, 0.0) + train_flops(n_params, tokens, frozen)

    @property
    def training_total(self) -> float:
        """All training compute (evaluation excluded)."""
        return sum(v for k, v in self.by_category.items() if k != "eval")

    def state_dict(self) -> dict:
        return dict(self.by_category)

    def load_state_dict(self, d: dict) -> None:
        self.by_category = {**{c: 0.0 for c in CATEGORIES}, **d}
