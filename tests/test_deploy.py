"""Deployment library: dropout masks, pass@k, participation, replicas, plots."""

import os
import random
import subprocess
import sys
from statistics import mean

import pytest
import torch
from conftest import run_context

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.core.auction import AuctionResult
from swarm_runtime.core.episode import Agent, Episode, Turn
from swarm_runtime.core.loop import new_slots
from swarm_runtime.evaluation.deploy import (
    SKIPPED,
    dropout_presence,
    milestone_pass_at_k,
    participation_by_decision,
    pass_at_k,
    plot_dropout,
    plot_participation,
    plot_population,
)
from swarm_runtime.sampling.play import play

MAX_T = 8


@pytest.fixture(scope="module")
def ctx(registry):
    return run_context(registry, "domain=minecraft", "task=wooden_pickaxe", f"task.max_decisions={MAX_T}")


# ---------------------------------------------------------------------------- pass@k
def test_pass_at_k_hand_values():
    assert pass_at_k(5, 0, 1) == 0.0
    assert pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # c / n
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2) = 0.7
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - 35 / 210)  # 1 - C(7,4)/C(10,4)
    assert pass_at_k(3, 2, 2) == 1.0  # n - c < k: every draw of 2 hits
    for bad in [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def _ep(seed, **has):
    return Episode(seed, metrics={f"has_{m}": float(v) for m, v in has.items()})


def test_milestone_pass_at_k_mean_se_over_seeds():
    # seed 1: 4 runs, a reached twice, b never; seed 2: 4 runs, a once, b once
    eps = [
        _ep(1, a=1, b=0),
        _ep(1, a=1, b=0),
        _ep(1, a=0, b=0),
        _ep(1, a=0, b=0),
        _ep(2, a=1, b=0),
        _ep(2, a=0, b=1),
        _ep(2, a=0, b=0),
        _ep(2, a=0, b=0),
    ]
    res = milestone_pass_at_k(eps, ["a", "b"], k=2)
    a1, a2 = 1 - 1 / 6, 1 - 3 / 6  # 1 - C(2,2)/C(4,2), 1 - C(3,2)/C(4,2)
    assert res["a"][0] == pytest.approx((a1 + a2) / 2)
    assert res["a"][1] == pytest.approx(abs(a1 - a2) / 2)  # SE of two values = |x - y| / 2
    assert res["b"] == pytest.approx(((0 + 0.5) / 2, 0.25))
    assert milestone_pass_at_k(eps, ["a"], k=1)["a"][0] == pytest.approx((0.5 + 0.25) / 2)
    with pytest.raises(ValueError, match="at least 5 runs"):
        milestone_pass_at_k(eps, ["a"], k=5)
    with pytest.raises(ValueError, match="valid: a, b"):
        milestone_pass_at_k(eps, ["wooden_pick"], k=1)


# ---------------------------------------------------------------------------- dropout
def test_dropout_presence_statistics_and_determinism():
    assert dropout_presence(0, 3) is None and dropout_presence(0.0, 12, per="episode") is None
    pres = dropout_presence(0.3, 12)
    masks = [pres(s, t, 12) for s in range(50) for t in range(40)]
    absent = mean(1 - x for m in masks for x in m)
    assert abs(absent - 0.3) < 0.02  # 24000 draws: SE ~ 0.003
    assert masks == [dropout_presence(0.3, 12)(s, t, 12) for s in range(50) for t in range(40)]
    assert pres(7, 3, 12) != pres(7, 4, 12) or pres(7, 5, 12) != pres(7, 6, 12)  # per turn: redrawn
    assert dropout_presence(0.3, 12, seed=1)(7, 3, 12) != pres(7, 3, 12) or dropout_presence(0.3, 12, seed=1)(
        8, 3, 12
    ) != pres(8, 3, 12)
    # agent a's draw does not depend on the swarm size: 3 agents see the first 3 of the 12 draws
    assert all(dropout_presence(0.3, 3)(s, t, 3) == pres(s, t, 12)[:3] for s in range(20) for t in range(10))
    # consumes no shared RNG
    state = random.getstate()
    pres(1, 1, 12)
    assert random.getstate() == state
    # per episode: constant over turns, ~p over (episode, agent) pairs
    ep = dropout_presence(0.6, 3, per="episode")
    assert all(ep(s, t, 3) == ep(s, 0, 3) for s in range(100) for t in range(30))
    assert abs(mean(1 - x for s in range(2000) for x in ep(s, 0, 3)) - 0.6) < 0.03
    assert all(not any(dropout_presence(1.0, 4)(s, t, 4)) for s in range(5) for t in range(5))
    with pytest.raises(ValueError, match="made for 12 agents"):
        pres(0, 0, 3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(p=1.5, n_agents=3), r"p=1.5 .*\[0, 1\]"),
        (dict(p=-0.1, n_agents=3), r"\[0, 1\]"),
        (dict(p="0.3", n_agents=3), r"\[0, 1\]"),
        (dict(p=0.3, n_agents=3, per="decision"), "turn, episode"),
        (dict(p=0.3, n_agents=0), "positive integer"),
    ],
)
def test_dropout_presence_bad_input(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        dropout_presence(**kwargs)


def test_dropout_in_the_episode_loop(ctx):
    """Absent agents do not bid; a turn where every agent is absent is skipped."""
    agents, _ = ctx.build_swarm()
    pres = dropout_presence(0.6, len(agents))
    with torch.no_grad():
        eps = play(
            new_slots(ctx.domain, ctx.task, [3, 4]),
            agents,
            ctx.coordinator(),
            ctx.domain,
            MAX_T,
            random.Random(0),
            presence=pres,
        )
    n_empty = 0
    for ep in eps:
        for turn in ep.turns:
            mask = pres(ep.seed, turn.t, len(agents))
            assert [b is not None for b in turn.bids] == mask
            if not any(mask):
                n_empty += 1
                assert turn.winner is None and turn.action_tokens is None
    assert n_empty > 0  # 0.6^3 of 16 turns: the draws for seeds 3, 4 contain such turns
    with torch.no_grad():
        none = play(
            new_slots(ctx.domain, ctx.task, [3]),
            agents,
            ctx.coordinator(),
            ctx.domain,
            MAX_T,
            random.Random(0),
            presence=dropout_presence(1.0, len(agents)),
        )[0]
    assert len(none.turns) == MAX_T and none.acted == [] and none.reward == 0.0


# ---------------------------------------------------------------------------- replicas
def test_replicas_share_weights_and_sample_independently(ctx):
    agents, policies = ctx.build_swarm(replicas=4)
    assert len(agents) == 12 and len(policies) == 3
    by_role = {}
    for i, a in enumerate(agents):
        by_role.setdefault(a.role, []).append(i)
        assert a.policy is policies[a.role]
    # 12 envs in the same state: every replica sees the same bid prompt at turn 0
    with torch.no_grad():
        eps = play(
            new_slots(ctx.domain, ctx.task, [11] * 12), agents, ctx.coordinator(), ctx.domain, 2, random.Random(0)
        )
    groups = [[ep.turns[0].bids[i] for i in idx] for ep in eps for idx in by_role.values()]
    assert all(len(set(ep.turns[0].bid_prompts[i] for i in idx)) == 1 for ep in eps for idx in by_role.values())
    identical = sum(len(set(g)) == 1 for g in groups)
    assert identical < len(groups) / 2, groups  # untrained models: bids near uniform over 5 levels
    # actions: same prompt, same model, independent draws
    by_winner_role = {}
    for ep in eps:
        w = ep.turns[0].winner
        if w is not None:
            by_winner_role.setdefault(agents[w].role, []).append(ep.turns[0].action_text)
    assert any(len(set(texts)) > 1 for texts in by_winner_role.values() if len(texts) > 1), by_winner_role


# ---------------------------------------------------------------------------- participation
def _turn(t, winner):
    return Turn(t, [], [], [], AuctionResult(winner, None))


def test_participation_by_decision_hand_counts():
    agents = [Agent("A#1", "A", None), Agent("A#2", "A", None), Agent("B", "B", None)]
    eps = [
        Episode(0, turns=[_turn(0, 0), _turn(1, 2), _turn(2, None)]),
        Episode(1, turns=[_turn(0, 1), _turn(1, 1)]),
        Episode(2, turns=[_turn(0, 2)]),
    ]
    roles = participation_by_decision(eps, agents, 4)
    assert list(roles) == ["A", "B", SKIPPED]
    assert roles["A"] == pytest.approx([2 / 3, 1 / 2, 0, 0])
    assert roles["B"] == pytest.approx([1 / 3, 1 / 2, 0, 0])
    assert roles[SKIPPED] == pytest.approx([0, 0, 1, 0])  # t=2: one running episode, skipped; t=3: none runs
    names = participation_by_decision(eps, agents, 4, by="name")
    assert names["A#1"] == pytest.approx([1 / 3, 0, 0, 0]) and names["A#2"] == pytest.approx([1 / 3, 1 / 2, 0, 0])
    with pytest.raises(ConfigError, match="role, name"):
        participation_by_decision(eps, agents, 4, by="agent")


def test_participation_on_a_played_batch(ctx, tmp_path):
    agents, _ = ctx.build_swarm(replicas=2)
    with torch.no_grad():
        eps = play(
            new_slots(ctx.domain, ctx.task, [1, 2, 3, 4, 5, 6]),
            agents,
            ctx.coordinator(),
            ctx.domain,
            MAX_T,
            random.Random(0),
            presence=dropout_presence(0.5, len(agents)),
        )
    roles = participation_by_decision(eps, agents, MAX_T)
    names = participation_by_decision(eps, agents, MAX_T, by="name")
    assert set(roles) == {"Logger", "Miner", "Smith", SKIPPED}
    assert set(names) == {a.name for a in agents} | {SKIPPED}
    for t in range(MAX_T):
        running = [ep for ep in eps if len(ep.turns) > t]
        assert sum(s[t] for s in roles.values()) == pytest.approx(1.0 if running else 0.0)
        for role in ("Logger", "Miner", "Smith"):  # replicas pooled
            assert roles[role][t] == pytest.approx(names[f"{role}#1"][t] + names[f"{role}#2"][t])
        skipped = sum(ep.turns[t].winner is None for ep in running)
        assert roles[SKIPPED][t] == pytest.approx(skipped / len(running) if running else 0.0)
    assert sum(roles[SKIPPED]) > 0  # half the agents absent: some turns have no bidder or only zero bids
    png = plot_participation(
        {"after SFT": roles, "after MPT": names}, tmp_path / "p" / "participation.png", "participation"
    )
    assert png.exists() and png.stat().st_size > 5000 and png.read_bytes()[:4] == b"\x89PNG"


def test_dropout_and_population_plots(tmp_path):
    curves = {
        "3 agents": {0.0: (10.0, 1.0), 0.3: (8.0, 1.2), 0.9: (1.0, 0.5)},
        "12 agents": {0.0: (11.0, 0.9), 0.3: (10.5, 1.0), 0.9: (6.0, 1.5)},
    }
    png = plot_dropout(curves, tmp_path / "dropout.png", "dropout")
    assert png.stat().st_size > 5000 and png.read_bytes()[:4] == b"\x89PNG"
    bars = {"3 agents": {"a": (0.2, 0.1), "b": (0.5, 0.05)}, "12 agents": {"a": (0.4, 0.1), "b": (0.7, 0.05)}}
    png = plot_population(bars, tmp_path / "population.png", "pass@3")
    assert png.stat().st_size > 5000 and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_population_memory_benchmark_smoke():
    """The benchmark runs end to end (three fresh subprocesses) and sees the weights shared."""
    from conftest import ROOT

    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "population_memory.py"),
            "--task",
            "wooden_pickaxe",
            "--episodes",
            "2",
            "--decisions",
            "3",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [ln.split() for ln in proc.stdout.splitlines() if ln.split()[:1] in (["3"], ["12"])]
    assert [(r[0], r[1], r[2]) for r in rows] == [("3", "shared", "3"), ("12", "shared", "3"), ("12", "copied", "12")]
    assert rows[0][3] == rows[1][3] and float(rows[2][3]) == pytest.approx(4 * float(rows[0][3]), rel=0.01)
    assert "peak RSS 12 agents / 3 agents:" in proc.stdout
