"""The warm CLI (tests/forkcli.py ``WarmCLI``, the ``warm_swarm`` fixture) answers as the cold ``swarm``
does: the same exit code, stdout and stderr for a listing, a bad value and a usage error, a command's
cwd honoured, and a command past its timeout killed (``TimeoutExpired``)."""

import subprocess

import pytest
from conftest import TINY_RUN, swarm


def test_warm_and_cold_answer_alike(tmp_path, warm_swarm):
    for args in (["domains"], ["run", "algo.lr=-1", f"run_dir={tmp_path / 'never'}"], ["nosuchcommand"]):
        cold, warm = swarm(*args, cwd=tmp_path), warm_swarm(*args, cwd=tmp_path)
        assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr), args
    assert cold.returncode == 2 and "invalid choice" in cold.stderr
    assert not (tmp_path / "never").exists()


def test_a_warm_command_runs_in_its_cwd_and_is_killed_at_its_timeout(tmp_path, warm_swarm):
    (tmp_path / "r.yaml").write_text("domain: [minecraft\n")
    res = warm_swarm("run", "recipe=r.yaml", cwd=tmp_path)  # a relative path: read from the cwd
    assert res.returncode == 2 and "not YAML" in res.stderr, res.stderr
    # env: test_prompt_overflow's run under SWARM_PROMPT_OVERFLOW=warn passes only if the child sees it
    with pytest.raises(subprocess.TimeoutExpired):
        warm_swarm("run", *TINY_RUN, f"run_dir={tmp_path / 'slow'}", cwd=tmp_path, timeout=0.5)
    again = warm_swarm("domains", cwd=tmp_path)  # the server goes on after a killed child
    assert again.returncode == 0 and "minecraft" in again.stdout
