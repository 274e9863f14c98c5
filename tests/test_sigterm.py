"""SIGTERM to a ``swarm run`` (a scheduler's preemption: SLURM, Kubernetes), in process and on a local Ray the run
started: one line saying the run was stopped and the command that resumes it, exit code 143, no traceback and no
native stack (Ray's failure signal handler printed ``*** SIGTERM received ***`` and a backtrace and the process
ended with SIGABRT), the run folder's lock released, and the resume equal to the uninterrupted run."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import TINY_RUN, run_eval, run_rows, swarm

RAY_ARGS = ["cluster.kind=ray", "cluster.env_workers=2", "cluster.num_cpus=2"]


def _stop_after_first_update(run, args: list[str], cwd) -> subprocess.CompletedProcess:
    """``swarm run ARGS`` in a subprocess, SIGTERM as soon as its ``iter-000001`` checkpoint is written; its result."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)  # the run starts its own local Ray (the case seen: that Ray gone with the run)
    cmd = [sys.executable, "-m", "swarm_runtime.cli.main", "run", *args, f"run_dir={run}"]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    target = run / "checkpoints" / "iter-000001" / "state.json"
    deadline = time.time() + 300
    while time.time() < deadline and not target.exists() and proc.poll() is None:
        time.sleep(0.05)
    try:
        assert target.exists() and proc.poll() is None, "the run ended before its first update's checkpoint"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _check_stopped_and_resume(res, run, tmp_path, twin):
    assert res.returncode == 143, (res.returncode, res.stderr[-3000:])
    assert res.stderr.strip().splitlines()[-1] == (
        f"swarm: stopped by SIGTERM; continue with: swarm run resume=true run_dir={run}"
    )
    for native in ("SIGTERM received", "Traceback", "*** ", "@     0x"):
        assert native not in res.stderr, res.stderr[-3000:]
    assert not (run / "eval.json").exists()  # stopped mid-run, not after it
    with open(run / ".lock", "a+") if (run / ".lock").exists() else open(os.devnull) as f:  # lock released
        import fcntl

        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    r = swarm("run", f"run_dir={run}", "resume=true", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed at phase rl iteration" in (run / "run.log").read_text()
    assert run_rows(run) == run_rows(twin)
    assert run_eval(run) == run_eval(twin)


def test_sigterm_stops_an_in_process_run_in_one_line_and_it_resumes(tiny_run, tmp_path):
    run = tmp_path / "run"
    res = _stop_after_first_update(run, [*TINY_RUN, "checkpoint_every=1"], tmp_path)
    _check_stopped_and_resume(res, run, tmp_path, tiny_run[0])


@pytest.mark.ray
def test_sigterm_stops_a_ray_run_without_a_native_stack_and_it_resumes(tiny_run, tmp_path):
    """The run's own local Ray (no cluster.address): its end is the run's, by the run's ``finally`` blocks."""
    pytest.importorskip("ray")
    run = tmp_path / "run"
    res = _stop_after_first_update(run, [*TINY_RUN, "checkpoint_every=1", *RAY_ARGS], tmp_path)
    _check_stopped_and_resume(res, run, tmp_path, tiny_run[0])
