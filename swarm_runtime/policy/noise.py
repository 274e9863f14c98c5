"""Common random numbers: sampling noise keyed by *where* it is used, not by call order.

With one generator per policy, a draw depends on everything sampled before it in
the batch, so a counterfactual branch and its original episode see unrelated noise
from the branch point on, and their score difference is mostly that noise. Keyed
noise gives every draw its own uniform, a pure function of ``(episode noise id,
turn, agent, kind, token position)``; tokens are picked by inverse CDF, so two
rollouts that share a noise id make the same choice wherever their distributions
agree, and differ only through what the forced decision changed.
"""
from __future__ import annotations

from typing import Sequence

import torch

_MASK = (1 << 64) - 1

#: the ``kind`` part of a key: a bid, an action (or proposal), the coordinator's tie-breaking
BID, ACTION, COORDINATOR = 0, 1, 2


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def key_hash(*parts: int) -> int:
    """A 64-bit hash of a tuple of integers (order matters); equal tuples, equal hashes."""
    h = 0x243F6A8885A308D3
    for p in parts:
        h = _splitmix64(h ^ (int(p) & _MASK))
    return h


def uniform(*parts: int) -> float:
    """A uniform draw in [0, 1) determined by ``parts`` alone (53 bits)."""
    return (key_hash(*parts) >> 11) / float(1 << 53)


def inverse_cdf(probs: torch.Tensor, u: Sequence[float]) -> torch.Tensor:
    """Row ``i``'s sample: the first index whose cumulative probability exceeds ``u[i]``
    (times the row's total). Zero-probability indices are never picked."""
    cdf = probs.detach().double().cpu().cumsum(-1)
    target = torch.tensor(list(u), dtype=torch.float64)[:, None] * cdf[:, -1:]
    idx = torch.searchsorted(cdf, target, right=True).squeeze(1)
    last_positive = probs.shape[-1] - 1 - (probs.detach().cpu() > 0).flip(-1).long().argmax(-1)
    return torch.minimum(idx, last_positive).to(probs.device)
