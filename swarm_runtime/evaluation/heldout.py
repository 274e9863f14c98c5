"""Held-out evaluation: every eval seed, several sampled runs, mean ± standard error."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence

import torch

from swarm_runtime.core.episode import Agent, Episode
from swarm_runtime.core.loop import new_slots
from swarm_runtime.core.noise import key_hash
from swarm_runtime.sampling.play import play


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample std / sqrt(n))."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    m = sum(values) / n
    if n == 1:
        return m, 0.0
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    return m, math.sqrt(var / n)


def paired_difference(after: dict, before: dict, key: str = "seed_rewards") -> tuple[float, float, int]:
    """Mean ± SE over the shared held-out seeds of ``after`` minus ``before`` per-seed reward
    (two :func:`summarize` outputs on the same seeds; ``key="seed_success"`` pairs the success
    rate instead). Pairing removes the seeds' own spread (easy and hard worlds), so it is the
    right test of "did training help"."""
    a, b = after.get(key, {}), before.get(key, {})
    shared = [s for s in a if s in b]
    m, se = mean_se([a[s] - b[s] for s in shared])
    return m, se, len(shared)


def summarize(episodes: Sequence[Episode], runs: int, agents: Sequence[Agent], domain=None) -> dict:
    """Average the runs of each seed first, then mean ± SE over seeds (each seed is one
    held-out instance). Episodes whose reward is missing (a failed judge) are left out and counted.
    ``domain``: its :meth:`~swarm_runtime.core.domain.Domain.eval_figures` (over the episodes with a known reward)
    are added, their names listed under ``domain_metrics``, and its ``eval_report`` under ``domain_report``."""
    per_seed: dict[int, list[Episode]] = defaultdict(list)
    for ep in episodes:
        per_seed[ep.seed].append(ep)
    out: dict = {
        "episodes": len(episodes),
        "seeds": len(per_seed),
        "runs": runs,
        "reward_missing": sum(ep.reward_missing for ep in episodes),
    }
    known = {s: [e for e in eps if not e.reward_missing] for s, eps in per_seed.items()}
    seed_means = [sum(e.reward for e in eps) / len(eps) for eps in known.values() if eps]
    out["reward_mean"], out["reward_se"] = mean_se(seed_means)
    out["seed_rewards"] = {str(s): sum(e.reward for e in eps) / len(eps) for s, eps in known.items() if eps}
    metric_names = sorted({k for ep in episodes for k in ep.metrics})
    for name in metric_names:
        per_seed_metric = {
            str(s): sum(float(e.metrics.get(name, 0.0)) for e in eps) / len(eps) for s, eps in known.items() if eps
        }
        out[f"{name}_mean"], out[f"{name}_se"] = mean_se(list(per_seed_metric.values()))
        if name == "success":  # kept per seed, like the reward, for the paired test of a success rate
            out["seed_success"] = per_seed_metric
    turns = defaultdict(int)
    total = 0
    for ep in episodes:
        for t in ep.turns:
            if t.winner is not None:
                turns[agents[t.winner].name] += 1
                total += 1
    out["turn_share"] = {a.name: turns[a.name] / total if total else 0.0 for a in agents}
    out["unparsed_bids"] = sum(ep.unparsed_bids for ep in episodes)
    out["invalid_actions"] = sum(ep.invalid_actions for ep in episodes)
    out["decisions_mean"] = sum(len(ep.turns) for ep in episodes) / max(1, len(episodes))
    if domain is not None:
        add_domain_figures(out, domain, [e for e in episodes if not e.reward_missing])
    return out


def add_domain_figures(out: dict, domain, episodes: Sequence[Episode]) -> None:
    """The domain's own evaluation figures and report (none for a domain without the hooks)."""
    figures = getattr(domain, "eval_figures", None)
    extra = figures(episodes) if callable(figures) and episodes else {}
    for name, (mean, se) in extra.items():
        out[f"{name}_mean"], out[f"{name}_se"] = float(mean), float(se)
    if extra:
        out["domain_metrics"] = list(extra)
    report = getattr(domain, "eval_report", None)
    text = report(out) if callable(report) and episodes else ""
    if text:
        out["domain_report"] = text


def evaluate(
    agents: list[Agent],
    coordinator,
    domain,
    task,
    seeds: Sequence[int],
    runs: int,
    seed: int,
    temperature: float | None = None,
    presence=None,
    common_random_numbers: bool = False,
    sampler=None,
    models=None,
) -> tuple[dict, list[Episode]]:
    """Play ``runs`` sampled episodes on every seed (one batch) and summarise. The
    policies' sampling RNG (and an engine ``sampler``'s stream of unkeyed rows' seeds) is seeded from ``seed`` for
    the evaluation and, with the temperature, restored afterwards, so evaluation never perturbs training and does not
    depend on where training left those streams. ``common_random_numbers``: run ``r`` on held-out seed ``s``
    draws keyed noise ``(seed, r, s)``, so two swarms evaluated with the same ``seed``
    meet the same noise episode by episode (a tighter paired comparison). ``sampler`` / ``models``: who
    draws the bids and actions (default: in process, from the agents' policies; :func:`~swarm_runtime.sampling.play.play`)."""
    policies = {id(a.policy): a.policy for a in agents}.values()
    saved = [(p, p.rng_state(), p.temperature) for p in policies]
    try:
        for i, p in enumerate(policies):
            p.gen.manual_seed(seed * 1000 + i)
            if temperature is not None:
                p.temperature = float(temperature)
        all_seeds = [s for _ in range(runs) for s in seeds]
        slots = new_slots(domain, task, all_seeds)
        if common_random_numbers:
            for i, s in enumerate(slots):
                s.episode.noise = key_hash(seed, i // max(1, len(seeds)), s.episode.seed)
        with torch.no_grad(), _seeded(sampler, seed):
            episodes = play(
                slots,
                agents,
                coordinator,
                domain,
                int(task.max_decisions),
                random.Random(seed),
                presence=presence,
                sampler=sampler,
                models=models,
            )
    finally:
        for p, state, temp in saved:
            p.set_rng_state(state)
            p.temperature = temp
    return summarize(episodes, runs, agents, domain), episodes


def _seeded(sampler, seed: int):
    """An engine sampler's stream of unkeyed rows' seeds seeded from ``seed`` inside (then put back: sampling/openai.py,
    ``sampler_rng_seeded``); nothing to do in process (the policies' generators are seeded above)."""
    if sampler is None:
        from contextlib import nullcontext

        return nullcontext()
    from swarm_runtime.sampling.openai import sampler_rng_seeded

    return sampler_rng_seeded(sampler, seed)
