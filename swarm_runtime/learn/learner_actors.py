"""MPT's updates and SFT on learner actors (``cluster.learners=ray``; docs/reference/cluster.md, "Learner actors"):
the trainer's side of :mod:`swarm_runtime.cluster.learners` (the actors, started on first use, each training the
roles it holds) and of a sharded learner (:mod:`swarm_runtime.cluster.shards`)."""

from __future__ import annotations

from functools import partial

from loguru import logger

from swarm_runtime.cluster import restart_wait_s
from swarm_runtime.cluster.placement import node_resources
from swarm_runtime.learn.phases import Rewound
from swarm_runtime.models.masters import restore_master_weights

#: Metrics of ``bid_update`` counted over all pairs: summed over the learner actors that each got a share.
SUMMED = ("charts/bid_pairs", "charts/bid_pairs_higher_won", "charts/bid_pairs_runner_up")


class LearnerActors:
    """A trainer's updates (:meth:`_update`) and SFT (:meth:`_sft_on_learners`) in process or on learner actors,
    as ``cluster.learners`` says. Mixed into :class:`~swarm_runtime.learn.mpt.MPTTrainer`, whose ``cfg``, ``ctx``,
    ``agents``, ``policies``, ``optimizers``, ``_envs``, ``_optimizer_maker()``, ``_reference_policies()``,
    ``_rewind(lost)``, ``_stopped(gone)`` and ``_address_arg()`` it uses; ``_group`` (the actors),
    ``_group_loaded`` (whether they hold the driver's weights and optimizer state of now) and ``learner_options``
    are set by its constructor."""

    def _ray_learners(self) -> bool:
        c = self.cfg.get("cluster")
        return c is not None and c.get("learners", "local") == "ray"

    def _update(self, kind: str, fn, items: list, agent_of, **kw) -> dict:
        """Update ``kind`` (``fn``: ``action_update`` on samples, ``bid_update`` on pairs; ``agent_of(item)``: the
        agent index an item trains; ``kw["reference"]``: whether the reference policies take part). In process
        (``cluster.learners=local``), or on the learner actors of the items' roles (``ray``): each gets its items
        (and ``behaviour``, aligned with them), the driver takes back the changed weights and the FLOPs counted."""
        use_ref = bool(kw.pop("reference"))
        if not self._ray_learners():
            ref = self._reference_policies() if use_ref else None
            return fn(self.agents, items, self.optimizers[kind], reference=ref, **kw)
        from swarm_runtime.cluster.learners import LearnerGone, LearnerLost, copy_params, replay_flops

        try:
            group = self._learners()
            results = group.update(fn, kind, self._shares(group, items, agent_of, use_ref, kw))
        except LearnerLost as lost:
            self._rewind(lost)
            raise Rewound(str(lost)) from None
        except LearnerGone as gone:
            raise self._stopped(gone) from None
        m: dict = {}
        for res in results:
            for k, v in res["metrics"].items():
                m[k] = m[k] + v if k in SUMMED and k in m else v
            for role, tensors in res["params"].items():
                copy_params(self.policies[role], tensors)
            replay_flops(self.ctx.flops, res["flops"])
        return m

    def _shares(self, group, items: list, agent_of, use_ref: bool, kw: dict) -> dict:
        """``{learner: (its items, its keyword arguments)}``: each item to the learner of its agent's role
        (``behaviour``, one entry per item, split alike); no items: the first role's learner, with none."""
        share: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            share.setdefault(group.learner_of[self.agents[agent_of(item)].role], []).append(i)
        if not share:  # nothing to train: the learner of the first role answers the empty update's metrics
            share = {group.learner_of[next(iter(self.policies))]: []}
        return {
            name: (
                [items[i] for i in idx],
                {
                    **kw,
                    "reference": use_ref,
                    **({"behaviour": [kw["behaviour"][i] for i in idx]} if "behaviour" in kw else {}),
                },
            )
            for name, idx in share.items()
        }

    def _sft_on_learners(self, fn, kwargs_of) -> list[tuple]:
        """``cluster.learners=ray``: the learner actors start now (before SFT) and each runs ``fn`` (:func:`sft_units`,
        or the monolithic model's) on its roles, with ``kwargs_of(roles)`` (their demos, seeds and settings as in
        process: the same result); the driver copies the trained weights (and fp32 masters, and a trained shared
        base) into its copies. The units in the in-process order (bases, then roles), each with the FLOPs it
        counted. A learner lost here is restarted and does its SFT again (``LearnerGroup.sft``, within
        ``cluster.learner_restarts``; a sharded learner's ranks all); one that cannot be (its restarts used up) ends the
        run with one line: there is no checkpoint yet, and a resume does the SFT again."""
        from swarm_runtime.cluster.learners import LearnerGone, LearnerLost, copy_params

        try:
            group = self._learner_group(sft_first=True)
            results = group.sft(fn, {name: kwargs_of(roles) for name, roles in group.roles.items()})
        except (LearnerLost, LearnerGone) as exc:
            raise LearnerGone(
                f"{exc}, during the SFT cold start; the run has no checkpoint yet: "
                f"swarm run run_dir={self.ctx.run_dir} "
                f"resume=true{self._address_arg()} starts it again (SFT from the start)"
            ) from None
        shared = {p.shared_base.name: p.shared_base for p in self.policies.values() if hasattr(p, "shared_base")}
        units = []
        for name, res in results.items():
            for role, tensors in res["params"].items():
                copy_params(self.policies[role], tensors)
                restore_master_weights(self.policies[role].parameters(), res["masters"][role])
            for base, tensors in res["bases"].items():
                shared[base].load_base_params(tensors)
            units += res["units"]
            logger.info("SFT of {} ran on learner {} (pid {})", "+".join(group.roles[name]), name, group.pids[name])
        order = {role: i for i, role in enumerate(self.policies)}
        return sorted(units, key=lambda u: (u[0] != "base", order[u[3]]))

    def _learners(self):
        """``cluster.learners=ray``: the learner actors (:meth:`_learner_group`), given the reference policies and
        loaded with the driver's weights and optimizer state whenever the driver's are the newer (the start of RL, a
        resume's or a rewind's checkpoint); from then on the optimizers live only there."""
        from swarm_runtime.cluster.learners import params_of, trained_bases, training_state

        group = self._learner_group()
        if not self._group_loaded:
            a = self.cfg.algo
            if (float(a.kl_coef) > 0 or str(a.bid_reference) == "sft") and group.reference_missing:
                group.set_reference(self._reference_policies())  # made after SFT: the actors started before it
            bases = trained_bases(self.policies)  # the actors were made before SFT: a restarted one lacks its base's
            self._group.load(
                {
                    role: {
                        "params": params_of(p),
                        "state": training_state(p, {k: t[role] for k, t in self.optimizers.items() if role in t}),
                        **({"base": bases[role]} if role in bases else {}),
                    }
                    for role, p in self.policies.items()
                }
            )
            self._group_loaded, self.optimizers = True, {}
        return self._group

    def _learner_group(self, sft_first: bool = False):
        """The learner actors, started on first use: before SFT (``sft_first``: a sharded learner's ranks then
        each run SFT on their own full copy, and are sharded after it) or, on a resumed run, at its first update.
        They are started without reference policies (those come from the SFT checkpoint: :meth:`_learners`)."""
        from swarm_runtime.cluster.learners import LearnerGroup
        from swarm_runtime.cluster.sharded_learners import ShardedLearnerGroup

        if self._group is None:
            c, t = self.cfg.cluster, self.cfg.get("train")
            # fsdp, deepspeed: each learner train.shards ranks (cluster/shards.py)
            sharded = t is not None and str(t.engine) in ("fsdp", "deepspeed")
            make = (
                partial(ShardedLearnerGroup, shards=int(t.shards), engine=str(t.engine), join=not sft_first)
                if sharded
                else LearnerGroup
            )
            self._group = make(
                self.policies,
                [(x.name, x.role) for x in self.agents],
                self._optimizer_maker(),
                None,
                self.ctx.run_dir,
                max_restarts=int(c.learner_restarts),
                options=self._learner_placement,
                address=c.address,
                num_cpus=c.get("num_cpus"),
                restart_wait_s=restart_wait_s(self.cfg),
            )
            spec = getattr(self._envs[1], "placement", None) if self._envs is not None else None
            if spec is not None:  # each rank in its group's bundle, as the actor and Ray's accounts tell
                from swarm_runtime.cluster.placement import check_learners_placed

                for line in check_learners_placed(spec, self._group.placement_groups(), self._group.roles):
                    logger.info("placement: {}", line)
            # where each rank runs (its node's id, address and custom resources), as it says: on more than one node
            # (cluster.resources, a placement's bundles, or Ray's choice) the logs and the multi-node tests read it
            from swarm_runtime.cluster.ray_helpers import nodes_of

            g = self._group
            names = [(n, k) for n in g.actors for k in range(len(g.processes(n)))]
            where = nodes_of(g.ray, [g.processes(n)[k] for n, k in names], g.restart_wait_s)
            logger.info("learners on nodes: {}", ", ".join(f"{n}[{k}] {w}" for (n, k), w in zip(names, where)))
        return self._group

    def _learner_placement(self, name: str, roles: list[str], shard: int = 0) -> dict:
        """Ray options of learner ``name``'s shard ``shard``: :attr:`learner_options`, and with ``cluster.placement``
        its slot (learner shard ``shard``) in the placement group of its roles, which the env cluster reserved."""
        from swarm_runtime.cluster.shards import rank_gpus

        out = {**node_resources(self.cfg, "learner"), **self.learner_options}
        spec = getattr(self._envs[1], "placement", None) if self._envs is not None else None
        out.update(rank_gpus(self.cfg, placed=spec is not None))  # a sharded rank's GPU, unless its bundle has it
        if spec is not None:
            from swarm_runtime.cluster.placement import actor_options

            group = next((g.name for g in spec.groups if set(roles) <= set(g.roles)), None)
            if group is None:
                raise RuntimeError(f"learner {name!r}: no placement group holds its roles {roles}")
            out.update(actor_options(spec, group, "learner", shard))
        return out

    def _last_lr(self, kind: str) -> float:
        """The learning rate of the first role's ``kind`` optimizer (the ``charts/lr`` metric)."""
        if self._group_loaded:
            return self._group.lr[kind][next(iter(self.policies))]
        return next(iter(self.optimizers[kind].values()))[1].get_last_lr()[0]

    def _training_states(self) -> dict | None:
        """The optimizer state and fp32 masters of each role for a checkpoint: the learner actors' once they hold
        them (``cluster.learners=ray``), else None (the driver's own optimizers)."""
        if not self._group_loaded:
            return None
        from swarm_runtime.cluster.learners import LearnerGone, LearnerLost

        try:
            return self._group.training_states()
        except LearnerLost as lost:
            self._rewind(lost)
            raise Rewound(str(lost)) from None
        except LearnerGone as gone:
            raise self._stopped(gone) from None
