"""Sampler actors on Ray (docs/reference/cluster.md, "Sampler actors"): ``cluster.samplers=ray`` with
``rollout.engine=local`` draws a run's bids and actions in a Ray actor that holds a copy of the policies,
instead of in the trainer's process.

- :class:`SamplerWorker` (the actor's body, plain Python): the policies, unpickled from the trainer's copy as
  the sampler was made (after SFT), answering a batched turn's rows with the in-process sampler the factory
  hands it (``sampling/local.py: LocalSampler``: the same calls, the same mixed-adapter batches; passed in, so
  that this package imports only the core).
- :class:`RaySampler` (the trainer's side, a :class:`~swarm_runtime.core.protocols.Sampler`): one Ray call per
  batched ``bid`` or ``act``. Each call ships every policy's sampling state (its generator's state and its
  temperature, which evaluation reseeds and sets on the trainer's policies) and takes back the state it left, so
  the trainer's policies hold the generator that sampled (the checkpoint's ``policy_rng``) and the draws are the
  in-process ones. The FLOPs the actor's forwards count come back as the same ``forward`` calls, made on the
  trainer's counters in order. After an update, :meth:`RaySampler.sync` puts the changed models' parameters in
  Ray's object store and loads them into the actor.

Faults: Ray restarts an actor whose process died (``cluster.sampler_restarts``); the restarted actor unpickles
the policies again (its constructor's argument stays in the object store) and the trainer loads it with every
model's last synced parameters. Every call carries the trainer's sync count; an actor that has not taken that
many syncs (restarted between calls) answers "lost" and is loaded first. The interrupted call is made again
with the sampling state it was first sent with, so the retried batch draws the same tokens; the episodes live
in the trainer, so none is lost or counted twice. Restarts exhausted, or no node to hold the actor within
``cluster.restart_wait_s``: :class:`SamplerActorError`; the run stops with one line and the command that resumes it
from its last checkpoint (``learn/mpt.py: MPTTrainer.train``).
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Mapping

from loguru import logger

from swarm_runtime.cluster.actors import RESTART_WAIT_S, ActorBody, ActorGroup
from swarm_runtime.cluster.learners import copy_params, params_of

#: Tries of one call (a first try and its retries after restarts) before giving up.
MAX_TRIES = 5
LOST = (False, None)


class SamplerActorError(RuntimeError):
    """The sampler actor is gone for good (its restarts are spent, or it keeps dying)."""


def flop_counters(policies: Mapping) -> list:
    """The distinct FLOP counters the policies count their forwards on (a split policy's and a shared base's too),
    in a fixed order: pickled with the policies, they are the actor's counters at the same positions."""
    seen: dict[int, object] = {}
    for p in policies.values():
        for part in (p, getattr(p, "bid_policy", None), getattr(p, "action_policy", None)):
            c = getattr(part, "flops", None)
            if c is not None:
                seen.setdefault(id(c), c)
    return list(seen.values())


def sampling_state(policies: Mapping) -> dict:
    """Each policy's generator state and temperature: what a sampler call draws with."""
    return {m: (p.rng_state(), float(p.temperature)) for m, p in policies.items()}


def set_sampling_state(policies: Mapping, state: Mapping) -> None:
    for m, (rng, temperature) in state.items():
        policies[m].set_rng_state(rng)
        policies[m].temperature = temperature


class SamplerWorker(ActorBody):
    """The actor's body: ``blob`` pickles ``(policies, counters, local)``: the policies (model name -> policy),
    their FLOP counters (:func:`flop_counters`) and the in-process sampler class that answers on them
    (``local(policies)``). ``threads``: torch's intra-op threads, the trainer's (the same float reductions)."""

    def __init__(self, blob: bytes, threads: int):
        import torch

        torch.set_num_threads(max(1, int(threads)))
        self.policies, counters, local = pickle.loads(blob)
        for p in self.policies.values():
            p.eval()
        self.sampler = local(self.policies)
        self.log: list[tuple[int, int, int]] = []
        for i, c in enumerate(counters):  # the forwards counted here go back to the trainer's counter i
            c.forward = lambda n_params, tokens, i=i: self.log.append((i, int(n_params), int(tokens)))
        self.synced = 0  #: syncs taken (a restarted actor has taken none)

    def load(self, synced: int, refs: dict) -> bool:
        """Take the parameters of some models (``refs``: model -> object ref of its tensors); ``synced``: the
        trainer's sync count they bring this actor to."""
        import ray

        values = ray.get(list(refs.values()))
        for m, tensors in zip(refs, values):
            copy_params(self.policies[m], tensors)
        self.synced = int(synced)
        return True

    def call(self, method: str, synced: int, rows: list, state: dict) -> tuple:
        """``bid`` or ``act`` on ``rows`` with the sampling ``state``; ``(True, (responses, state after, FLOP
        log))``, or :data:`LOST` when this actor has not taken the trainer's ``synced`` syncs."""
        if int(synced) != self.synced:
            return LOST
        import torch

        set_sampling_state(self.policies, state)
        self.log = []
        with torch.no_grad():
            out = getattr(self.sampler, method)(rows)
        return True, (out, {m: p.rng_state() for m, p in self.policies.items()}, self.log)


