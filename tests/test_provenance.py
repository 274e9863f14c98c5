"""Library versions and the code's commit in results files: what :mod:`swarm_runtime.runs.provenance`
records, that it never fails outside a checkout, and that it does not take another repository's commit."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

from swarm_runtime import __version__
from swarm_runtime.runs.provenance import NOT_INSTALLED, code_commit, stamp, versions, versions_line


def test_versions_name_python_the_libraries_the_package_and_its_commit():
    v = versions()
    assert list(v) == ["python", "torch", "transformers", "peft", "swarm-runtime", "commit"]
    assert v["python"] == platform.python_version() and v["swarm-runtime"] == __version__
    assert v["torch"] == metadata.version("torch") and v["transformers"] == metadata.version("transformers")
    line = versions_line(v)
    assert line.startswith(f"versions: python {v['python']}, torch {v['torch']}, transformers {v['transformers']}, ")
    assert "\n" not in line and len(line) < 160
    no_git = {**v, "peft": NOT_INSTALLED, "commit": None}
    assert versions_line(no_git).endswith(f"peft not installed, swarm-runtime {__version__} (not a git checkout)")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_commit_of_a_checkout_only_its_own_and_marked_dirty(tmp_path):
    def git(*args, cwd=tmp_path / "repo"):
        subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)

    pkg = tmp_path / "repo" / "swarm_runtime"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text("a = 1\n")
    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "x", "--allow-empty")
    git("add", "-A")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "y")
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=pkg, capture_output=True, text=True
    ).stdout.strip()
    assert code_commit(pkg) == head
    (pkg / "x.py").write_text("a = 2\n")
    assert code_commit(pkg) == head + "+dirty"
    nested = tmp_path / "repo" / "vendor" / "swarm_runtime"  # installed inside someone else's repository
    nested.mkdir(parents=True)
    assert code_commit(nested) is None
    outside = tmp_path / "site-packages" / "swarm_runtime"  # an installed wheel: no checkout at all
    outside.mkdir(parents=True)
    assert code_commit(outside) is None


def test_stamp_adds_versions_once_and_skips_a_missing_file(tmp_path):
    f = tmp_path / "eval.json"
    assert stamp(f) is False and not f.exists()
    f.write_text(json.dumps({"results": {"MPT": {"reward_mean": 1.5}}}))
    assert stamp(f) is True
    data = json.loads(f.read_text())
    assert data == {"results": {"MPT": {"reward_mean": 1.5}}, "versions": versions()}
    f.write_text(json.dumps({"versions": {"torch": "older"}}))
    stamp(f)  # a file that already says what produced it keeps it
    assert json.loads(f.read_text()) == {"versions": {"torch": "older"}}


def test_a_copy_without_git_says_so_and_takes_the_commit_from_swarm_commit(tmp_path):
    """A ``git archive`` export or an sdist (no .git): the versions say ``not a git checkout`` beside the
    package's version (never ``unknown``), and ``SWARM_COMMIT`` names the commit; the fields stay."""
    import os
    import sys

    import swarm_runtime

    copy = tmp_path / "export"
    shutil.copytree(
        Path(swarm_runtime.__file__).parent, copy / "swarm_runtime", ignore=shutil.ignore_patterns("__pycache__")
    )
    show = (
        "import json; from swarm_runtime.runs import provenance; from swarm_runtime.runs.provenance import versions, "
        "versions_line; print(json.dumps(versions())); print(versions_line()); print(provenance.__file__)"
    )
    env = {k: v for k, v in os.environ.items() if k != "SWARM_COMMIT"}
    for given in (None, "abc1234"):
        res = subprocess.run(
            [sys.executable, "-c", show],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={**env, "PYTHONPATH": str(copy), **({"SWARM_COMMIT": given} if given else {})},
        )
        assert res.returncode == 0, res.stderr
        v, line, ran = json.loads(res.stdout.splitlines()[0]), *res.stdout.splitlines()[1:3]
        assert Path(ran).is_relative_to(copy)  # the copy ran, not the installed package
        assert list(v) == ["python", "torch", "transformers", "peft", "swarm-runtime", "commit"]
        assert v["commit"] == given and v["swarm-runtime"] == __version__
        assert line.endswith(
            f"swarm-runtime {__version__} (commit abc1234)"
            if given
            else f"swarm-runtime {__version__} (not a git checkout)"
        ), line
        assert "unknown" not in line


