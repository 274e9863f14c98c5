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
    each sample's action tokens only. ``advantages`` may live on another device (the CPU) than
    ``logprobs`` (the model's GPU)."""
    return -(advantages.detach().to(logprobs.device) * logprobs).mean()


def bradley_terry_loss(logp_winner: torch.Tensor, logp_loser: torch.Tensor,
                       weights: torch.Tensor | None = None) -> torch.Tensor:
    """``-mean(w * log sigmoid(log pi(y_w|h) - log pi(y_l|h)))``; ``w = 1`` (the paper) unless
    ``weights`` are given (see :func:`pair_weights`)."""
    terms = F.logsigmoid(logp_winner - logp_loser)
    if weights is not None:
        terms = terms * weights.detach().to(terms.device)
    return -terms.mean()


def pair_weights(margins: Sequence[float], scheme: str) -> list[float]:
    """Weights of decisive branch pairs for :func:`bradley_terry_loss`.

    ``uniform`` (DESIGN 2.4): every pair counts 1, so a step follows how often the higher
    bid's branch scored better. ``margin``: each pair counts ``|score difference|``,
    normalised to mean 1 over the pairs, so a step follows the *mean* score difference;
    a rare large win (a success bonus) then outweighs many small losses.
    """
    if scheme == "uniform":
        return [1.0] * len(margins)
    if scheme != "margin":
        raise ValueError(f"unknown bid pair weight {scheme!r}; valid: {', '.join(PAIR_WEIGHTS)}")
    m = [abs(float(x)) for x in margins]
    mean = sum(m) / len(m) if m else 0.0
    return [x / mean for x in m] if mean > 0 else [1.0] * len(m)


#: Schemes of :func:`pair_weights` (``algo.bid_pair_weight``).
PAIR_WEIGHTS = ("uniform", "margin")
