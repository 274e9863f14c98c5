"""Learner actors (``cluster.learners=ray``, swarm_runtime/cluster/learner.py) on a local Ray bound to 127.0.0.1: a
real ``swarm run`` writes the same metrics.jsonl and eval.json as in process; a learner killed with kill -9 in the
middle of an update is restarted, the run rewinds to its last checkpoint and ends with the unkilled run's metrics
and eval; with its restarts used up the run stops with one line naming what was lost and how to resume; bad input
is one line and exit 2."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT, TINY_RUN, swarm

RAY_ARGS = ["cluster.kind=ray", "cluster.env_workers=2", "cluster.num_cpus=2", "cluster.learners=ray"]
#: TINY_RUN with SFT long enough that the updates move the weights (rewards, so non-zero advantages, and bid pairs)
RUN = [*TINY_RUN, "algo.sft.epochs=12"]


def _rows(run_dir):
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]


def _eval(run_dir):
    out = json.loads((run_dir / "eval.json").read_text())
    out.pop("provenance", None)
    return out


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    pytest.importorskip("ray")
    tmp = tmp_path_factory.mktemp("local")
    r = swarm("run", *RUN, f"run_dir={tmp / 'run'}", cwd=tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp / "run"


@pytest.mark.ray
@pytest.mark.slow
def test_learner_actors_write_the_same_metrics_eval_and_checkpoints(in_process, tmp_path):
    import torch

    r = swarm("run", *RUN, *RAY_ARGS, f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "learners on Ray: 3" in r.stderr  # one per role: full copies
    rows = _rows(tmp_path / "run")
    assert rows == _rows(in_process) and len(rows) >= 3
    updates = [row for row in rows if "kind" in row]
    assert [u["kind"] for u in updates] == ["action", "bid"]
    assert any(updates[0].get(f"charts/grad_norm_{r}", 0) > 0 for r in ("Logger", "Miner", "Smith"))  # the weights moved
    assert updates[1]["charts/bid_pairs"] > 0 and any(k.startswith("losses/bid_") for k in updates[1])
    assert _eval(tmp_path / "run") == _eval(in_process)
    # the last checkpoint's optimizer state came from the actors: the same as the in-process run's
    for role in ("Logger", "Miner", "Smith"):
        mine, theirs = (
            torch.load(d / "checkpoints" / "iter-000002" / "agents" / role / "training_state.pt", weights_only=True)
            for d in (tmp_path / "run", in_process)
        )
        assert list(mine) == list(theirs)
        for kind in ("action", "bid"):
            a, b = mine[f"optimizer_{kind}"], theirs[f"optimizer_{kind}"]
            assert a["param_groups"] == b["param_groups"] and a["state"].keys() == b["state"].keys()
            for k in a["state"]:
                for name, t in a["state"][k].items():
                    assert torch.equal(t, b["state"][k][name]), (role, kind, k, name)
            assert mine[f"scheduler_{kind}"] == theirs[f"scheduler_{kind}"]


KILLER = textwrap.dedent("""
    import os, signal, sys
    from swarm_runtime.cluster import learner

    KILL_AT = int(os.environ["KILL_AT"])
    seen = {"n": 0, "kills": 0}
    update = learner.LearnerGroup.update

    def killing_update(self, fn, kind, payloads):
        seen["n"] += 1
        if seen["n"] == KILL_AT:  # the update is sent; kill its first learner before it answers
            get = self._get

            def get_after_kill(refs):
                del self._get
                name = next(iter(refs))
                pid = int(open(self.pid_files[name]).read())  # the pid file the actor writes in the run folder
                os.kill(pid, signal.SIGKILL)
                seen["kills"] += 1
                print(f"KILLED learner {name} pid {pid}", file=sys.stderr, flush=True)
                return get(refs)

            self._get = get_after_kill
        return update(self, fn, kind, payloads)

    learner.LearnerGroup.update = killing_update
    from swarm_runtime.cli import main
    rc = main(sys.argv[1:])
    print(f"KILLS {seen['kills']}", file=sys.stderr, flush=True)
    sys.exit(rc)
""")


def _killed_run(tmp_path, kill_at: int, *extra: str):
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "KILL_AT": str(kill_at)}
    return subprocess.run(
        [sys.executable, str(script), "run", *RUN, *RAY_ARGS, *extra, f"run_dir={tmp_path / 'run'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.ray
@pytest.mark.slow
def test_a_learner_killed_mid_update_is_restarted_and_the_run_rewinds(in_process, tmp_path):
    """kill -9 of a learner actor while the second update (a bid update) is in flight: Ray restarts it, the run
    rewinds to its last checkpoint (iter-000000) inside the same ``swarm run`` and plays updates 1 and 2 again;
    metrics.jsonl (no row twice) and eval.json equal the unkilled in-process run's."""
    r = _killed_run(tmp_path, 2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "KILLS 1" in r.stderr and r.stderr.count("restarted: pid") == 1
    rewound = [line for line in r.stderr.splitlines() if "rewinding to checkpoint" in line]
    assert len(rewound) == 1 and "lost at update 2" in rewound[0] and "iter-000000" in rewound[0], rewound
    rows = _rows(tmp_path / "run")
    steps = [row["step"] for row in rows if "kind" in row]
    assert steps == [1, 2]  # each update once
    assert rows == _rows(in_process)
    assert _eval(tmp_path / "run") == _eval(in_process)


@pytest.mark.ray
@pytest.mark.slow
def test_a_learner_that_cannot_be_restarted_stops_the_run_resumably(tmp_path):
    """``cluster.learner_restarts=0`` (a node lost: no restart): one line naming the learner and its roles, where
    the run stopped and the command that resumes it; exit 2; the checkpoint it names is there."""
    pytest.importorskip("ray")
    r = _killed_run(tmp_path, 1, "cluster.learner_restarts=0")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-2]  # the last is the script's KILLS line
    assert last.startswith("swarm: error: learner "), last
    assert "cluster.learner_restarts=0" in last and "stopped at update 1" in last
    assert f"swarm run run_dir={tmp_path / 'run'} resume=true" in last
    assert "its last checkpoint is iter-000000" in last
    assert (tmp_path / "run" / "checkpoints" / "iter-000000" / "state.json").is_file()


@pytest.mark.parametrize(
    "arg, valid",
    [
        ("cluster.learners=gpu", "local, ray"),
        ("cluster.learner_restarts=-1", "0"),
        ("cluster.learners=ray", "cluster.kind=ray"),  # without cluster.kind=ray
    ],
)
def test_bad_learner_keys_are_refused(arg, valid, tmp_path):
    r = swarm("run", *TINY_RUN, arg, f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert arg.split("=")[0] in last and valid in last, last
