"""Env workers past ``swarm run``'s MPT (docs/reference/cluster.md): ``swarm eval RUN cluster.kind=ray`` and
``algo=rlcr`` step their envs on env workers with the numbers of in process; the driver's round trips per turn
(one ``step_many`` per worker, the metrics with the step, releases sent with the next call), also across a
kill -9; the envs of rollouts made ahead and never played are closed. Ray tests start a local Ray bound to
127.0.0.1 (tests/test_cluster.py has the MPT run and its kill -9 recovery)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from conftest import TINY_RLCR, TINY_RUN, copy_run, swarm
from test_env_close import Tracker

RAY_ARGS = ["cluster.kind=ray", "cluster.env_workers=2", "cluster.num_cpus=2"]


def _task():
    from swarm_runtime.config.load import resolve
    from swarm_runtime.plugins.manager import get_registry

    return resolve(["domain=minecraft", "task=wooden_pickaxe"], get_registry()[1]).task


def _closed_line(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if "env workers closed" in line)


# --------------------------------------------------------------------------- swarm eval and algo=rlcr
@pytest.fixture
def trained(tiny_run, tmp_path):
    """A copy of the session's tiny run (``swarm eval`` writes its files into the run folder)."""
    pytest.importorskip("ray")
    return copy_run(tiny_run[0], tmp_path / "run")


def _eval_file(run_dir, name):
    out = json.loads((run_dir / name).read_text())
    for k in ("overrides", "versions", "provenance"):
        out.pop(k, None)
    return out


@pytest.mark.ray
def test_swarm_eval_on_env_workers_writes_the_same_eval(trained):
    local = swarm("eval", str(trained), "eval.runs=2", cwd=trained)
    assert local.returncode == 0, local.stderr[-3000:]
    # cluster.address=null starts a Ray of its own, whatever cluster RAY_ADDRESS (or the last `ray start` on this
    # machine) names: nothing listens at this one
    remote = swarm("eval", str(trained), "eval.runs=2", *RAY_ARGS, cwd=trained, env={"RAY_ADDRESS": "127.0.0.1:9"})
    assert remote.returncode == 0, remote.stderr[-3000:]
    assert "env workers on Ray: 2" in remote.stderr
    closed = _closed_line(remote.stderr)
    assert "'in_use': 0" in closed and "'restarts': 0" in closed  # every env given back, then closed
    files = sorted(p.name for p in trained.glob("eval-*--eval.runs=2*.json"))
    assert len(files) == 2, files
    a, b = (_eval_file(trained, f) for f in files)
    assert a == b and a["episodes"] == 4


def _rows(run_dir):
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]


@pytest.mark.ray
def test_rlcr_on_env_workers_writes_the_same_metrics_and_eval(tmp_path):
    pytest.importorskip("ray")
    args = [*TINY_RLCR, "algo.iterations=1", "rlcr.eval_runs=1", "eval.episodes=2"]
    local = swarm("run", *args, f"run_dir={tmp_path / 'local'}", cwd=tmp_path)
    assert local.returncode == 0, local.stderr[-3000:]
    remote = swarm("run", *args, *RAY_ARGS, f"run_dir={tmp_path / 'ray'}", cwd=tmp_path)
    assert remote.returncode == 0, remote.stderr[-3000:]
    assert "env workers on Ray: 2" in remote.stderr
    closed = _closed_line(remote.stderr)
    assert "'in_use': 0" in closed and "'made': 0" not in closed  # the concurrent envs lived on the workers
    rows = _rows(tmp_path / "local")
    assert _rows(tmp_path / "ray") == rows and len(rows) >= 2
    a, b = (json.loads((tmp_path / d / "eval.json").read_text()) for d in ("local", "ray"))
    a.pop("provenance", None), b.pop("provenance", None)
    assert a == b


def test_env_workers_close_their_cluster_when_the_body_raises(monkeypatch):
    """``swarm eval``'s ``env_workers``: the cluster is closed also when the evaluation raised."""
    import swarm_runtime.cluster as cluster_pkg

    closed = []

    class Fake:
        def close(self):
            closed.append(True)
            return {}

    monkeypatch.setattr(cluster_pkg, "env_domain", lambda cfg, domain: ("remote", Fake()))
    with pytest.raises(ValueError, match="boom"), cluster_pkg.env_workers(None, "domain") as domain:
        assert domain == "remote"
        raise ValueError("boom")
    assert closed == [True]