class RaySampler(ActorGroup):
    """The trainer's side of a sampler actor over ``learner``'s policies (see the module's docstring). ``local``:
    the in-process sampler class the actor answers with (``LocalSampler``). ``options``: Ray actor options
    (placement: resources, a node, a placement group), over the defaults. ``restart_wait_s``: how long a dead actor
    is waited for (``cluster.restart_wait_s``)."""

    name = "ray"

    def __init__(
        self,
        learner,
        local,
        address: str | None = None,
        num_cpus: int | None = None,
        max_restarts: int = 8,
        options: dict | None = None,
        restart_wait_s: float = RESTART_WAIT_S,
    ):
        import torch

        t0 = time.perf_counter()
        super().__init__(address, num_cpus, restart_wait_s=restart_wait_s, max_restarts=max_restarts)
        self.learner = learner
        self.policies = dict(learner.policies)
        self.counters = flop_counters(self.policies)
        self._versions = {m: learner.version(m) for m in self.policies}
        #: the policies as the sampler was made: kept in the object store (a restarted actor unpickles it again)
        self._blob = self.ray.put(pickle.dumps((self.policies, self.counters, local)))
        self.actor = self.spawn(SamplerWorker, self._blob, torch.get_num_threads(), options=options)
        self.pid = self.pids_of([self.actor])[0]
        self.synced = 0  #: syncs sent (the actor's count must match before it answers)
        self._params: dict = {}  #: model -> object ref of its last synced parameters
        self.restarts = 0  #: actor deaths seen
        self.retried = 0  #: calls made again after a death
        self.calls = 0
        self.start_s = time.perf_counter() - t0
        logger.info(
            "sampler actor on Ray: pid {}, {} models, up in {:.1f} s", self.pid, len(self.policies), self.start_s
        )
        # where it runs, as it says (the multi-node tests read it)
        logger.info("sampler actor on node {}", self.nodes_of([self.actor])[0])

    # ------------------------------------------------------------------ the Sampler protocol
    def bid_levels(self, model: str):
        return getattr(self.policies[model], "bid_levels", None)

    def version(self, model: str) -> int:
        return self._versions.get(model, 0)

    def bid(self, rows):
        return self._call("bid", rows)

    def act(self, rows):
        return self._call("act", rows)

    def sync(self, learner, models) -> None:
        """Put the changed models' parameters in the object store and load them into the actor."""
        refs = {m: self.ray.put([t.cpu() for t in params_of(learner.policies[m])]) for m in models}
        self._params.update(refs)
        self.synced += 1
        try:
            self.ray.get(self.actor.load.remote(self.synced, refs))
        except self.ray.exceptions.RayActorError:
            self._recover()
        for m in models:
            self._versions[m] = learner.version(m)

    def _close(self) -> dict:
        if self.ray.is_initialized():
            self.kill([self.actor])
            self.stop_ray()
        stats = {"calls": self.calls, "restarts": self.restarts, "retried": self.retried}
        logger.info("sampler actor closed: {}", stats)
        return stats

    # ------------------------------------------------------------------ calls and faults
    def _call(self, method: str, rows) -> list:
        if not rows:
            return []
        rows = [type(r)(r.model, r.prompt, r.key) for r in rows]  # the context stays here (training rows have none)
        state = sampling_state(self.policies)

        def attempt() -> tuple:
            return self.ray.get(self.actor.call.remote(method, self.synced, rows, state))

        def exhausted() -> SamplerActorError:
            return SamplerActorError(f"the sampler actor failed {MAX_TRIES} calls in a row (its process keeps dying)")

        value, tries = self.dispatch(attempt, self._recover, MAX_TRIES, exhausted, recover_last=False)
        self.retried += tries > 1
        out, after, log = value
        set_sampling_state(self.policies, {m: (after[m], state[m][1]) for m in after})
        for i, n_params, tokens in log:
            self.counters[i].forward(n_params, tokens)
        for r, row in zip(out, rows):
            r.version = self.version(row.model)
        self.calls += 1
        return out

    def _recover(self) -> None:
        """Wait for the restarted actor (or say that it is gone) and load it with every model's last synced
        parameters, bringing it to the trainer's sync count."""
        ray = self.ray
        wait_s = self.restart_wait_s  # cluster.restart_wait_s
        end = time.monotonic() + wait_s

        def gone(why: str) -> SamplerActorError:
            return SamplerActorError(f"the sampler actor (pid {self.pid}) was lost: its process died and {why}")

        while True:
            pid = self.await_restart(self.actor, self.pid, same_ok=True, check=self._alive, gone=gone)
            try:
                ray.get(self.actor.load.remote(self.synced, dict(self._params)), timeout=wait_s)
                break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:  # lost again while loading
                if time.monotonic() > end:
                    raise SamplerActorError(
                        f"the sampler actor (pid {self.pid}) was lost: its process died and it did not take the synced "
                        f"models within {wait_s:g} s (cluster.restart_wait_s; {type(exc).__name__})"
                    ) from None
                time.sleep(0.2)
        if pid != self.pid:
            tail = f"; loaded with {len(self._params)} synced models"
            self.log_restart("sampler actor", self.pid, pid, self.actor, tail)
            self.pid = pid
            self.restarts += 1

    def _alive(self) -> None:
        """Raise :class:`SamplerActorError` if Ray will not restart the actor again (its restarts are spent)."""
        if self.spent(self.actor):
            raise SamplerActorError(
                f"the sampler actor died and its restarts are spent (cluster.sampler_restarts={self.max_restarts})"
            )
