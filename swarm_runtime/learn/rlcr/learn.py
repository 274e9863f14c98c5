"""The RLCR learning rule (seed: "a simple policy-gradient algorithm with one shared policy and a flat
collective advantage for all agents"): G rollouts per task instance, advantage = return minus the
group mean (optionally over the group std), and that one number on every token every agent generated
in the rollout. Pure functions, then the REINFORCE step."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from swarm_runtime.learn.logprobs import sampled_logprobs
from swarm_runtime.learn.optim import accumulate_and_step
from swarm_runtime.learn.rlcr.clock import latency_penalized


def group_advantages(
    returns: Sequence[float], groups: Sequence[int], normalize_std: bool = False, eps: float = 1e-6
) -> list[float]:
    """``A_i = R_i - mean_{j in g(i)} R_j`` (divided by the group's population std when
    ``normalize_std``; a group whose returns are all equal gets 0)."""
    by: dict[int, list[float]] = defaultdict(list)
    for r, g in zip(returns, groups):
        by[g].append(float(r))
    stats = {}
    for g, rs in by.items():
        m = sum(rs) / len(rs)
        sd = math.sqrt(sum((r - m) ** 2 for r in rs) / len(rs))
        stats[g] = (m, sd)
    out = []
    for r, g in zip(returns, groups):
        m, sd = stats[g]
        a = float(r) - m
        out.append(a / (sd + eps) if normalize_std and sd > 0 else (0.0 if normalize_std else a))
    return out


def group_pass_rates(progress: Sequence[float], groups: Sequence[int], reward_max: float) -> list[float]:
    """``mean_pass_rate(q)`` of each rollout's task instance: the group's mean progress / reward_max."""
    by: dict[int, list[float]] = defaultdict(list)
    for p, g in zip(progress, groups):
        by[g].append(float(p))
    return [sum(by[g]) / len(by[g]) / reward_max for g in groups]


def collective_returns(rollouts, beta: float, reward_max: float) -> list[float]:
    """Each rollout's learning return: its anytime return, minus ``beta * reward_max * mean_pass_rate(q)
    * T / T_max`` when ``rlcr.latency_penalty = beta > 0`` (T = the rollout's simulated duration). The seed's
    ``R_task`` is a pass rate in [0, 1]; ours is in the task's reward units, so the penalty is scaled by
    ``reward_max`` and ``beta`` means what it means there (0.5: up to half the task's reward)."""
    rates = group_pass_rates([r.progress for r in rollouts], [r.group for r in rollouts], reward_max)
    return [latency_penalized(r.progress, beta * reward_max, p, r.duration, r.t_max) for r, p in zip(rollouts, rates)]


def flat_samples(rollouts, advantages: Sequence[float]) -> list[tuple[str, list[int], float]]:
    """``(prompt, tokens, advantage)`` for every turn of every rollout: each turn of rollout i, of any
    agent, carries rollout i's advantage (no per-agent credit). Rollouts with advantage 0 are kept
    out (their gradient is exactly zero)."""
    return [
        (t.prompt, t.tokens, float(a)) for r, a in zip(rollouts, advantages) if a != 0.0 for t in r.turns if t.tokens
    ]


def reinforce_step(policy, samples, opt, sched, scale: float, minibatch: int, grad_clip: float) -> dict:
    """One REINFORCE step: loss = -mean over turns of ``(A / scale) * log pi(turn tokens | prompt)``
    (the sequence log-prob sums the tokens, so every token gets the same A)."""
    if not samples:
        return {"losses/policy": 0.0, "losses/grad_norm": 0.0, "charts/trained_turns": 0.0}

    def chunk_loss(p, chunk):
        logp = sampled_logprobs(p, [c[0] for c in chunk], [c[1] for c in chunk])
        import torch

        adv = torch.tensor([c[2] / scale for c in chunk], dtype=logp.dtype, device=logp.device)
        return -(adv * logp).mean()

    loss, norm = accumulate_and_step(policy, list(samples), minibatch, chunk_loss, opt, sched, grad_clip)
    return {"losses/policy": loss, "losses/grad_norm": norm, "charts/trained_turns": float(len(samples))}
