"""Keyed Gumbel noise for sampling (common random numbers): a draw is a pure function of its key
(:mod:`swarm_runtime.core.noise`), picked by the Gumbel-max trick.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from swarm_runtime.core.noise import key_hash


def gumbel(key: tuple[int, ...], n: int) -> torch.Tensor:
    """``n`` standard Gumbel draws (float64) determined by ``key`` alone."""
    gen = torch.Generator().manual_seed(key_hash(*key) >> 1)
    u = torch.rand(n, generator=gen, dtype=torch.float64).clamp_(min=1e-300)
    return -torch.log(-torch.log(u))


def gumbel_max(logits: torch.Tensor, keys: Sequence[tuple[int, ...]]) -> torch.Tensor:
    """Row ``i``'s sample from ``softmax(logits[i])``: ``argmax(logits[i] + gumbel(keys[i]))``.
    ``-inf`` logits (banned tokens) are never picked."""
    noise = torch.stack([gumbel(tuple(k), logits.shape[-1]) for k in keys]).to(logits.device)
    return (logits.detach().double() + noise).argmax(-1)
