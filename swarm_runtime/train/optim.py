"""AdamW with linear warm-up and cosine decay, and gradient clipping."""
from __future__ import annotations

import math

import torch


def make_optimizer(params, lr: float, weight_decay: float, total_steps: int, warmup: int = 0,
                   min_ratio: float = 0.1, eps: float = 1e-8):
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95), eps=eps)

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        span = max(1, total_steps - warmup)
        progress = min(1.0, (step - warmup) / span)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def clip_and_step(params, opt, sched, max_norm: float) -> float:
    params = [p for p in params if p.grad is not None]
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return norm


def accumulate_and_step(policy, batch: list, minibatch: int, chunk_loss, opt, sched, grad_clip: float):
    """Accumulate gradients over ``batch`` in chunks of ``minibatch`` (each chunk's loss
    weighted by its share, so the result is the batch mean), then take one clipped step.
    Returns ``(loss, gradient norm before clipping)``."""
    policy.train()
    n, total = len(batch), 0.0
    for i in range(0, n, minibatch):
        chunk = batch[i:i + minibatch]
        loss = chunk_loss(policy, chunk) * len(chunk) / n
        loss.backward()
        total += float(loss.detach())
    norm = clip_and_step(policy.parameters(), opt, sched, grad_clip)
    policy.eval()
    return total, norm
