"""Sharded learner: one update of a policy under FSDP2 (``torch.distributed.fsdp.fully_shard``) across the
processes of a learner group, the same update :func:`~swarm_runtime.learn.optim.accumulate_and_step` takes in
one process (docs/reference/sharding.md).

Each rank builds the policy from the same factory (the same initial weights), shards its parameters (every
transformer block its own FSDP unit, then the root), makes the run's optimizer over its shards, and takes its
share of the batch: the batch mean of the per-sample loss is a sum over ranks of ``sum(rank's samples) / n``,
so the gradients reduced across ranks are the one-process gradient. Gradient clipping sees the global norm;
AdamW steps each rank's shard. The full state dict is gathered on rank 0 at the end.

:func:`sharded_update` runs in each rank; :func:`spawn_update` starts a group of ``world`` processes on this
machine (gloo on a CPU device mesh) and returns rank 0's result; :func:`deepspeed_update` is the same update
under DeepSpeed ZeRO-3.

In a run (``train.engine=fsdp``, swarm_runtime/cluster/shards.py) each rank is a learner actor that keeps its
sharded models and optimizers across updates: a policy with a :class:`Shard` takes
:func:`~swarm_runtime.learn.optim.accumulate_and_step` through :func:`shard_step` (its chunks of the batch, the
side statistics of the chunk closures merged across ranks); :func:`full_params`, :func:`load_full_params`,
:func:`full_optimizer_state` and :func:`load_full_optimizer_state` move full tensors in and out of the shards
(the in-process optimizer's ``state_dict`` format, so checkpoints are the same under both engines).
"""

from __future__ import annotations

import copy
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

from swarm_runtime.learn.losses import reinforce_chunk

#: A batch row of the REINFORCE loss: (prompt, action tokens, advantage[, sampler log-probs]).
Row = tuple


@dataclass(frozen=True)
class OptimSettings:
    """The optimizer of one update, as :func:`~swarm_runtime.learn.optim.make_optimizer` takes it, and the
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


@dataclass(frozen=True)
class Shard:
    """The rank of a policy's process in its learner's process group (``policy.shard``; None: one process)."""

    rank: int
    world: int
    #: the compute dtype of a bf16/fp16 model (its sharded parameters are the fp32 masters: :func:`to_masters`);
    #: None: an fp32 model
    compute: torch.dtype | None = None
    engine: str = "fsdp"  #: ``fsdp`` (``policy.model`` sharded by FSDP2) or ``deepspeed`` (it is a ZeRO-3 engine)

    def step(self, policy, batch: Sequence, minibatch: int, chunk_loss, opt, sched, grad_clip: float, side=()):
        """This rank's part of one optimizer step over ``batch`` (:func:`shard_step`): what
        :func:`~swarm_runtime.learn.optim.accumulate_and_step` does for a sharded policy."""
        return shard_step(policy, batch, minibatch, chunk_loss, opt, sched, grad_clip, side)


def _merge_side(side: Sequence, parts: Sequence[Sequence]) -> None:
    """Set each object of ``side`` (lists, and objects with ``merge``: ``sampling/mismatch.py: Mismatch``) to the
    merge of every rank's (``parts[rank][i]``), in rank order: the batch order of :func:`rank_chunks`."""
    for i, obj in enumerate(side):
        mine = [p[i] for p in parts]
        if isinstance(obj, list):
            obj[:] = [x for m in mine for x in m]
        else:
            obj.merge(mine)


def _restore(side: Sequence, saved: Sequence) -> None:
    for obj, was in zip(side, saved):
        if isinstance(obj, list):
            obj[:] = was
        else:
            obj.__dict__.update(was.__dict__)