# --------------------------------------------------------------------------- the driver's round trips
@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    ray.init(
        address="local",
        num_cpus=2,
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    # test traffic stays on loopback (tests/conftest.py): the node and its GCS advertise 127.0.0.1
    nodes = ray.nodes()
    assert [n["NodeManagerAddress"] for n in nodes] == ["127.0.0.1"], nodes
    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
    yield ray
    ray.shutdown()


def _play(domain, task, seeds, turns, on_sent=None):
    """Reset an env per seed and step them ``turns`` turns as ``episode.play`` does (every step sent, then
    collected); each env's observations and final metrics."""
    from swarm_runtime.core.engine import prefetch_steps
    from swarm_runtime.core.env import close_all
    from swarm_runtime.core.loop import make_env

    envs = [make_env(domain, task) for _ in seeds]
    seen = [[env.reset(s)] for env, s in zip(envs, seeds)]
    actions = ["chop tree", "craft planks", "chop tree", "craft stick"]
    for t in range(turns):
        live = [i for i, e in enumerate(envs) if not e.done]
        prefetch_steps([(envs[i], actions[t % len(actions)], "Logger") for i in live])
        if on_sent is not None:
            on_sent(t)
        for i in live:
            seen[i].append(envs[i].step(actions[t % len(actions)], "Logger").observation)
    out = [(obs, envs[i].metrics()) for i, obs in enumerate(seen)]
    close_all(envs)
    return out


@pytest.fixture(scope="module")
def minecraft_cluster(local_ray):
    """Two env workers of minecraft/wooden_pickaxe on the local Ray (shared: starting workers takes seconds)."""
    from swarm_runtime.cluster.env_cluster import EnvCluster

    cluster = EnvCluster("minecraft", _task(), 2)
    yield cluster
    cluster.close()


@pytest.mark.ray
def test_a_turn_is_one_call_per_worker_with_the_in_process_numbers(minecraft_cluster):
    from swarm_runtime.cluster.env_cluster import ClusterDomain
    from swarm_runtime.plugins.manager import get_registry

    cluster = minecraft_cluster
    domain, task = get_registry()[1].domains["minecraft"], _task()
    seeds, turns = [3, 4, 5, 6], 3
    expected = _play(domain, task, seeds, turns)
    calls = [cluster.calls]
    got = _play(ClusterDomain(domain, cluster), task, seeds, turns, on_sent=lambda t: calls.append(cluster.calls))
    calls.append(cluster.calls)
    assert got == expected
    # 4 resets (one call each: open and reset together), then per turn one step_many per worker; the metrics
    # came with the last step (no call of their own)
    assert calls[1] - calls[0] == len(seeds)
    assert [b - a for a, b in zip(calls[1:], calls[2:])] == [2] * turns
    # the 4 releases are sent with the next call, one release_many per worker: the pools are full again
    before = cluster.calls
    _play(ClusterDomain(domain, cluster), task, seeds, 1)
    assert cluster.calls - before == 2 + len(seeds) + 2  # releases, resets, one turn
    stats = cluster.ray.get([w.stats.remote() for w in cluster.workers])
    assert [w["made"] for w in stats] == [2, 2] and [w["in_use"] for w in stats] == [2, 2]


@pytest.mark.ray
def test_a_worker_killed_with_a_turn_queued_replays_its_envs(minecraft_cluster):
    """kill -9 of a worker after a turn's steps were queued (not yet sent): the batch finds it dead, Ray restarts
    it, each of its envs is replayed from its seed and steps, and every number equals in process."""
    from swarm_runtime.cluster.env_cluster import ClusterDomain
    from swarm_runtime.plugins.manager import get_registry

    cluster = minecraft_cluster
    domain, task = get_registry()[1].domains["minecraft"], _task()
    seeds, turns = [3, 4, 5, 6], 3
    expected = _play(domain, task, seeds, turns)
    restarts, replayed = cluster.restarts, cluster.replayed

    def kill(t):
        if t == 1:
            os.kill(cluster.pids[0], signal.SIGKILL)

    got = _play(ClusterDomain(domain, cluster), task, seeds, turns, on_sent=kill)
    assert got == expected
    assert cluster.restarts - restarts == 1 and cluster.replayed - replayed == 2  # worker 0's two envs


# --------------------------------------------------------------------------- rollouts made ahead, never played
def test_rollouts_made_ahead_and_never_played_close_their_envs(registry, tmp_path, monkeypatch):
    """``rollout.max_staleness=2``: update 0 makes the rollouts of updates 0-2 (their envs reset now) and plays
    them ahead on a thread; the run raises after update 0's rollout while update 2's is still queued. Its
    future is cancelled, and its envs closed by ``train``'s end (each env made is closed exactly once)."""
    from omegaconf import open_dict

    from swarm_runtime.config.load import resolve
    from swarm_runtime.learn import mpt
    from swarm_runtime.learn.phases import PhasedTrainer
    from swarm_runtime.runs.context import RunContext

    pm, reg = registry
    cfg = resolve([*TINY_RUN, "algo.iterations=4"], reg)
    with open_dict(cfg):
        cfg.rollout.max_staleness = 2  # the local sampler (validation asks an engine for it; the thread is ours)
    ctx = RunContext(cfg, pm, reg, tmp_path)
    tracker = Tracker(monkeypatch, ctx.domain)  # every env the run's domain makes, and its closes
    trainer = mpt.MPTTrainer(ctx)
    play, plays = mpt.play, []

    def waiting_play(slots, *a, **kw):  # update 1's rollout waits until update 2's is cancelled
        plays.append(len(plays))
        if len(plays) == 2:
            end = time.monotonic() + 60
            while not trainer._ahead[2].cancelled() and time.monotonic() < end:
                time.sleep(0.01)
        return play(slots, *a, **kw)

    def one_rollout_then_raise(self):
        self._setup()
        self._episodes(0)
        raise RuntimeError("the update failed")

    monkeypatch.setattr(mpt, "play", waiting_play)
    monkeypatch.setattr(PhasedTrainer, "train", one_rollout_then_raise)
    with pytest.raises(RuntimeError, match="the update failed"):
        trainer.train()
    assert plays == [0, 1]
    assert len(tracker.made) == 3 * int(cfg.algo.envs_per_step)  # three rollouts' envs made, two played
    assert tracker.counts() == [1] * len(tracker.made)  # each closed once


@pytest.mark.ray
@pytest.mark.parametrize("key", ["learners", "samplers"])
def test_rlcr_refuses_learner_and_sampler_actors(key, tmp_path):
    pytest.importorskip("ray")
    r = swarm("run", *TINY_RLCR, "cluster.kind=ray", f"cluster.{key}=ray", f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert f"cluster.{key}=ray: algo.name=rlcr keeps" in last and f"cluster.{key}=local" in last, last
