"""Sampler actors (``cluster.samplers=ray``, swarm_runtime/cluster/samplers.py): decisions per second of the batched
episode loop with its bids and actions drawn in a sampler actor on a local Ray, against in process.

The tiny job's swarm (the default model, ``domain=minecraft task=wooden_pickaxe``, a short SFT so the models emit
real actions), the same seeds played ``--repeats`` times with each sampler, alternated, after a warm-up batch (the
best wall of each is kept); the episodes must come out the same (the actor draws what the trainer would). Prints
each rate, the ratio, and the seconds one Ray call adds.

    python benchmarks/sampler_actors.py [--envs 2,32] [--decisions 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from loguru import logger

from swarm_runtime.config.load import resolve
from swarm_runtime.core.loop import new_slots
from swarm_runtime.learn.sft import collect_demos, sft
from swarm_runtime.plugins.manager import get_registry
from swarm_runtime.runs.context import RunContext
from swarm_runtime.sampling.local import LocalLearner, LocalSampler, model_names
from swarm_runtime.sampling.play import play


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="wooden_pickaxe")
    ap.add_argument("--envs", default="2,32", help="envs per batch (comma-separated: one measurement each)")
    ap.add_argument("--decisions", type=int, default=16, help="decision cap (the tiny job's task.max_decisions)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each sampler per batch size (the best is kept)")
    args = ap.parse_args()
    logger.remove()
    pm, reg = get_registry()
    cfg = resolve(["domain=minecraft", f"task={args.task}", f"task.max_decisions={args.decisions}"], reg)
    ctx = RunContext(cfg, pm, reg, None)
    agents, policies = ctx.build_swarm()
    demos = collect_demos(ctx.domain, ctx.task, ctx.seeds("train")[:2])
    for i, (role, pol) in enumerate(policies.items()):
        sft(pol, demos[role], 1, float(cfg.algo.sft.lr), 64, i, progress=False)
    coord, seeds, cap = ctx.coordinator(), ctx.seeds("train"), int(ctx.task.max_decisions)
    models = model_names(agents)

    def run(sampler, batch):
        states = [p.rng_state() for p in policies.values()]
        t0 = time.perf_counter()
        calls = getattr(sampler, "calls", 0)
        with torch.no_grad():
            eps = play(
                new_slots(ctx.domain, ctx.task, batch),
                agents,
                coord,
                ctx.domain,
                cap,
                random.Random(0),
                sampler=sampler,
                models=models,
            )
        wall = time.perf_counter() - t0
        for p, s in zip(policies.values(), states):  # the next sampler starts from the same generators
            p.set_rng_state(s)
        n = sum(len(e.turns) for e in eps)
        return (
            n,
            wall,
            [[(t.winner, t.bids, t.action_tokens, t.action_logprobs) for t in e.turns] for e in eps],
            getattr(sampler, "calls", 0) - calls,
        )

    from swarm_runtime.cluster.samplers import RaySampler

    learner = LocalLearner(policies)
    local = LocalSampler(policies, learner)
    t0 = time.perf_counter()
    actor = RaySampler(learner, LocalSampler, num_cpus=2)
    up = time.perf_counter() - t0
    try:
        run(local, seeds[:2]), run(actor, seeds[:2])  # warm-up
        print(
            f"minecraft/{args.task}, model {cfg.model.name} ({next(iter(policies.values())).n_params / 1e6:.2f}M "
            f"params x {len(policies)} agents), torch threads {torch.get_num_threads()}, decision cap {cap}; "
            f"Ray and the actor up in {up:.1f} s"
        )
        for n_envs in [int(x) for x in args.envs.split(",")]:
            batch = seeds[:n_envs]
            best: dict = {}
            for _ in range(args.repeats):  # alternated; the best wall of each (the machine is shared)
                for name, sampler in (("local", local), ("actor", actor)):
                    res = run(sampler, batch)
                    if name not in best or res[1] < best[name][1]:
                        best[name] = res
            (nl, wl, el, _), (na, wa, ea, calls) = best["local"], best["actor"]
            assert el == ea, "the sampler actor drew other episodes than in process"
            print(
                f"{n_envs} envs: in process {nl} decisions in {wl:.2f} s = {nl / wl:.1f} decisions/s; "
                f"sampler actor {na / wa:.1f} decisions/s ({calls} Ray calls, "
                f"{(wa - wl) / max(1, calls) * 1e3:.1f} ms added per call): {(na / wa) / (nl / wl):.2f}x in process"
            )
    finally:
        actor.close()


if __name__ == "__main__":
    main()