def shard_step(policy, batch: Sequence, minibatch: int, chunk_loss, opt, sched, grad_clip: float, side=()):
    """:func:`~swarm_runtime.learn.optim.accumulate_and_step` in rank ``policy.shard.rank`` of an FSDP2-sharded
    ``policy.model``: this rank's chunks (:func:`rank_chunks`; gradients reduced after the last one), a step at the
    global gradient norm; returns ``(batch loss, grad norm)`` as one process reports them. What the chunk closures
    gather (``side``: lists, ``Mismatch``) and the FLOPs they record (``policy.flops.events``) are merged across ranks
    (in batch order; a padding chunk's are dropped), so every rank holds the one-process figures."""
    rank, world = policy.shard.rank, policy.shard.world
    model, ds = policy.model, policy.shard.engine == "deepspeed"
    flops = getattr(getattr(policy, "flops", None), "events", None)
    n0 = None if flops is None else len(flops)
    chunks = rank_chunks(batch, rank, world, minibatch)
    real = sum(1 for _, w in chunks if w > 0)
    policy.train()
    total, saved, mine = 0.0, None, None
    for i, (chunk, weight) in enumerate(chunks):
        if i == real:  # padding chunks (a rank short of samples): their statistics and FLOPs are dropped
            saved = copy.deepcopy(list(side))
            mine = None if flops is None else flops[n0:]
        last = i == len(chunks) - 1  # reduce once, after the last chunk
        (model.set_gradient_accumulation_boundary if ds else model.set_requires_gradient_sync)(last)
        loss = chunk_loss(policy, chunk) * weight
        if ds:  # ZeRO-3 accumulates into its gradient partitions; it averages over ranks as FSDP does
            model.backward(loss * world, scale_wrt_gas=False)
        else:
            (loss * world).backward()  # FSDP averages over ranks; the batch mean is their sum
        total += float(loss.detach())
    if saved is not None:
        _restore(side, saved)
    elif flops is not None:
        mine = flops[n0:]
    if ds:
        norm = _zero3_step(model, opt, grad_clip)
    else:
        params = [p for p in policy.parameters() if p.grad is not None]  # an adapter's own (its base is frozen)
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip) if params else torch.zeros(())
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        opt.step()
        opt.zero_grad(set_to_none=True)
    sched.step()
    policy.eval()
    loss_sum = torch.tensor([total], dtype=torch.float64)
    dist.all_reduce(loss_sum)
    parts: list = [None] * world
    dist.all_gather_object(parts, (copy.deepcopy(list(side)), mine))
    _merge_side(side, [p[0] for p in parts])
    if flops is not None:
        flops[n0:] = [e for p in parts for e in p[1]]
    return float(loss_sum), float(norm)


def _zero3_step(engine, opt, grad_clip: float):
    """Step a ZeRO-3 ``engine`` at its accumulation boundary with client optimizer ``opt`` (the kind's own AdamW:
    swarm_runtime/cluster/deepspeed_shards.py), its gradients clipped at ``grad_clip`` (the global norm); the norm."""
    engine.optimizer.optimizer = opt
    engine.optimizer.clip_grad = float(grad_clip)
    engine.step()
    return torch.as_tensor(engine.get_global_grad_norm())


def zero3_config(low: torch.dtype | None = None) -> dict:
    """A ZeRO-3 engine's config: stage 3, the run's torch AdamW as the client optimizer; the gradient accumulation
    (a batch's chunk count) and clipping (``grad_clip``) are set per update by :func:`shard_step`. ``low``
    (bfloat16): DeepSpeed's bf16 mode, the module computing in bf16 over ZeRO's fp32 master partition (what the
    client optimizers step), gradients reduced and accumulated in fp32 as FSDP's :func:`mixed_precision` does (its
    default reduces and accumulates them in bf16: docs/notebook/cluster.md, "DeepSpeed ZeRO-3 in a run", has both
    measured), torch's linear kept."""
    out = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 3},
        "zero_force_ds_cpu_optimizer": False,  # the run's torch AdamW, not DeepSpeed's CPU Adam
        "steps_per_print": 1 << 30,
    }
    if low is torch.bfloat16:
        out.update(
            bf16={"enabled": True},
            communication_data_type="fp32",
            data_types={"grad_accum_dtype": "fp32"},
        )
        # ZeRO-3's own linear (``memory_efficient_linear``) adds the bias after rounding the matmul to bf16, where
        # torch's adds it before: the learner's log-probs then differ from the sampler's (measured: up to 1.3e-2)
        out["zero_optimization"] = {"stage": 3, "memory_efficient_linear": False}
    elif low is not None:  # placement.py refuses it before a run starts
        raise ValueError(f"a ZeRO-3 learner computes in float32 or bfloat16, not {low}")
    return out


