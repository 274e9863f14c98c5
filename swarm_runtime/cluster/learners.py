"""Learner actors (docs/reference/cluster.md, "Learner actors"): ``cluster.learners=ray`` keeps a run's
trainable weights and their optimizers in Ray actors, one per role with a full copy, one per shared base when
the roles are LoRA adapters on it (every role of the base in one actor).

The driver (the trainer) keeps the auction, credit, branches, the turn engine and a sampling copy of each
policy. An update's samples (or bid pairs) go to the actors of the roles they train; each runs the update
function the driver names (``learn/action.py: action_update``, ``learn/bid.py: bid_update``: the same math and
metrics as in process) on its own policies and optimizers, and sends back the metrics, the changed roles'
parameters (through Ray's object store) and the FLOPs it counted; the driver copies the parameters into its
sampling copies (then ``Sampler.sync`` as in process) and replays the FLOPs into the run's counter.

Checkpoints are written by the driver as in process: the weights from its (synced) copies, the optimizer and
scheduler state and fp32 master weights from the actors (:meth:`LearnerGroup.training_states`), so a checkpoint
is the same whichever ``cluster.learners`` wrote it.

Faults: Ray restarts an actor whose process died (``cluster.learner_restarts`` times), from its creation
arguments (the weights as RL started); the driver then rewinds the run to its last checkpoint and loads that
into every actor (:meth:`LearnerGroup.load`). :class:`LearnerLost` is raised for the driver to rewind;
:class:`LearnerGone` when the restarts are used up (a node lost): the run stops with one line naming what was
lost and how to resume.

Plain Python besides Ray: the actor is :class:`LearnerWorker` under ``ray.remote``. This module does not import
the training package: the driver passes the update and optimizer functions (pickled by reference).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from loguru import logger

from swarm_runtime.cluster.actors import RESTART_WAIT_S, ActorBody, ActorGroup
from swarm_runtime.config.errors import ConfigError
from swarm_runtime.models.masters import master_weights, restore_master_weights

#: Restarts Ray gives a learner actor by default (``cluster.learner_restarts``).
MAX_RESTARTS = 4
#: What a learner actor answers a call meant for another process of it (:meth:`LearnerWorker.checked`): Ray restarted it
#: between calls (its node lost while the driver asked nothing), from its creation arguments
RESTARTED = "learner restarted"


class LearnerLost(RuntimeError):
    """A learner actor's process died during a call; Ray restarted it. The driver rewinds to its checkpoint."""

    def __init__(self, name: str, pid: int, new_pid: int):
        super().__init__(f"learner {name!r} lost (pid {pid}); restarted as pid {new_pid}")
        self.name, self.pid, self.new_pid = name, pid, new_pid
        #: the other learners' answers to the call that lost this one, by learner (:meth:`LearnerGroup._get`; None:
        #: not kept)
        self.answered: dict | None = None


class LearnerGone(ConfigError):
    """A learner actor died and Ray will not restart it (restarts used up, or its node is gone). A
    :class:`ConfigError` for the command line's sake only: one line, exit 2 (as ``checkpoint.CheckpointError``)."""


class RecordingFlops:
    """The FLOPs counter of an actor's policies: records each call, for the driver to replay into the run's
    counter in the same order (the same sums, bit for bit, as counting in process)."""

    def __init__(self):
        self.events: list[tuple] = []

    def forward(self, n_params: int, tokens: int) -> None:
        self.events.append(("forward", n_params, tokens))

    def train(self, n_params: int, tokens: int, frozen: int = 0) -> None:
        self.events.append(("train", n_params, tokens, frozen))

    def take(self) -> list[tuple]:
        out, self.events = self.events, []
        return out


def replay_flops(counter, events: Sequence[tuple]) -> None:
    """Count ``events`` (:class:`RecordingFlops`) into ``counter`` under its current category."""
    for kind, *args in events:
        getattr(counter, kind)(*args)


def params_of(policy) -> list:
    """The trainable tensors of a policy, in ``parameters()`` order (a full copy: the model; an adapter: its
    LoRA matrices), detached."""
    return [p.detach() for p in policy.parameters()]


