"""Sampler-learner mismatch and truncated importance weights (docs/reference/engine.md, "Off-policy terms").

A response's tokens were drawn by a sampler (an inference server, or the in-process model) whose
per-token log-probs ``s_t`` came back with them; the learner recomputes ``l_t`` on its own weights
before it steps. With the same weights and dtype the two agree up to float rounding; a stale sampler
(``rollout.max_staleness`` > 0) or another kernel makes them differ. Per token, ``d_t = l_t - s_t``:

- approximate KL(sampler || learner): the mean of ``exp(d) - 1 - d`` (Schulman's k3 estimator: unbiased,
  never negative, low variance) over tokens;
- the largest ``|d_t|``;
- the share of tokens whose ratio ``exp(d_t)`` lies outside ``[1/c, c]`` (``c`` = ``algo.is_cap``, or
  :data:`REPORT_CAP` when the cap is off).

``algo.is_cap = c`` weights each response's REINFORCE term by ``min(c, exp(sum_t d_t))`` (truncated
importance sampling, no gradient through the weight), and each Bradley-Terry pair's term by the same
weight of the pair's original bid (the one the sampler drew in the rollout: :func:`swarm_runtime.learn.bid.bid_update`);
off (None) both losses are today's on-policy ones. Bids are reported as ``mismatch/bid_*``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

#: The ratio bound the "past cap" share is reported at when ``algo.is_cap`` is off.
REPORT_CAP = 2.0


def token_deltas(learner: torch.Tensor, sampler: list[float]) -> torch.Tensor:
    """``l_t - s_t`` of one response (``learner``: its per-token log-probs, detached)."""
    s = torch.tensor(sampler, dtype=torch.float64)
    return learner.detach().double().cpu() - s


def importance_weight(deltas: torch.Tensor, cap: float) -> float:
    """``min(cap, exp(sum_t d_t))``: the truncated sequence-level importance weight."""
    return float(min(cap, math.exp(min(float(deltas.sum()), 700.0))))


@dataclass
class Mismatch:
    """Running sums of one model's token deltas over an update."""

    cap: float = REPORT_CAP
    tokens: int = 0
    k3: float = 0.0
    max_abs: float = 0.0
    past: int = 0
    responses: int = 0
    weights: list = field(default_factory=list)

    def add(self, deltas: torch.Tensor) -> None:
        if deltas.numel() == 0:
            return
        self.tokens += int(deltas.numel())
        self.responses += 1
        self.k3 += float((deltas.exp() - 1 - deltas).sum())
        self.max_abs = max(self.max_abs, float(deltas.abs().max()))
        self.past += int((deltas.abs() > math.log(self.cap)).sum())

    def merge(self, parts: list[Mismatch]) -> None:
        """Become the sums of ``parts`` (each rank's of a sharded update, ``learn/sharded.py: shard_step``), in
        order."""
        self.tokens, self.responses = sum(m.tokens for m in parts), sum(m.responses for m in parts)
        self.k3, self.past = sum(m.k3 for m in parts), sum(m.past for m in parts)
        self.max_abs = max((m.max_abs for m in parts), default=0.0)
        self.weights = [w for m in parts for w in m.weights]

    def metrics(self, name: str, prefix: str = "") -> dict[str, float]:
        """The update's figures of model ``name``; ``prefix`` names what was compared (``bid_``: bids)."""
        if not self.tokens:
            return {}
        m = f"mismatch/{prefix}"
        out = {
            f"{m}approx_kl_{name}": self.k3 / self.tokens,
            f"{m}max_abs_dlogp_{name}": self.max_abs,
            f"{m}past_cap_{name}": self.past / self.tokens,
        }
        if self.weights:
            out[f"{m}is_weight_mean_{name}"] = sum(self.weights) / len(self.weights)
        return out
