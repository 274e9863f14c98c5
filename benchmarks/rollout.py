"""Rollout throughput: the batched episode loop against a naive loop.

Prints, from one run on the same models and seeds:
- agent-decisions per second of the batched loop (all envs of a turn in one
  batch per model) and of a naive loop (one env at a time: one bid call per
  agent, one action call, one env step), and their ratio;
- the share of the batched loop's wall time spent outside model forward passes;
- the batched loop's rate with common random numbers (keyed Gumbel-max sampling,
  ``algo.common_random_numbers``) as a fraction of its rate with the generators;
- where the domain lists action choices (Minecraft, VLN-CE), the time of one
  batched action generation with constrained decoding (``model.constrained_actions``)
  as a multiple of the free-text time, on the same action prompts (episode lengths
  change with the constraint, so the loop's own rate would not compare like with like).

    python benchmarks/rollout.py [--envs 32] [--decisions 60] [--domain minecraft --task iron_pickaxe] [--hardware h200]
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
from swarm_runtime.sampling.play import play


class ForwardTimer:
    """Accumulates wall time spent inside the models' forward passes."""

    def __init__(self, models):
        self.total, self._t0 = 0.0, 0.0
        for m in models:
            m.register_forward_pre_hook(self._pre)
            m.register_forward_hook(self._post)

    def _pre(self, module, *_):
        if next(module.parameters()).is_cuda:
            torch.cuda.synchronize()
        self._t0 = time.perf_counter()

    def _post(self, module, *_):
        if next(module.parameters()).is_cuda:
            torch.cuda.synchronize()  # kernels run asynchronously: count them inside the forward pass
        self.total += time.perf_counter() - self._t0


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domain", default="minecraft")
    ap.add_argument("--task", default="iron_pickaxe")
    ap.add_argument("--envs", type=int, default=32)
    ap.add_argument("--naive-envs", type=int, default=4, help="episodes of the naive loop (it is slow)")
    ap.add_argument("--decisions", type=int, default=60, help="decision cap of the benchmark episodes")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--hardware", default="cpu", help="hardware preset (cpu, or a GPU one: h200, b200, rtx_pro_6000)")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    logger.remove()
    if args.threads:
        torch.set_num_threads(args.threads)
    pm, reg = get_registry()
    cfg = resolve(
        [
            f"domain={args.domain}",
            f"task={args.task}",
            f"task.max_decisions={args.decisions}",
            f"hardware={args.hardware}",
        ],
        reg,
    )
    ctx = RunContext(cfg, pm, reg, None)
    agents, policies = ctx.build_swarm()
    # A short SFT so the models emit real actions (the same models serve both loops).
    demos = collect_demos(ctx.domain, ctx.task, ctx.seeds("train")[:4])
    for i, (role, pol) in enumerate(policies.items()):
        sft(pol, demos[role], 1, float(cfg.algo.sft.lr), 64, i, progress=False)
    timer = ForwardTimer([p.model for p in policies.values()])
    coord, seeds = ctx.coordinator(), ctx.seeds("train")
    cap = int(ctx.task.max_decisions)

    prompts: dict[int, list[str]] = {}  # agent -> action prompts of its acted turns (last run)

    def run(batches, keyed: bool = False):
        n, t0, f0 = 0, time.perf_counter(), timer.total
        prompts.clear()
        with torch.no_grad():
            for batch in batches:
                slots = new_slots(ctx.domain, ctx.task, batch)
                for k, s in enumerate(slots):
                    s.episode.noise = k + 1 if keyed else None
                eps = play(slots, agents, coord, ctx.domain, cap, random.Random(0))
                n += sum(len(e.turns) for e in eps)
                for e in eps:
                    for t in e.acted:
                        prompts.setdefault(t.winner, []).append(t.action_prompt)
        wall = time.perf_counter() - t0
        return n, wall, timer.total - f0

    run([seeds[:4]])  # warm-up
    nb, wb, fb = run([seeds[: args.envs]])
    nn, wn, fn = run([[s] for s in seeds[: args.naive_envs]])
    nk, wk, _ = run([seeds[: args.envs]], keyed=True)
    rate_b, rate_n = nb / wb, nn / wn
    print(
        f"domain {args.domain}/{args.task}, model {cfg.model.name} on {cfg.hardware.device} "
        f"({next(iter(policies.values())).n_params / 1e6:.2f}M params x {len(policies)} agents), "
        f"torch threads {torch.get_num_threads()}, decision cap {cap}"
    )
    print(f"batched loop: {args.envs} envs, {nb} decisions in {wb:.1f}s = {rate_b:.1f} decisions/s")
    print(f"naive loop:   {args.naive_envs} envs one at a time, {nn} decisions in {wn:.1f}s = {rate_n:.1f} decisions/s")
    print(f"speed-up batched / naive: {rate_b / rate_n:.1f}x (target >= 10x)")
    print(f"batched loop time outside model forward passes: {100 * (wb - fb) / wb:.1f}% (target <= 20%)")
    print(f"naive loop time outside model forward passes:   {100 * (wn - fn) / wn:.1f}%")
    print(
        f"batched loop with common random numbers: {nk} decisions in {wk:.1f}s = {nk / wk:.1f} decisions/s, "
        f"{(nk / wk) / rate_b:.2f}x the generators' rate"
    )
    choices = {role: ctx.domain.action_choices(ctx.task, role) for role in policies}
    if any(choices.values()):
        free, constrained = constrained_cost(agents, prompts, choices, args.envs)
        print(
            f"action generation with constrained decoding: {constrained:.2f}s against {free:.2f}s free "
            f"on the same prompts, {constrained / free:.2f}x the free-text time"
        )


def constrained_cost(agents, prompts: dict[int, list[str]], choices: dict, envs: int) -> tuple[float, float]:
    """Seconds of batched action generation on each agent's action ``prompts`` (its first ``envs``, 3 times), free
    and with constrained decoding over its role's action ``choices``."""
    spent = {False: 0.0, True: 0.0}  # constrained? -> seconds of action generation
    with torch.no_grad():
        for a, ps in prompts.items():
            pol, texts = agents[a].policy, choices[agents[a].role]
            if not texts:
                continue
            for constrain in (False, True):
                pol.action_trie = None
                if constrain:
                    pol.constrain_actions(texts)
                t0 = time.perf_counter()
                for _ in range(3):
                    pol.act(ps[:envs])
                spent[constrain] += time.perf_counter() - t0
    return spent[False], spent[True]


if __name__ == "__main__":
    main()
