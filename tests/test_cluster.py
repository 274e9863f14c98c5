"""Env workers (``cluster.kind=ray``, swarm_runtime/cluster/): the worker's env pool, then on a local Ray bound to
127.0.0.1: a real ``swarm run`` writes the same metrics.jsonl and eval.json as in process, also when env workers
are killed with kill -9 in the middle of an update's rollout; bad input is one line and exit 2."""

import textwrap

import pytest

from tests.conftest import TINY_RUN, in_process_twin, patched_swarm, run_eval, run_rows, swarm

RAY_ARGS = ["cluster.kind=ray", "cluster.env_workers=2", "cluster.num_cpus=2"]


def _task():
    from omegaconf import OmegaConf

    from swarm_runtime.config.load import resolve
    from swarm_runtime.plugins.manager import get_registry

    cfg = resolve(["domain=minecraft", "task=wooden_pickaxe"], get_registry()[1])
    return OmegaConf.to_container(cfg.task, resolve=True)


def test_env_worker_reuses_released_envs_and_closes_every_env_once(monkeypatch):
    from swarm_runtime.cluster.env_worker import LOST, EnvWorker

    w = EnvWorker("minecraft", _task())
    for eid in (1, 2):
        assert w.open(eid) == (True, None)
    closed = []
    monkeypatch.setattr(type(w.envs[1]), "close", lambda self: closed.append(id(self)), raising=False)
    ok, obs = w.reset(1, 7)
    assert ok and isinstance(obs, str) and w.observation(1) == (True, obs)
    assert w.step(1, "chop tree", "Logger")[0]
    snap = w.snapshot(1)[1]
    first = id(w.envs[1])
    w.release(1)
    assert w.reset(1, 7) == LOST and w.step(1, "chop tree", "Logger") == LOST  # a released (or lost) id
    assert w.open(3) == (True, None) and id(w.envs[3]) == first and w.made == 2  # the free env is reused
    assert w.restore(3, snap) == (True, w.envs[3].observation())
    assert w.reset(3, 7) == (True, obs)  # a reused env starts its episode afresh
    w.release(3)
    envs = {id(w.envs[2]), first}
    stats = w.shutdown()
    assert stats["made"] == 2 and stats["in_use"] == 1 and stats["free"] == 1
    assert sorted(closed) == sorted(envs) and w.envs == {} and w.free == []  # each env closed once


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    return in_process_twin(tmp_path_factory, *TINY_RUN)


