"""``resume=true`` with settings on the command line: a setting that would change the saved run is
refused (exit 2, naming it, nothing in the run folder touched) by ``swarm experiment`` and ``swarm run``
alike, never silently dropped; one equal to the saved value (in any spelling) and the machine
(``hardware=...``) are fine. The real CLI in a subprocess on a smoke-sized experiment and run."""

import json
from pathlib import Path

import pytest
from conftest import copy_run, swarm

#: One training (SFT + 2 updates) and one evaluated coordinator, on training seed 0.
EXP = [
    "domain=minecraft",
    "task=wooden_pickaxe",
    "task.max_decisions=12",
    "algo.sft.demo_episodes=2",
    "algo.sft.epochs=1",
    "algo.envs_per_step=2",
    "experiment.iterations=2",
    "algo.action_steps=1",
    "algo.bid_steps=1",
    "eval.episodes=2",
    "eval.runs=1",
    "progress=false",
    "tensorboard=false",
    "hardware.threads=1",
    "experiment.train_seeds=[0]",
    "experiment.coordinators=[auction]",
    "model.lora.lr_scale=1",
]


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    d = tmp_path_factory.mktemp("resume")
    res = swarm("experiment", "coordination", *EXP, f"run_dir={d / 'exp'}", cwd=d)
    assert res.returncode == 0, res.stderr[-3000:]
    return d / "exp"


def files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def resume(folder, *args, cli=swarm):
    """``swarm experiment coordination resume=true`` on ``folder``; ``cli``: ``swarm`` (a cold process) or
    the ``warm_swarm`` fixture (a child forked from a warmed interpreter)."""
    return cli("experiment", "coordination", "resume=true", f"run_dir={folder}", *args, cwd=folder.parent)


@pytest.mark.parametrize(
    "args, named",
    [
        (
            ["experiment.train_seeds=[0,1,2]", "experiment.iterations=12", "hardware=cpu"],
            ["experiment.train_seeds: saved [0], given [0,1,2]", "experiment.iterations: saved 2, given 12"],
        ),
        (["task=stone_pickaxe"], ["task: saved wooden_pickaxe, given stone_pickaxe"]),
        (["max_decisions=20"], ["max_decisions: saved 12, given 20"]),  # a bare task key
    ],
)
def test_a_resume_that_would_change_the_saved_run_exits_2_and_touches_nothing(experiment, args, named, warm_swarm):
    before = files(experiment)
    res = resume(experiment, *args, cli=warm_swarm)
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


def test_a_resume_with_the_saved_values_in_other_spellings_proceeds(experiment, warm_swarm):
    cells = {k: v for k, v in files(experiment).items() if "/cells/" in f"/{k}"}
    res = resume(
        experiment,
        "experiment.iterations=2",
        "experiment.train_seeds=[ 0 ]",
        "task.max_decisions=12",
        "domain=minecraft",
        "task=wooden_pickaxe",
        "algo.lr=0.00003",
        "experiment.coordinators=[auction]",
        cli=warm_swarm,
    )
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
    res = resume(experiment, "hardware.threads=1", "progress=false")  # the saved values, given again
    assert res.returncode == 0, res.stderr[-3000:]
    command = next(line for line in (experiment / "results.md").read_text().splitlines() if line.startswith("Command:"))
    assert command.count("hardware.threads=1") == 1 and command.count("progress=false") == 1, command


