"""GPU check of model.adapter=lora, for a session with one CUDA GPU (fits in ~10 minutes on
an H200; no download): a Qwen2-style model of ~0.5B parameters built from a config (random weights,
bf16), then for 3 and 12 adapter agents (one adapter each) on one base:

1. one SFT step of every agent's adapter (:func:`swarm_runtime.learn.sft.sft`, one step each);
2. one MPT update: a rollout turn over ``--envs`` envs (every agent's bid prompt in one mixed-adapter
   batch, then the winners' actions generated in one mixed batch) and one REINFORCE step per agent
   (:func:`swarm_runtime.learn.action.action_update`);

printing the peak CUDA memory (``torch.cuda.max_memory_allocated``), tokens/s of each phase, and the
memory plan's estimate for the same settings (:mod:`swarm_runtime.models.memory_plan`) beside it.

    python benchmarks/gpu_adapters.py [--agents 3 12] [--envs 16] [--prompt 512] [--profile h200]

Without CUDA it prints why and exits 0 (CI has no GPU). ``--cpu-tiny`` runs the same steps on the CPU
with the tiny model's shape in float32 (``hardware=cpu``; peak memory is then the process's peak RSS): a
check of the script's logic, not a measurement.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

#: Qwen2-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV heads), a 150k-word vocabulary.
ARCH = dict(hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14, num_kv_heads=2, max_positions=4096)
WORDS = 150_000
#: ``--cpu-tiny``: the tiny CPU model's shape and a domain-sized vocabulary.
TINY = dict(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2, max_positions=512)
TINY_WORDS = 300

# The synthetic prompts are longer than model.max_prompt_tokens on purpose and measured cut from the left to the
# limit (SWARM_PROMPT_OVERFLOW=warn; docs/guides/write-a-domain.md, section 4), not refused: keep that cut here.
os.environ.setdefault("SWARM_PROMPT_OVERFLOW", "warn")


class Device:
    """CUDA, or the CPU for ``--cpu-tiny`` (peak resident memory instead of peak CUDA memory)."""

    def __init__(self, cpu: bool):
        import torch

        self.torch, self.cpu = torch, cpu
        self.name = "cpu" if cpu else "cuda"

    def sync(self) -> None:
        if not self.cpu:
            self.torch.cuda.synchronize()

    def reset(self) -> None:
        if not self.cpu:
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()

    def peak(self) -> float:
        if self.cpu:
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
        return float(self.torch.cuda.max_memory_allocated())


# Long on purpose: a measurement script's one procedure, its phases in the order the module docstring lists them,
# each printing as it goes (split a phase out when another script needs it).
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, nargs="+", default=[3, 12])
    ap.add_argument("--envs", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=512, help="prompt length in tokens")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--profile", default="h200", help="hardware profile whose dtype/micro-batch/memory apply")
    ap.add_argument(
        "--cpu-tiny",
        action="store_true",
        help="the same steps on the CPU, tiny shape, float32 (checks the script's logic; no measurement)",
    )
    args = ap.parse_args()
    import torch

    arch, n_words = (TINY, TINY_WORDS) if args.cpu_tiny else (ARCH, WORDS)
    if args.cpu_tiny:
        args.profile = "cpu"
    dev = Device(args.cpu_tiny)
    if not args.cpu_tiny and not torch.cuda.is_available():
        print("benchmarks/gpu_adapters.py: no CUDA device (torch.cuda.is_available() is False); skipped")
        return 0
    from loguru import logger
    from omegaconf import OmegaConf

    from swarm_runtime.config.load import resolve
    from swarm_runtime.core.episode import Agent
    from swarm_runtime.learn.action import action_update
    from swarm_runtime.learn.optim import make_optimizer
    from swarm_runtime.learn.sft import Example, sft
    from swarm_runtime.models.adapters import build_adapter_swarm
    from swarm_runtime.models.memory_plan import make_plan
    from swarm_runtime.models.mixed_batch import MixedBatch
    from swarm_runtime.plugins.manager import get_registry

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    _, reg = get_registry()
    words = [f"w{i}" for i in range(n_words)]
    rng = random.Random(0)

    def prompt() -> str:
        return " ".join(f"w{rng.randrange(n_words)}" for _ in range(args.prompt - 2))

    if args.cpu_tiny:
        print("device: cpu (--cpu-tiny: the tiny shape in float32, a check of the logic)")
    else:
        print(
            f"device: {torch.cuda.get_device_name(0)}, "
            f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB"
        )
    for n in args.agents:
        dev.reset()
        cfg = resolve(
            [
                f"hardware={args.profile}",
                "model.adapter=lora",
                f"model.lora.rank={args.rank}",
                f"model.lora.alpha={2 * args.rank}",
                f"model.max_prompt_tokens={args.prompt}",
                "model.max_action_tokens=8",
                f"algo.envs_per_step={args.envs}",
                "algo.branches_per_episode=1",
                *[f"model.{k}={v}" for k, v in arch.items()],
            ],
            reg,
        )
        hw = cfg.hardware
        model_cfg = OmegaConf.merge(cfg.model, {"device": dev.name})
        roles = [f"agent{i}" for i in range(n)]
        t0 = time.perf_counter()
        policies = build_adapter_swarm(model_cfg, hw, words, [0.0, 0.2, 0.4, 0.6, 0.8], roles, list(range(n)))
        build_s = time.perf_counter() - t0
        shared = next(iter(policies.values())).shared_base
        vocab = shared.model.get_base_model().config.vocab_size
        plan = make_plan(cfg, n, n, vocab)
        mb = int(hw.micro_batch or cfg.algo.minibatch) if not args.cpu_tiny else 4
        # 1. one SFT step per adapter
        dev.sync()
        t0, tokens = time.perf_counter(), 0
        for i, p in enumerate(policies.values()):
            ex = [Example("act", prompt(), "w1 w2 w3") for _ in range(mb)]
            sft(p, ex, 1, 1e-4, mb, i, progress=False, max_steps=1)
            tokens += sum(len(p.encode_prompt(e.prompt)) + 4 for e in ex)
        dev.sync()
        sft_s = time.perf_counter() - t0
        sft_tps = tokens / sft_s
        # 2. one MPT update: a rollout turn (mixed batches) + a REINFORCE step per agent
        agents = [Agent(r, r, p) for r, p in policies.items()]
        rows = [p for p in policies.values() for _ in range(args.envs)]
        bid_prompts = [prompt() for _ in rows]
        act_rows = [rows[k * n % len(rows)] for k in range(args.envs)]
        act_prompts = [prompt() for _ in range(args.envs)]
        dev.sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            MixedBatch(rows).bid(bid_prompts)
            acts = MixedBatch(act_rows).act(act_prompts)
        dev.sync()
        roll_s = time.perf_counter() - t0
        roll_tokens = (len(rows) + args.envs) * args.prompt + sum(len(a.tokens) for a in acts)
        idx = {id(p): i for i, p in enumerate(policies.values())}
        samples = [
            (idx[id(p)], q, a.tokens, float(k % 3)) for k, (p, q, a) in enumerate(zip(act_rows, act_prompts, acts))
        ]
        opts = {r: make_optimizer(p.parameters(), 1e-5, 0.0, 10) for r, p in policies.items()}
        t0 = time.perf_counter()
        action_update(agents, samples, opts, reward_scale=1.0, minibatch=mb, grad_clip=1.0)
        dev.sync()
        upd_s = time.perf_counter() - t0
        upd_tokens = sum(len(policies[agents[s[0]].role].encode_prompt(s[1])) + len(s[2]) for s in samples)
        peak = dev.peak()
        print(
            f"\n{n} adapter agents on one {shared.n_base / 1e9:.2f}B base ({hw.dtype or 'float32'}, rank {args.rank}, "
            f"micro-batch {mb}, {args.envs} envs, {args.prompt}-token prompts); built in {build_s:.1f}s"
        )
        print(f"  SFT step of every adapter: {sft_s:.2f}s, {sft_tps:,.0f} tokens/s")
        print(
            f"  rollout turn (mixed bid batch of {len(rows)} rows + actions): {roll_s:.2f}s, "
            f"{roll_tokens / roll_s:,.0f} tokens/s"
        )
        print(f"  REINFORCE step per agent: {upd_s:.2f}s, {upd_tokens / upd_s:,.0f} tokens/s")
        what = "peak RSS of the process" if args.cpu_tiny else "peak CUDA memory"
        print(f"  {what} {peak / 2**30:.2f} GiB; the memory plan's estimate {plan.total / 2**30:.2f} GiB")
        print("  " + plan.format().replace("\n", "\n  "))
        del policies, agents, opts, shared
    return 0


if __name__ == "__main__":
    sys.exit(main())
