"""Monolithic REINFORCE baseline (``algo=monolithic``; docs/reference/method.md, section 5;
docs/reference/algorithm.md, "The baselines and what they simplify").

ONE model of the size of one agent (same model config, built by the same
policy backend) acts every turn:

- **Prompts**: the domain's ``single_prompt`` (observation + public log, no
  role); the env is stepped with ``role=None``, which the env contract defines
  as "a single monolithic model" (every action is allowed: Minecraft ignores the
  role, VLN-CE's ``role_allows(None, ...)`` and OpenResearcher's tool check
  accept any action). Its turns are logged as ``you`` (``episode.SINGLE_ACTOR``).
- **SFT at matched compute**: the union of all roles' expert demonstrations (the
  same demo seeds as the swarm would draw), trained for as many examples x epochs
  as the swarm's SFTs together. Each expert step gives the swarm one bid example
  per role plus one action example, and the monolithic model one action example,
  so it takes ``(n_roles + 1) * epochs`` passes' worth of examples
  (``max_steps`` caps the last epoch). ``algo.sft.match=data`` instead trains on the
  same demos for the same epochs as each swarm agent (matched data, ~1/(n_roles+1)
  of the compute): the swarm's agents see only their own role's share of it.
- **REINFORCE**: return = the undiscounted **reward-to-go** of each turn
  (``credit.reward_to_go``, registered as the ``reward_to_go`` credit scheme),
  advantage = return minus the mean return of the update's batch (the mean
  baseline; with one agent the core's per-agent baseline is exactly that),
  divided by ``algo.reward_scale`` (or ``task.reward_max``), same optimizer,
  clipping and schedule as MPT's action steps. No bids, so no bid steps.

Everything else (rollout metrics, FLOPs, checkpoints, resume, held-out
evaluation, observer hooks) is :class:`MPTTrainer`'s.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

from loguru import logger

from swarm_runtime.core.credit import reward_to_go
from swarm_runtime.core.episode import Agent
from swarm_runtime.learn.mpt import MPTTrainer
from swarm_runtime.learn.sft import collect_demos, demo_accuracy, sft
from swarm_runtime.runs.context import RunContext

#: Name (and checkpoint folder) of the single model.
MONOLITHIC = "Monolithic"


def reward_to_go_credit(rewards, bids, rng) -> list[float]:
    """Credit scheme ``reward_to_go``: each turn's undiscounted return; the bids are ignored."""
    return reward_to_go(rewards)


def build_monolithic(ctx: RunContext, init_dir: Path | None = None) -> tuple[list[Agent], dict]:
    """One model the size of one agent (the first role's seed), acting on ``single_prompt``."""
    path = Path(init_dir) / MONOLITHIC if init_dir is not None else None
    policy = ctx.make_policy(int(ctx.cfg.seed) * 100, path)
    ctx.constrain_actions({MONOLITHIC: policy}, {MONOLITHIC: None})
    return [Agent(MONOLITHIC, MONOLITHIC, policy, prompt_kind="single")], {MONOLITHIC: policy}


def matched_sft_plan(
    n_single: int, n_roles: int, epochs: int, batch_size: int, action_epochs: int | None = None
) -> tuple[int, int]:
    """(epochs, max_steps) giving the monolithic model the swarm's SFT examples x epochs.

    Per expert step the swarm trains ``n_roles`` bid examples for ``epochs`` passes + 1
    action example for ``action_epochs`` passes (None = ``epochs``), the monolithic model
    1 action example: target = ``n_single * (n_roles * epochs + action_epochs)``."""
    target = n_single * (n_roles * epochs + (epochs if action_epochs is None else action_epochs))
    return math.ceil(target / max(1, n_single)), math.ceil(target / batch_size)


