"""The diagnostic benchmarks: their estimators on data whose answer is known, and each script end
to end on a tiny run's checkpoint."""

import importlib.util
import random
import subprocess
import sys

import pytest
from conftest import ROOT, copy_run


def _load(name: str):
    """A benchmark script as a module (its directory on the path, as when it is run)."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_action_signal_separates_the_actions_worth_from_continuation_noise():
    """Scores = Q(s, a) + noise with Var_a Q = 0.25 (Q = ±0.5, a fair coin) and noise variance 1."""
    signal_and_noise = _load("action_signal").signal_and_noise
    rng = random.Random(0)
    rows = []
    for _ in range(4000):
        q = [rng.choice((-0.5, 0.5)) for _ in range(2)]
        rows.append([[q[side] + rng.gauss(0, 1) for _ in range(2)] for side in range(2)])
    sig, se, noise = signal_and_noise(rows)
    assert sig == pytest.approx(0.25, abs=4 * se) and se < 0.05
    assert noise == pytest.approx(1.0, rel=0.05)
    # actions that do not matter: no signal beyond its standard error
    flat = [[[rng.gauss(0, 1) for _ in range(2)] for _ in range(2)] for _ in range(4000)]
    sig0, se0, _ = signal_and_noise(flat)
    assert abs(sig0) < 4 * se0


def test_credit_baselines_remove_what_the_state_predicts_and_nothing_else():
    mod = _load("credit_baselines")
    rng = random.Random(1)
    # credit = a per-seed level + noise: the leave-one-out group mean removes the level
    rows = []
    for seed in range(40):
        level = rng.gauss(0, 1)
        rows += [(seed * 4 + g, seed, 0, "obs", level + rng.gauss(0, 0.3)) for g in range(4)]
    plain = [r[4] for r in rows]
    group = mod.group_residuals(rows)
    assert _var(group) < 0.3 * _var(plain)
    # credit set by a word of the prompt: the cross-fitted text baseline removes it
    rows = [
        (i, i, 0, f"you see a {w} ahead", (1.0 if w == "door" else -1.0) + rng.gauss(0, 0.3))
        for i, w in enumerate(rng.choice(("door", "wall")) for _ in range(200))
    ]
    assert _var(mod.text_residuals(rows, 1.0)) < 0.3 * _var([r[4] for r in rows])
    # pure noise: neither baseline helps (they can only add variance)
    rows = [(i, i // 4, 0, f"you see item {rng.randrange(50)}", rng.gauss(0, 1)) for i in range(200)]
    assert _var(mod.group_residuals(rows)) >= 0.9 * _var([r[4] for r in rows])
    assert _var(mod.text_residuals(rows, 1.0)) >= 0.9 * _var([r[4] for r in rows])


def _var(xs):
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)


@pytest.fixture(scope="module")
def tiny_checkpoint(tiny_run, tmp_path_factory):
    """A copy of the SFT checkpoint of the session's tiny run (conftest ``tiny_run``)."""
    return copy_run(tiny_run[0] / "checkpoints" / "sft", tmp_path_factory.mktemp("bench") / "sft")


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, args, header",
    [
        ("action_signal.py", ["--iterations", "1", "--envs", "4"], "| role | turns | signal"),
        ("credit_baselines.py", ["--seeds", "3", "--group-size", "2"], "| agent | turns | var(c - mean)"),
    ],
)
def test_diagnostic_benchmarks_run_on_a_checkpoint(tiny_checkpoint, script, args, header):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / script),
            str(tiny_checkpoint),
            *args,
            "domain=minecraft",
            "task=wooden_pickaxe",
            "task.max_decisions=16",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert header in proc.stdout
    assert any(
        line.startswith("| Logger") or line.startswith("| Miner") or line.startswith("| Smith")
        for line in proc.stdout.splitlines()
    ), proc.stdout
