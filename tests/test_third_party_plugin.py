"""The complete third-party plugin of docs/plugins.md, exercised end to end.

Everything a third-party package would ship lives in this module: a tiny domain
(``colors``: two roles place coloured blocks in a seeded order), a custom
coordinator and a custom credit scheme. They are registered
the way tests register plugins (``make_plugin_manager(extra_plugins=...)``),
checked with the conformance kit, resolved into a run config and played with
real tiny models built by ``RunContext.build_swarm``.
"""

from __future__ import annotations

import random

import pytest
import torch
from omegaconf import OmegaConf

import swarm_runtime
from swarm_runtime.config.load import resolve
from swarm_runtime.conformance.suite import check_domain
from swarm_runtime.core.auction import AuctionResult
from swarm_runtime.core.credit import fold_skipped_rewards
from swarm_runtime.core.domain import Domain, Role
from swarm_runtime.core.env import DomainEnv, ExpertStep, StepResult
from swarm_runtime.core.loop import new_slots
from swarm_runtime.learn.action import action_update, credit_samples
from swarm_runtime.learn.optim import make_optimizer
from swarm_runtime.plugins.manager import build_registry, make_plugin_manager
from swarm_runtime.runs.context import RunContext
from swarm_runtime.sampling.play import play

# --------------------------------------------------------------------------- the domain


class ColorsEnv(DomainEnv):
    """Place ``length`` blocks in a seeded colour order; only the role of the
    next colour may ``place`` (reward 1 per block, done when all are placed)."""

    def __init__(self, length: int):
        self.length = length

    def reset(self, seed: int) -> str:
        rng = random.Random(seed)
        self.pattern = [rng.choice(["red", "blue"]) for _ in range(self.length)]
        self.placed = 0
        return self.observation()

    def observation(self) -> str:
        if self.placed >= self.length:
            return "done"
        return f"next {self.pattern[self.placed]} left {self.length - self.placed}"

    def step(self, action: str, role: str | None = None) -> StepResult:
        done = self.placed >= self.length
        if done or action.strip() != "place" or (role is not None and role.lower() != self.pattern[self.placed]):
            return StepResult(self.observation(), valid=False)  # unparsable or wrong role: a no-op
        self.placed += 1
        done = self.placed >= self.length
        return StepResult(self.observation(), reward=1.0, done=done, info={"success": float(done)})

    def expert_action(self) -> ExpertStep | None:
        if self.placed >= self.length:
            return None
        return ExpertStep(self.pattern[self.placed].capitalize(), "place")

    def metrics(self) -> dict[str, float]:
        return {"success": float(self.placed >= self.length)}


class ColorsDomain(Domain):
    name = "colors"
    description = "Two roles place coloured blocks in a seeded order."
    roles = (Role("Red", "places red blocks"), Role("Blue", "places blue blocks"))

    # A package would set ``tasks_dir = Path(__file__).parent / "tasks"`` and ship
    # ``place.yaml``; a test domain can override these two methods instead.
    def task_names(self) -> list[str]:
        return ["place"]

    def task_config(self, task: str):
        if task not in self.task_names():
            raise KeyError(task)
        return OmegaConf.create(
            {  # a fresh object each call: resolve() pops ``overrides``
                "max_decisions": 8,
                "reward_max": 4,
                "reward_min": 0,
                "train_seeds": {"start": 0, "count": 100},
                "eval_seeds": {"start": 1000, "count": 4},
                "length": 4,  # a domain-specific key: `swarm run domain=colors length=3` sets it
                "overrides": {"model": {"max_action_tokens": 3}, "algo": {"envs_per_step": 4}},
            }
        )

    def make_env(self, task) -> DomainEnv:
        return ColorsEnv(int(task.length))  # int(): command-line values may arrive as strings

    def vocabulary(self, task) -> list[str]:
        return ["next", "red", "blue", "left", "done", "place"]  # digits and punctuation are added by the core


# --------------------------------------------------------------------------- coordinator and credit


class LowestIndexCoordinator:
    """Highest bid wins like the auction, but ties go to the lowest agent index."""

    uses_bids = True  # the episode loop asks every present agent for a bid

    def __init__(self, cfg=None):
        self.cfg = cfg

    def select(self, bids, rng, turn) -> AuctionResult:
        present = sorted(((b, i) for i, b in enumerate(bids) if b is not None), key=lambda x: (-x[0], x[1]))
        if not present or present[0][0] <= 0:
            return AuctionResult(None, None)  # every bid 0 (or nobody present): the turn is skipped
        (top, winner), rest = present[0], present[1:]
        if not rest:
            return AuctionResult(winner, None, top, 0.0)
        return AuctionResult(winner, rest[0][1], top, rest[0][0])


