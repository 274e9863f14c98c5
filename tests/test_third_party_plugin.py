"""The complete third-party plugin of docs/reference/plugins.md, exercised end to end.

Everything a third-party package would ship lives in this module: a tiny domain
(``colors``: two roles place coloured blocks in a seeded order), a custom
coordinator, a custom credit scheme, a config rule of the domain's own task key
with a cross-key check, and a conformance suite. They are registered the way
tests register plugins (``make_plugin_manager(extra_plugins=...)``) and, for the
command line, as an installed package's entry point; checked with the
conformance kit, resolved into a run config and played with real tiny models
built by ``RunContext.build_swarm``. The module imports no torch: the command
line loads it (as a plugin) before torch.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import swarm_runtime
from swarm_runtime import ConformanceError, Domain, DomainEnv, ExpertStep, Role, StepResult, check_domain
from swarm_runtime.config.errors import ConfigError
from swarm_runtime.config.load import resolve
from swarm_runtime.config.rules import Rule, ints
from swarm_runtime.core.auction import AuctionResult
from swarm_runtime.core.credit import fold_skipped_rewards
from swarm_runtime.core.loop import new_slots
from swarm_runtime.plugins.manager import build_registry, make_plugin_manager

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


# --------------------------------------------------------------------------- config rule and check


#: ``task.length``, the domain's own key: 1 to 16 blocks (a rule's error names the key, the value and this).
LENGTH = Rule("task.length", *ints(1, 16))


def length_fits(cfg, registry) -> None:
    """A cross-key check: a colors task's blocks fit in its decisions (``registry``: unused here)."""
    if cfg.domain == "colors" and int(cfg.task.length) > int(cfg.task.max_decisions):
        raise ConfigError(
            f"task.length={cfg.task.length} needs task.max_decisions >= {cfg.task.length}, got {cfg.task.max_decisions}"
        )


# --------------------------------------------------------------------------- conformance suite


def check_colour_roles(domain, task, **kw) -> None:
    """A conformance suite of the domain's own promise: every colour of a seed's pattern has the role that
    places it (``**kw``: what else ``check_domain`` passes, such as ``max_tokens``)."""
    cfg = domain.task_config(task) if isinstance(task, str) else task
    roles = {r.name for r in domain.roles}
    for seed in range(5):
        env = domain.make_env(cfg)
        env.reset(seed)
        missing = sorted({c.capitalize() for c in env.pattern} - roles)
        if missing:
            raise ConformanceError(f"{domain.name}/{task}, seed {seed}: no role places {', '.join(missing)}")


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

    @swarm_runtime.hookimpl
    def swarm_register_config_rules(self, register, register_check):
        register(LENGTH, domain="colors")
        register_check(length_fits)

    @swarm_runtime.hookimpl
    def swarm_register_conformance_suites(self, register):
        register("colour_roles", check_colour_roles, applies=lambda domain, task: domain.name == "colors")


#: The object an entry point names (``colors = test_third_party_plugin:PLUGIN``).
PLUGIN = ColorsPlugin()


@pytest.fixture
def plugin():
    pm = make_plugin_manager(extra_plugins=[(PLUGIN, "colors_plugin")])
    try:
        yield pm, build_registry(pm)
    finally:
        pm.unregister(name="colors_plugin")


# --------------------------------------------------------------------------- tests


def test_domain_passes_the_conformance_kit(plugin):
    _, reg = plugin
    assert [s.name for s in reg.conformance_suites.values()] == ["rlcr", "colour_roles"]
    check_domain(ColorsDomain(), "place", registry=reg)  # the core's checks, then both suites (rlcr: not applicable)


def test_the_plugins_suite_catches_what_it_promises():
    class Green(ColorsDomain):
        roles = (Role("Red", "places red blocks"), Role("Green", "places green blocks"))

    with pytest.raises(ConformanceError, match=r"colors/place, seed \d: no role places Blue"):
        check_colour_roles(Green(), "place")


def test_plugin_registers_through_the_public_hooks(plugin):
    pm, reg = plugin
    assert reg.provenance["colors_plugin"] == [
        "domain:colors",
        "coordinator:lowest_index",
        "credit_scheme:immediate",
        "config_rule:task.length (colors)",
        "config_check:length_fits",
        "conformance_suite:colour_roles",
    ]
    assert reg.get("coordinators", "lowest_index") is LowestIndexCoordinator
    assert "auction" in reg.coordinators and "bucket_brigade" in reg.credit_schemes  # built-ins still there


def test_config_resolves_task_overrides_and_bare_domain_keys(plugin):
    _, reg = plugin
    cfg = resolve(["domain=colors", "task=place", "length=3", "algo.coordinator=lowest_index"], reg)
    assert cfg.model.max_action_tokens == 3 and cfg.algo.envs_per_step == 4  # the task's overrides: block
    assert "overrides" not in cfg.task
    assert int(cfg.task.length) == 3  # bare key of the task YAML -> task.length


def test_the_plugins_rule_and_check_refuse_bad_values_naming_the_plugin(plugin):
    _, reg = plugin
    with pytest.raises(ConfigError) as err:
        resolve(["domain=colors", "task=place", "length=0"], reg)
    assert str(err.value) == (
        "task.length=0 is not valid: must be an integer in [1, 16] (rule of plugin 'colors_plugin' for domain 'colors')"
    )
    with pytest.raises(
        ConfigError, match=r"task.length=12 needs task.max_decisions >= 12, got 8 \(check 'length_fits' "
    ):
        resolve(["domain=colors", "task=place", "length=12"], reg)
    assert resolve(["domain=colors", "task=place", "length=12", "max_decisions=12"], reg).task.length == 12


def test_swarm_config_refuses_the_plugins_bad_value_before_torch(tmp_path):
    """The plugin installed as a package's entry point: ``swarm config`` refuses ``length=0`` in its precheck,
    with the domains-only registry (the rules come from their hook alone), in one line naming the plugin."""
    from conftest import swarm

    site = tmp_path / "site"
    info = site / "colors_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: colors-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[swarm_runtime]\ncolors = test_third_party_plugin:PLUGIN\n")
    path = [str(site), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
    env = {"PYTHONPATH": os.pathsep.join(p for p in path if p)}
    res = swarm("config", "domain=colors", "length=0", cwd=tmp_path, env=env)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1] == (
        "swarm: error: task.length=0 is not valid: must be an integer in [1, 16] "
        "(rule of plugin 'colors' for domain 'colors')"
    )


def test_tiny_swarm_plays_and_learns_with_plugin_parts(plugin, tmp_path):
    import torch

    from swarm_runtime.learn.action import action_update, credit_samples
    from swarm_runtime.learn.optim import make_optimizer
    from swarm_runtime.runs.context import RunContext
    from swarm_runtime.sampling.play import play

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