@pytest.mark.ray
@pytest.mark.slow
def test_ray_env_workers_write_the_same_metrics_and_eval(in_process, tmp_path, monkeypatch):
    # the run's own local Ray keeps to loopback without the tests' setting (tests/conftest.py): swarm sets it
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    r = swarm("run", *TINY_RUN, *RAY_ARGS, f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "env workers on Ray: 2" in r.stderr
    nodes = next(line for line in r.stderr.splitlines() if "env workers on nodes:" in line)
    assert nodes.count(" at 127.0.0.1 (") == 2, nodes  # both workers on a node that advertises loopback
    assert run_rows(tmp_path / "run") == run_rows(in_process) and len(run_rows(in_process)) >= 3
    assert run_eval(tmp_path / "run") == run_eval(in_process)
    closed = next(line for line in r.stderr.splitlines() if "env workers closed" in line)
    assert "'in_use': 0" in closed and "'restarts': 0" in closed  # every env given back, none lost


KILLER = textwrap.dedent("""
    import os, signal, sys
    from swarm_runtime.cluster import env_cluster as remote
    from swarm_runtime.learn import mpt

    sent = {"n": 0, "kills": 0}
    rl_step, held_out, prefetch = mpt.MPTTrainer.rl_step, mpt.MPTTrainer.held_out, remote.RemoteEnv.prefetch_step

    def counting_rl_step(self, it):
        sent["n"] = 0
        return rl_step(self, it)

    def counting_held_out(self, label):
        sent["n"] = 0
        return held_out(self, label)

    def killing_prefetch(self, action, role=None):
        prefetch(self, action, role)
        sent["n"] += 1
        if sent["n"] == 3:  # the update's rollout is under way: its third step was just sent to this worker
            os.kill(self.cluster.pids[self.w], signal.SIGKILL)
            sent["kills"] += 1
            print(f"KILLED worker {self.w} pid {self.cluster.pids[self.w]}", file=sys.stderr, flush=True)

    mpt.MPTTrainer.rl_step, mpt.MPTTrainer.held_out = counting_rl_step, counting_held_out
    remote.RemoteEnv.prefetch_step = killing_prefetch
    from swarm_runtime.cli.main import main
    rc = main(sys.argv[1:])
    print(f"KILLS {sent['kills']}", file=sys.stderr, flush=True)
    sys.exit(rc)
""")


@pytest.mark.ray
@pytest.mark.slow
def test_a_worker_killed_mid_update_is_restarted_and_its_episodes_replayed(in_process, ray_head, tmp_path):
    """kill -9 of an env worker during each update's rollout and each held-out evaluation (after SFT, after MPT):
    Ray restarts the actor, the interrupted episodes are replayed on it from their seeds and actions, and the
    run's metrics and eval equal the unkilled run's."""
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    run = (*TINY_RUN, *RAY_ARGS, *ray_head.args, f"run_dir={tmp_path / 'run'}")
    r = patched_swarm(script, "run", *run, cwd=tmp_path, env=ray_head.env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "KILLS 4" in r.stderr  # in the evaluation after SFT, in both updates, in the final evaluation
    assert r.stderr.count("restarted: pid") == 4
    assert r.stderr.count("replayed on the restarted worker") >= 4
    assert run_rows(tmp_path / "run") == run_rows(in_process)  # no episode lost or counted twice
    assert run_eval(tmp_path / "run") == run_eval(in_process)


def test_without_ray_the_run_names_the_extra(tmp_path):
    """Ray not importable: one line naming the extra, exit 2, before a run folder is made."""
    r = swarm("run", *TINY_RUN, "cluster.kind=ray", f"run_dir={tmp_path / 'run'}", cwd=tmp_path, without_ray=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "swarm: error: cluster.kind=ray needs Ray, which is not installed: pip install 'swarm-runtime[ray]'"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.ray
def test_an_unreachable_cluster_address_is_one_line(tmp_path):
    import socket

    pytest.importorskip("ray")
    with socket.socket() as s:  # a port on loopback where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = swarm(
        "run",
        *TINY_RUN,
        "cluster.kind=ray",
        f"cluster.address=127.0.0.1:{port}",
        f"run_dir={tmp_path / 'run'}",
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"swarm: error: cluster.address='127.0.0.1:{port}': no Ray cluster answers there")
    assert "checkpoints" not in {p.name for p in (tmp_path / "run").iterdir()}  # ended before SFT


@pytest.mark.parametrize(
    "arg, valid",
    [("cluster.kind=slurm", "local, ray"), ("cluster.env_workers=0", "1"), ("cluster.address=nohost", "host:port")],
)
def test_bad_cluster_keys_are_refused(arg, valid, tmp_path):
    r = swarm("run", *TINY_RUN, arg, f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert arg.split("=")[0] in last and valid in last, last


def test_a_resume_may_move_its_envs():
    """cluster.* says where the envs live, not what the run computes (the same metrics either way): a resume
    may change it, as it may change the machine (hardware.*), and it is not a conflict with the saved run."""
    from omegaconf import OmegaConf

    from swarm_runtime.runs.folder import resume_conflicts, resume_overrides

    args = ["cluster.kind=ray", "cluster.env_workers=4", "algo.lr=0.5"]
    applied = resume_overrides(args)
    assert ("cluster.kind", "ray") in applied and ("cluster.env_workers", "4") in applied
    saved = OmegaConf.create({"cluster": {"kind": "local", "env_workers": 2}, "algo": {"lr": 0.1}})
    assert [k for k, *_ in resume_conflicts(saved, args, {k for k, _ in applied})] == ["algo.lr"]