def zero3_engine(model: torch.nn.Module, opt: torch.optim.Optimizer, low: torch.dtype | None):
    """``model`` (fp32 parameters: a bf16 model's masters, :func:`to_masters`) as a ZeRO-3 engine stepping ``opt``;
    ``low``: the module is cast to it (DeepSpeed's bf16 mode) and ZeRO's fp32 master partition set from the masters
    (it would be made from the rounded weights otherwise: the sub-bf16 progress of an SFT before lost). Every rank
    calls it."""
    import deepspeed
    from deepspeed.utils import safe_set_full_fp32_param

    masters = [p.detach().clone() for p in model.parameters()] if low is not None else []
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=zero3_config(low))
    for p, m in zip(engine.module.parameters(), masters):
        safe_set_full_fp32_param(p, m)
    return engine


def _fsdp_modules(model: torch.nn.Module) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def resharded(model: torch.nn.Module) -> list:
    """``model``'s parameters after every FSDP unit is resharded (the root stays unsharded after a forward without
    backward), in ``parameters()`` order: the sharded DTensors the optimizers step."""
    for m in _fsdp_modules(model):
        m.reshard()
    return list(model.parameters())


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t.detach().clone()


def _full_cpu(t):
    return _full(t).cpu() if torch.is_tensor(t) else t


def full_params(model: torch.nn.Module, params: Sequence | None = None) -> list[torch.Tensor]:
    """The full tensors of ``model``'s parameters (``parameters()`` order), or of ``params`` (some of them: a
    policy's, as an adapter's LoRA matrices on a shared base); a collective: every rank calls it."""
    every = resharded(model)
    return [_full(p).detach() for p in (every if params is None else params)]


def _sharded_like(p, t: torch.Tensor):
    """``t`` (a full tensor) as ``p``'s local shard (``p`` a DTensor) or as it is (a plain tensor)."""
    if not hasattr(p, "device_mesh"):
        return t
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(t.detach().to(p.device), p.device_mesh, p.placements)


def load_full_params(model: torch.nn.Module, tensors: Sequence[torch.Tensor], params: Sequence | None = None) -> None:
    """Copy full ``tensors`` (:func:`full_params` order) into ``model``'s shards (or those of ``params``, some of
    them), in place (every rank calls it)."""
    every = resharded(model)
    params = every if params is None else list(params)
    if len(params) != len(tensors):
        raise RuntimeError(f"sharded learner load: {len(tensors)} tensors for a model of {len(params)} parameters")
    with torch.no_grad():
        for p, t in zip(params, tensors):
            local = _sharded_like(p, t.to(p.dtype))
            (p.to_local() if hasattr(p, "to_local") else p).copy_(
                local.to_local() if hasattr(local, "to_local") else local
            )


def full_optimizer_state(opt: torch.optim.Optimizer) -> dict:
    """``opt.state_dict()`` with each sharded state tensor gathered (a collective) on the CPU: the format of the same
    optimizer over the unsharded parameters (integer-indexed state in parameter order, the same param groups)."""
    sd = opt.state_dict()
    return {
        "state": {i: {k: _full_cpu(v) for k, v in st.items()} for i, st in sd["state"].items()},
        "param_groups": copy.deepcopy(sd["param_groups"]),
    }


def load_full_optimizer_state(opt: torch.optim.Optimizer, state: dict) -> None:
    """Load ``state`` (:func:`full_optimizer_state`'s format, or an in-process optimizer's) into ``opt`` over
    sharded parameters: each moment sharded as its parameter (every rank calls it)."""
    params = [p for g in opt.param_groups for p in g["params"]]
    sharded = {  # copies: the optimizer steps its state in place (a ``step`` tensor it was given included)
        int(i): {
            k: (_sharded_like(params[int(i)], v) if k != "step" else v.clone()) if torch.is_tensor(v) else v
            for k, v in st.items()
        }
        for i, st in state["state"].items()
    }
    opt.load_state_dict({"state": sharded, "param_groups": copy.deepcopy(state["param_groups"])})