def immediate_credit(rewards, bids, rng) -> list[float]:
    """Each actor keeps exactly the reward its own action earned (no pass-back)."""
    return [float(r) for r in rewards]


# --------------------------------------------------------------------------- the plugin


class ColorsPlugin:
    """In a package this would be a module named in ``[project.entry-points.swarm_runtime]``."""

    @swarm_runtime.hookimpl
    def swarm_register_domains(self, register):
        register(ColorsDomain())

    @swarm_runtime.hookimpl
    def swarm_register_coordinators(self, register):
        register("lowest_index", LowestIndexCoordinator)

    @swarm_runtime.hookimpl
    def swarm_register_credit_schemes(self, register):
        register("immediate", immediate_credit)


@pytest.fixture
def plugin():
    pm = make_plugin_manager(extra_plugins=[(ColorsPlugin(), "colors_plugin")])
    try:
        yield pm, build_registry(pm)
    finally:
        pm.unregister(name="colors_plugin")


# --------------------------------------------------------------------------- tests


def test_domain_passes_the_conformance_kit():
    check_domain(ColorsDomain(), "place")


def test_plugin_registers_through_the_public_hooks(plugin):
    pm, reg = plugin
    assert reg.provenance["colors_plugin"] == ["domain:colors", "coordinator:lowest_index", "credit_scheme:immediate"]
    assert reg.get("coordinators", "lowest_index") is LowestIndexCoordinator
    assert "auction" in reg.coordinators and "bucket_brigade" in reg.credit_schemes  # built-ins still there


def test_config_resolves_task_overrides_and_bare_domain_keys(plugin):
    _, reg = plugin
    cfg = resolve(["domain=colors", "task=place", "length=3", "algo.coordinator=lowest_index"], reg)
    assert cfg.model.max_action_tokens == 3 and cfg.algo.envs_per_step == 4  # the task's overrides: block
    assert "overrides" not in cfg.task
    assert int(cfg.task.length) == 3  # bare key of the task YAML -> task.length


def test_tiny_swarm_plays_and_learns_with_plugin_parts(plugin, tmp_path):
    pm, reg = plugin
    cfg = resolve(
        [
            "domain=colors",
            "task=place",
            "algo.coordinator=lowest_index",
            "algo.credit=immediate",
            "progress=false",
            "tensorboard=false",
        ],
        reg,
    )
    ctx = RunContext(cfg, pm, reg, tmp_path)
    agents, policies = ctx.build_swarm()
    assert [a.role for a in agents] == ["Red", "Blue"] and set(policies) == {"Red", "Blue"}

    coordinator, rng = ctx.coordinator(), random.Random(0)
    seeds = ctx.seeds("train")[: int(cfg.algo.envs_per_step)]
    with torch.no_grad():
        episodes = play(
            new_slots(ctx.domain, ctx.task, seeds), agents, coordinator, ctx.domain, int(ctx.task.max_decisions), rng
        )
    assert [e.seed for e in episodes] == seeds
    assert ctx.flops.by_category["rollout"] > 0
    for ep in episodes:
        assert 1 <= len(ep.turns) <= 8 and 0.0 <= ep.reward <= 4.0
        for turn in ep.turns:  # every decision followed the plugin coordinator's rule
            assert turn.auction == LowestIndexCoordinator().select(turn.bids, rng, turn.t)

    samples = credit_samples(episodes, ctx.credit_fn(), rng)
    expected = [
        r
        for ep in episodes
        for r in fold_skipped_rewards([t.reward for t in ep.turns], [t.winner is not None for t in ep.turns])
    ]
    assert [s[3] for s in samples] == expected  # the plugin credit scheme was used

    # One REINFORCE step on the plugin-made credit moves the weights of an agent that acted.
    assert samples, "no agent acted in the batch"
    samples.append((samples[0][0], samples[0][1], samples[0][2], 3.0))  # a credit spread -> non-zero advantage
    opts = {r: make_optimizer(p.parameters(), 1e-3, 0.0, 10) for r, p in policies.items()}
    role = agents[samples[0][0]].role
    before = [p.detach().clone() for p in policies[role].parameters()]
    metrics = action_update(agents, samples, opts, reward_scale=float(cfg.task.reward_max), minibatch=16, grad_clip=1.0)
    assert f"losses/action_{role}" in metrics
    assert any(not torch.equal(a, b) for a, b in zip(before, policies[role].parameters()))
