"""Action learning (docs/reference/method.md, section 3): REINFORCE on each agent's own action tokens,
advantage = credit minus the agent's mean credit in the batch."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import partial

from swarm_runtime.core.credit import fold_skipped_rewards
from swarm_runtime.core.episode import Agent, Episode
from swarm_runtime.learn.logprobs import logprobs_in_chunks
from swarm_runtime.learn.losses import per_agent_advantages, reinforce_chunk
from swarm_runtime.learn.optim import accumulate_and_step
from swarm_runtime.sampling.mismatch import REPORT_CAP, Mismatch


def credit_samples(episodes: Sequence[Episode], credit_fn: Callable, rng: random.Random):
    """(agent index, action prompt, action tokens, credit) for every acted turn of
    every episode whose reward is known."""
    return credit_samples_and_turns(episodes, credit_fn, rng)[0]


def credit_samples_and_turns(episodes: Sequence[Episode], credit_fn: Callable, rng: random.Random):
    """:func:`credit_samples` and the turn each sample comes from (its sampler log-probs and version)."""
    out, turns = [], []
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
            turns.append(turn)
    return out, turns


def action_update(
    agents: list[Agent],
    samples,
    optimizers: dict,
    reward_scale: float,
    minibatch: int,
    grad_clip: float,
    reference: dict | None = None,
    kl_coef: float = 0.0,
    behaviour: Sequence[list[float] | None] | None = None,
    is_cap: float | None = None,
) -> dict[str, float]:
    """One REINFORCE update of every model that acted in ``samples``.

    ``behaviour`` (one entry per sample: the sampler's per-token log-probs of its action, or None):
    the learner's own log-probs, computed for the loss anyway, are compared with them per role
    (``mismatch/*`` metrics, :mod:`swarm_runtime.sampling.mismatch`); with ``is_cap`` each sample's
    term is weighted by its truncated importance weight ``min(is_cap, pi_learner / pi_sampler)``.

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
    # Replicas of a role share a model; the baseline is per agent (docs/reference/method.md, section 3).
    adv = per_agent_advantages(credit, [s[0] for s in samples])
    by_policy: dict[int, list] = defaultdict(list)
    behaviour = list(behaviour) if behaviour is not None else [None] * len(samples)
    for (a, prompt, tokens, _), A, b in zip(samples, adv, behaviour):
        by_policy[id(agents[a].policy)].append((prompt, tokens, A / reward_scale, b))
    for agent in agents:
        batch = by_policy.pop(id(agent.policy), None)
        if not batch:
            continue
        stats = Mismatch(cap=is_cap or REPORT_CAP)
        chunk_loss = partial(reinforce_chunk, stats=stats, is_cap=is_cap)
        loss, norm = accumulate_and_step(
            agent.policy, batch, minibatch, chunk_loss, *optimizers[agent.role], grad_clip, side=(stats,)
        )
        metrics[f"losses/action_{agent.role}"] = loss
        metrics[f"charts/grad_norm_{agent.role}"] = norm
        metrics.update(stats.metrics(agent.role))
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
