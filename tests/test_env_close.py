"""``DomainEnv.close()``: optional in the contract, forwarded once by ValidatedEnv (which refuses a closed
env's use), called by the runtime on every env it made when an episode batch, an evaluation, the SFT demos,
an RLCR batch or a run ends (also when it raised), and checked by the conformance kit."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import TINY_RLCR, TINY_RUN, run_context

from swarm_domains.minecraft.task import TaskSpec
from swarm_domains.minecraft.world import CraftWorld
from swarm_runtime.conformance.env import check_close
from swarm_runtime.conformance.probe import ConformanceError, Probe
from swarm_runtime.core.env import DomainEnv, EnvContractError, StepResult, ValidatedEnv, close_all
from swarm_runtime.core.loop import make_env, new_slots
from swarm_runtime.evaluation.heldout import evaluate
from swarm_runtime.learn.bid import pick_contested, run_branches
from swarm_runtime.learn.rlcr.loop import LoopOptions, play_concurrent
from swarm_runtime.learn.sft import collect_demos
from swarm_runtime.sampling.local import LocalSampler
from swarm_runtime.sampling.play import play


class Tracker:
    """Every env ``domain`` makes (``make_env``, ``concurrent_env``) and how often each was closed; the envs
    keep their own class's behaviour (a subclass made per env class counts ``close()``)."""

    def __init__(self, monkeypatch, domain, fail_reset_seed: int | None = None):
        self.made: list = []
        self.closes: dict[int, int] = {}
        self.fail_reset_seed = fail_reset_seed
        for name in ("make_env", "concurrent_env"):
            monkeypatch.setattr(domain, name, self._maker(getattr(domain, name)))

    def _maker(self, orig):
        def make(task):
            env = orig(task)
            if all(e is not env for e in self.made):
                self._track(env)
            return env

        return make

    def _track(self, env):
        tracker, base = self, type(env)

        def close(self_):
            tracker.closes[id(self_)] = tracker.closes.get(id(self_), 0) + 1
            base.close(self_)

        def reset(self_, seed):
            if seed == tracker.fail_reset_seed:
                raise ValueError(f"no world for seed {seed}")
            return base.reset(self_, seed)

        env.__class__ = type(base.__name__, (base,), {"close": close, "reset": reset})
        self.made.append(env)

    def counts(self) -> list[int]:
        return [self.closes.get(id(e), 0) for e in self.made]

    def all_closed_once(self) -> bool:
        return bool(self.made) and self.counts() == [1] * len(self.made)


@pytest.fixture(scope="module")
def ctx(registry):
    return run_context(registry, "domain=minecraft", "task=iron_pickaxe", "task.max_decisions=24")


@pytest.fixture(scope="module")
def swarm_agents(ctx):
    agents, _ = ctx.build_swarm()
    return agents


# --------------------------------------------------------------------------- the contract
def test_close_is_optional_and_validated_env_forwards_it_once_then_refuses_the_env(ctx, monkeypatch):
    class Bare(DomainEnv):  # a third-party env written before close() existed
        def reset(self, seed):
            return "hi"

        def step(self, action, role=None):
            return StepResult("hi")

        def observation(self):
            return "hi"

    assert Bare().close() is None
    ValidatedEnv(object(), "duck").close()  # a duck-typed env without close() is left alone

    t = Tracker(monkeypatch, ctx.domain)
    env = make_env(ctx.domain, ctx.task)
    env.reset(3)
    env.step("chop tree", "Logger")
    snap = env.snapshot()
    env.close()
    env.close()
    assert t.counts() == [1]
    with pytest.raises(
        EnvContractError,
        match=r"^minecraft, seed 3, step 1, action 'chop tree' by "
        r"Logger: step\(\) called after close\(\) \(a closed env is not used "
        r"again; make a new one\)$",
    ):
        env.step("chop tree", "Logger")
    for call in (lambda: env.reset(0), lambda: env.restore(snap)):
        with pytest.raises(EnvContractError, match=r"called after close\(\)"):
            call()
    fresh = make_env(ctx.domain, ctx.task)  # the closed env's snapshot restores into another env and plays on
    fresh.restore(snap)
    assert fresh.t == 1 and fresh.observation() == snap[0]["_obs"]
    assert fresh.step("chop tree", "Logger").valid


