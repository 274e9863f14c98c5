"""SFT cold start (docs/reference/method.md, section 5): each agent learns only its own role's demonstrations.

Demos come from the domain's scripted expert (``DomainEnv.expert_action``). At
every expert step each role gets a bid example (drawn from ``owner_bids`` for the
role that owns the action, from ``other_bids`` for the others), and the owner gets the action
example. A single (monolithic) model gets the union through ``single_prompt``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from swarm_runtime.core.domain import Domain, Event
from swarm_runtime.core.env import closing_all
from swarm_runtime.core.episode import SINGLE_ACTOR
from swarm_runtime.core.loop import make_env
from swarm_runtime.learn.optim import clip_and_step, make_optimizer
from swarm_runtime.models.tokenizer import split_words


@dataclass
class Example:
    kind: str  #: ``bid`` or ``act``
    prompt: str
    target: object  #: bid level (float) or action text (str)


def collect_demos(
    domain: Domain,
    task,
    seeds: Sequence[int],
    owner_bids: Sequence[float] = (0.6, 0.8),
    other_bids: Sequence[float] = (0.0, 0.2, 0.4),
    single: bool = False,
    rng: random.Random | None = None,
) -> dict[str, list[Example]]:
    """Roll the scripted expert on ``seeds``; return examples per role (or under
    ``"single"`` for one model acting every turn). Each bid example's target is
    drawn from ``owner_bids`` (the role owning the expert's action) or ``other_bids``."""
    rng = rng or random.Random(0)
    roles = [r.name for r in domain.roles]
    demos: dict[str, list[Example]] = {("single" if single else r): [] for r in roles}
    for seed in seeds:
        env = make_env(domain, task)
        with closing_all([env]):
            env.reset(seed)
            log: list[Event] = []
            for t in range(int(task.max_decisions)):
                exp = env.expert_action()
                if exp is None:
                    break
                obs = env.observation()
                if single:
                    demos["single"].append(Example("act", domain.single_prompt(obs, log), exp.action))
                else:
                    for role in roles:
                        level = rng.choice(list(owner_bids if role == exp.role else other_bids))
                        demos[role].append(Example("bid", domain.bid_prompt(role, obs, log), level))
                    demos[exp.role].append(Example("act", domain.action_prompt(exp.role, obs, log), exp.action))
                res = env.step(exp.action, exp.role)
                # the public log as the acting model will see it: a single model's turns are logged as SINGLE_ACTOR
                log.append(Event(t, SINGLE_ACTOR if single else exp.role, exp.action, res.valid, float(res.reward)))
                if env.done:
                    break
    return demos


def sft(
    policy,
    examples: list[Example],
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    desc: str = "sft",
    progress: bool = True,
    max_steps: int | None = None,
    action_epochs: int | None = None,
    micro_batch: int | None = None,
) -> dict[str, float]:
    """Supervised fine-tuning on ``examples``: mean token cross-entropy of the targets.

    Bid examples get ``epochs`` passes, action examples ``action_epochs`` (None =
    ``epochs``); each pass is shuffled, and one cosine schedule spans them all. ``micro_batch``
    (``hardware.micro_batch``; None = the whole batch): a step's forward and backward passes run on at most
    that many examples at a time, their gradients summed before the step (:func:`batch_loss`)."""
    if not examples:
        return {"loss": float("nan"), "steps": 0}
    pairs = [
        (e.kind, e.prompt, policy.bid_target(e.target) if e.kind == "bid" else policy.action_target(e.target))
        for e in examples
    ]
    passes = {"bid": int(epochs), "act": int(epochs if action_epochs is None else action_epochs)}
    rng = random.Random(seed)
    schedule: list[list[tuple]] = []
    for epoch in range(max(passes.values())):
        rng.shuffle(pairs)  # in place, pass after pass: with equal passes the order is the historical one
        schedule.append([(p, t) for kind, p, t in pairs if epoch < passes[kind]])
    n_steps = sum((len(e) + batch_size - 1) // batch_size for e in schedule)
    total = n_steps if max_steps is None else min(max_steps, n_steps)
    opt, sched = make_optimizer(policy.parameters(), lr, 0.0, total, warmup=max(1, total // 20))
    policy.train()
    losses: list[float] = []
    bar = tqdm(total=total, desc=desc, disable=not progress, leave=False)
    step = trained = 0
    for epoch_pairs in schedule:
        for i in range(0, len(epoch_pairs), batch_size):
            if step >= total:
                break
            batch = epoch_pairs[i : i + batch_size]
            loss = batch_loss(policy, batch, micro_batch)
            clip_and_step(policy.parameters(), opt, sched, 1.0)
            losses.append(loss)
            step += 1
            trained += len(batch)
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    policy.eval()
    tail = losses[-max(1, len(losses) // 10) :]
    return {
        "loss": sum(tail) / len(tail),
        "first_loss": losses[0],
        "steps": step,
        "examples": len(pairs),
        "examples_trained": trained,
    }


def batch_loss(policy, batch: list[tuple], micro_batch: int | None = None) -> float:
    """Backpropagate the mean token cross-entropy of ``batch`` ((prompt, target ids) pairs) and return it.
    With ``micro_batch`` smaller than the batch, in slices of that many examples, each slice's summed
    cross-entropy divided by the whole batch's token count: the same loss and gradient (up to the order of
    floating-point sums), with the activations of one slice held at a time."""
    tokens = sum(len(t) for _, t in batch)
    size = len(batch) if micro_batch is None else max(1, int(micro_batch))
    total = 0.0
    for j in range(0, len(batch), size):
        part = batch[j : j + size]
        logp = policy.logprobs([p for p, _ in part], [t for _, t in part])
        loss = -logp.sum() / tokens
        loss.backward()
        total += float(loss.detach())
    return total


@torch.no_grad()
def demo_accuracy(policy, examples: list[Example], limit: int = 256) -> float:
    """Share of action demos the policy reproduces word for word when sampling greedily."""
    acts = [e for e in examples if e.kind == "act"][:limit]
    if not acts:
        return float("nan")
    t = policy.temperature
    policy.temperature = 0.0
    try:
        outs = policy.act([e.prompt for e in acts])
    finally:
        policy.temperature = t
    # Compare word sequences: the word-level decoder writes "degree ." for "degree.".
    return sum(split_words(o.text) == split_words(e.target) for o, e in zip(outs, acts)) / len(acts)