def _block_classes(model: torch.nn.Module) -> set[str]:
    """Class names of the model's transformer blocks (Hugging Face models list them in ``_no_split_modules``)."""
    return set(getattr(model, "_no_split_modules", None) or ())


def shard_model(model: torch.nn.Module, mesh, mp_policy=None, units: Sequence = ()) -> torch.nn.Module:
    """``fully_shard`` each of ``units`` (inner units first), every transformer block, then the root (embeddings,
    tied head, final norm), in place. A PEFT model (a base with LoRA adapters) is sharded the same way: each unit
    holds frozen base weights and trainable adapter matrices side by side (FSDP2 keeps ``requires_grad`` per
    parameter); on a bf16/fp16 base the LoRA layers are ``units`` (:func:`lora_units`). ``mp_policy``: FSDP2's
    ``MixedPrecisionPolicy`` (None: compute in the parameters' dtype)."""
    from torch.distributed.fsdp import fully_shard

    kw = {} if mp_policy is None else {"mp_policy": mp_policy}
    for m in units:
        fully_shard(m, mesh=mesh, **kw)
    blocks = _block_classes(model)
    for m in model.modules():
        if m is not model and type(m).__name__ in blocks:
            fully_shard(m, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    return model


def low_precision(model: torch.nn.Module) -> torch.dtype | None:
    """The bf16/fp16 dtype of ``model``'s weights (the first such), None when all are fp32."""
    from swarm_runtime.learn.optim import LOW_PRECISION

    return next((p.dtype for p in model.parameters() if p.dtype in LOW_PRECISION), None)


def to_masters(model: torch.nn.Module) -> torch.dtype | None:
    """A bf16/fp16 model's parameters made fp32 in place, each its fp32 master (``learn/optim.py: master_weight``:
    the in-process optimizer's, whose rounding is the weight), so that FSDP2 shards and AdamW steps the masters and
    computes in the low dtype (:func:`mixed_precision`), as the in-process update does. Returns that dtype (None: an
    fp32 model, left as it is)."""
    from swarm_runtime.learn.optim import LOW_PRECISION, master_weight

    low = low_precision(model)
    if low is not None:
        with torch.no_grad():
            for p in model.parameters():
                if p.dtype in LOW_PRECISION:
                    p.data = master_weight(p).clone()
    return low


def mixed_precision(low: torch.dtype | None):
    """FSDP2's ``MixedPrecisionPolicy`` for compute in ``low`` (parameters gathered in it; gradients reduced and
    accumulated in fp32); None for fp32."""
    if low is None:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)


def lora_units(shared) -> list:
    """The FSDP2 units of LoRA adapters on a bf16/fp16 base (``shared``: models/adapters.py's ``SharedBase``): FSDP2
    gathers a unit's parameters as one buffer of one dtype, so each LoRA layer's frozen base Linear is a unit (bf16)
    and the LoRA layer around it another (its adapters' fp32 matrices, gathered around the layer's forward, which
    ``GroupedLoRA`` keeps); the blocks and the root then hold bf16 weights only. Inner units first."""
    return [u for m in shared.lora_layers for u in (m.base_layer, m)]


def shard_policies(policies: dict, mesh, rank: int, world: int) -> None:
    """Shard the models of ``policies`` (a learner's roles) in place, each model once (the roles that are LoRA
    adapters on one base share it), and give every policy its :class:`Shard`. A bf16/fp16 model is sharded as its
    fp32 masters computing in its dtype (:func:`to_masters`); a bf16/fp16 base with LoRA adapters stays as it is (the
    base frozen in its dtype, the fp32 adapters trained as they are, as in process: :func:`lora_units`).
    ``fully_shard`` replaces each parameter by a sharded one, so an adapter policy reads its parameters from the model
    again."""
    done: dict[int, torch.dtype | None] = {}
    for policy in policies.values():
        if id(policy.model) not in done:
            shared = getattr(policy, "shared_base", None)
            if shared is not None and low_precision(policy.model) is not None:
                done[id(policy.model)] = None  # no masters: the frozen base is not stepped, the adapters are fp32
                shard_model(policy.model, mesh, units=lora_units(shared))
            else:
                low = done[id(policy.model)] = to_masters(policy.model)
                shard_model(policy.model, mesh, mixed_precision(low))
        if hasattr(policy, "rebind_params"):
            policy.rebind_params()
        policy.shard = Shard(rank, world, done[id(policy.model)])