def test_close_all_closes_every_env_even_when_one_raises():
    closed = []

    class E:
        def __init__(self, name, fail=False):
            self.name, self.fail = name, fail

        def close(self):
            closed.append(self.name)
            if self.fail:
                raise OSError(f"{self.name} would not stop")

    with pytest.raises(OSError, match="b would not stop"):
        close_all([E("a"), E("b", fail=True), E("c")])
    assert closed == ["a", "b", "c"]
    close_all([E("d", fail=True)], quiet=True)  # logged: a caller unwinding from another error keeps that one


# --------------------------------------------------------------------------- the runtime closes what it made
def test_a_batch_closes_its_envs_and_branches_restore_the_closed_episodes_snapshots(ctx, swarm_agents, monkeypatch):
    t = Tracker(monkeypatch, ctx.domain)
    rng = random.Random(1)
    with torch.no_grad():
        eps = play(
            new_slots(ctx.domain, ctx.task, [0, 1]),
            swarm_agents,
            ctx.coordinator(),
            ctx.domain,
            24,
            rng,
            record_snapshots=True,
        )
    assert len(t.made) == 2 and t.all_closed_once()
    picks = pick_contested(eps, 2, rng)
    assert picks
    with torch.no_grad():
        pairs = run_branches(swarm_agents, ctx.coordinator(), ctx.domain, ctx.task, picks, 10, rng)
    assert pairs and len(t.made) > 2 and t.all_closed_once()


def test_a_batch_that_raises_and_a_reset_that_raises_leave_no_env_open(ctx, swarm_agents, monkeypatch):
    class Broken(LocalSampler):
        calls = 0

        def act(self, rows):
            Broken.calls += 1
            if Broken.calls == 2:
                raise RuntimeError("sampler lost")
            return super().act(rows)

    t = Tracker(monkeypatch, ctx.domain, fail_reset_seed=7)
    sampler, models = Broken.for_agents(swarm_agents)
    with pytest.raises(RuntimeError, match="sampler lost"), torch.no_grad():
        play(
            new_slots(ctx.domain, ctx.task, [0, 1, 2]),
            swarm_agents,
            ctx.coordinator(),
            ctx.domain,
            24,
            random.Random(0),
            sampler=sampler,
            models=models,
        )
    assert len(t.made) == 3 and t.all_closed_once()
    with pytest.raises(ValueError, match="no world for seed 7"):
        new_slots(ctx.domain, ctx.task, [4, 5, 7, 8])
    assert len(t.made) == 6 and t.all_closed_once()  # 4 and 5 made and reset, 7 made and failed; 8 never made


def test_evaluation_demos_and_rlcr_rollouts_close_their_envs(ctx, swarm_agents, monkeypatch):
    t = Tracker(monkeypatch, ctx.domain)
    res, _ = evaluate(swarm_agents, ctx.coordinator(), ctx.domain, ctx.task, [0, 1], 2, 5)
    assert res["runs"] == 2 and len(t.made) == 4 and t.all_closed_once()
    demos = collect_demos(ctx.domain, ctx.task, [0, 1, 2])
    assert demos["Smith"] and len(t.made) == 7 and t.all_closed_once()

    def decide(requests):
        return [("hi", [0]) for _ in requests]

    rollouts = play_concurrent(ctx.domain, ctx.task, [0, 1], decide, LoopOptions(t_max=40, agents=2))
    assert len(rollouts) == 2 and len(t.made) == 9 and t.all_closed_once()

    def boom(requests):
        raise RuntimeError("decider lost")

    with pytest.raises(RuntimeError, match="decider lost"):
        play_concurrent(ctx.domain, ctx.task, [0, 1], boom, LoopOptions(t_max=40, agents=2))
    assert len(t.made) == 11 and t.all_closed_once()


