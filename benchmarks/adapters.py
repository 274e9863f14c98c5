"""Adapters on one base vs full copies, on a ~100M-parameter Qwen2-style model built
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
#: ``--size 20m``: a moderate model between the two (~21M parameters with the 30k vocabulary).
MID = dict(hidden_size=384, intermediate_size=1024, num_layers=6, num_heads=6, num_kv_heads=2, max_positions=512)

# The synthetic prompts are longer than model.max_prompt_tokens on purpose and measured cut from the left to the
# limit (SWARM_PROMPT_OVERFLOW=warn; docs/guides/write-a-domain.md, section 4), not refused: keep that cut here.
os.environ.setdefault("SWARM_PROMPT_OVERFLOW", "warn")


def use_size(size: str) -> None:
    global ARCH, WORDS
    if size == "tiny":
        ARCH, WORDS = TINY, TINY_WORDS
    elif size == "20m":
        ARCH = MID


def peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def model_cfg(rank: int):
    from omegaconf import OmegaConf

    from swarm_runtime.config.schema import LORA_TARGETS

    return OmegaConf.create(
        {
            **ARCH,
            "bid_mode": "logits",
            "temperature": 1.0,
            "max_action_tokens": 4,
            "max_bid_tokens": 6,
            "max_prompt_tokens": 96,
            "dtype": "float32",
            "device": "cpu",
            "path": None,
            "lora": {"rank": rank, "alpha": 2.0 * rank, "dropout": 0.0, "target_modules": list(LORA_TARGETS)},
        }
    )


def words() -> list[str]:
    return [f"w{i}" for i in range(WORDS)]


def prompts(n: int, seed: int, length: int = 64) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(WORDS)}" for _ in range(length)) for _ in range(n)]


def build(mode: str, agents: int, rank: int, adapters: int | None = None):
    """``(list of per-agent policies, the object serving all rows at once or None)``. ``lora``:
    ``adapters`` distinct adapters (default: one per agent), agent ``i`` on adapter ``i % adapters``
    (replicas of a role share its adapter)."""
    import torch
    from omegaconf import OmegaConf

    from swarm_runtime.models.adapters import build_adapter_swarm
    from swarm_runtime.models.mixed_batch import MixedBatch
    from swarm_runtime.models.transformers_backend import make_transformers_policy

    levels = [0.0, 0.2, 0.4, 0.6, 0.8]
    cfg = model_cfg(rank)
    if mode == "lora":
        k = adapters or agents
        roles = [f"agent{i}" for i in range(k)]
        pol = build_adapter_swarm(cfg, OmegaConf.create({}), words(), levels, roles, list(range(k)))
        torch.manual_seed(0)
        with torch.no_grad():  # distinct adapters (LoRA B starts at zero)
            for p in pol.values():
                for w in p.parameters():
                    w.add_(torch.randn_like(w) * 0.01)
        distinct = list(pol.values())
        policies = [distinct[i % k] for i in range(agents)]
        return policies, MixedBatch(policies)
    n = 1 if mode == "base" else agents
    policies = [make_transformers_policy(cfg, words(), levels, seed=i) for i in range(n)]
    return policies, None


def status_mib() -> dict:
    """Current and peak resident memory (``VmRSS``, ``VmHWM``) in MiB, from /proc (Linux)."""
    out = {}
    try:
        for line in open("/proc/self/status"):
            if line.startswith(("VmRSS", "VmHWM")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) / 1024
    except OSError:
        pass
    return out


def measure_memory(args) -> dict:
    """One setting in this process: build, the rollout (every agent's bid prompt in every env as one
    batch, then one action per env), then ``--steps`` training steps (agent ``i % agents``'s policy:
    a REINFORCE-style loss over ``--envs`` rows, backward, clipped AdamW step, gradients freed), with
    ``--optimizers`` AdamW per distinct trained policy (the trainer has two per role: action and bid)."""
    import torch

    from swarm_runtime.learn.optim import make_optimizer

    torch.set_num_threads(args.threads)
    phases = {"start": status_mib()}
    policies, mixed = build(args.mode, args.child, args.rank, args.adapters)
    phases["built"] = status_mib()
    steps = args.steps if args.steps is not None else len(policies)
    optimizers: dict[int, list] = {}
    if args.train and args.mode != "base":  # made before the rollout, as the trainer makes them
        for p in policies[:steps]:
            if id(p) not in optimizers:
                optimizers[id(p)] = [
                    make_optimizer(p.parameters(), 1e-4, 0.0, 10, eager_state=args.eager_state)
                    for _ in range(args.optimizers)
                ]
    n_rows = args.rollout_agents or len(policies)  # agents whose bid prompts the rollout scores
    bid_prompts = prompts(args.envs * n_rows, 1)
    act_prompts = prompts(args.envs, 2)
    rollout(policies, mixed, bid_prompts, act_prompts, args.envs)
    phases["rollout"] = status_mib()
    rss_rollout = peak_rss()
    if optimizers:
        train_steps(policies, optimizers, steps, args.optimizers, act_prompts, phases)
        phases["trained"] = status_mib()
    distinct = list({id(p): p for p in policies}.values())
    trained = [w for p in distinct for w in p.parameters()] if optimizers else []
    state = sum(
        t.numel() * t.element_size()
        for opts in optimizers.values()
        for opt, _ in opts
        for st in opt.state.values()
        for t in st.values()
        if torch.is_tensor(t)
    )
    out = {
        "mode": args.mode,
        "agents": len(policies) if args.mode != "base" else 1,
        "policies": len(distinct),
        "train": bool(optimizers),
        "steps": steps if optimizers else 0,
        "optimizers": args.optimizers,
        "rollout_rows": len(bid_prompts),
        "peak_rss": peak_rss(),
        "peak_rss_rollout": rss_rollout,
        "phases": phases,
        "trained_bytes": sum(w.numel() * w.element_size() for w in trained),
        "optimizer_bytes": state,
    }
    if mixed is not None:
        shared = policies[0].shared_base
        out["base_params"] = shared.n_base
        out["adapter_params"] = policies[0].n_params - shared.n_base
    else:
        out["params_per_copy"] = policies[0].n_params
    return out


def rollout(policies: list, mixed, bid_prompts: list[str], act_prompts: list[str], envs: int) -> None:
    """The rollout's model calls: every agent's bid prompt in every env, then one action per env; one mixed-adapter
    batch each (``mixed``), else one call per full copy over its rows."""
    import torch

    from swarm_runtime.models.mixed_batch import MixedBatch

    with torch.no_grad():
        rows = [policies[i // envs % len(policies)] for i in range(len(bid_prompts))]
        actors = [policies[i % len(policies)] for i in range(envs)]
        if mixed is not None:
            MixedBatch(rows).bid(bid_prompts)
            MixedBatch(actors).act(act_prompts)
        else:
            for p in policies:  # one call per full copy over its rows
                mine = [q for q, r in zip(bid_prompts, rows) if r is p]
                if mine:
                    p.bid(mine)
            for p in policies:
                mine = [q for q, r in zip(act_prompts, actors) if r is p]
                if mine:
                    p.act(mine)


def train_steps(policies: list, optimizers: dict, steps: int, n_opt: int, act_prompts: list[str], phases: dict) -> None:
    """``steps`` training steps, step ``k`` on policy ``k % agents`` with its ``k % n_opt``-th optimizer: a
    REINFORCE-style loss over the action prompts, backward, clipped AdamW step; memory after the first in
    ``phases``."""
    from swarm_runtime.learn.optim import clip_and_step

    for k in range(steps):
        p = policies[k % len(policies)]
        opt, sched = optimizers[id(p)][k % n_opt]
        p.train()
        resp = [p.action_target("w1 w2 w3")] * len(act_prompts)
        loss = -p.logprobs(act_prompts, resp).mean()
        loss.backward()
        del loss
        clip_and_step(list(p.parameters()), opt, sched, 1.0)
        p.eval()
        if k == 0:
            phases["step 1"] = status_mib()


def run_child(argv: list[str]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run([sys.executable, __file__, *argv], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{argv} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


#: ``memory``'s settings: (label, mode, agents, distinct adapters, agents in the rollout, training steps).
def memory_settings(hi: int, roles: int, full: bool) -> list[tuple]:
    out = [
        ("base alone, the same rollout", "base", 1, None, hi, 0),
        ("one model (base + 1 adapter), the same rollout and steps", "lora", 1, 1, hi, hi),
        (f"{hi} agents, {hi} distinct adapters (worst case)", "lora", hi, hi, hi, hi),
        (
            f"{hi} agents = {roles} roles x {hi // roles} replicas, {roles} adapters (the paper's population)",
            "lora",
            hi,
            roles,
            hi,
            hi,
        ),
        (f"{roles} agents, {roles} adapters", "lora", roles, roles, roles, roles),
    ]
    if full:
        out += [
            ("1 full copy", "full", 1, None, 1, 1),
            (f"{roles} full copies", "full", roles, None, roles, roles),
            (f"{hi} full copies, rollout only", "full", hi, None, hi, 0),
        ]
    return out


def memory(args) -> None:
    hi, roles = max(args.agents), min(args.agents)
    common = [
        "--threads",
        str(args.threads),
        "--rank",
        str(args.rank),
        "--envs",
        str(args.envs),
        "--optimizers",
        str(args.optimizers),
        "--size",
        args.size,
    ] + (["--eager-state"] if args.eager_state else [])
    print(
        f"model: {ARCH}, {WORDS} words; LoRA rank {args.rank}; {args.envs} envs (bid rows per agent, action rows); "
        f"{args.optimizers} AdamW per trained policy (moments allocated "
        f"{'when made' if args.eager_state else 'at the first step'}); torch threads {args.threads}; "
        "one fresh process per setting"
    )
    res = {}
    settings = memory_settings(hi, roles, not args.no_full)
    argvs = [
        ["_child", "--mode", mode, "--child", str(n), "--rollout-agents", str(rollout), "--steps", str(steps), *common]
        + (["--adapters", str(k)] if k else [])
        + (["--train"] if steps else [])
        for _, mode, n, k, rollout, steps in settings
    ]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # separate processes: peaks do not mix
        results = pool.map(run_child, argvs)
        for (label, *_), r in zip(settings, results):
            res[label] = r
            ph = r["phases"]
            print(
                f"{label:<72} peak {r['peak_rss'] / MiB:6.0f} MiB (rollout {r['peak_rss_rollout'] / MiB:6.0f}; RSS built "
                f"{ph['built'].get('VmRSS', 0):5.0f}, after rollout {ph['rollout'].get('VmRSS', 0):5.0f}"
                + (
                    f", after step 1 {ph['step 1'].get('VmRSS', 0):5.0f}, after all {ph['trained'].get('VmRSS', 0):5.0f}"
                    if "trained" in ph
                    else ""
                )
                + f"); {r['rollout_rows']} bid rows, {r['steps']} steps, "
                f"trained tensors {r['trained_bytes'] / MiB:.1f} MiB + AdamW state {r['optimizer_bytes'] / MiB:.1f} MiB",
                flush=True,
            )
    labels = [x[0] for x in memory_settings(hi, roles, not args.no_full)]
    base, one, worst, pop, few = (res[labels[i]] for i in range(5))
    print(
        f"\nbase: {worst['base_params'] / 1e6:.1f}M parameters; one adapter (rank {args.rank}): "
        f"{worst['adapter_params'] / 1e6:.2f}M ({worst['adapter_params'] / worst['base_params']:.2%} of the base)"
    )
    for name, r in ((f"{hi} distinct adapters", worst), (f"{roles} adapters x {hi // roles} replicas", pop)):
        print(
            f"{hi} agents, {name}: / one model doing the same rollout and steps {r['peak_rss'] / one['peak_rss']:.3f}x "
            f"(target <= 1.15); / the base alone doing the rollout only {r['peak_rss'] / base['peak_rss']:.3f}x"
        )
    state = (worst["trained_bytes"] + worst["optimizer_bytes"]) / hi  # exact tensor bytes per adapter
    rss_per = (worst["peak_rss"] - few["peak_rss"]) / (hi - roles)
    line = (
        f"training state per extra adapter agent: {state / MiB:.1f} MiB of tensors (weights + AdamW moments); "
        f"peak RSS per extra agent {rss_per / MiB:.1f} MiB ({hi} vs {roles} distinct adapters)"
    )
    if not args.no_full:
        f1, f3 = res[labels[5]], res[labels[6]]
        full_state = (f3["trained_bytes"] + f3["optimizer_bytes"]) / roles
        full_per = (f3["peak_rss"] - f1["peak_rss"]) / (roles - 1)
        line += (
            f"; a full copy: {full_state / MiB:.0f} MiB of tensors, peak RSS {full_per / MiB:.0f} MiB per extra agent"
            f" -> {state / full_state:.2%} of a full copy's tensors (target < 5%)"
        )
    print(line)


def batching(args) -> None:
    """One turn of ``n`` agents with distinct adapters in ``--envs`` envs: bid scoring (every agent's
    bid prompt in every env) and action generation (one row per env, agent ``env % n``), greedy so both
    ways generate the same tokens. Mixed: one :class:`MixedBatch` call for the bids and one for the
    actions. Per agent: each agent's own call over its rows (the single-adapter path: the base with
    that adapter's LoRA on every row, no adapter switching), the best a runtime without mixed
    batches can do short of one merged full copy per agent."""
    import torch

    from swarm_runtime.models.mixed_batch import MixedBatch

    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    print(
        f"model: {ARCH}, {WORDS} words; LoRA rank {args.rank}; {args.envs} envs; torch threads {args.threads}; "
        f"{'CPU' if args.clock == 'cpu' else 'wall-clock'} time; "
        f"best of {args.repeats}; load average {os.getloadavg()[0]:.1f}"
    )
    for n in args.agents:
        policies, _ = build("lora", n, args.rank)
        bid_rows = [p for p in policies for _ in range(args.envs)]
        bid_prompts = prompts(len(bid_rows), 1)
        act_rows = [policies[i % n] for i in range(args.envs)]
        act_prompts = prompts(args.envs, 2)
        for p in policies:
            p.temperature = 0.0  # greedy: both ways generate the same tokens (the same work)

        def mixed_bid():
            MixedBatch(bid_rows).bid(bid_prompts)

        def mixed_act():
            return [r.tokens for r in MixedBatch(act_rows).act(act_prompts)]

        def per_agent_bid():
            for i, p in enumerate(policies):
                p.bid(bid_prompts[i * args.envs : (i + 1) * args.envs])

        def per_agent_act():
            out = [None] * args.envs
            for i, p in enumerate(policies):
                mine = [k for k in range(args.envs) if k % n == i]
                if mine:
                    for k, r in zip(mine, p.act([act_prompts[k] for k in mine])):
                        out[k] = r.tokens
            return out

        times = {}
        with torch.no_grad():
            assert mixed_act() == per_agent_act()  # the same tokens both ways
            for name, fn in (
                ("mixed_bid", mixed_bid),
                ("per_bid", per_agent_bid),
                ("mixed_act", mixed_act),
                ("per_act", per_agent_act),
            ):
                fn()  # warm-up
                best = float("inf")
                for _ in range(args.repeats):
                    t0 = clock()
                    fn()
                    best = min(best, clock() - t0)
                times[name] = best
        mixed, per = times["mixed_bid"] + times["mixed_act"], times["per_bid"] + times["per_act"]
        print(
            f"{n:>3} agents x {args.envs} envs: one mixed-adapter batch {mixed * 1e3:8.1f} ms, one call per agent "
            f"{per * 1e3:8.1f} ms: {per / mixed:.2f}x  (bids {times['mixed_bid'] * 1e3:.1f} vs "
            f"{times['per_bid'] * 1e3:.1f} ms: {times['per_bid'] / times['mixed_bid']:.2f}x; actions "
            f"{times['mixed_act'] * 1e3:.1f} vs {times['per_act'] * 1e3:.1f} ms: "
            f"{times['per_act'] / times['mixed_act']:.2f}x)",
            flush=True,
        )
        del policies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["memory", "batching", "_child"])
    ap.add_argument("--agents", type=int, nargs="+", default=[3, 12])
    ap.add_argument("--envs", type=int, default=4, help="envs per turn (bid rows per agent; action rows)")
    ap.add_argument("--rank", type=int, default=8, help="LoRA rank (model.lora.rank default)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="`batching`: wall-clock seconds, or this process's CPU seconds (time.process_time: with "
        "--threads 1 the same on an idle machine, and far less disturbed by other jobs on a shared one)",
    )
    ap.add_argument(
        "--size",
        choices=["100m", "20m", "tiny"],
        default="100m",
        help="the ~100M model, a ~21M one, or model=tiny's shape",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--optimizers",
        type=int,
        default=1,
        choices=[1, 2],
        help="AdamW per trained policy in `memory` (2: the trainer's action + bid optimizers)",
    )
    ap.add_argument("--no-full", action="store_true", help="`memory` without the full-copy settings")
    ap.add_argument("--jobs", type=int, default=1, help="`memory`: settings measured at once (each its own process)")
    ap.add_argument(
        "--eager-state",
        action="store_true",
        help="`memory`: AdamW moments allocated when the optimizers are made (make_optimizer(eager_state=True))",
    )
    ap.add_argument("--mode", choices=["base", "full", "lora"], help=argparse.SUPPRESS)
    ap.add_argument("--adapters", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rollout-agents", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)
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