def monolithic_sft_units(
    policies: dict,
    *,
    demos: list,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    max_steps: int | None,
    progress: bool,
    after=lambda: None,
    micro_batch: int | None = None,
) -> list[tuple]:
    """The monolithic model's SFT cold start on ``demos`` (all roles' expert actions, ``single_prompt``) and its
    greedy demo-action accuracy, in process or on its learner actor (``cluster.learners=ray``: ``LearnerWorker.sft``
    calls it as it calls ``learn/mpt.py: sft_units``, whose unit shape it shares): ``[("role", MONOLITHIC,
    metrics, MONOLITHIC)]``; ``after()`` once the unit is done (a learner counts its FLOPs there)."""
    policy = policies[MONOLITHIC]
    m = sft(
        policy,
        demos,
        epochs,
        lr,
        batch_size,
        seed,
        max_steps=max_steps,
        desc="SFT monolithic",
        progress=progress,
        micro_batch=micro_batch,
    )
    if demos:
        m["demo_action_accuracy"] = demo_accuracy(policy, demos)
    after()
    return [("role", MONOLITHIC, m, MONOLITHIC)]


@dataclasses.dataclass
class _MonolithicContext(RunContext):
    """The run's context, but the "swarm" is one model and it always acts (round-robin over one)."""

    def build_swarm(self, init_dir: Path | None = None, replicas: int = 1):
        return build_monolithic(self, init_dir)

    def coordinator(self, name: str | None = None):
        return self.registry.get("coordinators", "round_robin")(self.cfg)

    def credit_fn(self, name: str | None = None):
        return reward_to_go_credit


class MonolithicTrainer(MPTTrainer):
    """Monolithic REINFORCE, registered as ``algo.name=monolithic`` (preset ``algo=monolithic``)."""

    label = "Monolithic REINFORCE"

    def __init__(self, ctx: RunContext):
        ctx = _MonolithicContext(**{f.name: getattr(ctx, f.name) for f in dataclasses.fields(RunContext)})
        super().__init__(ctx)
        if int(self.cfg.algo.bid_steps) != 0:
            logger.info("monolithic: no bids, so algo.bid_steps {} -> 0", self.cfg.algo.bid_steps)
            self.cfg.algo.bid_steps = 0

    def cold_start(self) -> None:
        ctx, s = self.ctx, self.cfg.algo.sft
        ctx.flops.category = "sft"
        train_seeds = ctx.seeds("train")
        demo_seeds = self.rng.sample(train_seeds, min(int(s.demo_episodes), len(train_seeds)))
        demos = collect_demos(ctx.domain, ctx.task, demo_seeds, single=True)["single"]
        if s.match == "data":
            (epochs, steps), matched = (int(s.action_epochs or s.epochs), None), "demos x epochs"
        else:
            epochs, steps = matched_sft_plan(
                len(demos), len(ctx.domain.roles), int(s.epochs), int(s.batch_size), s.action_epochs
            )
            matched = "examples x epochs"
        t0 = time.time()
        settings = dict(
            demos=demos,
            epochs=epochs,
            lr=float(s.lr),
            batch_size=int(s.batch_size),
            seed=int(self.cfg.seed),
            max_steps=steps,
            progress=bool(self.cfg.progress),
            micro_batch=self.cfg.hardware.get("micro_batch"),
        )
        if self._ray_learners():  # on its learner actor, as the swarm's SFT is (MPTTrainer._sft_on_learners)
            from swarm_runtime.cluster.learners import replay_flops

            (_, _, m, _, events), *_ = self._sft_on_learners(monolithic_sft_units, lambda roles: settings)
            replay_flops(ctx.flops, events)
        else:
            m = monolithic_sft_units(self.policies, **settings)[0][2]
        if demos:
            m["matched_examples"] = float(m["steps"] * int(s.batch_size))
            logger.info(
                "SFT monolithic: {} demo actions x {} epochs ({} steps, matched to the swarm's {}), loss "
                "{:.3f} -> {:.3f}, greedy demo-action accuracy {:.0%} ({:.0f}s)",
                len(demos),
                epochs,
                m["steps"],
                matched,
                m["first_loss"],
                m["loss"],
                m["demo_action_accuracy"],
                time.time() - t0,
            )
            self.writer.log(0, {f"sft/{k}_{MONOLITHIC}": v for k, v in m.items()})
            self._hook("swarm_on_train_step", step=0, kind="sft", metrics={"role": MONOLITHIC, **m})
        self.state["phase"] = "sft_done"
        self._save("sft")

    def held_out(self, label: str) -> dict:
        return super().held_out(label.replace("MPT", "RL"))


__all__ = [
    "MONOLITHIC",
    "MonolithicTrainer",
    "build_monolithic",
    "matched_sft_plan",
    "monolithic_sft_units",
    "reward_to_go_credit",
]