def test_the_run_checks_close_the_env_they_build(registry, monkeypatch):
    """A run builds one env to check its task (``run.check_task``) and, under ``algo=rlcr``, one concurrent env
    to check for ``progress()`` (``validation.rlcr``); each is closed right after."""
    from swarm_runtime.config.load import resolve
    from swarm_runtime.config.validation import rlcr
    from swarm_runtime.runs.context import check_task

    _, reg = registry
    cfg = resolve(list(TINY_RLCR), reg)
    t = Tracker(monkeypatch, reg.domains["minecraft"])
    check_task(reg.domains["minecraft"], cfg)
    rlcr(cfg, reg)
    assert len(t.made) == 2 and t.all_closed_once()


CLOSE_AUDIT = textwrap.dedent("""
    import json, sys
    from swarm_domains.minecraft import plugin
    made, closes = [], {}

    def tracked(orig):
        def make(self, task):
            env = orig(self, task)
            base = type(env)

            def close(self_):
                closes[id(self_)] = closes.get(id(self_), 0) + 1
                base.close(self_)

            env.__class__ = type(base.__name__, (base,), {"close": close})
            made.append(env)
            return env
        return make

    plugin.MinecraftDomain.make_env = tracked(plugin.MinecraftDomain.make_env)
    from swarm_runtime.cli.main import main
    rc = main(sys.argv[1:])
    print("CLOSE_AUDIT " + json.dumps({"rc": rc, "made": len(made), "counts": [closes.get(id(e), 0) for e in made]}))
""")


def test_a_real_run_closes_every_env_it_made(tmp_path):
    """``swarm run`` (SFT demos, rollouts, counterfactual branches, held-out evaluation) in a subprocess whose
    minecraft domain counts every env it makes and every close."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CLOSE_AUDIT, "run", *TINY_RUN, f"run_dir={tmp_path / 'run'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("CLOSE_AUDIT ")]
    assert line, out.stdout[-2000:] + out.stderr[-3000:]
    audit = json.loads(line[-1].split(" ", 1)[1])
    assert audit["rc"] == 0 and audit["made"] > 10
    assert audit["counts"] == [1] * audit["made"], audit


# --------------------------------------------------------------------------- the conformance kit
def test_the_kit_passes_a_good_close_and_never_uses_a_closed_env(ctx):
    check_close(ctx.domain, "iron_pickaxe")
    p = Probe(ctx.domain, ctx.task, "iron_pickaxe")
    p.reset(0)
    p.close()
    p.close()
    with pytest.raises(AssertionError, match=r"conformance kit: step\(\) on an env the kit closed"):
        p.step("chop tree", "Logger")


def _mutant(ctx, monkeypatch, **methods):
    """The minecraft domain, its env (``CraftWorld``) with ``methods`` replaced."""
    cls = type("CraftWorld", (CraftWorld,), methods)
    monkeypatch.setattr(ctx.domain, "make_env", lambda task: cls(TaskSpec.from_config(task)))


class Server:
    """Something every env of a task shares (a simulator server, a corpus)."""

    up = True


def test_the_kit_catches_a_close_that_raises_twice_tears_down_shared_state_or_shares_its_snapshot(ctx, monkeypatch):
    def once(self):
        if getattr(self, "_gone", False):
            raise RuntimeError("already closed")
        self._gone = True

    _mutant(ctx, monkeypatch, close=once)
    with pytest.raises(
        ConformanceError,
        match=r"a second close\(\) \(of an env never reset\) raised RuntimeError: "
        r"already closed",
    ):
        check_close(ctx.domain, "iron_pickaxe")

    def stop_server(self):
        Server.up = False

    def render(self):
        return CraftWorld._render(self) + ("" if Server.up else " offline")

    _mutant(ctx, monkeypatch, close=stop_server, _render=render)
    Server.up = True
    with pytest.raises(
        ConformanceError,
        match=r"played after other envs of the task were closed differs .*close\(\) "
        r"tore down something the task's envs share",
    ):
        check_close(ctx.domain, "iron_pickaxe")
    Server.up = True

    def shallow(self):
        return dict(self.__dict__)  # the inventory dict itself, not a copy

    def drop(self):
        self.inventory.clear()

    _mutant(ctx, monkeypatch, snapshot=shallow, close=drop)
    with pytest.raises(
        ConformanceError,
        match=r"a snapshot taken before close\(\) restored into another env of the "
        r"task differs .*inventory",
    ):
        check_close(ctx.domain, "iron_pickaxe")
