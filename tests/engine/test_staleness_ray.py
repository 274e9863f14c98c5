"""``rollout.max_staleness=1`` on Ray (docs/reference/cluster.md, "Staleness"), on a local Ray bound to
127.0.0.1 with our own serve worker standing in for vLLM's server (test_engine_actor's shim; no vLLM needed): the
rollout of the next update plays ahead on the engine's weights while this update trains, with the engine sampler's
server started by a sampler actor (``cluster.samplers=ray``), or with the update trained by learner actors
(``cluster.learners=ray``). Each writes the metrics.jsonl rows of the same run in process
(``cluster.kind=local``), ``charts/staleness`` included.

A run with rollouts played ahead is made deterministic here by :data:`WAITER` (an update's sync waits until the
next update's rollout has played whole, so that rollout is on the weights before the sync in every run) and by
keyed draws (:data:`RUN`). Without them, how much of a rollout is drawn before the sync, and which seeds the rollout
thread and the branches take from the sampler's generator, depend on the threads' timing in any of the runs, in
process too (tests/engine/test_staleness_worker.py)."""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import patched_swarm
from test_engine_actor import ARGS, _rows, _same_rows, worker_python

pytestmark = [pytest.mark.ray, pytest.mark.slow]

#: test_engine_actor's run (adapters on one base, rollout.engine=vllm on our worker) with 3 updates (action, bid,
#: action), the next update's rollout played ahead, every draw keyed (common random numbers: a row's seed is a
#: function of its key, not the next number of the sampler's generator, which the rollout thread and the bid update's
#: branches would take in an order set by timing, and which a rewind starts again: it is made with the sampler)
RUN = [a for a in ARGS if not a.startswith("algo.iterations")] + [
    "algo.iterations=3",
    "rollout.max_staleness=1",
    "algo.common_random_numbers=true",
    "eval.common_random_numbers=true",
]
ON_RAY = ["cluster.kind=ray", "cluster.env_workers=1", "cluster.num_cpus=2"]

#: Patches ``swarm``'s update ``it`` to sync only once the rollout of update ``it + 1`` (played ahead) has played
WAIT = textwrap.dedent("""
    import sys
    from swarm_runtime.learn import mpt

    synced = mpt.MPTTrainer._synced
    def waiting_synced(self, it, m):
        ahead = (self._ahead or {}).get(it + 1)
        if ahead is not None:
            ahead.exception(timeout=600)
            print(f"UPDATE {it}: rollout {it + 1} played before the sync", file=sys.stderr, flush=True)
        return synced(self, it, m)

    mpt.MPTTrainer._synced = waiting_synced
""")
#: ``swarm ARGS`` with :data:`WAIT`
WAITER = WAIT + "from swarm_runtime.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"


def _run(tmp_path, python: str, *extra: str, script: str = WAITER, env: dict | None = None):
    """``swarm run RUN extra`` under ``script`` (:data:`WAITER`), our worker as vLLM (its Python ``python``)."""
    (tmp_path / "waiter.py").write_text(script)
    env = {"SWARM_VLLM_PYTHON": python, **(env or {})}
    r = patched_swarm(tmp_path / "waiter.py", "run", *RUN, *extra, f"run_dir={tmp_path / 'run'}", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    for it in (0, 1):
        assert f"UPDATE {it}: rollout {it + 1} played before the sync" in r.stderr, r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    """``(the worker's "vLLM Python", the run in process: cluster.kind=local, the trainer starts the server)``;
    its lag: update 0's rollout on the first weights, update 1's a whole update behind (an action update changes
    every model), update 2's too if the bid update changed a model (it had contested pairs), else none."""
    pytest.importorskip("ray")
    tmp = tmp_path_factory.mktemp("local")
    python = worker_python(tmp)
    _run(tmp, python)
    rows = [r for r in _rows(tmp / "run") if "kind" in r]
    assert [r["kind"] for r in rows] == ["action", "bid", "action"]
    changed = any(k.startswith("losses/bid_") for k in rows[1])
    assert [r["charts/staleness"] for r in rows] == [0.0, 1.0, float(changed)], rows
    return python, tmp / "run"


def test_an_engine_actor_plays_ahead_as_the_trainers_server(in_process, ray_head, tmp_path):
    python, here = in_process
    r = _run(tmp_path, python, *ON_RAY, *ray_head.args, "cluster.samplers=ray", env=ray_head.env)
    assert "vLLM sampler actor on Ray (default)" in r.stderr and "sampler actor of base default closed" in r.stderr
    _same_rows(tmp_path / "run", here)
    assert (
        json.loads((tmp_path / "run" / "eval.json").read_text())["results"]
        == json.loads((here / "eval.json").read_text())["results"]
    )


def test_learner_actors_train_while_the_trainer_plays_ahead_and_a_rewind_drops_it(in_process, ray_head, tmp_path):
    """The learners on Ray (one actor: the base's adapters); kill -9 of it while update 2 (bid) is in flight, the
    rollout of update 3 playing ahead: Ray restarts it, the run drops that rollout (waits for it, closes its envs) and
    rewinds to its checkpoint before RL (iter-000000: no rollout made yet, so the rewound run draws as the unkilled
    one), plays the updates again and ends with the in-process run's rows (each update once) and eval."""
    from test_learner_actors import KILLER

    python, here = in_process
    extra = (*ON_RAY, *ray_head.args, "cluster.learners=ray")
    r = _run(tmp_path, python, *extra, script=WAIT + KILLER, env={"KILL_AT": "2", **ray_head.env})
    assert "learners on Ray: 1 (base-default: Logger+Miner+Smith" in r.stderr, r.stderr[-3000:]
    assert "KILLS 1" in r.stderr and r.stderr.count("restarted: pid") == 1, r.stderr[-3000:]
    rewound = [line for line in r.stderr.splitlines() if "rewinding to checkpoint" in line]
    assert len(rewound) == 1 and "lost at update 2" in rewound[0] and "iter-000000" in rewound[0], rewound
    _same_rows(tmp_path / "run", here)
    assert (
        json.loads((tmp_path / "run" / "eval.json").read_text())["results"]
        == json.loads((here / "eval.json").read_text())["results"]
    )
