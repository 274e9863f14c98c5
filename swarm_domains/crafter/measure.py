"""Figures of docs/domains/crafter.md: the scripted expert's Crafter score on held-out seeds, and the length of the
prompts it meets in tokens (the tiny models' word-level tokenizer; SmolLM2's when its converted base is in the
cache). ``python -m swarm_domains.crafter.measure [TASK] [EPISODES]``."""

from __future__ import annotations

import sys
from pathlib import Path

from swarm_domains.crafter.plugin import CrafterDomain
from swarm_domains.crafter.score import crafter_score, success_rates
from swarm_runtime.core.domain import Event


def expert_episodes(domain: CrafterDomain, task: str, n: int) -> tuple[list[dict], list[str]]:
    """Play the expert on the first ``n`` eval seeds: each episode's metrics, and every bid prompt it met."""
    cfg = domain.task_config(task)
    env = domain.make_env(cfg)
    seeds = domain.episode_seeds(cfg, "eval")[:n]
    metrics, prompts = [], []
    for seed in seeds:
        obs, log = env.reset(seed), []
        for turn in range(int(cfg.max_decisions)):
            e = env.expert_action()
            prompts.append(domain.bid_prompt(e.role, obs, log))
            r = env.step(e.action, e.role)
            log.append(Event(turn, e.role, e.action, r.valid, r.reward))
            obs = r.observation
            if r.done:
                break
        metrics.append(env.metrics())
    env.close()
    return metrics, prompts


def token_counts(domain: CrafterDomain, task: str, prompts: list[str]) -> dict[str, tuple[float, int]]:
    """Mean and largest prompt length per tokenizer (beginning of sequence included)."""
    from swarm_runtime.models.tokenizer import build_tokenizer

    out = {}
    tiny = build_tokenizer(domain.all_words(domain.task_config(task)), [0.0, 0.5, 1.0])
    tokenizers = {"tiny (word level)": tiny}
    try:
        from transformers import AutoTokenizer

        from swarm_runtime.models.pretrained import cache_root

        found = sorted(Path(cache_root()).glob("smollm2-*"))
        if found:
            tokenizers["SmolLM2-135M"] = AutoTokenizer.from_pretrained(str(found[-1]))
    except ImportError:
        pass
    for name, tok in tokenizers.items():
        lengths = [len(tok(p).input_ids) + (0 if name.startswith("tiny") else 1) for p in prompts]
        out[name] = (sum(lengths) / len(lengths), max(lengths))
    return out


def main(argv: list[str]) -> None:
    task = argv[0] if argv else "iron_pickaxe"
    n = int(argv[1]) if len(argv) > 1 else 32
    domain = CrafterDomain()
    metrics, prompts = expert_episodes(domain, task, n)
    achievements = [k[4:] for k in metrics[0] if k.startswith("ach_")]
    rates = success_rates([{k[4:]: v for k, v in m.items() if k.startswith("ach_")} for m in metrics], achievements)
    print(
        f"expert on {task}, {n} held-out seeds: Crafter score {crafter_score(list(rates.values())):.1f}%, "
        f"success {100 * sum(m['success'] for m in metrics) / n:.1f}%, "
        f"return {sum(m['crafter_return'] for m in metrics) / n:.2f}, "
        f"{sum(m['achievements'] for m in metrics) / n:.2f} achievements per episode"
    )
    print(" ".join(f"{a} {r:.0f}" for a, r in rates.items()))
    for name, (mean, top) in token_counts(domain, task, prompts).items():
        print(f"bid prompt tokens, {name}: mean {mean:.0f}, max {top}")


if __name__ == "__main__":
    main(sys.argv[1:])
