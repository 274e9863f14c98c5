"""Sharded learners, the driver's side (docs/reference/sharding.md, "Sharded learners in a run"):
``train.engine=fsdp`` or ``deepspeed`` with ``train.shards=S`` and ``cluster.learners=ray`` makes each learner ``S`` Ray
actors, the ranks of one process group: :class:`ShardedLearnerGroup`, a
:class:`~swarm_runtime.cluster.learners.LearnerGroup` whose learners are ranks of
:class:`~swarm_runtime.cluster.shards.ShardWorker` (FSDP2) or
:class:`~swarm_runtime.cluster.deepspeed_shards.DeepSpeedShardWorker` (ZeRO-3).

An update goes to every rank of a learner alike; rank 0 answers for the learner, so the driver sees what one
:class:`~swarm_runtime.cluster.learners.LearnerWorker` sends.

Faults: a rank that dies breaks its group's collectives (the others would wait out the gloo timeout,
:data:`~swarm_runtime.cluster.shards.GROUP_TIMEOUT_S`). The driver kills the learner's other ranks too (Ray restarts
every rank, from its creation arguments), forms the group again and raises
:class:`~swarm_runtime.cluster.learners.LearnerLost`: the run rewinds to its last checkpoint and loads it into every
rank, as with one actor per learner. A rank lost during the SFT cold start (before the ranks join): its learner's ranks
are restarted alike and do their SFT again, the other learners' SFT kept (``LearnerGroup.sft``); all join after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from loguru import logger

from swarm_runtime.cluster.deepspeed_shards import DeepSpeedShardWorker
from swarm_runtime.cluster.learners import RESTARTED, LearnerGone, LearnerGroup, LearnerLost
from swarm_runtime.cluster.shards import GROUP_TIMEOUT_S, ShardWorker


def _worker_class(engine: str) -> type:
    """A rank's actor class for ``train.engine``: :class:`ShardWorker` (fsdp) or the ZeRO-3 one (deepspeed)."""
    return DeepSpeedShardWorker if engine == "deepspeed" else ShardWorker


