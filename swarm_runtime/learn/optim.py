"""AdamW with linear warm-up and cosine decay, and gradient clipping; fp32 master weights for
models loaded in bfloat16 or float16."""

from __future__ import annotations

import math

import torch

from swarm_runtime.models.masters import master_weights, restore_master_weights  # noqa: F401 (their home before swarm_runtime.masters)

#: Parameter dtypes whose optimizer steps go through an fp32 master copy.
LOW_PRECISION = (torch.bfloat16, torch.float16)


def master_weight(p: torch.Tensor) -> torch.Tensor:
    """The fp32 master copy of a low-precision parameter, shared by every optimizer of that
    parameter (MPT has one for action steps and one for bid steps). Elements whose rounded value
    no longer matches the parameter (weights loaded or changed outside the optimizers) are taken
    from the parameter again."""
    m = getattr(p, "_swarm_master", None)
    if m is None or m.shape != p.shape or m.device != p.device:
        m = p.detach().float().clone()
        p._swarm_master = m
    else:
        drift = m.to(p.dtype).ne(p)
        if bool(drift.any()):
            m[drift] = p.detach()[drift].float()
    return m


class MasterWeightAdamW(torch.optim.AdamW):
    """AdamW over fp32 master copies of bfloat16/float16 parameters (fp32 ones are stepped as
    usual). A step of lr 1e-6 (the paper's RL rate) is far below half a unit in the last place of a
    bf16 weight (~6e-5 at 0.02), so stepping the bf16 weights directly would round most updates
    away; the master accumulates them, and the model's weights are rounded from it after each
    step. Memory: 4 more bytes per low-precision parameter (the fp32 master)."""

    def __init__(self, params, **kw):
        self._model_params = list(params)
        self._pairs = [(p, master_weight(p)) for p in self._model_params if p.dtype in LOW_PRECISION]
        masters = {id(p): m for p, m in self._pairs}
        super().__init__([masters.get(id(p), p) for p in self._model_params], **kw)

    @torch.no_grad()
    def step(self, closure=None):
        for p, m in self._pairs:
            if master_weight(p) is not m:  # it also picks up changes made to the weights since the last step
                raise RuntimeError(
                    "a bf16/fp16 weight changed device or shape after its optimizer was made; "
                    "move the model before making its optimizers"
                )
            m.grad = None if p.grad is None else p.grad.detach().float()
        loss = super().step(closure)
        for p, m in self._pairs:
            p.copy_(m)
            m.grad = None
        return loss

    def zero_grad(self, set_to_none: bool = True):
        super().zero_grad(set_to_none)
        for p in self._model_params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()


def init_adam_state(opt: torch.optim.Optimizer) -> None:
    """Allocate AdamW's moments now, exactly as its first step would (zeros, ``step`` 0 on the CPU),
    instead of lazily at the first step. Same numbers; but the moments of every optimizer of a swarm
    sit together in memory before the first rollout, instead of being allocated between one
    update's activations and the next, which fragments the heap (with many small adapters, a peak
    of ~80 MiB above the live tensors at 12 adapters of a 100M base: docs/benchmarks.md)."""
    for group in opt.param_groups:
        if group.get("fused") or group.get("capturable") or group.get("amsgrad"):
            return  # torch's own lazy initialisation then (other step and moment layouts)
        for p in group["params"]:
            state = opt.state[p]
            if not state:
                state["step"] = torch.tensor(
                    0.0, dtype=torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
                )  # torch's _get_scalar_dtype()
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def make_optimizer(
    params,
    lr: float,
    weight_decay: float,
    total_steps: int,
    warmup: int = 0,
    min_ratio: float = 0.1,
    eps: float = 1e-8,
    eager_state: bool = False,
):
    """AdamW (:class:`MasterWeightAdamW` for bf16/fp16 parameters) with the LR schedule;
    ``eager_state``: its moments allocated now (:func:`init_adam_state`)."""
    params = list(params)
    cls = MasterWeightAdamW if any(p.dtype in LOW_PRECISION for p in params) else torch.optim.AdamW
    opt = cls(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95), eps=eps)
    if eager_state:
        init_adam_state(opt)

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        span = max(1, total_steps - warmup)
        progress = min(1.0, (step - warmup) / span)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


#: Optimizer settings a run's config sets; a checkpoint's copies of them are not restored.
CONFIGURED = ("eps", "weight_decay", "betas")


def load_optimizer_state(opt, sched, opt_state: dict, sched_state: dict) -> dict:
    """Load a checkpoint's optimizer and scheduler state (Adam moments, step counts) but keep this
    run's configured hyper-parameters. Torch's ``load_state_dict`` restores the saved learning rate
    (``base_lrs``, ``initial_lr``), eps and weight decay, so a run resumed after its ``config.yaml``
    changed ``algo.lr`` would silently train at the old rate. Returns ``{name: (saved, configured)}``
    for each setting that differed."""
    configured = [{k: g[k] for k in CONFIGURED} for g in opt.param_groups]
    base = list(sched.base_lrs)
    opt.load_state_dict(opt_state)
    sched.load_state_dict(sched_state)
    changed = {}
    if list(sched.base_lrs) != base:
        changed["lr"] = (sched.base_lrs[0], base[0])
    for g, c in zip(opt.param_groups, configured):
        for k, v in c.items():
            if g[k] != v:
                changed[k] = (g[k], v)
                g[k] = v
    sched.base_lrs = base
    for g, b, f in zip(opt.param_groups, base, sched.lr_lambdas):
        g["initial_lr"], g["lr"] = b, b * f(sched.last_epoch)
    sched._last_lr = [g["lr"] for g in opt.param_groups]
    return changed


def clip_and_step(params, opt, sched, max_norm: float) -> float:
    params = [p for p in params if p.grad is not None]
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return norm


def accumulate_and_step(policy, batch: list, minibatch: int, chunk_loss, opt, sched, grad_clip: float, side=()):
    """Accumulate gradients over ``batch`` in chunks of ``minibatch`` (each chunk's loss
    weighted by its share, so the result is the batch mean), then take one clipped step.
    Returns ``(loss, gradient norm before clipping)``. A policy with a ``shard`` (a rank of a sharded
    learner, ``train.engine=fsdp``) takes its share of the batch instead (``policy.shard.step``:
    ``learn/sharded.py: shard_step``), ``side`` (what ``chunk_loss`` gathers: lists, ``Mismatch``) merged across
    ranks; read by that path only."""
    shard = getattr(policy, "shard", None)
    if shard is not None:
        return shard.step(policy, batch, minibatch, chunk_loss, opt, sched, grad_clip, side)
    policy.train()
    n, total = len(batch), 0.0
    for i in range(0, n, minibatch):
        chunk = batch[i : i + minibatch]
        loss = chunk_loss(policy, chunk) * len(chunk) / n
        loss.backward()
        total += float(loss.detach())
    norm = clip_and_step(policy.parameters(), opt, sched, grad_clip)
    policy.eval()
    return total, norm
