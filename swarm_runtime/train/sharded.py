"""Sharded learner: one update of a policy under FSDP2 (``torch.distributed.fsdp.fully_shard``) across the
processes of a learner group, the same update :func:`~swarm_runtime.train.optim.accumulate_and_step` takes in
one process (docs/distributed.md).

Each rank builds the policy from the same factory (the same initial weights), shards its parameters (every
transformer block its own FSDP unit, then the root), makes the run's optimizer over its shards, and takes its
share of the batch: the batch mean of the per-sample loss is a sum over ranks of ``sum(rank's samples) / n``,
so the gradients reduced across ranks are the one-process gradient. Gradient clipping sees the global norm;
AdamW steps each rank's shard. The full state dict is gathered on rank 0 at the end.

:func:`sharded_update` runs in each rank; :func:`spawn_update` starts a group of ``world`` processes on this
machine (gloo on a CPU device mesh) and returns rank 0's result; :func:`deepspeed_update` is the same update
under DeepSpeed ZeRO-3. What is not here yet: learner
actors that keep the sharded model and its optimizer across updates (Ray), and a run-level
``train.engine=fsdp``; see docs/distributed.md.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

#: A batch row of the REINFORCE loss: (prompt, action tokens, advantage[, sampler log-probs]).
Row = tuple


@dataclass(frozen=True)
class OptimSettings:
    """The optimizer of one update, as :func:`~swarm_runtime.train.optim.make_optimizer` takes it, and the
    update's minibatch and gradient clip (``algo.*``)."""

    lr: float
    weight_decay: float = 0.0
    total_steps: int = 1
    warmup: int = 0
    eps: float = 1e-8
    minibatch: int = 8
    grad_clip: float = 1.0


def shard_slices(n: int, world: int) -> list[slice]:
    """Contiguous shares of ``n`` samples over ``world`` ranks, sizes differing by at most one."""
    if world < 1:
        raise ValueError(f"world={world!r}: a learner group has at least one process")
    base, extra = divmod(int(n), int(world))
    out, start = [], 0
    for r in range(world):
        size = base + (1 if r < extra else 0)
        out.append(slice(start, start + size))
        start += size
    return out


