"""The fp32 master copies of low-precision parameters, as a checkpoint saves and restores them.

The optimizer (:class:`swarm_runtime.learn.optim.MasterWeightAdamW`) keeps each bfloat16/float16
parameter's master as the parameter's ``_swarm_master`` attribute; the checkpoint
(:mod:`swarm_runtime.runs.checkpoint`) saves and restores them through the two functions here, so the core
does not import the training package above it."""

from __future__ import annotations

import torch

#: The attribute of a parameter holding its fp32 master copy.
MASTER_ATTR = "_swarm_master"


def master_weights(params) -> list[torch.Tensor | None] | None:
    """The fp32 masters of ``params`` (None where a parameter has none), for a checkpoint; None
    when no parameter has one."""
    masters = [getattr(p, MASTER_ATTR, None) for p in params]
    return masters if any(m is not None for m in masters) else None


def restore_master_weights(params, saved) -> None:
    """Copy checkpointed masters into the live ones (in place: the optimizers hold them), so a
    resumed run keeps the sub-bf16 progress the rounded weights in the checkpoint do not show."""
    for p, m in zip(params, saved or []):
        if m is not None and getattr(p, MASTER_ATTR, None) is not None:
            getattr(p, MASTER_ATTR).copy_(m)
