"""Rollout throughput on the in-process sampler against a vLLM server, and their log-prob mismatch.

One adapter swarm (``model.adapter=lora``, the tiny base) plays the same episodes twice through the turn
engine: once with ``rollout.engine=local`` (in process) and once on the vLLM server a run would start
(``rollout.engine=vllm``). Prints decisions per second of each and their ratio, the wall time per
batch (model call), and the per-token log-prob difference between the server's answers and the
learner's scores of the same tokens (same weights, fp32). Needs ``SWARM_VLLM_PYTHON`` (docs/guides/vllm.md).

    SWARM_VLLM_PYTHON=~/.venvs/vllm/bin/python python benchmarks/engine.py --envs 16 --decisions 24
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch

from swarm_runtime.config.load import resolve
from swarm_runtime.core.engine import TurnEngine
from swarm_runtime.core.env import closing_all
from swarm_runtime.core.loop import AuctionTurns, new_slots
from swarm_runtime.plugins.manager import get_registry
from swarm_runtime.runs.context import RunContext
from swarm_runtime.sampling.factory import make_sampler
from swarm_runtime.sampling.local import LocalLearner, LocalSampler, model_names


def play(ctx, agents, sampler, seeds, decisions):
    """Decisions per second, batches and the episodes of one batched rollout over ``sampler``."""
    for i, p in enumerate({id(a.policy): a.policy for a in agents}.values()):
        p.gen.manual_seed(i)
    engine = TurnEngine(sampler)
    turns = AuctionTurns.for_agents(
        agents, model_names(agents), ctx.coordinator(), ctx.domain, decisions, random.Random(0)
    )
    t0 = time.perf_counter()
    slots = new_slots(ctx.domain, ctx.task, seeds)
    with torch.no_grad(), closing_all([s.env for s in slots]):  # the envs closed at the end, also when it raised
        episodes = engine.run(turns.rounds(slots))
    wall = time.perf_counter() - t0
    n = sum(len(e.turns) for e in episodes)
    return n / wall, wall, engine.batches, n, episodes


def mismatch(agents, episodes) -> tuple[float, int]:
    """Largest |server - learner| per-token log-prob over every acted turn, and the tokens compared."""
    from swarm_runtime.learn.logprobs import sampled_logprobs

    worst, count = 0.0, 0
    for e in episodes:
        for t in e.acted:
            if t.action_logprobs is None:
                continue
            out: list = []
            with torch.no_grad():
                sampled_logprobs(agents[t.winner].policy, [t.action_prompt], [t.action_tokens], per_token_out=out)
            d = (out[0].double() - torch.tensor(t.action_logprobs, dtype=torch.float64)).abs()
            worst, count = max(worst, float(d.max())), count + d.numel()
    return worst, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--domain", default="minecraft")
    ap.add_argument("--task", default="iron_pickaxe")
    ap.add_argument("--envs", type=int, default=16)
    ap.add_argument("--decisions", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pm, reg = get_registry()
    cfg = resolve(
        [f"domain={args.domain}", f"task={args.task}", "model.adapter=lora", "rollout.engine=vllm", "progress=false"],
        reg,
    )
    ctx = RunContext(cfg, pm, reg, None)
    agents, policies = ctx.build_swarm()
    torch.manual_seed(1)
    with torch.no_grad():  # LoRA B starts at 0: give each role's adapter weights of its own
        for p in policies.values():
            for w in p.parameters():
                w.add_(torch.randn_like(w) * 0.05)
    seeds = ctx.seeds("train")[: args.envs]
    learner = LocalLearner(policies)
    local = play(ctx, agents, LocalSampler(policies, learner), seeds, args.decisions)
    t0 = time.perf_counter()
    engine = make_sampler(cfg, learner, Path(tempfile.mkdtemp(prefix="bench-engine-")))
    start = time.perf_counter() - t0
    try:
        remote = play(ctx, agents, engine, seeds, args.decisions)
    finally:
        engine.close()
    worst, tokens = mismatch(agents, remote[4])
    print(
        f"{args.domain}/{args.task}, adapter swarm on the tiny base, {args.envs} envs x {args.decisions} decisions, "
        f"torch threads {args.threads}"
    )
    print(
        f"local: {local[3]} decisions in {local[1]:.1f}s = {local[0]:.1f} decisions/s, {local[2]} batches "
        f"({1000 * local[1] / max(1, local[2]):.1f} ms per batch)"
    )
    print(
        f"vllm:  {remote[3]} decisions in {remote[1]:.1f}s = {remote[0]:.1f} decisions/s, {remote[2]} batches "
        f"({1000 * remote[1] / max(1, remote[2]):.1f} ms per batch); server start and sync {start:.1f}s"
    )
    print(f"vllm / local decisions per second: {remote[0] / local[0]:.2f}x")
    print(
        f"per-token log-prob, server vs learner on the same weights: max |difference| {worst:.2e} over {tokens} tokens"
    )


if __name__ == "__main__":
    main()
