"""A sharded learner's rank (docs/reference/sharding.md, "Sharded learners in a run"):
``train.engine=fsdp train.shards=S`` with ``cluster.learners=ray`` makes each learner (a role's full copy, or a base
with its roles' LoRA adapters) ``S`` Ray actors, the ranks of one process group (gloo on CPUs, nccl on GPUs);
:class:`ShardWorker` is one rank's body, the driver's side is :mod:`.sharded_learners`. Each rank keeps the role's model
sharded by FSDP2 (``learn/sharded.py: shard_policies``) and the role's optimizers over its shards
(``mpt.role_optimizers``: the same settings) across updates.

An update goes to every rank of a learner alike (the same payload); each runs the same ``action_update`` /
``bid_update`` (FSDP forwards are collectives: the KL and bid-reference forwards run on every rank alike), but
``accumulate_and_step`` takes only the rank's chunks of each batch (the policy's ``shard``:
``learn/sharded.py: shard_step``) and the metrics, side statistics and FLOPs are merged across ranks. Rank 0
answers for the learner: the metrics, the changed roles' full parameters (gathered) and the FLOPs, so the driver
sees what :class:`~swarm_runtime.cluster.learners.LearnerWorker` sends. Checkpoints hold the full optimizer state
in the in-process optimizer's format (a run checkpointed under fsdp resumes under local, and back).

Faults: a rank that dies breaks its group's collectives (the others would wait out the gloo timeout,
:data:`GROUP_TIMEOUT_S`); the driver regroups the learner (:mod:`.sharded_learners`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta

from swarm_runtime.cluster.learners import LearnerWorker

#: Seconds a collective of a learner's ranks (joining the group included) waits for a rank that does not come.
GROUP_TIMEOUT_S = 120.0


def _no_optimizers(policies) -> dict:
    return {}


def rank_device(visible_gpus: int) -> tuple[str, str, str]:
    """``(process-group backend, device-mesh type, model device)`` of a learner rank that sees ``visible_gpus`` CUDA
    devices: ``nccl`` on its first (Ray gives an actor asking ``num_gpus`` its own GPUs through
    ``CUDA_VISIBLE_DEVICES``, so the rank's device is ``cuda:0``), else ``gloo`` on the CPU."""
    return ("nccl", "cuda", "cuda:0") if int(visible_gpus) > 0 else ("gloo", "cpu", "cpu")


def rank_gpus(cfg, placed: bool) -> dict:
    """Ray options a sharded learner's rank adds for its GPU: ``num_gpus=1`` with ``train.engine=fsdp`` (or
    ``deepspeed``) on a CUDA
    profile (``hardware.device=cuda...``) when no placement group holds it (``placed``: ``cluster.placement``'s bundle
    has its GPU already, ``placement.actor_options``, which must not be asked twice); {} otherwise."""
    t = cfg.get("train")
    sharded = t is not None and str(t.engine) in ("fsdp", "deepspeed")
    return {"num_gpus": 1} if sharded and not placed and str(cfg.hardware.device).startswith("cuda") else {}


def to_device(policies, device: str) -> None:
    """Move the models of ``policies`` (shared bases once) to ``device``, and point the policies' inputs there."""
    for p in policies:
        p.model.to(device)
        p.device = device


class ShardWorker(LearnerWorker):
    """Rank ``rank`` of a learner of ``world`` ranks: :class:`LearnerWorker` whose policies are sharded, and whose
    optimizers are made, when it joins its group (:meth:`join`)."""

    def __init__(self, name: str, rank: int, world: int, policies: dict, agents, make_optimizers: Callable, *rest):
        self.rank, self.world, self._make_optimizers = int(rank), int(world), make_optimizers
        super().__init__(name, policies, agents, _no_optimizers, *rest)

    def address(self) -> tuple[str, int]:
        """Where the group meets (rank 0's): this node's IP and a free port."""
        import ray

        from swarm_runtime.learn.sharded import free_port

        host = ray.util.get_node_ip_address()
        return host, free_port(host)

    def join(self, host: str, port: int) -> int:
        """Join the group at ``host:port`` (every rank at once; gloo on the CPU, nccl on this actor's GPU:
        :func:`rank_device`), shard each policy's model over it and make the optimizers over the shards. Returns this
        process's pid."""
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        from swarm_runtime.learn.sharded import shard_policies

        backend, kind, device = rank_device(torch.cuda.device_count() if torch.cuda.is_available() else 0)
        if kind == "cuda":  # this actor's GPU (num_gpus): the models there before they are sharded
            torch.cuda.set_device(0)
            to_device([*self.policies.values(), *(self.reference or {}).values()], device)
        dist.init_process_group(
            backend,
            init_method=f"tcp://{host}:{port}",
            rank=self.rank,
            world_size=self.world,
            timeout=timedelta(seconds=GROUP_TIMEOUT_S),
        )
        mesh = init_device_mesh(kind, (self.world,))
        for role, policy in self.policies.items():
            if not hasattr(policy, "model"):
                raise RuntimeError(f"learner {self.name!r}: role {role} has no model; fsdp cannot shard it")
        # a base with its roles' adapters: sharded once; a bf16 model: its fp32 masters, computing in bf16
        shard_policies(self.policies, mesh, self.rank, self.world)
        self.optimizers = self._make_optimizers(self.policies)
        return os.getpid()

    def sft(self, fn: Callable, kwargs: dict) -> dict:
        """:meth:`LearnerWorker.sft` on this rank's own full copy, before :meth:`join` shards it (every rank alike:
        the same seed and examples, the same result); rank 0 answers, the others send nothing back."""
        out = super().sft(fn, kwargs)
        return out if self.rank == 0 else {}

    def _params(self, role: str) -> list:
        from swarm_runtime.learn.sharded import full_params

        policy = self.policies[role]
        full = full_params(policy.model, list(policy.parameters()))  # a collective: every rank gathers
        return [t.cpu() for t in full] if self.rank == 0 else []  # the driver may have no GPU

    def training_states(self) -> dict:
        """Per role: the fp32 masters (a bf16/fp16 model's: its sharded parameters), the optimizer and scheduler
        state of each kind, gathered (rank 0's; the others answer {}); ``learner.training_state``'s format."""
        from swarm_runtime.learn.sharded import full_optimizer_state, full_params

        out: dict = {}
        for role, policy in self.policies.items():
            st = out[role] = {}
            if policy.shard.compute is not None:  # the sharded fp32 parameters are the masters (in-process format)
                st["master_weights"] = [t.cpu() for t in full_params(policy.model, list(policy.parameters()))]
            for kind, table in self.optimizers.items():
                if role in table:
                    opt, sched = table[role]
                    st[f"optimizer_{kind}"], st[f"scheduler_{kind}"] = full_optimizer_state(opt), sched.state_dict()
        return out if self.rank == 0 else {}

    def load(self, states: dict) -> dict:
        """:meth:`LearnerWorker.load` into the shards (full weights, a trained shared base, optimizer state, sharded
        here)."""
        import copy

        from swarm_runtime.learn.sharded import load_full_optimizer_state, load_full_params

        for role, st in copy.deepcopy(dict(states)).items():
            policy = self.policies[role]
            masters = st["state"].get("master_weights") or [None] * len(st["params"])  # a bf16 run's fp32 masters
            full = [t if m is None else m for t, m in zip(st["params"], masters)]
            load_full_params(policy.model, full, list(policy.parameters()))
            if "base" in st:  # a shared base the SFT trained (restarted ranks were made with the untrained one)
                load_full_params(policy.model, st["base"], policy.shared_base.base_params())
            for kind, table in self.optimizers.items():
                if f"optimizer_{kind}" in st["state"] and role in table:
                    opt, sched = table[role]
                    load_full_optimizer_state(opt, st["state"][f"optimizer_{kind}"])
                    sched.load_state_dict(st["state"][f"scheduler_{kind}"])
        return self.lrs()