class ShardedLearnerGroup(LearnerGroup):
    """:class:`LearnerGroup` whose learners are ``shards`` :class:`ShardWorker` ranks each (``self.ranks``;
    ``self.actors``: each learner's rank 0); ``engine="deepspeed"``: ZeRO-3 ranks (cluster/deepspeed_shards.py)."""

    def __init__(self, *args, shards: int, engine: str = "fsdp", join: bool = True, **kw):
        """``join`` False: the ranks form their groups (and shard their models) only after :meth:`sft` (the SFT cold
        start, each rank on its own full copy)."""
        self.shards, self.engine = int(shards), str(engine)
        self.ranks: dict[str, list] = {}  #: learner -> its ranks' actors
        self.rank_pids: dict[str, list[int]] = {}  #: learner -> its ranks' pids
        self._unjoined = not join  #: ranks started and not in their groups yet (until sft)
        super().__init__(*args, **kw)
        if join:
            self._joined()

    def _joined(self, when: str = "") -> None:
        logger.info(
            "learners sharded{}: {} ranks each ({}): {}",
            when,
            self.shards,
            self.engine,
            ", ".join(f"{n} pids {'+'.join(map(str, pids))}" for n, pids in self.rank_pids.items()),
        )

    def sft(self, fn: Callable, payloads) -> dict:
        """:meth:`LearnerGroup.sft` on every rank (each its own full copy, :meth:`ShardWorker.sft`), then the ranks
        of each learner form their group and shard the trained models."""
        out = super().sft(fn, payloads)
        if self._unjoined:
            self._join(*self.ranks)
            self._unjoined = False
            self._joined(" after their SFT")
        return out

    def _shard_pid_file(self, name: str, k: int) -> str | None:
        f = self.pid_files[name]
        return None if f is None else str(Path(f).with_name(f"{name}.{k}.pid"))

    def _start(self, agents: list, make_optimizers: Callable, threads: int) -> dict:
        body = _worker_class(self.engine)
        for name, (policies, reference) in self._args.items():
            self.ranks[name] = [
                self.spawn(
                    body,
                    name,
                    k,
                    self.shards,
                    policies,
                    agents,
                    make_optimizers,
                    reference,
                    self._shard_pid_file(name, k),
                    threads,
                    options=self.options(name, k),
                )
                for k in range(self.shards)
            ]
        if self._unjoined:  # their pids now (a rank lost during SFT is named by them); the group after it
            for name, ranks in self.ranks.items():
                self.rank_pids[name] = self.pids_of(ranks)
        else:
            self._join(*self.ranks)
        return {name: ranks[0] for name, ranks in self.ranks.items()}

    def _join(self, *names: str) -> list[int]:
        """Form the process groups of learners ``names`` (each at rank 0's address; every rank of every learner
        joins at once: a ZeRO-3 join takes tens of seconds on a loaded CPU); the last learner's ranks' pids."""
        addresses = self.ray.get([self.ranks[n][0].address.remote() for n in names])
        refs = {n: [a.join.remote(*at) for a in self.ranks[n]] for n, at in zip(names, addresses)}
        for name, rs in refs.items():
            self.rank_pids[name] = self.ray.get(rs, timeout=GROUP_TIMEOUT_S + 30)
        return self.rank_pids[names[-1]]

    def processes(self, name: str) -> list:
        return list(self.ranks[name])

    def _call(self, name: str, method: str, *args):
        return [a.checked.remote(pid, method, *args) for a, pid in zip(self.ranks[name], self.rank_pids[name])]

    def _get(self, refs: dict):
        """Every rank's answer (rank 0's returned per learner); a rank lost: :meth:`_regroup`, then
        :class:`LearnerLost` (or :class:`LearnerGone`) once the other learners answered (``answered``: theirs, as
        :meth:`LearnerGroup._get` keeps them: an SFT asked again need not ask them). The other ranks of a lost one fail
        too (gloo sees the peer gone, or times out): their errors wait for the lost rank's; with no rank lost the first
        is raised."""
        out, lost, failed = {}, None, None
        for name, rs in refs.items():
            answer, k, exc = self._rank0_answer(name, rs)
            if k is not None:
                lost = lost or (name, k)
            elif exc is not None:
                failed = failed or exc
            else:
                out[name] = answer
        if lost is not None:
            err = self._regroup(*lost)
            if isinstance(err, LearnerLost):
                err.answered = out
            raise err
        if failed is not None:
            raise failed
        return out

    def _rank0_answer(self, name: str, rs: list) -> tuple:
        """Wait for every rank of learner ``name`` (refs ``rs``, as they come): ``(rank 0's answer, None, None)``;
        ``(None, k, None)``: rank ``k`` lost (died, or restarted between calls: ``LearnerWorker.checked``); ``(None,
        None, error)``: a rank's call failed."""
        ray, answer, failed = self.ray, None, None
        pending = {r: k for k, r in enumerate(rs)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            k = pending.pop(done[0])
            try:
                value = ray.get(done[0])
            except ray.exceptions.RayActorError:
                return None, k, None
            except ray.exceptions.RayTaskError as exc:
                failed = failed or exc
                continue
            if isinstance(value, str) and value == RESTARTED:
                return None, k, None
            if k == 0:
                answer = value
        return (None, None, failed) if failed is not None else (answer, None, None)

    def _regroup(self, name: str, lost: int) -> Exception:
        """Rank ``lost`` of learner ``name`` died: kill its other ranks (their group is broken; Ray restarts them
        all), wait for every rank to answer from a new process, form the group again (before the SFT cold start's
        end: not yet, the ranks join after their SFT); the exception to raise."""
        ray, old = self.ray, list(self.rank_pids[name])
        self.pids[name] = old[lost]  # the process a message names
        if self.restarts[name] >= self.max_restarts:
            self.kill(self.ranks[name])
            return LearnerGone(
                self._gone(name, f"Ray restarts it at most cluster.learner_restarts={self.max_restarts} times")
            )
        for k, a in enumerate(self.ranks[name]):
            if k != lost:
                ray.kill(a, no_restart=False)
        end = time.monotonic() + self.restart_wait_s  # for all ranks together (cluster.restart_wait_s)
        new = []
        for k, a in enumerate(self.ranks[name]):
            try:
                new.append(self.await_restart(a, old[k], max(1.0, end - time.monotonic())))
            except TimeoutError as exc:
                return LearnerGone(self._gone(name, f"its rank {k}: {exc}"))
        if self._unjoined:  # lost during the SFT cold start: the new ranks do their SFT again, then join
            self.rank_pids[name] = new
        else:
            try:
                new = self._join(name)
            except ray.exceptions.RayError as exc:
                return LearnerGone(self._gone(name, f"its restarted ranks did not form a group ({type(exc).__name__})"))
        self.restarts[name] += 1
        self.pids[name] = new[0]
        logger.warning(
            "learner {} restarted: pid {} -> {} (rank {} lost; ranks {} -> {})", name, old[0], new[0], lost, old, new
        )
        return LearnerLost(name, old[lost], new[lost])

    def _close(self) -> dict:
        for ranks in self.ranks.values():
            self.kill(ranks[1:])
        return {**super()._close(), "shards": self.shards}
