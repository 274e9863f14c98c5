"""The gateway's state (:class:`Gateway`): the population and the episode engine, the episodes (running and
recently ended), the journal and its recovery after a crash, how an episode is played and ended, the sweep of
idle client-side episodes, and the drain on shutdown. The routes (:mod:`swarm_runtime.serve.routes`) read it
as ``request.app.state.gateway``; :mod:`swarm_runtime.serve.lifecycle` starts and stops its agents.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from typing import Any

from loguru import logger

from swarm_runtime.core.env import close_all
from swarm_runtime.runs.runfiles import write_serving
from swarm_runtime.serve.answerer import NoAgentsLeft
from swarm_runtime.serve.episodes import EngineOptions, ServedEpisode, versions_of
from swarm_runtime.serve.journal import COMPACT_BYTES, Journal, append_synced, recover_into
from swarm_runtime.serve.metrics import Metrics
from swarm_runtime.serve.population import Population, PopulationOptions
from swarm_runtime.serve.resolved import GatewaySetup, role_folder
from swarm_runtime.serve.swap import Versions


def population_options(cfg, serve_dir) -> PopulationOptions:
    s = cfg.serve
    return PopulationOptions(
        max_prompt_tokens=int(cfg.model.max_prompt_tokens),
        device=str(cfg.hardware.device),
        worker_threads=int(s.worker_threads),
        restart_workers=bool(s.restart_workers),
        probe_interval_s=float(s.probe_interval_ms) / 1000,
        drop_after_misses=int(s.drop_after_misses),
        log_dir=serve_dir / "workers",
        gateway_id=secrets.token_hex(8),
        join_timeout_s=float(s.startup_timeout_s),
        max_restarts=int(s.max_restarts),
        restart_window_s=float(s.restart_window_s),
        backoff_max_s=float(s.restart_backoff_max_s),
    )


def engine_options(cfg) -> EngineOptions:
    s = cfg.serve
    temperature = cfg.eval.temperature if cfg.eval.temperature is not None else cfg.model.temperature
    return EngineOptions(
        bid_levels=[float(b) for b in cfg.algo.bid_levels],
        bid_mode=str(cfg.model.bid_mode),
        temperature=float(temperature),
        max_action_tokens=int(cfg.model.max_action_tokens),
        max_bid_tokens=int(cfg.model.max_bid_tokens),
        constrained_actions=bool(cfg.model.constrained_actions),
        bid_deadline_s=float(s.bid_deadline_ms) / 1000,
        action_timeout_s=float(s.action_timeout_ms) / 1000,
        agent_wait_s=float(s.agent_wait_s),
        journal_tokens=bool(s.journal_tokens),
    )


def worker_launcher(s, adapter_run: bool):
    """Who starts the workers: None (forked here, ``serve.cluster=local``) or Ray actors (``ray``)."""
    if str(s.cluster) != "ray":
        return None
    if adapter_run:
        from swarm_runtime.config.errors import ConfigError

        raise ConfigError(
            "serve.cluster=ray serves one worker per agent; this run's agents are LoRA adapters on one base "
            "(model.adapter=lora), served by one worker on this host: valid for it: serve.cluster=local"
        )
    from swarm_runtime.serve.ray_workers import RayWorkers

    return RayWorkers(s.address, restart=bool(s.restart_workers))


def lost_turns(records: list[dict]) -> int:
    """Turns lost to faults, not skipped by the auction's choice: nobody acted because every winner
    failed to act, or because no bid arrived at all (every agent asked missed its deadline)."""
    return sum(1 for r in records if r["agent"] is None and (r["failed"] or (r["missed"] and not r["bids"])))


class Gateway:
    """Everything the gateway holds (module docstring). Built before anything is served: the journal of the
    last run is recovered here (its unfinished episodes are ``interrupted``)."""

    def __init__(self, setup: GatewaySetup):
        from swarm_runtime.runs.context import RunContext

        self.setup, self.cfg, self.s = setup, setup.cfg, setup.cfg.serve
        self.ctx = RunContext(self.cfg, setup.pm, setup.registry, setup.run_dir)
        self.domain = self.ctx.domain
        self.roles = [r.name for r in self.domain.roles]
        self.serve_dir = setup.run_dir / "serve"
        self.serve_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = Metrics()
        #: a model.adapter=lora run: PEFT adapters pointing to one base (swarm_base.json), served by one worker
        self.adapter_run = (role_folder(setup.checkpoint, self.roles[0]) / "swarm_base.json").exists()
        self.pop = Population(population_options(self.cfg, self.serve_dir), worker_launcher(self.s, self.adapter_run))
        self.opts = engine_options(self.cfg)
        self.accepting = True
        self.episodes: dict[str, ServedEpisode] = {}  #: running ones and those ended recently
        self.past: dict[str, dict] = {}  #: episodes a crash interrupted (recovered from the journal)
        self.http = None  #: httpx client of the population's probes (lifespan)
        self.agent_clients = None  #: :class:`~swarm_runtime.serve.transport.AgentClients` (lifespan)
        self.engine = None  #: :class:`~swarm_runtime.serve.episodes.Engine` (lifespan)
        self.background: list[asyncio.Future] = []
        self.hosts: dict[str, Any] = {}  #: an adapter run's worker per role
        self.versions = Versions(setup.checkpoint)  #: the versions served, and the live swap (serve/swap.py)
        self.seed_sets: dict[tuple[str, str], set] = {}
        self.transcripts = self.serve_dir / "episodes.jsonl"
        self.journal_path = self.serve_dir / "journal.jsonl"
        self.recover_journal()
        self.journal = Journal(self.journal_path)
        self.journal_limit = int(os.environ.get("SWARM_JOURNAL_COMPACT_BYTES", COMPACT_BYTES))  # tests make it small
        self.note_serving()

    def note_serving(self) -> None:
        """Name the checkpoints this gateway serves (its versions) in ``RUN/serve/serving.json``: a run training in
        this folder keeps them (runs/runfiles.py ``serving_checkpoints``), so a swap and a rollback find them."""
        write_serving(self.setup.run_dir, os.getpid(), self.versions.folders.values())

    def replicas(self, role: str) -> int:
        r = self.s.replicas
        return int(r.get(role, 1)) if hasattr(r, "get") else int(r)

    def recover_journal(self) -> None:
        """Episodes the journal saw start and not end: ``interrupted``, in episodes.jsonl and by id."""
        lost = recover_into(self.journal_path, self.transcripts)
        for body in lost:
            self.past[body["id"]] = body
            self.metrics.episodes["interrupted"] += 1
        if lost:
            logger.warning(
                "{} episodes were interrupted by the gateway's last stop: {} (status interrupted)",
                len(lost),
                ", ".join(e["id"] for e in lost[:8]),
            )

    # ------------------------------------------------------------------ episodes
    def running_count(self) -> int:
        return sum(1 for e in self.episodes.values() if e.status == "running")

    def ready(self) -> tuple[bool, list[str]]:
        """Ready: at least one agent of every role up. Also the roles with none."""
        up = {a.role for a in self.pop.bidders()}
        missing = [r for r in self.roles if r not in up]
        return self.accepting and not missing, missing

    def summary(self, ep: ServedEpisode, turns: bool = False) -> dict:
        body = self.engine.summary(ep)
        return {**body, "turns": ep.records} if turns else body

    def finish(self, ep: ServedEpisode, status: str, error: str | None = None) -> None:
        """End ``ep`` with ``status`` (``done`` becomes ``degraded`` when more than ``serve.degraded_share`` of its
        turns were lost to faults): its env closed, counted, its transcript written, the journal told."""
        if status == "done" and ep.records:
            lost = lost_turns(ep.records)
            if lost / len(ep.records) > float(self.s.degraded_share):
                status = "degraded"
                error = (
                    f"{lost} of {len(ep.records)} turns lost to missed bids or failed agents (more than "
                    f"serve.degraded_share={self.s.degraded_share:g})"
                )
        if ep.status == "running" or status != "done":
            ep.status, ep.error = status, error
        if ep.env is not None:  # a server-side episode's world ends with it (ep.env stays: it marks the kind)
            close_all([ep.env], quiet=True)
        with self.metrics.lock:
            self.metrics.episodes[ep.status] += 1
            self.metrics.episode_duration.observe(time.monotonic() - ep.started)
        temperature = self.opts.temperature if ep.temperature is None else ep.temperature  # what its samples drew at
        line = {**self.summary(ep, turns=True), "env": ep.kind, "temperature": temperature, "samples": ep.samples}
        append_synced(self.transcripts, line)  # before its end
        self.journal.end(ep.id, ep.status, versions_of(ep.records))
        logger.info(
            "episode {} {}: reward {:.2f} in {} decisions{}",
            ep.id,
            ep.status,
            ep.episode.reward,
            len(ep.records),
            f" ({error})" if error else "",
        )

    def record_call(self, ep: ServedEpisode, turn, rec: dict, samples: dict) -> None:
        """An intercept episode's chat call as its next turn: the core's ``turn``, the API's record ``rec`` and its
        ``samples``, journaled before the answer leaves."""
        ep.episode.turns.append(turn)
        ep.records.append(rec)
        ep.samples.append(samples)
        ep.last_used = time.monotonic()
        with self.metrics.lock:
            self.metrics.turns += 1
        self.journal.turn(ep.id, rec, samples)

    def give_reward(self, ep: ServedEpisode, reward: float) -> None:
        """A client-side episode whose reward was due (``reward_later``): ``reward`` is added to its last turn's
        (its record, the core's turn and the journal) and the episode ends ``done``."""
        rec, turn = ep.records[-1], ep.episode.turns[-1]
        rec["reward"] = turn.reward = float(rec["reward"]) + float(reward)
        ep.episode.reward += float(reward)
        self.journal.reward(ep.id, rec["t"], rec["reward"], rec["valid"])
        ep.reward_due = False
        self.finish(ep, "done")

    async def run_episode(self, ep: ServedEpisode, on_turn=None) -> None:
        """Play ``ep`` on the engine and end it by its outcome (every turn's record journaled first; ``on_turn``
        too). Cancelled: it ends as ``ep.stop`` says, else ``interrupted`` (the gateway shuts down)."""

        def turned(rec):
            self.journal.turn(ep.id, rec, ep.samples[-1])
            if on_turn is not None:
                on_turn(rec)

        def rewarded(rec):
            self.journal.reward(ep.id, rec["t"], rec["reward"], rec["valid"])

        try:
            await self.engine.play(ep, turned, rewarded)
            if not ep.reward_due:  # else it ends when its client posts the reward (give_reward), or expires
                self.finish(ep, "done")
        except NoAgentsLeft as exc:
            self.finish(ep, "failed", str(exc))
        except asyncio.CancelledError:
            if ep.stop is not None:
                self.finish(ep, *ep.stop)
            else:
                self.finish(ep, "interrupted", "the gateway shut down")
                raise
        except Exception as exc:  # an env error: the episode fails, the service does not
            logger.exception("episode {} failed", ep.id)
            self.finish(ep, "failed", f"{type(exc).__name__}: {exc}")

    def play(self, ep: ServedEpisode, on_turn=None) -> asyncio.Future:
        """Start playing ``ep`` in a task of its own (:meth:`run_episode`)."""
        ep.runner = asyncio.ensure_future(self.run_episode(ep, on_turn))
        return ep.runner

    async def end(self, ep: ServedEpisode, status: str, why: str, wait_s: float = 30.0) -> None:
        """End a running ``ep`` with ``status``: its loop's task cancelled (it ends the episode so) and awaited up
        to ``wait_s``, or ended here when nothing plays it."""
        ep.stop = (status, why)
        if ep.runner is not None and not ep.runner.done():
            ep.runner.cancel()
            await asyncio.wait([ep.runner], timeout=wait_s)
        elif ep.status == "running":
            self.finish(ep, status, why)

    # ------------------------------------------------------------------ upkeep
    async def sweep(self) -> None:
        """Every second: idle client-side episodes expire, ended ones are forgotten after a while, and the
        journal is compacted to the running episodes when it grew past its limit."""
        s = self.s
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for eid, ep in list(self.episodes.items()):
                if (
                    ep.status == "running"
                    and ep.env is None
                    and not ep.lock.locked()  # a turn in progress is not idle
                    and now - ep.last_used > float(s.episode_idle_s)
                ):
                    why = "its reward did not come within" if ep.reward_due else "no turn for more than"
                    await self.end(ep, "expired", f"{why} serve.episode_idle_s={s.episode_idle_s}s")
                if ep.status != "running" and now - ep.last_used > max(60.0, float(s.episode_idle_s)):
                    self.episodes.pop(eid, None)
            while len(self.past) > 10_000:
                self.past.pop(next(iter(self.past)))
            if self.journal.size() > self.journal_limit:
                self.compact_journal()

    def compact_journal(self) -> None:
        live = [e for e in self.episodes.values() if e.status == "running"]
        starts = [
            {
                **self.journal.start_event(e, e.kind, e.client),
                "time": e.started_wall,
            }
            for e in live
        ]
        self.journal.compact([(start, e.records, e.samples) for start, e in zip(starts, live)])
        logger.info("journal compacted to the {} running episodes", len(live))

    async def drain(self) -> None:
        """SIGTERM: refuse new work (503), let running episodes finish within serve.shutdown_grace_s."""
        self.accepting = False
        end = time.monotonic() + float(self.s.shutdown_grace_s)
        logger.info(
            "draining: no new episodes; {} running get up to {}s", self.running_count(), self.s.shutdown_grace_s
        )
        while self.running_count() and time.monotonic() < end:
            await asyncio.sleep(0.1)