def test_without_resume_the_same_arguments_in_other_spellings_are_the_same_run(experiment, tmp_path, warm_swarm):
    """``swarm experiment NAME run_dir=D`` on a folder that holds the experiment compares the arguments
    resolved (``1`` and ``1.0`` of a float key, another order), as an identical list is: it reruns,
    skipping the finished cells; a real change, or a saved argument left off, is refused naming it."""
    import shutil

    copy = tmp_path / "exp"
    shutil.copytree(experiment, copy)
    same = [a.replace("model.lora.lr_scale=1", "model.lora.lr_scale=1.0") for a in reversed(EXP)]
    res = warm_swarm("experiment", "coordination", *same, f"run_dir={copy}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    log = (copy / "run.log").read_text().split("experiment coordination in")[-1]
    assert "cell train-mpt: done before, skipped" in log and "cell coordination-auction: done before, skipped" in log
    before = files(copy)
    changed = [
        a.replace("experiment.iterations=2", "experiment.iterations=3") for a in same if "max_decisions" not in a
    ]
    bad = warm_swarm("experiment", "coordination", *changed, f"run_dir={copy}", cwd=tmp_path)
    assert bad.returncode == 2, bad.stderr[-3000:]
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in bad.stderr, bad.stderr[-3000:]
    assert lines[0].startswith(
        f"swarm: error: {str(copy)!r} already holds this experiment run with other arguments "
        "(experiment.iterations: saved 2, given 3; task.max_decisions: saved 12, not given, so "
    )
    assert lines[0].endswith("); continue it with resume=true or pick another run_dir")
    assert "lr_scale" not in lines[0]
    assert files(copy) == before


def test_swarm_run_refuses_what_resuming_would_change_with_the_same_comparison(registry, tmp_path):
    """``swarm run resume=true`` asks the same comparison as the experiment: groups by the name they
    pick, values resolved; the machine, the display and ``algo.iterations`` apply."""
    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.config.load import resolve
    from swarm_runtime.runs.folder import refuse_resume_conflicts, resume_conflicts

    _, reg = registry
    saved = resolve(["domain=minecraft", "task=wooden_pickaxe", "task.max_decisions=16"], reg)
    same = [
        "domain=minecraft",
        "task=wooden_pickaxe",
        "max_decisions=16",
        "algo.lr=0.00003",
        "model=tiny",
        "hardware=cpu",
        "hardware.threads=3",
        "algo.iterations=9",
        "run_dir=x",
        "resume=true",
        "progress=false",
        "log_level=DEBUG",
    ]
    applied = refuse_resume_conflicts(saved, same, tmp_path / "config.yaml", also=("algo.iterations",))
    assert [k for k, _ in applied] == ["hardware", "hardware.threads", "algo.iterations", "progress", "log_level"]
    changed = ["task=stone_pickaxe", "model=small", "algo.lr=1e-4", "max_decisions=20", "task.llm_judge.api_key=sk-1"]
    with pytest.raises(ConfigError) as e:
        refuse_resume_conflicts(saved, changed, tmp_path / "config.yaml", also=("algo.iterations",))
    assert str(e.value) == (
        f"resume=true continues the run as saved in {str(tmp_path / 'config.yaml')!r}, but the command line changes "
        "task: saved wooden_pickaxe, given stone_pickaxe; model: saved tiny, given small; algo.lr: saved 3e-05, "
        "given 1e-4; max_decisions: saved 16, given 20; drop them to resume the run as saved, or give a new run_dir "
        "to start a run with them"
    )
    assert resume_conflicts(saved, ["algo.iterations=9"]) == [("algo.iterations", int(saved.algo.iterations), "9")]
    # a key given twice counts as resolving reads it, the last value: a recipe's expanded 24, then the command line's 16
    assert resume_conflicts(saved, ["task.max_decisions=24", "max_decisions=16", "run_dir=x", "resume=true"]) == []
    assert resume_conflicts(saved, ["max_decisions=16", "task.max_decisions=24"]) == [("task.max_decisions", 16, "24")]


@pytest.fixture(scope="module")
def resumable(tiny_run, tmp_path_factory):
    """A copy of the session's tiny run (conftest ``tiny_run``): these tests resume it."""
    return copy_run(tiny_run[0], tmp_path_factory.mktemp("resume-run") / "run")


def resume_run(folder, *args, cli=swarm):
    return cli("run", "resume=true", f"run_dir={folder}", *args, cwd=folder.parent)


@pytest.mark.parametrize(
    "args, named",
    [
        (["algo.lr=1e-4", "algo.iterations=3", "hardware.threads=1"], ["algo.lr: saved 3e-05, given 1e-4"]),
        (
            ["task=stone_pickaxe", "max_decisions=20"],
            ["task: saved wooden_pickaxe, given stone_pickaxe", "max_decisions: saved 16, given 20"],
        ),
    ],
)
def test_swarm_run_resume_that_would_change_the_saved_run_exits_2_and_touches_nothing(
    resumable, args, named, warm_swarm
):
    """The same refusal (and words) as ``swarm experiment ... resume=true``, where it used to warn
    and continue with the saved value."""
    before = files(resumable)
    res = resume_run(resumable, *args, cli=warm_swarm)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert f"resume=true continues the run as saved in {str(resumable / 'config.yaml')!r}" in lines[0]
    for n in named:
        assert n in lines[0]
    them = "them" if len(named) > 1 else "it"
    assert f"drop {them} to resume the run as saved, or give a new run_dir to start a run with {them}" in lines[0]
    assert "hardware" not in lines[0] and "iterations" not in lines[0]  # these apply on resume
    assert files(resumable) == before  # nothing already written is lost or rewritten (the lock file included)


def test_swarm_run_resume_with_the_saved_values_in_other_spellings_proceeds(resumable, warm_swarm):
    res = resume_run(
        resumable,
        "algo.lr=0.00003",
        "task.max_decisions=16",
        "domain=minecraft",
        "task=wooden_pickaxe",
        "algo.iterations=2",
        "hardware=cpu",
        "log_level=DEBUG",
        cli=warm_swarm,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "(resuming from iter-000002)" in (resumable / "run.log").read_text()
    assert "Held-out evaluation" in res.stdout


def test_a_saved_secret_is_not_read_back_as_the_literal_redacted_marker(tmp_path):
    """experiment.json keeps a command-line secret as ``<redacted>``; resuming must not pass that string
    on as the key: it is dropped, so the environment variable (or the value given again) applies."""
    from swarm_runtime.experiments.runner import _saved_args

    saved = {
        "experiment": "coordination",
        "args": [
            "domain=openresearcher",
            "task.llm_judge.api_key=<redacted>",
            "task.llm_judge.model=gpt-4o-mini",
            "algo.lr=1e-4",
        ],
    }
    (tmp_path / "experiment.json").write_text(json.dumps(saved))
    assert _saved_args(tmp_path / "experiment.json", "coordination") == [
        "domain=openresearcher",
        "task.llm_judge.model=gpt-4o-mini",
        "algo.lr=1e-4",
    ]


def test_swarm_run_resume_applies_a_secret_given_again(registry):
    """A secret is never saved (``<redacted>``, read back as null): given again on ``swarm run
    resume=true`` it applies, like the machine keys, and is not reported as ignored."""
    from swarm_runtime.config.load import resolve
    from swarm_runtime.runs.folder import apply_resume_overrides, refuse_resume_conflicts

    _, reg = registry
    saved = resolve(["domain=openresearcher", "task=embedded"], reg)
    given = ["task.llm_judge.api_key=sk-test-1234", "hardware.threads=1"]
    applied = refuse_resume_conflicts(saved, given, Path("config.yaml"), also=("algo.iterations",))
    assert applied == [("hardware.threads", "1"), ("task.llm_judge.api_key", "sk-test-1234")]
    apply_resume_overrides(saved, applied, None)
    assert saved.task.llm_judge.api_key == "sk-test-1234" and saved.hardware.threads == 1
