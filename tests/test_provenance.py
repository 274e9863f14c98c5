"""Library versions and the code's commit in results files (issue 18): what :mod:`swarm_runtime.provenance`
records, that it never fails outside a checkout, and that it does not take another repository's commit."""
from __future__ import annotations

import json
import platform
import shutil
import subprocess
from importlib import metadata

import pytest

from swarm_runtime import __version__
from swarm_runtime.provenance import NOT_INSTALLED, code_commit, stamp, versions, versions_line


def test_versions_name_python_the_libraries_the_package_and_its_commit():
    v = versions()
    assert list(v) == ["python", "torch", "transformers", "peft", "swarm-runtime", "commit"]
    assert v["python"] == platform.python_version() and v["swarm-runtime"] == __version__
    assert v["torch"] == metadata.version("torch") and v["transformers"] == metadata.version("transformers")
    line = versions_line(v)
    assert line.startswith(f"versions: python {v['python']}, torch {v['torch']}, transformers {v['transformers']}, ")
    assert "\n" not in line and len(line) < 160
    no_git = {**v, "peft": NOT_INSTALLED, "commit": None}
    assert versions_line(no_git).endswith(f"peft not installed, swarm-runtime {__version__}")


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
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=pkg, capture_output=True, text=True).stdout.strip()
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
