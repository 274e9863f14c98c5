"""``resume=true`` with settings on the command line: a setting that would change the saved run is
refused (``swarm experiment``) or named in a warning (``swarm run``), never silently dropped; one equal
to the saved value (in any spelling) and the machine (``hardware=...``) are fine. The real CLI in a
subprocess on a smoke-sized experiment."""
import json

import pytest
from conftest import swarm

#: One training (SFT + 2 updates) and one evaluated coordinator, on training seed 0.
EXP = ["domain=minecraft", "task=wooden_pickaxe", "task.max_decisions=12", "algo.sft.demo_episodes=2",
       "algo.sft.epochs=1", "algo.envs_per_step=2", "experiment.iterations=2", "algo.action_steps=1",
       "algo.bid_steps=1", "eval.episodes=2", "eval.runs=1", "progress=false", "tensorboard=false",
       "hardware.threads=1", "experiment.train_seeds=[0]", "experiment.coordinators=[auction]"]


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    d = tmp_path_factory.mktemp("resume")
    res = swarm("experiment", "coordination", *EXP, f"run_dir={d / 'exp'}", cwd=d)
    assert res.returncode == 0, res.stderr[-3000:]
    return d / "exp"


def files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def resume(folder, *args):
    return swarm("experiment", "coordination", "resume=true", f"run_dir={folder}", *args, cwd=folder.parent)


@pytest.mark.parametrize("args, named", [
    (["experiment.train_seeds=[0,1,2]", "experiment.iterations=12", "hardware=cpu"],
     ["experiment.train_seeds: saved [0], given [0,1,2]", "experiment.iterations: saved 2, given 12"]),
    (["task=stone_pickaxe"], ["task: saved wooden_pickaxe, given stone_pickaxe"]),
    (["max_decisions=20"], ["max_decisions: saved 12, given 20"]),  # a bare task key
])
def test_a_resume_that_would_change_the_saved_run_exits_2_and_touches_nothing(experiment, args, named):
    before = files(experiment)
    res = resume(experiment, *args)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert str(experiment / "experiment.json") in lines[0]
    for n in named:
        assert n in lines[0]
    them = "them" if len(named) > 1 else "it"
    assert f"drop {them} to resume the run as saved, or give a new run_dir to start a run with {them}" in lines[0]
    assert "hardware" not in lines[0]  # the machine may change
    assert files(experiment) == before  # nothing already written is lost or rewritten


def test_a_resume_with_the_saved_values_in_other_spellings_proceeds(experiment):
    cells = {k: v for k, v in files(experiment).items() if "/cells/" in f"/{k}"}
    res = resume(experiment, "experiment.iterations=2", "experiment.train_seeds=[ 0 ]", "task.max_decisions=12",
                 "domain=minecraft", "task=wooden_pickaxe", "algo.lr=0.00003", "experiment.coordinators=[auction]")
    assert res.returncode == 0, res.stderr[-3000:]
    log = (experiment / "run.log").read_text().split("(resuming)")[-1]
    assert "cell train-mpt: done before, skipped" in log and "cell coordination-auction: done before, skipped" in log
    assert {k: v for k, v in files(experiment).items() if k in cells} == cells
    assert json.loads((experiment / "results.json").read_text())["train_seeds"] == [0]


def test_a_resume_on_another_machine_proceeds(experiment):
    """The machine and what the run only shows (progress bars, log level) may change on resume."""
    res = resume(experiment, "hardware=cpu", "hardware.threads=2", "progress=true", "log_level=DEBUG")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "(resuming)" in (experiment / "run.log").read_text()
    assert json.loads((experiment / "experiment.json").read_text())["args"] == EXP  # saved as started


def test_swarm_run_names_what_resuming_ignores_with_the_same_comparison(registry):
    """``swarm run resume=true`` warns (its config.yaml wins) through the same comparison: groups by the
    name they pick, values resolved; the machine and ``algo.iterations`` apply."""
    from swarm_runtime.config import resolve
    from swarm_runtime.run import ignored_on_resume, resume_conflicts

    _, reg = registry
    saved = resolve(["domain=minecraft", "task=wooden_pickaxe", "task.max_decisions=16"], reg)
    same = ["domain=minecraft", "task=wooden_pickaxe", "max_decisions=16", "algo.lr=0.00003", "model=tiny",
            "hardware=cpu", "hardware.threads=3", "algo.iterations=9", "run_dir=x", "resume=true", "progress=false",
            "log_level=DEBUG"]
    assert ignored_on_resume(saved, same) == []
    changed = ["task=stone_pickaxe", "model=small", "algo.lr=1e-4", "max_decisions=20", "task.llm_judge.api_key=sk-1"]
    assert ignored_on_resume(saved, changed) == ["task=stone_pickaxe (the run has wooden_pickaxe)",
                                                 "model=small (the run has tiny)", "algo.lr=1e-4 (the run has 3e-05)",
                                                 "max_decisions=20 (the run has 16)"]
    assert resume_conflicts(saved, ["algo.iterations=9"]) == [("algo.iterations", int(saved.algo.iterations), "9")]


def test_a_saved_secret_is_not_read_back_as_the_literal_redacted_marker(tmp_path):
    """experiment.json keeps a command-line secret as ``<redacted>``; resuming must not pass that string
    on as the key: it is dropped, so the environment variable (or the value given again) applies."""
    from swarm_runtime.experiments.runner import _saved_args

    saved = {"experiment": "coordination", "args": ["domain=openresearcher", "task.llm_judge.api_key=<redacted>",
                                                     "task.llm_judge.model=gpt-4o-mini", "algo.lr=1e-4"]}
    (tmp_path / "experiment.json").write_text(json.dumps(saved))
    assert _saved_args(tmp_path / "experiment.json", "coordination") == [
        "domain=openresearcher", "task.llm_judge.model=gpt-4o-mini", "algo.lr=1e-4"]


def test_swarm_run_resume_applies_a_secret_given_again(registry):
    """A secret is never saved (``<redacted>``, read back as null): given again on ``swarm run
    resume=true`` it applies, like the machine keys, and is not reported as ignored."""
    from swarm_runtime.config import resolve
    from swarm_runtime.run import _apply_resume_overrides, ignored_on_resume

    _, reg = registry
    saved = resolve(["domain=openresearcher", "task=embedded"], reg)
    given = ["task.llm_judge.api_key=sk-test-1234", "hardware.threads=1"]
    assert ignored_on_resume(saved, given) == []
    _apply_resume_overrides(saved, given, None)
    assert saved.task.llm_judge.api_key == "sk-test-1234" and saved.hardware.threads == 1
