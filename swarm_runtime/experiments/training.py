"""Trainings inside an experiment: the registered trainers (``MPTTrainer`` and its
subclasses) in their own resumable sub-run folders, optionally stopped at a FLOPs
budget (matched compute) or started from another run's weights (transfer)."""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path

import torch
from loguru import logger

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.learn.mpt import MPTTrainer
from swarm_runtime.runs import checkpoint as ckpt


class BudgetReached(Exception):
    """Raised before an RL update once the run's training FLOPs reached its budget."""


class FlopsBudgetMixin:
    """Stop RL when ``flops/total`` reaches ``flops_budget``, then evaluate and finish as at the
    end of the iterations (``algo.iterations`` is the cap and spans the cosine schedule)."""

    flops_budget: float | None = None
    _step_flops: float = 0.0  #: FLOPs of the last update (to stop nearest to the budget)

    def rl_step(self, it: int) -> dict:
        total = self.ctx.flops.training_total
        # stop when the budget is reached, or when one more update would overshoot it by more than it
        # would leave unspent (so the run ends as close to the budget as its update size allows)
        if self.flops_budget is not None and total + self._step_flops / 2 >= self.flops_budget:
            raise BudgetReached(it)
        m = super().rl_step(it)
        self._step_flops = self.ctx.flops.training_total - total
        return m

    def train(self) -> dict:
        try:
            return super().train()
        except BudgetReached as stop:
            it = int(stop.args[0])
            logger.info(
                "FLOPs budget {:.3g} reached after {} updates ({:.3g} FLOPs)",
                self.flops_budget,
                it,
                self.ctx.flops.training_total,
            )
            self.state["final_eval"], evaluated = self.final_held_out("at the FLOPs budget")
            self.state["phase"] = "done"
            self.state["stopped_at_budget"] = True
            if evaluated:
                self.writer.log(
                    it,
                    {
                        "eval/reward_mean": self.state["final_eval"]["reward_mean"],
                        "eval/reward_se": self.state["final_eval"]["reward_se"],
                        "flops/total": self.ctx.flops.training_total,
                    },
                )
            self._save(f"iter-{it:06d}")
            return self.finish()


def make_trainer(factory, ctx, flops_budget: float | None = None):
    """``factory(ctx)``, or for a budget a subclass of the registered trainer class that honours it."""
    if flops_budget is None:
        return factory(ctx)
    if not (isinstance(factory, type) and issubclass(factory, MPTTrainer)):
        raise ConfigError(f"algorithm {factory!r} cannot be run at a FLOPs budget (only MPTTrainer subclasses)")
    cls = type(f"Budgeted{factory.__name__}", (FlopsBudgetMixin, factory), {"flops_budget": float(flops_budget)})
    return cls(ctx)


def seed_checkpoint(run_dir: Path, agents_dir: Path, seed: int) -> Path:
    """Start a run from another run's weights: ``checkpoints/sft`` holding a copy of ``agents_dir``
    (models only: fresh optimizers, zero FLOPs) at phase ``sft_done``, so the trainer resumes there
    and skips SFT. Used for transfer (adaptation FLOPs start at 0)."""
    root = run_dir / "checkpoints"
    tmp = root / ".tmp-sft"
    shutil.rmtree(tmp, ignore_errors=True)
    for role_dir in sorted(p for p in Path(agents_dir).iterdir() if p.is_dir()):
        dst = tmp / "agents" / role_dir.name
        shutil.copytree(role_dir, dst, ignore=shutil.ignore_patterns("training_state.pt"))
        gen = torch.Generator().manual_seed(int(seed))
        torch.save({"policy_rng": gen.get_state()}, dst / "training_state.pt")
    for base in sorted(Path(agents_dir).parent.glob("base*")):  # model.adapter=lora: the trained bases the adapters
        if base.is_dir():  # point to (base/, and base-NAME/ of each other model.bases base)
            shutil.copytree(base, tmp / base.name)
    torch.save(
        {"run": random.Random(int(seed)).getstate(), "python": random.getstate(), "torch": torch.get_rng_state()},
        tmp / "rng.pt",
    )
    import json

    (tmp / "state.json").write_text(
        json.dumps({"phase": "sft_done", "iteration": 0, "flops": {}, "initialised_from": str(agents_dir)})
    )
    final = root / "sft"
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    (root / "latest").write_text("sft")
    return final


def budget_cap(iterations: int, factor: float) -> int:
    """The iteration cap of a FLOPs-matched run."""
    return max(1, math.ceil(iterations * float(factor)))


def final_checkpoint(run_dir: Path) -> Path:
    """The finished checkpoint of a training run (``phase == done``), or a clear error."""
    latest = ckpt.latest_checkpoint(Path(run_dir))
    if latest is None or ckpt.load_state(latest).get("phase") != "done":
        raise ConfigError(
            f"{str(run_dir)!r} holds no finished training (checkpoints/latest with phase 'done'); "
            "finish it with `swarm run resume=true run_dir=...` or drop base="
        )
    return latest