def copy_params(policy, tensors: Sequence) -> None:
    """Copy ``tensors`` (:func:`params_of` of the same structure) into ``policy``'s parameters, in place."""
    import torch

    params = list(policy.parameters())
    if len(params) != len(tensors):
        raise RuntimeError(f"learner sync: {len(tensors)} tensors for a policy of {len(params)} parameters")
    with torch.no_grad():
        for p, t in zip(params, tensors):
            p.copy_(t)


def trained_bases(policies: Mapping) -> dict:
    """``{role: the weights of its shared base}`` for the first role of each shared base the SFT cold start trains
    (``model.adapter=lora`` on a config-built base): a role's :func:`params_of` are its adapter's only."""
    out, seen = {}, set()
    for role, p in policies.items():
        shared = getattr(p, "shared_base", None)
        if shared is not None and shared.trains_base and id(shared) not in seen:
            seen.add(id(shared))
            out[role] = [t.detach() for t in shared.base_params()]
    return out


def training_state(policy, optimizers: Mapping) -> dict:
    """What a checkpoint's ``training_state.pt`` holds of a role beside its RNG: fp32 masters (bf16/fp16
    weights only), then each kind's optimizer and scheduler state (``checkpoint.save_checkpoint``'s order)."""
    out: dict = {}
    masters = master_weights(policy.parameters())
    if masters is not None:
        out["master_weights"] = masters
    for kind, (opt, sched) in optimizers.items():
        out[f"optimizer_{kind}"], out[f"scheduler_{kind}"] = opt.state_dict(), sched.state_dict()
    return out


