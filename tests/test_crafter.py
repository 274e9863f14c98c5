"""The crafter domain (swarm_domains/crafter/): Crafter's own worlds through the public plugin hooks.

Without the ``crafter`` extra only the first tests run (the one-line errors, the score); the rest skip. Cost with the
extra (2 cores, shared): the executor and snapshot tests a few seconds, the conformance kit on ``iron_pickaxe`` and
one tiny ``swarm run`` + ``swarm eval`` in subprocesses most of the rest.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import swarm

from swarm_domains.crafter import compat
from swarm_domains.crafter.plugin import CrafterDomain
from swarm_domains.crafter.score import crafter_score, score_with_se, success_rates

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- without Crafter
@pytest.mark.parametrize(
    "version, says",
    [(None, "Crafter 1.8.3, which is not installed"), ("1.9.0", "runs on Crafter 1.8.3, found Crafter 1.9.0")],
)
def test_missing_or_other_crafter_is_one_line(monkeypatch, version, says):
    from swarm_domains.crafter.tables import load_tables

    load_tables.cache_clear()
    monkeypatch.setattr(compat, "installed_version", lambda: version)
    domain = CrafterDomain()
    with pytest.raises(ImportError) as err:
        domain.make_env(domain.task_config("iron_pickaxe"))
    msg = str(err.value)
    assert says in msg and "pip install 'swarm-runtime[crafter]'" in msg and "\n" not in msg
    load_tables.cache_clear()


def test_swarm_run_without_crafter_exits_2_with_one_line(tmp_path):
    """The real CLI in a subprocess, Crafter reported missing: exit 2, one line naming the extra, nothing written
    (~3 s: the CLI's imports)."""
    hide = (
        "import sys; import swarm_domains.crafter.compat as c; c.installed_version = lambda: None; "
        "from swarm_runtime.cli.main import main; sys.exit(main(sys.argv[1:]))"
    )
    env = {**os.environ, **_cli_env(tmp_path)}
    run = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "-c", hide, "run", "domain=crafter", "task=iron_pickaxe", f"run_dir={run}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert lines == [
        "swarm: error: crafter task iron_pickaxe: the crafter domain needs Crafter 1.8.3, which is not installed: "
        "pip install 'swarm-runtime[crafter]'"
    ]
    assert not run.exists()


def test_bad_task_value_names_it():
    domain = CrafterDomain()
    task = domain.task_config("iron_pickaxe")
    task.reward = "dense"
    with pytest.raises(ValueError, match="reward 'dense' is unknown; valid: crafter, milestones"):
        domain.make_env(task)


def test_crafter_score_by_value():
    assert crafter_score([0.0] * 22) == 0.0
    assert crafter_score([100.0] * 22) == pytest.approx(100.0)
    assert crafter_score([1.0, 0.0]) == pytest.approx(math.sqrt(2) - 1)  # exp((log 2 + log 1) / 2) - 1
    assert crafter_score([50.0, 10.0, 0.0]) == pytest.approx((51 * 11) ** (1 / 3) - 1)
    rates = success_rates([{"a": 1, "b": 0}, {"a": 1, "b": 1}, {"a": 0, "b": 0}, {"a": 1, "b": 0}], ["a", "b"])
    assert rates == {"a": 75.0, "b": 25.0}
    score, se = score_with_se({1: [{"a": 1, "b": 0}], 2: [{"a": 1, "b": 1}]}, ["a", "b"])
    assert score == pytest.approx(crafter_score([100.0, 50.0]))
    # leave-one-out: seed 1 alone gives crafter_score([100, 0]), seed 2 alone crafter_score([100, 100])
    loo = [crafter_score([100.0, 0.0]), 100.0]
    assert se == pytest.approx(math.sqrt(0.5 * sum((x - sum(loo) / 2) ** 2 for x in loo)))


# ---------------------------------------------------------------- with Crafter
@pytest.fixture(scope="module")
def domain():
    pytest.importorskip("crafter")
    return CrafterDomain()


def env_at(domain, seed: int = 0, task: str = "iron_pickaxe"):
    env = domain.make_env(domain.task_config(task))
    env.reset(seed)
    return env


def test_executor_collects_makes_and_steps_primitives(domain):
    env = env_at(domain)
    r = env.step("collect tree", "Gatherer")
    assert r.valid and env.player.inventory["wood"] == 1 and "have wood 1" in r.observation
    assert "collect_wood" in env.unlocked and r.reward == 1.0  # a milestone of iron_pickaxe
    assert 1 <= env.steps <= env.spec.frames and "last ok" in r.observation
    steps = env.steps
    r = env.step("make iron_pickaxe", "Smith")  # nothing to make it from: fails at once, no env step
    assert r.valid and "last failed" in r.observation and env.steps == steps and r.reward == 0.0
    r = env.step("noop", "Miner")  # a primitive action: exactly one env step
    assert r.valid and env.steps == steps + 1


