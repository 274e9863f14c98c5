"""RLCR loop throughput: agent-actions per second of the concurrent loop (4 and 8 agents per rollout)
against today's turn-based loop (one model acting every turn, ``episode.play``) on the same model.

Both loops get the same number of actors at once (``--actors``): the turn-based loop plays that many
envs, the concurrent loop ``actors / agents`` rollouts of ``agents`` agents each. The model is the RLCR
shared policy after a brief SFT on the scripted collective (so it emits real instructions whose
durations spread the agents over the clock); the turn-based loop uses it on the domain's single-model
prompt. Prints each loop's actions per second, the mean batch per model call, and the ratio
turn-based / concurrent per action (target <= 1.5).

    python benchmarks/rlcr_loop.py [--actors 32] [--decisions 60] [--threads 2]
"""
from __future__ import annotations

import argparse
import random
import subprocess
import time

import torch
from loguru import logger

from swarm_runtime.config import resolve
from swarm_runtime.episode import Agent, new_slots, play
from swarm_runtime.plugins import get_registry
from swarm_runtime.rlcr.loop import play_concurrent, policy_decider
from swarm_runtime.rlcr.trainer import demo_examples, loop_options, make_shared_policy
from swarm_runtime.run import RunContext
from swarm_runtime.train.sft import sft


class CountingDecider:
    def __init__(self, policy):
        self.inner, self.calls, self.rows = policy_decider(policy), 0, 0

    def __call__(self, requests):
        self.calls += 1
        self.rows += len(requests)
        return self.inner(requests)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--actors", type=int, default=32, help="agents acting at once in each loop")
    ap.add_argument("--decisions", type=int, default=60, help="actions per actor (turn-based: decision cap)")
    ap.add_argument("--agents", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--demo-episodes", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--ticks", type=float, nargs="+", default=[0.0, 10.0], help="rlcr.tick values to measure")
    args = ap.parse_args()
    logger.remove()
    if args.threads:
        torch.set_num_threads(args.threads)
    pm, reg = get_registry()
    cfg = resolve(["domain=minecraft", "task=iron_pickaxe", "algo=rlcr", "progress=false"], reg)
    ctx = RunContext(cfg, pm, reg, None)
    policy = make_shared_policy(ctx)
    examples, _ = demo_examples(ctx, policy, list(range(args.demo_episodes)))
    sft(policy, examples, 2, 2e-3, 64, 0, progress=False)
    seeds = list(range(1000, 1000 + args.actors))

    agent = Agent("Shared", "Shared", policy, prompt_kind="single")
    coordinator = reg.get("coordinators", "round_robin")(cfg)
    rates = {}
    with torch.no_grad():
        policy.gen.manual_seed(0)
        t0 = time.perf_counter()
        eps = play(new_slots(ctx.domain, cfg.task, seeds), [agent], coordinator, ctx.domain, args.decisions,
                   random.Random(0))
        dt = time.perf_counter() - t0
        n = sum(len(e.turns) for e in eps)
        rates["turn"] = n / dt
        print(f"turn-based loop: {args.actors} envs x 1 model acting every turn, {n} actions in {dt:.1f}s = "
              f"{rates['turn']:.1f} actions/s (batch per model call: up to {args.actors})")
        for tick in args.ticks:
            for k in args.agents:
                envs = max(1, args.actors // k)
                opts = loop_options(cfg, float("inf"), agents=k)
                opts = type(opts)(**{**opts.__dict__, "max_turns_per_agent": args.decisions, "tick": tick})
                dec = CountingDecider(policy)
                policy.gen.manual_seed(0)
                t0 = time.perf_counter()
                rs = play_concurrent(ctx.domain, cfg.task, seeds[:envs], dec, opts)
                dt = time.perf_counter() - t0
                n = sum(len(r.turns) for r in rs)
                rates[(k, tick)] = n / dt
                print(f"concurrent loop, {k} agents, tick {tick:g}s: {envs} rollouts x {k} agents, {n} actions in "
                      f"{dt:.1f}s = {rates[(k, tick)]:.1f} actions/s (mean batch per model call {dec.rows / dec.calls:.1f} "
                      f"over {dec.calls} calls; mean simulated minutes {sum(r.duration for r in rs) / len(rs) / 60:.1f})")
    for tick in args.ticks:
        for k in args.agents:
            print(f"per action, turn-based / concurrent with {k} agents, tick {tick:g}s: "
                  f"{rates['turn'] / rates[(k, tick)]:.2f}x (target <= 1.5x)")
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"model {policy.n_params / 1e6:.2f}M params, torch threads {torch.get_num_threads()}, commit {rev}")


if __name__ == "__main__":
    main()
