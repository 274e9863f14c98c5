"""One REINFORCE update of a real role model, in one process and sharded over a learner group
(swarm_runtime/learn/sharded.py), compared parameter by parameter.

The batch: every action the minecraft expert takes on a few training seeds (prompts as the role's model sees
them), each with a seeded advantage. The 1-process update is ``accumulate_and_step`` with the run's AdamW;
the sharded one runs ``--world`` processes (gloo on 127.0.0.1) under ``--engine fsdp`` (FSDP2 ``fully_shard``)
or ``--engine deepspeed`` (ZeRO-3; needs ``pip install deepspeed`` and, without a GPU, ``DS_ACCELERATOR=cpu``).
Prints the max abs difference of the parameters, how far the update moved them, the loss and global grad
norm of both, each rank's share of the parameters, and the seconds (docs/reference/sharding.md;
figures: docs/notebook/cluster.md).

    python benchmarks/sharded_update.py --engine fsdp --world 2
    DS_ACCELERATOR=cpu /path/to/venv-with-deepspeed/bin/python benchmarks/sharded_update.py --engine deepspeed
"""

from __future__ import annotations

import argparse
import functools
import random
import time

from swarm_runtime.config.load import resolve
from swarm_runtime.learn.losses import reinforce_chunk
from swarm_runtime.learn.optim import accumulate_and_step, make_optimizer
from swarm_runtime.learn.sft import collect_demos
from swarm_runtime.learn.sharded import ENGINES, OptimSettings, spawn_update
from swarm_runtime.models.masters import MASTER_ATTR
from swarm_runtime.models.transformers_backend import cast_weights, make_transformers_policy
from swarm_runtime.plugins.manager import get_registry


def _cast(make, dtype: str):
    """``make()``'s policy with its model's weights in ``dtype`` (``cast_weights``: the rotary buffers kept fp32)."""
    pol = make()
    pol.model = cast_weights(pol.model, dtype)
    return pol


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=ENGINES, default="fsdp")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=2, help="expert episodes whose actions make the batch")
    ap.add_argument("--minibatch", type=int, default=8)
    ap.add_argument("--start-method", default="fork", choices=("fork", "spawn"))
    ap.add_argument(
        "--dtype", default="float32", choices=("float32", "bfloat16"), help="the model's weights (a GPU run's)"
    )
    ap.add_argument("overrides", nargs="*", help="run config keys, e.g. model.hidden_size=128")
    args = ap.parse_args(argv)
    _, reg = get_registry()
    cfg = resolve(["domain=minecraft", "task=iron_pickaxe", *args.overrides], reg)
    domain = reg.domains[cfg.domain]
    words = domain.all_words(cfg.task)
    levels = tuple(float(b) for b in cfg.algo.bid_levels)
    make = functools.partial(make_transformers_policy, cfg.model, words, levels, int(cfg.seed))
    if args.dtype != "float32":  # built, then cast as a run's GPU profile casts it (models/adapters.py)
        make = functools.partial(_cast, make, args.dtype)
    demos = collect_demos(domain, cfg.task, list(range(args.seeds)))
    pol = make()
    rng = random.Random(0)
    batch = [
        (e.prompt, pol.action_target(e.target), rng.uniform(-1.0, 1.0))
        for role in demos
        for e in demos[role]
        if e.kind == "act"
    ]
    a = cfg.algo
    s = OptimSettings(
        lr=float(a.lr),
        weight_decay=float(a.weight_decay),
        total_steps=int(a.iterations),
        eps=float(a.adam_eps),
        minibatch=args.minibatch,
        grad_clip=float(a.grad_clip),
    )
    before = {n: p.detach().clone() for n, p in pol.model.named_parameters()}
    opt, sched = make_optimizer(pol.parameters(), s.lr, s.weight_decay, s.total_steps, s.warmup, eps=s.eps)
    t0 = time.perf_counter()
    loss, norm = accumulate_and_step(pol, batch, s.minibatch, reinforce_chunk, opt, sched, s.grad_clip)
    one_s = time.perf_counter() - t0
    one = {n: getattr(p, MASTER_ATTR, p) for n, p in pol.model.named_parameters()}  # a bf16 model's fp32 masters
    t0 = time.perf_counter()
    state, m = spawn_update(make, batch, s, args.world, start_method=args.start_method, engine=args.engine)
    wall = time.perf_counter() - t0
    names = [n for n in one if n in state]
    diff = max(float((state[n] - one[n].detach()).abs().max()) for n in names)
    moved = max(float((before[n] - one[n].detach()).abs().max()) for n in names)
    total = sum(p.numel() for p in one.values())
    # the two updates as vectors (sharded minus one-process, against the one-process move): a whole-model figure
    # beside the max, which a single element whose tiny gradient flips sign sets (AdamW's first step is ~lr * sign)
    gap = sum(float((state[n].float() - one[n].detach().float()).pow(2).sum()) for n in names) ** 0.5
    step = sum(float((one[n].detach().float() - before[n].float()).pow(2).sum()) for n in names) ** 0.5
    print(
        f"engine {args.engine}, {args.world} ranks, {args.dtype}, {len(batch)} samples, minibatch {args.minibatch}, "
        f"{total} parameters ({len(names)} tensors compared)"
    )
    print(f"max abs diff vs 1 process: {diff:.3g} (the update moved parameters by up to {moved:.3g})")
    print(f"norm of the difference of the updates: {gap / max(step, 1e-30):.3g} of the norm of the 1-process update")
    print(f"loss {m['loss']:.6g} vs {loss:.6g}; grad norm {m['grad_norm']:.6g} vs {norm:.6g}")
    print(f"parameters held per rank: {m.get('shard_params_by_rank')}")
    print(
        f"seconds: 1 process {one_s:.2f}; sharded update in rank 0 {m['seconds']:.2f} "
        f"(with model build and sharding); wall with process start {wall:.1f}"
    )


if __name__ == "__main__":
    main()
