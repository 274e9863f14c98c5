"""GPU check of the sharded learner (``train.engine=fsdp``; docs/guides/sharded-learners.md, "The GPU check"), for a
session with one CUDA GPU (a few minutes on an H200; no download): FSDP2 with NCCL on a group of one rank on the GPU
(NCCL does not allow two ranks on one device) against the in-process update on the same GPU, for fp32 weights and for
bf16 weights (in process: bf16 weights stepped through fp32 masters, ``MasterWeightAdamW``; sharded: the fp32 masters
sharded, computing in bf16 under FSDP2's ``MixedPrecisionPolicy``, gradients reduced in fp32).

The model: a Qwen2-style causal LM built from a config (random weights; ``--hidden``/``--layers``, by default about
0.1B parameters), the update: one REINFORCE step (``accumulate_and_step``, the run's AdamW) on ``--samples`` synthetic
prompts of the minecraft words with seeded advantages. Prints, per dtype, the max abs difference of the fp32
parameters (masters for bf16) and of the weights, how far the update moved them, the loss and gradient norm of both,
the seconds of each update and the peak CUDA memory.

    python benchmarks/gpu_sharded.py [--hidden 768] [--layers 12] [--samples 64] [--dtypes float32 bfloat16]

Without CUDA it prints one line and exits 0 (CI has no GPU). ``--cpu-check`` runs the same on the CPU with gloo and a
tiny shape: a check of the script's logic, not a measurement.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import time

#: The minecraft-like words of the synthetic prompts and actions.
WORDS = "you are Logger Smith Miner goal chop tree craft planks stick table log stone iron pickaxe action : .".split()


def make_policy(hidden: int, layers: int, device: str, dtype: str, seed: int = 0):
    """A policy over a Qwen2-style model of ``hidden`` x ``layers`` built from a config, on ``device`` in ``dtype``."""
    import torch
    from omegaconf import OmegaConf

    from swarm_runtime.models.transformers_backend import make_transformers_policy

    heads = max(1, hidden // 64)
    cfg = OmegaConf.create(
        dict(
            hidden_size=hidden,
            intermediate_size=4 * hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=max(1, heads // 4),
            max_positions=256,
            bid_mode="logits",
            temperature=1.0,
            max_action_tokens=4,
            max_bid_tokens=2,
            max_prompt_tokens=128,
            device=device,
        )
    )
    policy = make_transformers_policy(cfg, WORDS, (0.0, 0.2, 0.4, 0.6, 0.8), seed)
    policy.model.to(getattr(torch, dtype))
    return policy


def make_batch(policy, n: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    actions = ["chop tree", "craft planks", "craft stick", "craft table", "mine stone"]
    return [
        (
            " ".join(rng.choice(WORDS) for _ in range(48)) + " action :",
            policy.action_target(rng.choice(actions)),
            rng.uniform(-1.0, 1.0),
        )
        for _ in range(n)
    ]


def compare(args, dtype: str, device: str) -> dict:
    """The in-process update and the FSDP2 one (a group of one rank, initialised by the caller) of the same model
    and batch in ``dtype``; the differences and seconds."""
    import torch

    from swarm_runtime.learn.losses import reinforce_chunk
    from swarm_runtime.learn.optim import accumulate_and_step, make_optimizer, master_weight
    from swarm_runtime.learn.sharded import OptimSettings, sharded_update

    make = functools.partial(make_policy, args.hidden, args.layers, device, dtype)
    s = OptimSettings(lr=1e-4, weight_decay=0.01, total_steps=10, eps=1e-6, minibatch=args.minibatch, grad_clip=1.0)
    pol = make()
    batch = make_batch(pol, args.samples)
    before = {n: p.detach().float().clone() for n, p in pol.model.named_parameters()}
    opt, sched = make_optimizer(pol.parameters(), s.lr, s.weight_decay, s.total_steps, s.warmup, eps=s.eps)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync()
    t0 = time.perf_counter()
    loss, norm = accumulate_and_step(pol, batch, s.minibatch, reinforce_chunk, opt, sched, s.grad_clip)
    sync()
    one_s = time.perf_counter() - t0
    one_peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    low = dtype != "float32"
    masters = {n: (master_weight(p) if low else p).detach().float().cpu() for n, p in pol.model.named_parameters()}
    weights = {n: p.detach().cpu() for n, p in pol.model.named_parameters()}
    total = sum(p.numel() for p in pol.model.parameters())
    del pol, opt, sched
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    sync()
    t0 = time.perf_counter()
    state, m = sharded_update(0, 1, make, batch, s, device=device)
    sync()
    fsdp_s = time.perf_counter() - t0
    fsdp_peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    names = [n for n in masters if n in state]
    diff = max(float((state[n].float() - masters[n]).abs().max()) for n in names)
    moved = max(float((masters[n] - before[n].cpu()).abs().max()) for n in names)
    equal = sum(int(state[n].to(weights[n].dtype).eq(weights[n]).sum()) for n in names)
    out = dict(
        dtype=dtype,
        params=total,
        tensors=len(names),
        diff=diff,
        moved=moved,
        weights_equal=equal / max(1, sum(weights[n].numel() for n in names)),
        loss=(m["loss"], loss),
        norm=(m["grad_norm"], norm),
        seconds=(m["seconds"], one_s, fsdp_s),
        peak_gib=(fsdp_peak / 2**30, one_peak / 2**30),
    )
    print(
        f"{dtype}: {total / 1e6:.1f}M parameters, {len(batch)} samples, minibatch {s.minibatch}\n"
        f"  max abs diff of the fp32 parameters{' (masters)' if low else ''} vs in process: {diff:.3g} "
        f"(the update moved them by up to {moved:.3g}); {dtype} weights equal: {out['weights_equal']:.6f}\n"
        f"  loss {m['loss']:.6g} vs {loss:.6g}; grad norm {m['grad_norm']:.6g} vs {norm:.6g}\n"
        f"  seconds: in process {one_s:.2f}; fsdp {fsdp_s:.2f} (model build and sharding included; "
        f"update in rank {m['seconds']:.2f})\n"
        f"  peak CUDA memory GiB: fsdp {out['peak_gib'][0]:.2f}, in process {out['peak_gib'][1]:.2f}",
        flush=True,
    )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--minibatch", type=int, default=8)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    ap.add_argument(
        "--cpu-check", action="store_true", help="on the CPU (gloo), tiny shape: the script's logic, no measurement"
    )
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist

    if args.cpu_check:
        args.hidden, args.layers, args.samples, args.minibatch = 64, 2, 6, 4
        device, backend = "cpu", "gloo"
    elif not torch.cuda.is_available():
        print("gpu_sharded: no CUDA device here (torch.cuda.is_available() is False); nothing measured", flush=True)
        return 0
    else:
        device, backend = "cuda", "nccl"
        torch.cuda.set_device(0)
    os.environ.setdefault("SWARM_PROMPT_OVERFLOW", "warn")
    from swarm_runtime.learn.sharded import free_port

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        if not args.cpu_check:
            print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, backend {backend}", flush=True)
        for dtype in args.dtypes:
            compare(args, dtype, device)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