def test_expert_plays_through_the_executor(domain):
    env = env_at(domain, seed=100000)  # a held-out world where the expert makes the iron pickaxe
    for _ in range(int(domain.task_config("iron_pickaxe").max_decisions)):
        e = env.expert_action()
        r = env.step(e.action, e.role)
        if r.done:
            break
    m = env.metrics()
    assert m["success"] == 1.0 and m["ach_make_iron_pickaxe"] == 1.0 and m["achievements"] >= 9


def test_unparsable_instruction_is_counted_logged_and_wastes_the_turn(domain):
    from loguru import logger

    env = env_at(domain)
    before, steps = env.observation(), env.steps
    lines: list[str] = []
    sink = logger.add(lines.append, level="INFO", format="{message}")
    try:
        r = env.step("dance under the moon", "Gatherer")
    finally:
        logger.remove(sink)
    assert not r.valid and r.reward == 0.0 and not r.done and r.observation == before and env.steps == steps
    assert env.unparsed == 1 and env.metrics()["unparsed"] == 1.0
    assert any("unparsable instruction 'dance under the moon' by Gatherer" in line for line in lines)
    assert not env.step(None, "Miner").valid and env.unparsed == 2  # not even text: still no crash


def test_snapshot_from_another_crafter_version_is_refused(domain):
    env = env_at(domain)
    snap = env.snapshot()
    env.step("collect tree", "Gatherer")
    env.restore(snap)  # the same version: restored exactly
    assert env.player.inventory["wood"] == 0
    with pytest.raises(ValueError, match=r"snapshot from Crafter '1\.8\.2' refused: this env runs Crafter 1\.8\.3"):
        env.restore({**snap, "crafter": "1.8.2"})


def test_eval_figures_and_report(domain):
    names = domain.make_env(domain.task_config("iron_pickaxe")).t.achievements
    eps = [
        SimpleNamespace(
            seed=s, metrics={"crafter_return": float(s), **{f"ach_{a}": float(a == "collect_wood") for a in names}}
        )
        for s in (1, 2)
    ]
    fig = domain.eval_figures(eps)
    rates = [100.0 if a == "collect_wood" else 0.0 for a in names]
    assert fig["crafter_score"][0] == pytest.approx(crafter_score(rates))
    assert fig["crafter_return"] == pytest.approx((1.5, 0.5))
    report = domain.eval_report({**{f"ach_{a}_mean": 0.0 for a in names}, "ach_collect_wood_mean": 0.5})
    assert "| collect_wood | 50.0 |" in report and len(report.splitlines()) == 2 + 22


def test_conformance_kit(domain):
    """The whole kit on iron_pickaxe, its episodes cut to 10 instructions (the kit replays every step of several
    trajectories: the full 55 cost minutes; the kit on both full tasks passed when the domain was written)."""
    from swarm_runtime import check_domain

    task = domain.task_config("iron_pickaxe")
    task.instructions, task.max_decisions = 10, 12
    check_domain(domain, task)


def _cli_env(tmp_path: Path) -> dict:
    """The CLI's environment: this checkout first; the crafter entry point from a stand-in distribution when the
    installed swarm-runtime predates it (an editable install made before the entry point was added)."""
    path = [str(ROOT)]
    if not any(ep.name == "crafter" for ep in entry_points(group="swarm_runtime")):
        info = tmp_path / "site" / "crafter_entry-0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: crafter-entry\nVersion: 0\n")
        (info / "entry_points.txt").write_text("[swarm_runtime]\ncrafter = swarm_domains.crafter.plugin\n")
        path.append(str(info.parent))
    return {"PYTHONPATH": os.pathsep.join(path), "XDG_CACHE_HOME": str(tmp_path / "cache")}


def test_swarm_run_and_eval_print_the_crafter_table(domain, tmp_path):
    env = _cli_env(tmp_path)
    run = tmp_path / "run"
    args = [
        "run",
        "domain=crafter",
        "task=iron_pickaxe",
        "algo.envs_per_step=2",
        "algo.iterations=1",
        "algo.sft.demo_episodes=2",
        "eval.episodes=2",
        "eval.runs=1",
        "progress=false",
        "hardware.threads=1",
        "task.instructions=6",
        f"run_dir={run}",
    ]
    p = swarm(*args, cwd=tmp_path, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "crafter_score" in p.stdout and "crafter_return" in p.stdout
    assert "| achievement | success rate (%) |" in p.stdout and "| make_iron_pickaxe |" in p.stdout
    assert "| achievement | success rate (%) |" in (run / "eval.md").read_text()
    p = swarm("eval", str(run), cwd=tmp_path, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "crafter_score" in p.stdout and "| collect_wood |" in p.stdout
