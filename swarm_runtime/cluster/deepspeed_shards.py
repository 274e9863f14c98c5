"""DeepSpeed ZeRO-3 learner ranks (docs/reference/sharding.md, "DeepSpeed ZeRO-3 in a run"): ``train.engine=deepspeed
train.shards=S cluster.learners=ray`` makes each learner ``S`` Ray actors as ``train.engine=fsdp`` does
(swarm_runtime/cluster/sharded_learners.py: the same group, regroup and rewind); only what a DeepSpeed rank does
differently from an FSDP one (swarm_runtime/cluster/shards.py) is here.

A rank joins its group through ``deepspeed.init_distributed`` (gloo on the CPU, nccl on CUDA) and wraps each role's
model in a ZeRO-3 engine (``deepspeed.initialize``: the role's first optimizer kind as the client optimizer, which
ZeRO steps over its flat fp32 partition). The policy's model becomes the engine (forwards must go through it:
docs/reference/sharding.md). The role's other optimizer kinds (``mpt.role_optimizers``: action and bid steps have their
own AdamW moments and schedules) are plain torch optimizers too: :func:`~swarm_runtime.learn.sharded.shard_step`
hands the kind's optimizer to the engine before its step, so each keeps its own state over the same partition.
Engines and optimizers stay across updates.

Checkpoints move full tensors through DeepSpeed's documented ZeRO-3 accessors (``safe_get_full_fp32_param``,
``safe_get_full_optimizer_state`` and their ``safe_set_`` twins) in the in-process optimizer's ``state_dict`` format,
so a run checkpointed under deepspeed resumes under local, and back. DeepSpeed is imported in the actors only.
"""

from __future__ import annotations

import os
from datetime import timedelta

from swarm_runtime.cluster.shards import GROUP_TIMEOUT_S, ShardWorker, rank_device, to_device


class DeepSpeedShardWorker(ShardWorker):
    """Rank ``rank`` of a learner whose roles are ZeRO-3 engines (:class:`ShardWorker` otherwise)."""

    def join(self, host: str, port: int) -> int:
        """Join the group at ``host:port`` (every rank at once) and wrap each role's model in a ZeRO-3 engine."""
        import torch

        backend, kind, device = rank_device(torch.cuda.device_count() if torch.cuda.is_available() else 0)
        # DeepSpeed's accelerator: the user's, else this rank's device (0.19.8 unset falls back to the CPU with a
        # warning; named here, every rank and the backend agree)
        os.environ["DS_ACCELERATOR"] = os.environ.get("DS_ACCELERATOR") or kind
        os.environ.update(MASTER_ADDR=host, MASTER_PORT=str(port), RANK=str(self.rank), WORLD_SIZE=str(self.world))
        os.environ["LOCAL_RANK"] = "0" if kind == "cuda" else str(self.rank)  # Ray gives a GPU rank its own device
        if kind == "cuda":  # written as fsdp's GPU ranks (cluster/shards.py); not run on a GPU
            torch.cuda.set_device(0)
            to_device([*self.policies.values(), *(self.reference or {}).values()], device)
        import deepspeed

        from swarm_runtime.learn.sharded import Shard, to_masters, zero3_engine

        deepspeed.init_distributed(
            dist_backend=backend,
            auto_mpi_discovery=False,
            timeout=timedelta(seconds=GROUP_TIMEOUT_S),
            init_method=f"tcp://{host}:{port}",
            rank=self.rank,
            world_size=self.world,
            verbose=False,
        )
        low = {}
        for role, policy in self.policies.items():
            if not hasattr(policy, "model") or getattr(policy, "shared_base", None) is not None:
                raise RuntimeError(f"learner {self.name!r}: role {role} is not a full copy; ZeRO-3 cannot shard it")
            # a bf16 model: its fp32 masters, which ZeRO's partition holds (the module computes in bf16)
            low[role] = to_masters(policy.model)
            if low[role] not in (None, torch.bfloat16):
                raise RuntimeError(f"learner {self.name!r}: role {role} is {low[role]}; ZeRO-3 steps fp32 or bf16")
        self.optimizers = self._make_optimizers(self.policies)  # plain AdamW: the parameters are fp32 now
        for role, policy in self.policies.items():
            first = next(t[role][0] for t in self.optimizers.values() if role in t)
            policy.model = zero3_engine(policy.model, first, low[role])
            policy.shard = Shard(self.rank, self.world, low[role], engine="deepspeed")
        return os.getpid()

    def _params(self, role: str) -> list:
        from deepspeed.utils import safe_get_full_fp32_param

        full = [safe_get_full_fp32_param(p).detach().cpu().clone() for p in self.policies[role].parameters()]
        return full if self.rank == 0 else []  # every rank gathered (a collective)

    def training_states(self) -> dict:
        """Per role: a bf16 model's fp32 masters, each kind's optimizer state (:func:`full_optimizer_state`) and
        scheduler state (rank 0's)."""
        out: dict = {}
        for role, policy in self.policies.items():
            st = out[role] = {}
            if policy.shard.compute is not None:  # ZeRO's fp32 partition holds the masters (the in-process format)
                st["master_weights"] = self._params(role)
            for kind, table in self.optimizers.items():
                if role in table:
                    opt, sched = table[role]
                    st[f"optimizer_{kind}"] = full_optimizer_state(policy.model, opt)
                    st[f"scheduler_{kind}"] = sched.state_dict()
        return out if self.rank == 0 else {}

    def load(self, states: dict) -> dict:
        """:meth:`LearnerWorker.load` into the engines: the full weights (the module's partitions and ZeRO's fp32
        master partition: a bf16 run's masters where the state has them) and each kind's optimizer and scheduler
        state."""
        import copy

        for role, st in copy.deepcopy(dict(states)).items():
            engine = self.policies[role].model
            masters = st["state"].get("master_weights") or [None] * len(st["params"])  # a bf16 run's fp32 masters
            load_full_params(engine, [t if m is None else m for t, m in zip(st["params"], masters)])
            for kind, table in self.optimizers.items():
                if f"optimizer_{kind}" in st["state"] and role in table:
                    opt, sched = table[role]
                    load_full_optimizer_state(engine, opt, st["state"][f"optimizer_{kind}"])
                    sched.load_state_dict(st["state"][f"scheduler_{kind}"])
        return self.lrs()


