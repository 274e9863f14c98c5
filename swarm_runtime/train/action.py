"""Action learning (docs/method.md, section 3): REINFORCE on each agent's own action tokens,
advantage = credit minus the agent's mean credit in the batch."""
from __future__ import annotations

import random
from collections import defaultdict
from typing import Callable, Sequence

import torch

from swarm_runtime.credit import fold_skipped_rewards
from swarm_runtime.episode import Agent, Episode
from swarm_runtime.policy.base import logprobs_in_chunks, sampled_logprobs
from swarm_runtime.train.losses import per_agent_advantages, reinforce_loss
from swarm_runtime.train.optim import accumulate_and_step


def credit_samples(episodes: Sequence[Episode], credit_fn: Callable, rng: random.Random):
    """(agent index, action prompt, action tokens, credit) for every acted turn of
    every episode whose reward is known."""
    out = []
    for ep in episodes:
        if ep.reward_missing:
            continue
        acted = ep.acted
        if not acted:
            continue
        rewards = fold_skipped_rewards([t.reward for t in ep.turns], [t.winner is not None for t in ep.turns])
        bids = [t.auction.winning_bid for t in acted]
        for turn, c in zip(acted, credit_fn(rewards, bids, rng)):
            out.append((turn.winner, turn.action_prompt, turn.action_tokens, float(c)))
    return out


def action_update(agents: list[Agent], samples, optimizers: dict, reward_scale: float, minibatch: int,
                  grad_clip: float, reference: dict | None = None, kl_coef: float = 0.0) -> dict[str, float]:
    """One REINFORCE update of every model that acted in ``samples``.

    ``kl_coef`` > 0 with ``reference`` (role -> frozen policy, ``algo.kl_coef``): each action's
    credit is charged ``kl_coef * [log pi(a|h) - log pi_ref(a|h)]`` before the baseline, the
    KL-penalised reward of RLHF (Ziegler et al. 2019), so a step trades the credit it chases against
    drifting from the reference; the sample estimate of the KL is logged as ``charts/kl_<role>``."""
    if not samples:
        return {}
    credit = [s[3] for s in samples]
    metrics: dict[str, float] = {}
    if kl_coef > 0 and reference is not None:
        kl = _log_ratios(agents, samples, reference, minibatch)
        for agent in {id(a.policy): a for a in agents}.values():
            mine = [k for (a, *_), k in zip(samples, kl) if agents[a].policy is agent.policy]
            if mine:
                metrics[f"charts/kl_{agent.role}"] = sum(mine) / len(mine)
        credit = [c - kl_coef * k for c, k in zip(credit, kl)]
    # Replicas of a role share a model; the baseline is per agent (docs/method.md, section 3).
    adv = per_agent_advantages(credit, [s[0] for s in samples])
    by_policy: dict[int, list] = defaultdict(list)
    for (a, prompt, tokens, _), A in zip(samples, adv):
        by_policy[id(agents[a].policy)].append((prompt, tokens, A / reward_scale))
    for agent in agents:
        batch = by_policy.pop(id(agent.policy), None)
        if not batch:
            continue
        loss, norm = accumulate_and_step(agent.policy, batch, minibatch, _reinforce_chunk,
                                         *optimizers[agent.role], grad_clip)
        metrics[f"losses/action_{agent.role}"] = loss
        metrics[f"charts/grad_norm_{agent.role}"] = norm
    return metrics


def _log_ratios(agents: list[Agent], samples, reference: dict, minibatch: int) -> list[float]:
    """``log pi(a|h) - log pi_ref(a|h)`` of every sample's action under its agent's model as it is
    now (the policy that sampled it) and under the role's reference model."""
    out = [0.0] * len(samples)
    by_policy: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        by_policy[id(agents[s[0]].policy)].append(i)
    for idx in by_policy.values():
        agent = agents[samples[idx[0]][0]]
        prompts, tokens = [samples[i][1] for i in idx], [samples[i][2] for i in idx]
        now = logprobs_in_chunks(agent.policy, prompts, tokens, minibatch, actions=True)
        ref = logprobs_in_chunks(reference[agent.role], prompts, tokens, minibatch, actions=True)
        for i, a, b in zip(idx, now, ref):
            out[i] = a - b
    return out


def _reinforce_chunk(policy, chunk) -> torch.Tensor:
    logp = sampled_logprobs(policy, [c[0] for c in chunk], [c[1] for c in chunk], actions=True)
    return reinforce_loss(logp, torch.tensor([c[2] for c in chunk]))