class LearnerWorker(ActorBody):
    """One learner: the policies of ``roles`` (a role's full copy, or every adapter of one base), their
    optimizers (``make_optimizers(policies) -> {kind: {role: (optimizer, scheduler)}}``) and reference
    policies. ``agents``: the run's agents as ``(name, role)``, in the driver's order (samples and pairs name
    agents by index)."""

    def __init__(
        self,
        name: str,
        policies: dict,
        agents: Sequence[tuple[str, str]],
        make_optimizers: Callable,
        reference: dict | None = None,
        pid_file: str | None = None,
        threads: int | None = None,
    ):
        import torch

        if threads:
            torch.set_num_threads(int(threads))
        self.name, self.policies, self.reference = name, dict(policies), reference
        self.flops = RecordingFlops()
        for p in [*self.policies.values(), *(reference or {}).values()]:
            p.flops = self.flops
        absent = {role: object() for _, role in agents if role not in self.policies}  # roles of other learners
        self.agents = [
            SimpleNamespace(name=n, role=r, policy=self.policies[r] if r in self.policies else absent[r])
            for n, r in agents
        ]
        self.optimizers = make_optimizers(self.policies)
        if pid_file:  # for whoever needs to find this process (the fault test): rewritten by a restarted actor
            Path(pid_file).parent.mkdir(parents=True, exist_ok=True)
            Path(pid_file).write_text(f"{os.getpid()}\n")

    def checked(self, pid: int, method: str, *args):
        """``method(*args)``, if this is process ``pid`` (the one the driver loaded); else :data:`RESTARTED`, the call
        not made: a restarted actor holds its creation arguments' weights, not the trained ones (found on two nodes,
        tests/test_multinode.py: a learner whose node was lost between two calls answered the run's next calls from
        its restarted process, and the run ended with that learner's restarts at 0)."""
        if int(pid) != os.getpid():
            return RESTARTED
        return getattr(self, method)(*args)

    def placement_group(self) -> str | None:
        """The id (hex) of the Ray placement group this actor runs in, as Ray tells the actor; None: none."""
        import ray

        return ray.get_runtime_context().get_placement_group_id()

    def lrs(self) -> dict:
        """``{kind: {role: learning rate}}`` of the schedulers as they are."""
        return {k: {r: s.get_last_lr()[0] for r, (_, s) in t.items()} for k, t in self.optimizers.items()}

    def update(self, fn: Callable, kind: str, payload, kwargs: dict) -> dict:
        """``fn(agents, payload, optimizers[kind], **kwargs)`` (``kwargs["reference"]`` True: this learner's
        reference policies). Returns the metrics, the parameters of the roles it changed (a ``losses/*`` metric
        of theirs), the learning rates and the FLOPs counted."""
        kwargs = dict(kwargs)
        if "reference" in kwargs:
            kwargs["reference"] = self.reference if kwargs["reference"] else None
        self.flops.take()
        metrics = fn(self.agents, payload, self.optimizers[kind], **kwargs)
        changed = [r for r in self.policies if f"losses/{kind}_{r}" in metrics]
        return {
            "metrics": metrics,
            "params": {r: self._params(r) for r in changed},
            "lrs": self.lrs(),
            "flops": self.flops.take(),
        }

    def _params(self, role: str) -> list:
        """What the driver copies into its sampling copy of ``role`` after an update (:func:`params_of`)."""
        return params_of(self.policies[role])

    def set_reference(self, reference: dict | None) -> None:
        """This learner's reference policies (the frozen RL-start models), given after the SFT cold start made
        them: :meth:`LearnerGroup.set_reference`; sent again with every :meth:`LearnerGroup.load` (a restarted
        actor has only its creation arguments)."""
        self.reference = reference
        for p in (reference or {}).values():
            p.flops = self.flops

    def sft(self, fn: Callable, kwargs: dict) -> dict:
        """The SFT cold start of this learner's roles (``learn/mpt.py: sft_units``): ``fn(policies, after=...,
        **kwargs)`` -> ``[(kind, name, metrics)]``, ``after()`` called after each unit. Returns each unit with the
        FLOPs it counted, then every role's trained parameters and fp32 masters, and a trained shared base's
        weights (``model.adapter=lora``: the adapters' parameters do not hold them), by base name."""
        self.flops.take()
        cuts: list[list] = []
        units = fn(self.policies, after=lambda: cuts.append(self.flops.take()), **kwargs)
        bases = {self.policies[r].shared_base.name: t for r, t in trained_bases(self.policies).items()}
        return {
            "units": [(*u, f) for u, f in zip(units, cuts)],
            "params": {r: params_of(p) for r, p in self.policies.items()},
            "masters": {r: master_weights(p.parameters()) for r, p in self.policies.items()},
            "bases": bases,
        }

    def training_states(self) -> dict:
        """Per role: :func:`training_state` (for the driver's checkpoint)."""
        return {
            r: training_state(p, {k: t[r] for k, t in self.optimizers.items() if r in t})
            for r, p in self.policies.items()
        }

    def load(self, states: dict) -> dict:
        """Per role ``{"params": tensors, "state": training_state}`` (a checkpoint's, or the driver's at the
        start): weights, fp32 masters, optimizer and scheduler state (copied: ``Optimizer.load_state_dict`` keeps
        the tensors it is given, and Ray may hand them over read-only). Returns :meth:`lrs`."""
        import copy

        for role, st in copy.deepcopy(dict(states)).items():
            policy = self.policies[role]
            copy_params(policy, st["params"])
            if "base" in st:  # a shared base the SFT trained (a restarted actor has the untrained one it was made with)
                policy.shared_base.load_base_params(st["base"])
            restore_master_weights(policy.parameters(), st["state"].get("master_weights"))
            for kind, table in self.optimizers.items():
                if f"optimizer_{kind}" in st["state"] and role in table:
                    opt, sched = table[role]
                    opt.load_state_dict(st["state"][f"optimizer_{kind}"])
                    sched.load_state_dict(st["state"][f"scheduler_{kind}"])
        return self.lrs()


