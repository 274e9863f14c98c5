"""Action learning (DESIGN 2.3): REINFORCE on each agent's own action tokens,
advantage = credit minus the agent's mean credit in the batch."""
from __future__ import annotations

import random
from collections import defaultdict
from typing import Callable, Sequence

import torch

from swarm_runtime.credit import fold_skipped_rewards
from swarm_runtime.episode import Agent, Episode
from swarm_runtime.policy.base import sampled_logprobs
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
                  grad_clip: float) -> dict[str, float]:
    """One REINFORCE update of every model that acted in ``samples``."""
    if not samples:
        return {}
    # Replicas of a role share a model; the baseline is per agent (DESIGN 2.3).
    adv = per_agent_advantages([s[3] for s in samples], [s[0] for s in samples])
    by_policy: dict[int, list] = defaultdict(list)
    for (a, prompt, tokens, _), A in zip(samples, adv):
        by_policy[id(agents[a].policy)].append((prompt, tokens, A / reward_scale))
    metrics: dict[str, float] = {}
    for agent in agents:
        batch = by_policy.pop(id(agent.policy), None)
        if not batch:
            continue
        loss, norm = accumulate_and_step(agent.policy, batch, minibatch, _reinforce_chunk,
                                         *optimizers[agent.role], grad_clip)
        metrics[f"losses/action_{agent.role}"] = loss
        metrics[f"charts/grad_norm_{agent.role}"] = norm
    return metrics


def _reinforce_chunk(policy, chunk) -> torch.Tensor:
    logp = sampled_logprobs(policy, [c[0] for c in chunk], [c[1] for c in chunk])
    return reinforce_loss(logp, torch.tensor([c[2] for c in chunk]))
