"""FLOPs accounting: a first-class metric, since every comparison is at matched FLOPs.

Dense-transformer estimate (Kaplan et al.): a forward pass costs ``2 N`` FLOPs per
token and a training step (forward + backward) ``6 N``, with N the parameter count.
"""
from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = ("sft", "rollout", "branch", "update", "eval")


@dataclass
class FlopCounter:
    by_category: dict[str, float] = field(default_factory=lambda: {c: 0.0 for c in CATEGORIES})
    category: str = "rollout"

    def forward(self, n_params: int, tokens: int) -> None:
        self.by_category[self.category] = self.by_category.get(self.category, 0.0) + 2.0 * n_params * tokens

    def train(self, n_params: int, tokens: int) -> None:
        key = "sft" if self.category == "sft" else "update"
        self.by_category[key] = self.by_category.get(key, 0.0) + 6.0 * n_params * tokens

    @property
    def training_total(self) -> float:
        """All training compute (evaluation excluded)."""
        return sum(v for k, v in self.by_category.items() if k != "eval")

    def state_dict(self) -> dict:
        return dict(self.by_category)

    def load_state_dict(self, d: dict) -> None:
        self.by_category = {**{c: 0.0 for c in CATEGORIES}, **d}