def rank_chunks(batch: Sequence[Row], rank: int, world: int, minibatch: int) -> list[tuple[list[Row], float]]:
    """Rank ``rank``'s chunks of ``batch`` and their loss weights (``len(chunk) / n``, the share of the batch
    mean). Every rank gets the same number of chunks (each forward and backward is a collective under FSDP):
    a rank short of samples runs the first sample with weight 0."""
    n = len(batch)
    if n == 0:
        raise ValueError("an empty batch has no update")
    mb = max(1, int(minibatch))
    shares = [list(batch[s]) for s in shard_slices(n, world)]
    count = max((len(s) + mb - 1) // mb for s in shares)
    mine = shares[rank]
    chunks = [(mine[i : i + mb], len(mine[i : i + mb]) / n) for i in range(0, len(mine), mb)]
    while len(chunks) < count:
        chunks.append(([batch[0]], 0.0))
    return chunks


def _block_classes(model: torch.nn.Module) -> set[str]:
    """Class names of the model's transformer blocks (Hugging Face models list them in ``_no_split_modules``)."""
    return set(getattr(model, "_no_split_modules", None) or ())


def shard_model(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """``fully_shard`` every transformer block, then the root (embeddings, tied head, final norm), in place."""
    from torch.distributed.fsdp import fully_shard

    blocks = _block_classes(model)
    for m in model.modules():
        if m is not model and type(m).__name__ in blocks:
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _default_chunk_loss():
    from swarm_runtime.train.action import _reinforce_chunk

    return _reinforce_chunk


def sharded_update(
    rank: int,
    world: int,
    make_policy: Callable[[], Any],
    batch: Sequence[Row],
    settings: OptimSettings,
    chunk_loss: Callable | None = None,
    device: str = "cpu",
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """One update in rank ``rank`` of an initialised process group of ``world``; returns the full state dict
    of the policy's model (on rank 0; empty elsewhere) and the update's metrics (every rank): ``loss`` (the
    batch mean, as the one-process update reports it), ``grad_norm`` (before clipping), ``shard_params`` (the
    parameters this rank holds), ``seconds``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from swarm_runtime.train.optim import LOW_PRECISION, make_optimizer

    chunk_loss = chunk_loss or _default_chunk_loss()
    t0 = time.time()
    policy = make_policy()
    model = policy.model
    if any(p.dtype in LOW_PRECISION for p in model.parameters()):
        raise ValueError(
            "the sharded learner steps fp32 parameters; a bf16/fp16 model needs FSDP2's "
            "MixedPrecisionPolicy (not wired yet)"
        )
    mesh = init_device_mesh(device, (world,))
    shard_model(model, mesh)
    opt, sched = make_optimizer(
        model.parameters(), settings.lr, settings.weight_decay, settings.total_steps, settings.warmup, eps=settings.eps
    )
    policy.train()
    total = 0.0
    chunks = rank_chunks(batch, rank, world, settings.minibatch)
    for i, (chunk, weight) in enumerate(chunks):
        model.set_requires_gradient_sync(i == len(chunks) - 1)  # reduce once, after the last chunk
        loss = chunk_loss(policy, chunk) * weight
        (loss * world).backward()  # FSDP averages over ranks; the batch mean is their sum
        total += float(loss.detach())
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    policy.eval()
    loss_sum = torch.tensor([total], dtype=torch.float64)
    dist.all_reduce(loss_sum)
    held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    metrics = {
        "loss": float(loss_sum),
        "grad_norm": float(norm),
        "shard_params": float(held),
        "seconds": time.time() - t0,
    }
    return state, metrics


def deepspeed_update(
    rank: int,
    world: int,
    make_policy: Callable[[], Any],
    batch: Sequence[Row],
    settings: OptimSettings,
    chunk_loss: Callable | None = None,
) -> tuple[dict, dict[str, float]]:
    """The same update under DeepSpeed ZeRO-3 (``deepspeed.initialize`` with the run's AdamW and schedule as the
    client optimizer; gradient accumulation over the rank's chunks, clipping at the global norm), in rank
    ``rank`` of a process group DeepSpeed initialised. Returns the full fp32 parameters by name (rank 0; empty
    elsewhere) and the metrics of :func:`sharded_update`. Runs where ``DS_ACCELERATOR`` names a working
    accelerator (``cpu`` here: docs/distributed.md)."""
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param

    from swarm_runtime.train.optim import make_optimizer

    chunk_loss = chunk_loss or _default_chunk_loss()
    t0 = time.time()
    policy = make_policy()
    chunks = rank_chunks(batch, rank, world, settings.minibatch)
    opt, sched = make_optimizer(
        policy.model.parameters(),
        settings.lr,
        settings.weight_decay,
        settings.total_steps,
        settings.warmup,
        eps=settings.eps,
    )
    config = {
        "train_micro_batch_size_per_gpu": max(1, int(settings.minibatch)),
        "gradient_accumulation_steps": len(chunks),
        "gradient_clipping": float(settings.grad_clip),
        "zero_optimization": {"stage": 3},
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 1 << 30,
    }
    engine, _, _, _ = deepspeed.initialize(model=policy.model, optimizer=opt, lr_scheduler=sched, config=config)
    # forwards go through the engine: ZeRO-3 counts micro-steps there, and one that is not counted overwrites
    # the accumulated gradient partitions instead of adding to them (measured: only the last chunk's gradient)
    policy.model = engine
    policy.train()
    total = 0.0
    for chunk, weight in chunks:
        loss = chunk_loss(policy, chunk) * weight
        engine.backward(loss * world, scale_wrt_gas=False)  # DeepSpeed averages over ranks too
        engine.step()  # steps at the accumulation boundary (the last chunk) only
        total += float(loss.detach())
    policy.eval()
    loss_sum = torch.tensor([total], dtype=torch.float64)
    dist.all_reduce(loss_sum)
    held = sum(int(getattr(p, "ds_tensor", p).numel()) for p in engine.module.parameters())
    full = {n: safe_get_full_fp32_param(p).detach().clone() for n, p in engine.module.named_parameters()}
    metrics = {
        "loss": float(loss_sum),
        "grad_norm": float(engine.get_global_grad_norm()),
        "shard_params": float(held),
        "seconds": time.time() - t0,
    }
    return (full if rank == 0 else {}), metrics


#: The engines :func:`spawn_update` runs.
ENGINES = ("fsdp", "deepspeed")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _worker(
    rank: int,
    world: int,
    port: int,
    make_policy,
    batch,
    settings,
    chunk_loss,
    out: str,
    threads: int,
    engine: str = "fsdp",
):
    torch.set_num_threads(max(1, int(threads)))
    if engine == "deepspeed":
        import deepspeed

        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
        )
        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        update = deepspeed_update if engine == "deepspeed" else sharded_update
        state, metrics = update(rank, world, make_policy, batch, settings, chunk_loss)
        shards = [None] * world
        dist.all_gather_object(shards, metrics["shard_params"])
        if rank == 0:
            torch.save({"state": state, "metrics": {**metrics, "shard_params_by_rank": shards}}, out)
    finally:
        dist.destroy_process_group()


def spawn_update(
    make_policy: Callable[[], Any],
    batch: Sequence[Row],
    settings: OptimSettings,
    world: int,
    chunk_loss: Callable | None = None,
    threads: int = 1,
    start_method: str = "spawn",
    engine: str = "fsdp",
) -> tuple[dict[str, torch.Tensor], dict]:
    """Run :func:`sharded_update` in ``world`` new processes on this machine (gloo on 127.0.0.1, CPU mesh)
    and return rank 0's full state dict and metrics. ``start_method="spawn"`` (fresh interpreters: each
    imports torch and transformers again) needs ``make_policy`` and ``chunk_loss`` to pickle (module-level
    functions, ``functools.partial`` of them); ``"fork"`` starts from this process's imports (seconds instead
    of tens of seconds on a loaded machine; only where this process has started no CUDA and no OpenMP
    threads). ``engine``: ``fsdp`` (:func:`sharded_update`) or ``deepspeed`` (:func:`deepspeed_update`)."""
    import torch.multiprocessing as mp

    if engine not in ENGINES:
        raise ValueError(f"unknown sharded engine {engine!r}; valid: {', '.join(ENGINES)}")

    with tempfile.TemporaryDirectory(prefix="swarm-fsdp-") as tmp:
        out = str(Path(tmp) / "rank0.pt")
        env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS",)}
        os.environ["OMP_NUM_THREADS"] = str(max(1, int(threads)))
        try:
            mp.start_processes(
                _worker,
                args=(world, free_port(), make_policy, list(batch), settings, chunk_loss, out, threads, engine),
                nprocs=int(world),
                join=True,
                start_method=start_method,
            )
        finally:
            for k, v in env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        res = torch.load(out, weights_only=False)
    return res["state"], res["metrics"]
