"""The phase skeleton every trainer shares (``algo=mpt``, ``algo=monolithic``, ``algo=rlcr``): SFT cold
start -> held-out evaluation after SFT -> RL updates with checkpoints -> held-out evaluation after RL ->
results. ``state["phase"]`` (``init``, ``sft_done``, ``rl``, ``done``) is saved with every checkpoint, so
a killed run resumes at the phase it was in, and a finished one trains on when ``algo.iterations`` grows.

A trainer subclasses :class:`PhasedTrainer` and provides ``_setup()``, ``cold_start()``,
``held_out(label)``, ``rl_step(it) -> metrics`` (with ``metrics["kind"]``), ``finish()`` (with no update
made, :attr:`PhasedTrainer.final_is_sft`: one row, the SFT one), a
``policies`` dict (name -> policy, what checkpoints hold) and ``optimizers``; optionally
:meth:`log_eval` and :meth:`postfix`.
"""

from __future__ import annotations

import random

import torch
from loguru import logger
from tqdm.auto import tqdm

from swarm_runtime.runs import checkpoint as ckpt
from swarm_runtime.runs.context import RunContext


class Rewound(Exception):
    """The run went back to its last checkpoint (a learner actor was lost and restored,
    ``cluster/learners.py``): the RL phase goes on from the state that checkpoint holds."""


class PhasedTrainer:
    label = ""  #: row name of the trained checkpoint in the held-out table
    rl_name = "RL"  #: the RL phase's name in logs ("after MPT") and on the progress bar

    def __init__(self, ctx: RunContext):
        self.ctx, self.cfg = ctx, ctx.cfg
        self.rng = random.Random(int(self.cfg.seed))
        torch.manual_seed(int(self.cfg.seed))
        self.state: dict = {"phase": "init", "iteration": 0}

    def _hook(self, name: str, **kw) -> None:
        getattr(self.ctx.pm.hook, name)(**kw)

    def _save(self, tag: str) -> None:
        self.state["flops"] = self.ctx.flops.state_dict()
        ckpt.save_checkpoint(
            self.ctx.run_dir,
            tag,
            self.policies,
            self.optimizers,
            self.state,
            self.rng,
            keep=int(self.cfg.keep_checkpoints),
            training_states=self._training_states(),
            sampler_rng=self._sampler_rng(),
        )

    def _sampler_rng(self):
        """The state of the engine sampler's own generator for a checkpoint (None: the trainer has none)."""
        return None

    def _training_states(self) -> dict | None:
        """Each role's optimizer state and fp32 masters when they live elsewhere than ``self.optimizers``
        (learner actors); None: take them from ``self.optimizers``."""
        return None

    def log_eval(self, step: int, res: dict) -> None:
        """Write a held-out evaluation's headline numbers to the metrics (default: nothing)."""

    def postfix(self, m: dict) -> dict:
        """What the progress bar shows after an update."""
        return {}

    @property
    def trained(self) -> bool:
        """Whether the RL phase made an update (``algo.iterations=0`` makes none: the final checkpoint is
        the SFT one, so a final - SFT difference would compare a checkpoint with itself)."""
        return int(self.state.get("iteration", 0)) > 0

    @property
    def final_is_sft(self) -> bool:
        """No update made and the SFT checkpoint evaluated: the final checkpoint is the SFT one, so its
        evaluation is the one after SFT (not run again, not shown twice)."""
        return not self.trained and bool(self.state.get("sft_eval"))

    def final_held_out(self, label: str) -> tuple[dict, bool]:
        """The held-out evaluation of the final checkpoint and whether it was run now: with no update
        made (:attr:`final_is_sft`), the evaluation after SFT of the same weights."""
        if self.final_is_sft:
            logger.info(
                "held-out {}: 0 training updates, so the final checkpoint is the SFT one, evaluated after "
                "SFT; not evaluated again",
                label,
            )
            return self.state["sft_eval"], False
        return self.held_out(label), True

    def summary_lines(self, plots) -> list[str]:
        """The end of the printed summary: with no update made, a line saying the final checkpoint is the
        SFT one; then the run folder and what it holds (``tb/`` when written; plots, or why none)."""
        out = []
        if not self.trained:
            once = ", evaluated once (the SFT figures above)" if self.final_is_sft else ""
            out.append(
                f"{self.label}: 0 training updates (algo.iterations=0), so the {self.label} checkpoint is the "
                f"SFT one{once}; no {self.label} - SFT difference is reported"
            )
        run_dir = self.ctx.run_dir
        held = [
            "eval.json",
            "metrics.jsonl",
            *(["tb/"] if (run_dir / "tb").is_dir() else []),
            *(p.name for p in plots),
            "checkpoints/",
        ]
        why = (
            ""
            if plots
            else "; no plots: " + ("0 training updates" if not self.trained else "no training rows in metrics.jsonl")
        )
        out.append(f"Run folder: {run_dir} ({', '.join(held)}{why})")
        return out

    def _rl_phase(self, iterations: int, bar) -> None:
        """The RL updates with their checkpoints, then the final held-out evaluation."""
        cfg = self.cfg
        while self.state["phase"] == "rl" and self.state["iteration"] < iterations:
            it = self.state["iteration"]
            m = self.rl_step(it)
            self.state["iteration"] = it + 1
            self.writer.log(it + 1, m)
            self._hook("swarm_on_train_step", step=it + 1, kind=m["kind"], metrics=m)
            bar.update(1)
            shown = self.postfix(m)
            bar.set_postfix(**shown)
            logger.debug("update {} ({}): {}", it + 1, m["kind"], shown)
            if (it + 1) % int(cfg.checkpoint_every) == 0 or it + 1 == iterations:
                self._save(f"iter-{it + 1:06d}")
        if self.state["phase"] == "rl":
            self.state["final_eval"], evaluated = self.final_held_out(f"after {self.rl_name}")
            self.state["phase"] = "done"
            if evaluated:  # else its row is in the metrics already (step 0, after SFT)
                self.log_eval(iterations, self.state["final_eval"])
            self._save(f"iter-{iterations:06d}")

    def train(self) -> dict:
        self._setup()
        cfg = self.cfg
        self._hook("swarm_on_run_start", config=cfg, run_dir=str(self.ctx.run_dir))
        if self.state["phase"] == "init":
            self.cold_start()
        if self.state["phase"] == "sft_done":
            if not cfg.skip_sft_eval:
                self.state["sft_eval"] = self.held_out("after SFT")
                self.log_eval(0, self.state["sft_eval"])
            self.state["phase"] = "rl"
            self._save("iter-000000")
        iterations = int(cfg.algo.iterations)
        if self.state["phase"] == "done" and self.state["iteration"] < iterations:  # extended: train on
            logger.info("extending the finished run from {} to {} updates", self.state["iteration"], iterations)
            self.state["phase"] = "rl"
        bar = tqdm(total=iterations, initial=self.state["iteration"], desc=self.rl_name, disable=not cfg.progress)
        while True:
            try:
                self._rl_phase(iterations, bar)
                break
            except Rewound:  # back at the last checkpoint: go on from there
                bar.n = int(self.state["iteration"])
                bar.refresh()
        bar.close()
        return self.finish()
