"""The two MPT losses as pure tensor functions (DESIGN 2.3, 2.4)."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F


def per_agent_advantages(credit: Sequence[float], agent_ids: Sequence[int]) -> list[float]:
    """``A_k = c_k - mean_i``, where ``mean_i`` is the mean credit of agent i over its turns in the batch."""
    sums: dict[int, list[float]] = {}
    for c, a in zip(credit, agent_ids):
        sums.setdefault(a, []).append(float(c))
    means = {a: sum(v) / len(v) for a, v in sums.items()}
    return [float(c) - means[a] for c, a in zip(credit, agent_ids)]


def reinforce_loss(logprobs: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """``-mean(A_k * log pi(action tokens | h_k))``; ``logprobs`` are summed over
    each sample's action tokens only."""
    return -(advantages.detach() * logprobs).mean()


def bradley_terry_loss(logp_winner: torch.Tensor, logp_loser: torch.Tensor) -> torch.Tensor:
    """``-mean(log sigmoid(log pi(y_w|h) - log pi(y_l|h)))``."""
    return -F.logsigmoid(logp_winner - logp_loser).mean()
