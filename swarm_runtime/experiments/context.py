"""What an experiment works with: its config and folder, resumable cells, trainings
in sub-run folders, and held-out evaluations of checkpoints under any coordinator,
population size or dropout."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.config.load import resolve
from swarm_runtime.evaluation.heldout import evaluate
from swarm_runtime.experiments.training import budget_cap, final_checkpoint, make_trainer, seed_checkpoint
from swarm_runtime.runs import checkpoint as ckpt
from swarm_runtime.runs.context import RunContext
from swarm_runtime.runs.outputs import read_metrics
from swarm_runtime.runs.provenance import stamp


@dataclass
class Report:
    """What an experiment returns; the runner writes ``results.md`` / ``results.json`` from it.

    ``rows``: one dict per table row (``label`` plus columns; a ``(mean, se)`` pair prints as
    ``mean ± se``). ``tables``: further markdown tables (title -> text). ``plots``: PNG files in the
    run folder. ``data``: anything else for ``results.json``. ``notes``: lines under the table."""

    title: str
    rows: list[dict] = field(default_factory=list)
    tables: dict[str, str] = field(default_factory=dict)
    plots: list[Path] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _atomic_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=float))
    os.replace(tmp, path)


def flops_total(by_category: dict) -> float:
    """Training FLOPs of a checkpoint's counter (evaluation excluded), as ``flops/total``."""
    return float(sum(v for k, v in by_category.items() if k != "eval"))


