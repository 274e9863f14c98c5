"""Adapters on one base vs full copies (issue 19), on a ~100M-parameter Qwen2-style model built
from a config (random weights, a synthetic 30k-word vocabulary; no download).

``memory``: peak resident memory of a fresh process per setting (``ru_maxrss``):

- ``base``: the base model alone, scoring one batch of bid prompts and generating actions;
- ``lora 1``: the base with one adapter, the same rollout and one training step of the adapter (one
  agent: what the activations of a training step cost any single model);
- ``full N``: N full copies (one per agent), the same rollout batch, then one training step per agent
  (its own AdamW: weights + gradients + two moments), or rollout only (``--no-train``);
- ``lora N``: one base with N distinct LoRA adapters (one per agent: the worst case, replicas would
  share), the same rollout as one mixed-adapter batch, then one training step per agent's adapter.

and the ratios: 12 adapter agents / the base alone (target <= 1.15) and the training state each extra
agent adds, adapters / full copies (target < 5%).

``batching``: one turn's bid scoring (one forward over every agent's bid prompt in every env) and
action generation (one row per env), for N agents with distinct adapters: one mixed-adapter batch
(``MixedBatch``) against one call per agent, best of ``--repeats``; target >= 2x at 12 agents.

    python benchmarks/adapters.py memory [--agents 3 12] [--threads 1]
    python benchmarks/adapters.py batching [--agents 3 12] [--envs 4] [--threads 1] [--size 100m|tiny]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

MiB = 1024 * 1024
#: ~100M parameters: 30k vocabulary x 768 (tied) + 12 blocks of ~6.3M.
ARCH = dict(hidden_size=768, intermediate_size=2048, num_layers=12, num_heads=12, num_kv_heads=4, max_positions=512)
WORDS = 30_000
#: ``--size tiny``: the CPU default model (model=tiny) with a domain-sized vocabulary.
TINY = dict(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2, max_positions=512)
TINY_WORDS = 300


def use_size(size: str) -> None:
    global ARCH, WORDS
    if size == "tiny":
        ARCH, WORDS = TINY, TINY_WORDS


def peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def model_cfg(rank: int):
    from omegaconf import OmegaConf

    from swarm_runtime.config import LORA_TARGETS

    return OmegaConf.create({**ARCH, "bid_mode": "logits", "temperature": 1.0, "max_action_tokens": 4,
                             "max_bid_tokens": 6, "max_prompt_tokens": 96, "dtype": "float32", "device": "cpu",
                             "path": None, "lora": {"rank": rank, "alpha": 2.0 * rank, "dropout": 0.0,
                                                    "target_modules": list(LORA_TARGETS)}})


def words() -> list[str]:
    return [f"w{i}" for i in range(WORDS)]


def prompts(n: int, seed: int, length: int = 64) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(WORDS)}" for _ in range(length)) for _ in range(n)]


def build(mode: str, agents: int, rank: int):
    """``(list of per-agent policies, the object serving all rows at once or None)``."""
    import torch
    from omegaconf import OmegaConf

    from swarm_runtime.policy.adapters import MixedBatch, build_adapter_swarm
    from swarm_runtime.policy.transformers_backend import make_transformers_policy

    levels = [0.0, 0.2, 0.4, 0.6, 0.8]
    cfg = model_cfg(rank)
    if mode == "lora":
        roles = [f"agent{i}" for i in range(agents)]
        pol = build_adapter_swarm(cfg, OmegaConf.create({}), words(), levels, roles, list(range(agents)))
        torch.manual_seed(0)
        with torch.no_grad():  # distinct adapters (LoRA B starts at zero)
            for p in pol.values():
                for w in p.parameters():
                    w.add_(torch.randn_like(w) * 0.01)
        policies = list(pol.values())
        return policies, MixedBatch(policies)
    n = 1 if mode == "base" else agents
    policies = [make_transformers_policy(cfg, words(), levels, seed=i) for i in range(n)]
    return policies, None


def measure_memory(args) -> dict:
    import torch

    from swarm_runtime.train.optim import clip_and_step, make_optimizer

    torch.set_num_threads(args.threads)
    policies, mixed = build(args.mode, args.child, args.rank)
    n_agents = 1 if args.mode == "base" else args.child
    bid_prompts = prompts(args.envs * n_agents, 1)
    act_prompts = prompts(args.envs, 2)
    with torch.no_grad():
        if mixed is not None:
            rows = [p for p in policies for _ in range(args.envs)]
            from swarm_runtime.policy.adapters import MixedBatch

            MixedBatch(rows).bid(bid_prompts)
            MixedBatch([policies[i % n_agents] for i in range(args.envs)]).act(act_prompts)
        else:
            for i, p in enumerate(policies):
                p.bid(bid_prompts[i * args.envs:(i + 1) * args.envs] if args.mode != "base" else bid_prompts)
            policies[0].act(act_prompts)
    rss_rollout = peak_rss()
    if args.train and args.mode != "base":
        opts = []
        for p in policies:
            opt, sched = make_optimizer(p.parameters(), 1e-4, 0.0, 10)
            opts.append(opt)
            p.train()
            resp = [p.action_target("w1 w2 w3")] * args.envs
            loss = -p.logprobs(act_prompts, resp).mean()
            loss.backward()
            clip_and_step(list(p.parameters()), opt, sched, 1.0)
            p.eval()
    out = {"mode": args.mode, "agents": n_agents, "train": bool(args.train and args.mode != "base"),
           "peak_rss": peak_rss(), "peak_rss_rollout": rss_rollout}
    if mixed is not None:
        shared = policies[0].shared_base
        out["base_params"] = shared.n_base
        out["adapter_params"] = policies[0].n_params - shared.n_base
    else:
        out["params_per_copy"] = policies[0].n_params
    return out


def run_child(argv: list[str]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run([sys.executable, __file__, *argv], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{argv} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def memory(args) -> None:
    common = ["--threads", str(args.threads), "--rank", str(args.rank), "--envs", str(args.envs)]
    settings = [("base", 1, False), ("lora", 1, True), ("full", 1, True), ("full", 3, True)]
    settings += [("full", n, False) for n in args.agents]
    settings += [("lora", n, True) for n in args.agents]
    res = {}
    for mode, n, train in settings:
        r = run_child(["_child", "--mode", mode, "--child", str(n), *common] + (["--train"] if train else []))
        res[(mode, n, train)] = r
        print(f"{mode:<5} {n:>3} agents {'train' if train else 'rollout':<8} peak RSS {r['peak_rss'] / MiB:8.0f} MiB "
              f"(after the rollout {r['peak_rss_rollout'] / MiB:8.0f} MiB)", flush=True)
    base = res[("base", 1, False)]["peak_rss"]
    full_per_agent = (res[("full", 3, True)]["peak_rss"] - res[("full", 1, True)]["peak_rss"]) / 2
    lo, hi = min(args.agents), max(args.agents)
    lora_per_agent = (res[("lora", hi, True)]["peak_rss"] - res[("lora", lo, True)]["peak_rss"]) / (hi - lo)
    lora = res[("lora", hi, True)]
    print(f"\nbase: {lora['base_params'] / 1e6:.1f}M parameters; one adapter (rank {args.rank}): "
          f"{lora['adapter_params'] / 1e6:.2f}M ({lora['adapter_params'] / lora['base_params']:.2%} of the base)")
    one = res[("lora", 1, True)]["peak_rss"]
    print(f"{hi} adapter agents (rollout + one step each) / the base alone (rollout only): {lora['peak_rss'] / base:.3f}x; "
          f"/ one adapter agent doing the same rollout and step: {lora['peak_rss'] / one:.3f}x (target <= 1.15)")
    print(f"per extra agent: full copy {full_per_agent / MiB:.0f} MiB, adapter {lora_per_agent / MiB:.1f} MiB = "
          f"{lora_per_agent / full_per_agent:.2%} of a full copy (target < 5%)")
    for n in args.agents:
        print(f"{n} agents: full copies (rollout only) {res[('full', n, False)]['peak_rss'] / MiB:.0f} MiB, adapters "
              f"(trained) {res[('lora', n, True)]['peak_rss'] / MiB:.0f} MiB")


def batching(args) -> None:
    import torch

    from swarm_runtime.policy.adapters import MixedBatch

    torch.set_num_threads(args.threads)
    print(f"model: {ARCH}, {WORDS} words; LoRA rank {args.rank}; {args.envs} envs; torch threads {args.threads}; "
          f"best of {args.repeats}")
    for n in args.agents:
        policies, _ = build("lora", n, args.rank)
        bid_rows = [p for p in policies for _ in range(args.envs)]
        bid_prompts = prompts(len(bid_rows), 1)
        act_rows = [policies[i % n] for i in range(args.envs)]
        act_prompts = prompts(args.envs, 2)
        for p in policies:
            p.temperature = 0.0  # greedy: both ways generate the same tokens (the same work)

        def mixed():
            MixedBatch(bid_rows).bid(bid_prompts)
            MixedBatch(act_rows).act(act_prompts)

        def per_agent():
            for i, p in enumerate(policies):
                p.bid(bid_prompts[i * args.envs:(i + 1) * args.envs])
            for i, p in enumerate(policies):
                mine = [k for k in range(args.envs) if k % n == i]
                if mine:
                    p.act([act_prompts[k] for k in mine])

        times = {}
        with torch.no_grad():
            for name, fn in (("mixed", mixed), ("per_agent", per_agent)):
                fn()  # warm-up
                best = float("inf")
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    fn()
                    best = min(best, time.perf_counter() - t0)
                times[name] = best
        print(f"{n:>3} agents x {args.envs} envs: one mixed-adapter batch {times['mixed'] * 1e3:7.1f} ms, one call per "
              f"agent {times['per_agent'] * 1e3:7.1f} ms: {times['per_agent'] / times['mixed']:.2f}x", flush=True)
        del policies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["memory", "batching", "_child"])
    ap.add_argument("--agents", type=int, nargs="+", default=[3, 12])
    ap.add_argument("--envs", type=int, default=4, help="envs per turn (bid rows per agent; action rows)")
    ap.add_argument("--rank", type=int, default=8, help="LoRA rank (model.lora.rank default)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--size", choices=["100m", "tiny"], default="100m", help="the ~100M model, or model=tiny")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mode", choices=["base", "full", "lora"], help=argparse.SUPPRESS)
    ap.add_argument("--child", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from loguru import logger

    logger.remove()
    use_size(args.size)
    if args.what == "_child":
        print(json.dumps(measure_memory(args)))
    elif args.what == "memory":
        memory(args)
    else:
        batching(args)


if __name__ == "__main__":
    main()