@pytest.fixture
def fresh_versions():
    versions.cache_clear()
    yield
    versions.cache_clear()


def test_experiment_results_name_no_checkout_instead_of_unknown_and_git_wins_over_the_variable(
    monkeypatch, fresh_versions
):
    from swarm_runtime.experiments import runner
    from swarm_runtime.runs import provenance

    monkeypatch.delenv("SWARM_COMMIT", raising=False)
    monkeypatch.setattr(provenance, "code_commit", lambda where=None: None)  # git fails or finds no checkout
    assert versions()["commit"] is None and runner._commit() == "not a git checkout"
    assert provenance.commit_text() == "not a git checkout"
    versions.cache_clear()
    monkeypatch.setenv("SWARM_COMMIT", " 853edf0 ")
    assert runner._commit() == "853edf0" and provenance.commit_text() == "commit 853edf0"
    versions.cache_clear()
    monkeypatch.setattr(provenance, "code_commit", lambda where=None: "d2e87f1")  # a checkout: git is the truth
    assert versions()["commit"] == "d2e87f1"


def test_a_run_carries_the_commit_it_started_from_not_the_one_at_its_end(
    monkeypatch, fresh_versions, tmp_path, registry
):
    """``prepare_run`` pins the versions when a run starts; a checkout that moves on while it trains
    (a commit made during a long run) does not relabel its results."""
    from swarm_runtime.config.load import resolve
    from swarm_runtime.experiments import runner
    from swarm_runtime.runs import provenance
    from swarm_runtime.runs.folder import prepare_run

    pm, reg = registry
    monkeypatch.setattr(provenance, "code_commit", lambda where=None: "start01")
    cfg = resolve(["domain=minecraft", "task=wooden_pickaxe", f"run_dir={tmp_path / 'run'}", "progress=false"], reg)
    ctx = prepare_run(cfg, pm, reg)
    ctx.lock.release()
    monkeypatch.setattr(provenance, "code_commit", lambda where=None: "later02")  # the checkout moved on
    (tmp_path / "eval.json").write_text("{}")
    stamp(tmp_path / "eval.json")
    assert json.loads((tmp_path / "eval.json").read_text())["versions"]["commit"] == "start01"
    versions.cache_clear()  # an experiment pins them first thing
    with pytest.raises(Exception, match="unknown experiment"):
        runner.run_experiment("no_such_experiment", [], pm, reg)
    monkeypatch.setattr(provenance, "code_commit", lambda where=None: "later03")
    assert versions()["commit"] == "later02"


@pytest.mark.parametrize("value", ["main", "v0.1.0", "abc12", "853edf0 extra", "g853edf0"])
def test_swarm_commit_that_is_no_commit_hash_is_a_config_error_naming_it(monkeypatch, fresh_versions, value):
    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.runs import provenance

    monkeypatch.setattr(provenance, "code_commit", lambda where=None: None)
    monkeypatch.setenv("SWARM_COMMIT", value)
    with pytest.raises(ConfigError, match=r"SWARM_COMMIT='.*' is not a commit: .*7 to 40 hex digits"):
        provenance.pin()
    monkeypatch.setenv("SWARM_COMMIT", "853EDF0+dirty")
    versions.cache_clear()
    assert provenance.pin()["commit"] == "853edf0+dirty"


def test_run_eval_compares_everything_but_the_commit(tmp_path):
    """tests/conftest.py ``run_eval``: two runs of the same code with a commit made between them (the tests' own
    checks of Ray runs against their in-process twins) read equal; any other version, or a result, still differs."""
    from tests.conftest import run_eval

    def written(name: str, commit: str, torch: str = "2.13.0", reward: float = 1.0) -> Path:
        d = tmp_path / name
        d.mkdir()
        out = {"reward": reward, "versions": {"torch": torch, "commit": commit}, "provenance": {"run": name}}
        (d / "eval.json").write_text(json.dumps(out))
        return d

    a, b = written("a", "1111111"), written("b", "2222222+dirty")
    assert run_eval(a) == run_eval(b) == {"reward": 1.0, "versions": {"torch": "2.13.0"}}
    assert run_eval(a) != run_eval(written("c", "1111111", torch="2.12.0"))
    assert run_eval(a) != run_eval(written("d", "1111111", reward=0.5))