@dataclass
class ExperimentContext:
    """Handed to every experiment. ``args`` are the command's ``key=value`` arguments (without
    ``run_dir`` / ``resume``); every training inside re-resolves them plus its own."""

    name: str
    cfg: DictConfig
    pm: Any
    registry: Any
    run_dir: Path
    args: list[str]
    bar: Any = None
    cells_done: int = 0
    _memo: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ basics
    @property
    def xcfg(self) -> DictConfig:
        return self.cfg.experiment

    @property
    def ctx(self) -> RunContext:
        """A context of the experiment's own config (domain, task, seeds, policy factory)."""
        if not hasattr(self, "_ctx"):
            self._ctx = RunContext(self.cfg, self.pm, self.registry, self.run_dir)
        return self._ctx

    @property
    def domain(self):
        return self.ctx.domain

    @property
    def task(self) -> DictConfig:
        return self.cfg.task

    def eval_episodes(self) -> int | None:
        return self.cfg.eval.episodes or self.xcfg.eval_episodes

    def eval_seeds(self) -> list[int]:
        seeds = self.domain.episode_seeds(self.task, str(self.cfg.eval.split))
        n = self.eval_episodes()
        return seeds[: int(n)] if n else seeds

    def plan(self, total: int) -> None:
        """Declare how many cells the experiment has (the progress bar's length)."""
        if self.bar is None:
            self.bar = tqdm(
                total=total, desc=f"experiment {self.name}", unit="cell", disable=not bool(self.cfg.progress)
            )
        else:
            self.bar.total = total
            self.bar.refresh()

    # ------------------------------------------------------------------ cells
    def cell_path(self, key: str) -> Path:
        return self.run_dir / "cells" / f"{key.replace('/', '__')}.json"

    def cell(self, key: str, compute: Callable[[], dict]) -> dict:
        """The result of cell ``key``: loaded if a previous (killed) run finished it, else computed
        and saved at once, so ``resume=true`` skips it."""
        if key in self._memo:  # asked again within this invocation: no second count
            return self._memo[key]
        path = self.cell_path(key)
        if path.exists():
            logger.info("cell {}: done before, skipped", key)
            out = json.loads(path.read_text())
        else:
            t0 = time.time()
            logger.info("cell {}: running", key)
            out = compute()
            out["wall_s"] = time.time() - t0
            _atomic_json(path, out)
            logger.info("cell {}: done in {:.0f}s", key, out["wall_s"])
        self._memo[key] = out
        self.cells_done += 1
        if self.bar is not None:
            self.bar.update(1)
        return out

    # ------------------------------------------------------------------ trainings
    def resolve(self, extra: list[str]) -> DictConfig:
        return resolve(self.args + list(extra), self.registry)

    def train(
        self,
        key: str,
        extra: list[str] = (),
        *,
        budget: float | None = None,
        init_from: Path | None = None,
        iterations: int | None = None,
    ) -> dict:
        """Train with the registered algorithm of ``args + extra`` in ``trainings/<key>/`` (resumable
        like ``swarm run``). ``budget``: stop at that many training FLOPs (the iteration cap is then
        ``experiment.budget_factor`` x iterations). ``init_from``: an ``agents/`` folder to start from
        instead of SFT (its FLOPs are not counted)."""
        sub = self.run_dir / "trainings" / key

        def run() -> dict:
            cfg = self.resolve(list(extra))
            n = int(iterations if iterations is not None else self.xcfg.iterations)
            cfg.algo.iterations = budget_cap(n, self.xcfg.budget_factor) if budget is not None else n
            cfg.skip_sft_eval = not bool(self.xcfg.sft_eval)
            cfg.eval.episodes = self.eval_episodes()
            cfg.run_dir, cfg.resume = str(sub), False
            sub.mkdir(parents=True, exist_ok=True)
            resume_from = ckpt.latest_checkpoint(sub)
            if resume_from is None and (sub / "metrics.jsonl").exists():
                (sub / "metrics.jsonl").unlink()  # killed before its first checkpoint: start clean
            if resume_from is None and init_from is not None:
                resume_from = seed_checkpoint(sub, Path(init_from), int(cfg.seed))
            OmegaConf.save(cfg, sub / "config.yaml")
            ctx = RunContext(cfg, self.pm, self.registry, sub, resume_from)
            logger.info(
                "training {} ({}, {} updates{}){}",
                key,
                cfg.algo.name,
                cfg.algo.iterations,
                f", FLOPs budget {budget:.3g}" if budget is not None else "",
                f", resuming from {resume_from.name}" if resume_from else "",
            )
            make_trainer(self.registry.get("algorithms", cfg.algo.name), ctx, budget).train()
            stamp(sub / "eval.json")  # library versions and commit
            return self.training_summary(sub)

        return self.cell(f"train-{key}", run)

    @staticmethod
    def training_summary(run_dir: Path) -> dict:
        """Final and SFT held-out results, FLOPs and the reward-vs-FLOPs curve of a finished run."""
        state = ckpt.load_state(final_checkpoint(run_dir))
        curve = [
            (r["flops/total"], r["charts/episode_reward"])
            for r in read_metrics(run_dir)
            if "charts/episode_reward" in r and "flops/total" in r
        ]
        return {
            "run_dir": str(run_dir),
            "final_eval": state.get("final_eval"),
            "sft_eval": state.get("sft_eval"),
            "flops": flops_total(state.get("flops", {})),
            "flops_by_category": state.get("flops", {}),
            "iterations": state.get("iteration"),
            "stopped_at_budget": bool(state.get("stopped_at_budget")),
            "curve": curve,
        }

    @property
    def trains_swarm(self) -> int:
        """1 when :meth:`trained_swarm` trains the swarm here (a cell), 0 with ``experiment.base``."""
        return 0 if self.xcfg.base else 1

    def trained_swarm(self) -> Path:
        """The run folder of the trained MPT swarm: ``experiment.base`` if given, else trained here."""
        if self.xcfg.base:
            base = Path(self.xcfg.base)
            if not (base / "config.yaml").exists():
                raise ConfigError(f"experiment.base {str(base)!r} is not a run folder (no config.yaml)")
            saved = OmegaConf.load(base / "config.yaml")
            if (saved.domain, saved.task_name) != (self.cfg.domain, self.cfg.task_name):
                raise ConfigError(
                    f"experiment.base {str(base)!r} is a {saved.domain}/{saved.task_name} run; this "
                    f"experiment is {self.cfg.domain}/{self.cfg.task_name}"
                )
            final_checkpoint(base)
            return base
        return Path(self.train("mpt", ["algo=mpt"])["run_dir"])

    # ------------------------------------------------------------------ evaluation
    def load_swarm(self, run_dir: Path, tag: str = "final", replicas: int = 1):
        """Agents of a run's ``final`` (finished) or ``sft`` checkpoint; ``replicas`` per role share a model."""
        from swarm_runtime.learn.monolithic import MONOLITHIC, build_monolithic

        path = final_checkpoint(run_dir) if tag == "final" else Path(run_dir) / "checkpoints" / tag
        if not (path / "state.json").exists():
            raise ConfigError(f"checkpoint {tag!r} not found in {run_dir}")
        if (path / "agents" / MONOLITHIC).exists():
            return build_monolithic(self.ctx, path / "agents")
        return self.ctx.build_swarm(path / "agents", replicas=replicas)

    def evaluate(
        self,
        key: str,
        agents_fn: Callable[[], tuple],
        coordinator: str = "auction",
        presence: Callable | None = None,
        runs: int | None = None,
        extra: Callable[[list, list], dict] | None = None,
    ) -> dict:
        """Cell ``key``: held-out evaluation of the agents ``agents_fn()`` builds (mean ± SE over the
        eval seeds, ``eval.runs`` runs each); ``extra(episodes, agents)`` adds derived results."""

        def run() -> dict:
            agents, _ = agents_fn()
            seeds = self.eval_seeds()
            n_runs = int(runs if runs is not None else self.cfg.eval.runs)
            res, episodes = evaluate(
                agents,
                self.ctx.coordinator(coordinator),
                self.domain,
                self.task,
                seeds,
                n_runs,
                int(self.cfg.seed) + 7919,
                self.cfg.eval.temperature,
                presence=presence,
                common_random_numbers=bool(self.cfg.eval.common_random_numbers),
            )
            skipped = sum(t.winner is None for e in episodes for t in e.turns) / max(1, len(episodes))
            out = {
                "summary": res,
                "agents": [a.name for a in agents],
                "coordinator": coordinator,
                "eval_seeds": seeds,
                "runs": n_runs,
                "skipped_per_episode": skipped,
            }
            if extra is not None:
                out.update(extra(episodes, agents))
            return out

        return self.cell(key, run)

    def swarm_summary(self) -> dict:
        """:meth:`training_summary` of the trained MPT swarm; with ``experiment.base`` its held-out result
        is re-measured with this experiment's evaluation settings (a cell)."""
        run = self.trained_swarm()
        if not self.xcfg.base:
            return self.train("mpt", ["algo=mpt"])
        out = self.training_summary(run)
        out["final_eval"] = self.evaluate("base-final", lambda: self.load_swarm(run))["summary"]
        out["sft_eval"] = None
        return out