def learner_groups(policies: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Learner name -> its roles' policies: one per shared base (``base-<name>``: the roles that are adapters on
    it), one per role with a full copy (the role's name); in the roles' order."""
    out: dict[str, dict] = {}
    for role, p in policies.items():
        shared = getattr(p, "shared_base", None)
        key = role if shared is None else f"base-{shared.name}"
        out.setdefault(key, {})[role] = p
    return out


def pid_files(run_dir, names) -> dict[str, str | None]:
    """Where each learner's actor writes its pid: ``<run_dir>/learners/<name>.pid`` (None without a run folder).
    ``learners`` is recorded in the run folder's manifest, so ``overwrite=true`` deletes it with the run."""
    if run_dir is None:
        return dict.fromkeys(names)
    from swarm_runtime.runs.runfiles import claim

    folder = claim(Path(run_dir) / "learners")
    return {n: str(folder / f"{n}.pid") for n in names}


class LearnerGroup(ActorGroup):
    """The learner actors of a run (driver side). ``options``: extra Ray actor options (placement: resources,
    a placement group's bundle): a dict for every actor, or a function ``(learner name, its roles[, shard]) -> dict``
    (the shard given for shards > 0 of a sharded learner: swarm_runtime/cluster/sharded_learners.py).
    ``restart_wait_s``: how long a dead actor is waited for (``cluster.restart_wait_s``)."""

    def __init__(
        self,
        policies: Mapping[str, Any],
        agents: Sequence[tuple[str, str]],
        make_optimizers: Callable,
        reference: Mapping | None = None,
        run_dir: Path | None = None,
        max_restarts: int = MAX_RESTARTS,
        options: dict | Callable[[str, list[str]], dict] | None = None,
        address: str | None = None,
        num_cpus: int | None = None,
        restart_wait_s: float = RESTART_WAIT_S,
    ):
        import torch

        t0 = time.perf_counter()
        # the env workers' Ray when cluster.kind=ray started it first
        super().__init__(address, num_cpus, restart_wait_s=restart_wait_s, max_restarts=max_restarts)
        groups = learner_groups(policies)
        self.roles = {name: list(g) for name, g in groups.items()}
        self.learner_of = {r: name for name, rs in self.roles.items() for r in rs}
        self.pid_files = pid_files(run_dir, groups)
        self._options = options
        # the creation arguments (the policies as RL started, their references) stay referenced here while the
        # actors live: Ray restarts an actor from them (a restart whose arguments went out of scope fails)
        self._args = {
            name: (self.ray.put(g), None if reference is None else self.ray.put({r: reference[r] for r in g}))
            for name, g in groups.items()
        }
        self.actors = self._start(list(agents), make_optimizers, torch.get_num_threads())
        self.pids = dict(zip(self.actors, self.pids_of(self.actors.values())))
        self.restarts = {n: 0 for n in self.actors}
        self.lr: dict[str, dict[str, float]] = {}
        self._reference: dict | None = None  #: learner -> its reference policies in the object store (set_reference)
        logger.info(
            "learners on Ray: {} ({}), up in {:.1f} s",
            len(self.actors),
            ", ".join(f"{n}: {'+'.join(self.roles[n])} pid {self.pids[n]}" for n in self.actors),
            time.perf_counter() - t0,
        )

    def options(self, name: str, shard: int = 0) -> dict:
        """Ray options of learner ``name`` (its shard ``shard`` > 0: ``options(name, roles, shard)``)."""
        extra = self._options
        if callable(extra):
            extra = extra(name, self.roles[name], shard) if shard else extra(name, self.roles[name])
        return self.spawn_options(extra)

    def _start(self, agents: list, make_optimizers: Callable, threads: int) -> dict:
        """Create one :class:`LearnerWorker` actor per learner; ``{learner: actor}``."""
        return {
            name: self.spawn(
                LearnerWorker,
                name,
                args[0],
                agents,
                make_optimizers,
                args[1],
                self.pid_files[name],
                threads,
                options=self.options(name),
            )
            for name, args in self._args.items()
        }

    def processes(self, name: str) -> list:
        """The actors of learner ``name`` (one; a sharded learner's ranks in order)."""
        return [self.actors[name]]

    def placement_groups(self) -> dict[str, list]:
        """Per learner, the placement group id (hex, or None) each of its actors reports from inside."""
        return {n: self.ray.get([a.placement_group.remote() for a in self.processes(n)]) for n in self.actors}

    def _call(self, name: str, method: str, *args):
        """Call ``method`` of learner ``name`` in the process the driver knows (:meth:`LearnerWorker.checked`); what
        :meth:`_get` takes."""
        return self.actors[name].checked.remote(self.pids[name], method, *args)

    def _get(self, refs: dict):
        """``ray.get`` of ``{learner: ref}``; a learner whose process died (during the call, or before it: restarted,
        :data:`RESTARTED`): :meth:`_recover`, then :class:`LearnerLost` (or :class:`LearnerGone`)."""
        ray, out, lost = self.ray, {}, None
        for name, ref in refs.items():
            try:
                out[name] = ray.get(ref)
            except ray.exceptions.RayActorError:
                lost = lost or name
            else:
                if isinstance(out[name], str) and out[name] == RESTARTED:
                    del out[name]
                    lost = lost or name
        if lost is not None:
            exc = self._recover(lost)
            if isinstance(exc, LearnerLost):
                exc.answered = out  # what the others answered: a call made again need not ask them (sft)
            raise exc
        return out

    def _recover(self, name: str) -> Exception:
        """Wait for Ray to restart learner ``name``; the exception for the caller to raise."""
        pid = self.pids[name]
        if self.restarts[name] >= self.max_restarts:
            return LearnerGone(
                self._gone(name, f"Ray restarts it at most cluster.learner_restarts={self.max_restarts} times")
            )
        try:
            new = self.await_restart(self.actors[name], pid)
        except TimeoutError as exc:
            return LearnerGone(self._gone(name, str(exc)))
        self.restarts[name] += 1
        self.pids[name] = new
        self.log_restart(f"learner {name}", pid, new, self.actors[name])
        return LearnerLost(name, pid, new)

    def _gone(self, name: str, why: str) -> str:
        return (
            f"learner {name!r} (the trainable weights and optimizers of {', '.join(self.roles[name])}) was lost: its "
            f"process (pid {self.pids[name]}) died and {why}"
        )

    def update(self, fn: Callable, kind: str, payloads: Mapping[str, tuple]) -> list[dict]:
        """Run ``fn`` on each learner of ``payloads`` (``{learner: (payload, kwargs)}``) at once; their answers
        (:meth:`LearnerWorker.update`) in the order of ``payloads``."""
        refs = {n: self._call(n, "update", fn, kind, p, kw) for n, (p, kw) in payloads.items()}
        out = self._get(refs)
        for res in out.values():
            for k, table in res["lrs"].items():
                self.lr.setdefault(k, {}).update(table)
        return [out[n] for n in payloads]

    def sft(self, fn: Callable, payloads: Mapping[str, dict]) -> dict:
        """The SFT cold start on the learners of ``payloads`` (``{learner: kwargs of fn}``) at once:
        :meth:`LearnerWorker.sft` of each, by learner. A learner lost meanwhile and restarted by Ray (within
        ``cluster.learner_restarts``) does its SFT again, from the weights it was created with (the SFT's start, as
        the run's were when the actors started), while the others' answers are kept: the same result as without
        the loss. Its restarts used up: :class:`LearnerGone`."""
        done: dict = {}
        pending = dict(payloads)
        while pending:
            try:
                done.update(self._get({n: self._call(n, "sft", fn, kw) for n, kw in pending.items()}))
            except LearnerLost as lost:
                if lost.answered is None:  # a loss that kept no answers of the others: the run stops
                    raise
                done.update(lost.answered)
                logger.warning("learner {} lost during the SFT cold start: its SFT runs again ({})", lost.name, lost)
            pending = {n: kw for n, kw in pending.items() if n not in done}
        return {n: done[n] for n in payloads}

    @property
    def reference_missing(self) -> bool:
        """Whether :meth:`set_reference` has not given the learners their reference policies yet."""
        return self._reference is None

    def set_reference(self, reference: Mapping) -> None:
        """Give every learner its roles' reference policies (made after SFT: the actors started before it); kept
        in the object store and sent again by every :meth:`load` (a restarted actor lacks them)."""
        self._reference = {n: self.ray.put({r: reference[r] for r in roles}) for n, roles in self.roles.items()}

    def load(self, states: Mapping[str, dict]) -> None:
        """Load ``{role: {"params": ..., "state": ...[, "base": ...]}}`` into the learners (all of them at once; "base":
        :func:`trained_bases`), and their reference policies when :meth:`set_reference` gave them."""
        if self._reference is not None:
            self._get({n: self._call(n, "set_reference", ref) for n, ref in self._reference.items()})
        refs = {
            n: self._call(n, "load", {r: states[r] for r in roles if r in states}) for n, roles in self.roles.items()
        }
        for lrs in self._get(refs).values():
            for k, table in lrs.items():
                self.lr.setdefault(k, {}).update(table)

    def training_states(self) -> dict:
        """``{role: training_state}`` from every learner."""
        out: dict = {}
        for states in self._get({n: self._call(n, "training_states") for n in self.actors}).values():
            out.update(states)
        return out

    def _close(self) -> dict:
        self.kill(self.actors.values())
        self.stop_ray()
        return {"learners": len(self.actors), "restarts": dict(self.restarts)}
