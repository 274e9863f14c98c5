"""The two MPT losses as pure tensor functions (docs/reference/method.md, sections 3 and 4), and the REINFORCE loss of a
chunk of samples as the learners compute it (:func:`reinforce_chunk`: on-policy log-probs, importance weights)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from swarm_runtime.config.schemes import PAIR_WEIGHTS
from swarm_runtime.learn.logprobs import sampled_logprobs
from swarm_runtime.sampling.mismatch import Mismatch, importance_weight, token_deltas


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


def bradley_terry_loss(
    logp_winner: torch.Tensor,
    logp_loser: torch.Tensor,
    weights: torch.Tensor | None = None,
    ref_winner: torch.Tensor | None = None,
    ref_loser: torch.Tensor | None = None,
    beta: float = 1.0,
) -> torch.Tensor:
    """``-mean(w * log sigmoid(beta * z))`` with ``z = log pi(y_w|h) - log pi(y_l|h)`` (the paper:
    ``w = 1``, ``beta = 1``, no reference) or, given a reference policy's log-probs of the same
    responses, ``z = [log pi(y_w|h) - log pi_ref(y_w|h)] - [log pi(y_l|h) - log pi_ref(y_l|h)]``
    (the DPO form, ``algo.bid_reference``).

    Without a reference the optimum sets the bid odds to the pairs' win odds,
    ``pi(y_w)/pi(y_l) = p/(1-p)``, so pairs that split 50/50 by noise pull every bid toward the
    uniform distribution: the pairs that disagree with a confident policy get a gradient weight
    ``1 - sigmoid(z)`` near 1, the ones that agree near 0. With a reference the optimum is
    ``pi_ref``'s odds times ``(p/(1-p))^(1/beta)``: noise leaves the reference's bids in place and
    only a consistent preference moves them."""
    z = logp_winner - logp_loser
    if (ref_winner is None) != (ref_loser is None):
        raise ValueError("bradley_terry_loss needs both reference log-probs (ref_winner, ref_loser) or neither")
    if ref_winner is not None:
        z = z - (ref_winner.detach() - ref_loser.detach()).to(z.device)
    terms = F.logsigmoid(float(beta) * z)
    if weights is not None:
        terms = terms * weights.detach().to(terms.device)
    return -terms.mean()


def pair_weights(margins: Sequence[float], scheme: str) -> list[float]:
    """Weights of decisive branch pairs for :func:`bradley_terry_loss`.

    ``uniform`` (docs/reference/method.md, section 4): every pair counts 1, so a step follows how often the higher
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


def reinforce_chunk(policy, chunk, stats: Mismatch | None = None, is_cap: float | None = None) -> torch.Tensor:
    """The REINFORCE loss of ``chunk`` (``(prompt, tokens, advantage[, sampler log-probs])`` rows);
    rows with sampler log-probs feed ``stats`` and, with ``is_cap``, are importance-weighted."""
    tracked = stats is not None and all(len(c) > 3 and c[3] is not None and len(c[3]) == len(c[1]) for c in chunk)
    per_token: list | None = [] if tracked else None
    logp = sampled_logprobs(policy, [c[0] for c in chunk], [c[1] for c in chunk], actions=True, per_token_out=per_token)
    adv = torch.tensor([c[2] for c in chunk])
    if tracked and per_token:
        weights = []
        for c, lt in zip(chunk, per_token):
            d = token_deltas(lt, c[3])
            stats.add(d)
            if is_cap is not None:
                weights.append(importance_weight(d, is_cap))
        if weights:
            stats.weights += weights
            adv = adv * torch.tensor(weights, dtype=adv.dtype)
    return reinforce_loss(logp, adv)