def _flats(engine) -> list:
    """ZeRO-3's flat fp32 partitions of ``engine`` (one per sub-group): what its client optimizers step."""
    return list(engine.optimizer.fp32_partitioned_groups_flat)


def full_optimizer_state(engine, opt) -> dict:
    """``opt``'s state (a client optimizer of ``engine``) as the same optimizer over the full parameters would give
    its ``state_dict()``: moments per parameter index (``parameters()`` order, each gathered: a collective) and the
    param groups with those indices. No step taken yet: no state, as in process."""
    from deepspeed.utils import safe_get_full_optimizer_state

    params = list(engine.module.parameters())
    groups = [
        {**{k: v for k, v in g.items() if k != "params"}, "params": list(range(len(params)))} for g in opt.param_groups
    ]
    flat = [opt.state.get(f) for f in _flats(engine)]
    if not all(flat):
        return {"state": {}, "param_groups": groups}
    engine.optimizer.optimizer = opt  # the accessors read the engine's client optimizer's state
    keys = [k for k in flat[0] if k != "step"]
    state = {
        i: {
            "step": flat[0]["step"].clone(),
            **{k: safe_get_full_optimizer_state(p, k).detach().cpu().clone() for k in keys},
        }
        for i, p in enumerate(params)
    }
    return {"state": state, "param_groups": groups}


def load_full_optimizer_state(engine, opt, state: dict) -> None:
    """Load ``state`` (:func:`full_optimizer_state`'s format, or an in-process optimizer's) into ``opt`` over
    ``engine``'s partition: each moment's partition set through ``safe_set_full_optimizer_state`` (every rank)."""
    import torch
    from deepspeed.utils import safe_set_full_optimizer_state

    for g, saved in zip(opt.param_groups, state["param_groups"]):
        g.update({k: v for k, v in saved.items() if k != "params"})
    params = list(engine.module.parameters())
    entries = {int(i): st for i, st in state["state"].items()}
    for f in _flats(engine):
        opt.state.pop(f, None)
    if not entries:
        return
    first = entries[min(entries)]
    keys = [k for k, v in first.items() if k != "step" and torch.is_tensor(v)]
    for f in _flats(engine):  # AdamW's lazy state, made now so that the accessors have partitions to write
        opt.state[f] = {"step": first["step"].clone(), **{k: torch.zeros_like(f) for k in keys}}
    engine.optimizer.optimizer = opt
    for i, p in enumerate(params):
        for k in keys:
            if i in entries:
                safe_set_full_optimizer_state(p, entries[i][k].to(torch.float32), k)


def load_full_params(engine, tensors) -> None:
    """Copy full ``tensors`` (``parameters()`` order) into ``engine``'s module (each gathered, set, partitioned
    again) and into ZeRO's fp32 master partition (``safe_set_full_fp32_param``); every rank calls it."""
    import deepspeed
    import torch
    from deepspeed.utils import safe_set_full_fp32_param

    params = list(engine.module.parameters())
    if len(params) != len(tensors):
        raise RuntimeError(f"deepspeed learner load: {len(tensors)} tensors for a model of {len(params)} parameters")
    with deepspeed.zero.GatheredParameters(params, modifier_rank=0), torch.no_grad():
        for p, t in zip(params, tensors):
            p.data.copy_(t.to(p.dtype))
    for p, t in zip(params, tensors):
        safe_set_full_fp32_param(p, t.to(torch.float32))