def sharded_update(
    rank: int,
    world: int,
    make_policy: Callable[[], Any],
    batch: Sequence[Row],
    settings: OptimSettings,
    chunk_loss: Callable | None = None,
    device: str = "cpu",
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """One update in rank ``rank`` of an initialised process group of ``world`` (``device``: ``cpu`` with gloo,
    ``cuda`` with NCCL, the rank's current CUDA device); returns the full state dict of the policy's model (fp32: a
    bf16 model's masters; on rank 0, empty elsewhere) and the update's metrics (every rank): ``loss`` (the batch
    mean, as the one-process update reports it), ``grad_norm`` (before clipping), ``shard_params`` (the parameters
    this rank holds), ``seconds``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from swarm_runtime.learn.optim import make_optimizer

    chunk_loss = chunk_loss or reinforce_chunk
    t0 = time.time()
    policy = make_policy()
    model = policy.model
    if device != "cpu":  # a rank's GPU (NCCL): the model and the policy's inputs there
        model.to(device)
        policy.device = device
    low = to_masters(model)  # a bf16 model: fp32 masters sharded, bf16 compute
    mesh = init_device_mesh(device, (world,))
    shard_model(model, mesh, mixed_precision(low))
    opt, sched = make_optimizer(
        model.parameters(), settings.lr, settings.weight_decay, settings.total_steps, settings.warmup, eps=settings.eps
    )
    policy.shard = Shard(rank, world, low)
    loss, norm = shard_step(policy, batch, settings.minibatch, chunk_loss, opt, sched, settings.grad_clip)
    held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    metrics = {
        "loss": loss,
        "grad_norm": norm,
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
    """The same update under DeepSpeed ZeRO-3 (``deepspeed.initialize`` with the run's AdamW as the client optimizer,
    then :func:`shard_step`: gradient accumulation over the rank's chunks, clipping at the global norm), in rank
    ``rank`` of a process group DeepSpeed initialised. Returns the full fp32 parameters by name (rank 0; empty
    elsewhere) and the metrics of :func:`sharded_update`. Runs where ``DS_ACCELERATOR`` names a working
    accelerator (``cpu`` here: docs/notebook/cluster.md, "DeepSpeed ZeRO-3 on the CPU accelerator")."""
    from deepspeed.utils import safe_get_full_fp32_param

    from swarm_runtime.learn.optim import make_optimizer

    chunk_loss = chunk_loss or reinforce_chunk
    t0 = time.time()
    policy = make_policy()
    low = to_masters(policy.model)  # a bf16 model: ZeRO's fp32 partition holds its masters (zero3_engine)
    opt, sched = make_optimizer(
        policy.model.parameters(),
        settings.lr,
        settings.weight_decay,
        settings.total_steps,
        settings.warmup,
        eps=settings.eps,
    )
    engine = zero3_engine(policy.model, opt, low)
    # forwards go through the engine: ZeRO-3 counts micro-steps there, and one that is not counted overwrites
    # the accumulated gradient partitions instead of adding to them (measured: only the last chunk's gradient)
    policy.model, policy.shard = engine, Shard(rank, world, low, engine="deepspeed")
    loss, norm = shard_step(policy, batch, settings.minibatch, chunk_loss, opt, sched, settings.grad_clip)
    held = sum(int(getattr(p, "ds_tensor", p).numel()) for p in engine.module.parameters())
    full = {n: safe_get_full_fp32_param(p).detach().clone() for n, p in engine.module.named_parameters()}
    metrics = {
        "loss": loss,
        "grad_norm": norm,
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
