"""``algo=monolithic`` with ``cluster.learners=ray``: the one model's SFT cold start runs on its learner actor, as the
swarm's roles' SFT does (``MPTTrainer._sft_on_learners``), not in the driver: the worker's result equals the SFT in
process (no Ray), and a real ``swarm run`` on a local Ray writes the in-process run's metrics.jsonl and eval.json."""

import pytest

from tests.conftest import LOCAL_RAY, TINY_RUN, in_process_twin, run_eval, run_rows, swarm

MONO = [*TINY_RUN, "algo=monolithic"]


def test_a_learner_worker_runs_the_monolithic_sft_as_in_process(registry):
    """No Ray: ``LearnerWorker.sft(monolithic_sft_units, ...)`` on a copy of the one model gives the metrics, the
    FLOPs and the weights of the same SFT in process."""
    import dataclasses
    from functools import partial

    import torch

    from swarm_runtime.cluster.learners import LearnerWorker, replay_flops
    from swarm_runtime.learn.monolithic import MONOLITHIC, _MonolithicContext, monolithic_sft_units
    from swarm_runtime.learn.mpt import optimizer_settings, role_optimizers
    from swarm_runtime.learn.sft import collect_demos
    from swarm_runtime.models.flops import FlopCounter
    from tests.conftest import run_context

    ctx = run_context(registry, *MONO)
    ctx = _MonolithicContext(**{f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx)})
    (_, mine), (agents, theirs) = ctx.build_swarm(), ctx.build_swarm()
    demos = collect_demos(ctx.domain, ctx.task, [0, 1], single=True)["single"]
    settings = dict(demos=demos, epochs=2, lr=1e-3, batch_size=8, seed=5, max_steps=7, progress=False)

    here, cuts = FlopCounter(category="sft"), []
    mine[MONOLITHIC].flops = here
    want = monolithic_sft_units(mine, after=lambda: cuts.append(here.training_total), **settings)
    assert [u[0] for u in want] == ["role"] and want[0][2]["steps"] == 7 and len(cuts) == 1
    w = LearnerWorker(
        MONOLITHIC,
        theirs,
        [(a.name, a.role) for a in agents],
        partial(role_optimizers, settings=optimizer_settings(ctx.cfg)),
    )
    got = w.sft(monolithic_sft_units, settings)
    assert repr([u[:4] for u in got["units"]]) == repr(want)
    there = FlopCounter(category="sft")
    replay_flops(there, got["units"][0][4])
    assert there.by_category == here.by_category and there.training_total > 0
    assert all(torch.equal(a, b) for a, b in zip(mine[MONOLITHIC].parameters(), theirs[MONOLITHIC].parameters()))
    assert not all(
        torch.equal(a, b) for a, b in zip(mine[MONOLITHIC].parameters(), ctx.build_swarm()[1][MONOLITHIC].parameters())
    )


@pytest.mark.ray
def test_a_monolithic_run_on_learner_actors_equals_the_in_process_run(tmp_path_factory, tmp_path):
    """A real ``swarm run algo=monolithic`` with ``cluster.learners=ray`` on a local Ray: its SFT ran on the learner
    actor (the log says so), and metrics.jsonl (all but ``time/*``) and eval.json equal the in-process run's."""
    twin = in_process_twin(tmp_path_factory, *MONO)
    ray_args = ["cluster.kind=ray", "cluster.env_workers=2", "cluster.num_cpus=2", "cluster.learners=ray"]
    r = swarm("run", *MONO, *ray_args, f"run_dir={tmp_path / 'run'}", cwd=tmp_path, env=LOCAL_RAY)
    assert r.returncode == 0, r.stderr[-3000:]
    log = (tmp_path / "run" / "run.log").read_text()
    assert "SFT of Monolithic ran on learner Monolithic" in log
    assert run_rows(tmp_path / "run") == run_rows(twin)
    assert run_eval(tmp_path / "run") == run_eval(twin)
