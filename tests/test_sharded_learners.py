"""Sharded learners (``train.engine=fsdp train.shards=2 cluster.learners=ray``, swarm_runtime/cluster/shards.py) on a
local Ray bound to 127.0.0.1: a real ``swarm run`` whose learners are two FSDP2 ranks each writes the in-process run's
metrics.jsonl and eval.json (within :data:`TOL`, FSDP sums gradients in another order, while the two runs' updates
take the same samples and pairs: :func:`same_as`); its checkpoint holds the optimizer state in the in-process format
and resumes under ``train.engine=local``, where the next update on the same samples gives the sharded run's metrics; a
rank killed with kill -9 in an update brings its learner's ranks back as a new group and the run rewinds to its last
checkpoint (loaded into the shards) and ends with the unkilled run's metrics; a base with its roles' LoRA adapters
sharded runs as in process and resumes under local; bad input is one line and exit 2."""

import shutil
from pathlib import Path

import pytest

from tests.conftest import TINY_RUN, compare_evals, compare_on_same_inputs, in_process_twin, run_eval, run_rows, swarm
from tests.test_learner_actors import RAY_ARGS, _killed_run, _same_training_states, _sft_ran_on_the_learners
from tests.test_learner_actors import RUN as ACTORS_RUN

#: test_learner_actors' run (TINY_RUN with SFT long enough for bid pairs, 3 updates: action, bid, action, the third's
#: gradients not zero; the reference policies in every update, so the KL and bid-reference forwards run on every
#: rank) with a checkpoint after each update
RUN = [*ACTORS_RUN, "checkpoint_every=1"]
FSDP = [*RAY_ARGS, "train.engine=fsdp", "train.shards=2"]
#: relative tolerance of a metric against the in-process run's. Measured (docs/reference/cluster.md): the one metric that
#: differs is the bid update's gradient norm of one role, by 2.2e-7 relative (float32 sums in another order);
#: everything else, the FLOPs and eval.json are equal
TOL = 1e-5
#: metrics that are gaps between two log-probs of about 1 (the sampler's and the learner's, the policy's and the
#: reference's): a float32 sum in another order moves them by ~1e-7 absolute, a large relative change when the gap is
#: near 0 (measured with LoRA adapters: ``charts/bid_ref_logodds_Smith`` 6.0e-8 apart, ``mismatch/bid_max_abs_dlogp``
#: 2.4e-7), so they are compared within 1e-6 absolute, as tests/engine/test_engine_actor.py takes ``mismatch/*``
LOGP_GAPS = ("mismatch/", "charts/bid_ref_logodds_", "charts/kl_")


def _close(got: dict, exp: dict) -> None:
    """Row ``got`` (metrics.jsonl without ``time/*``) equals ``exp``, floats within :data:`TOL` (:data:`LOGP_GAPS`
    within 1e-6 absolute); prints the metrics that differ (the measurement of the tolerance)."""
    assert set(got) == set(exp), set(got) ^ set(exp)
    for k, v in exp.items():
        if isinstance(v, float) and got[k] != v:
            print(f"step {exp.get('step')} {k}: {got[k]!r} vs {v!r}, rel {abs(got[k] - v) / max(abs(v), 1e-30):.2g}")
            noise = 1e-6 if k.startswith(LOGP_GAPS) else 1e-9  # gaps of log-probs: float noise of ~1e-7
            assert got[k] == pytest.approx(v, rel=TOL, abs=noise), (exp.get("step"), k, got[k], v)
        else:
            assert got[k] == v, (exp.get("step"), k)


def same_as(run: Path, twin: Path, start: int = 0) -> int | None:
    """``run``'s metrics.jsonl and eval.json against ``twin``'s, from their common state after update ``start``
    (tests/conftest.py ``compare_on_same_inputs``: rows within :data:`TOL` while their rollouts agree,
    ``compare_evals``); the step of the first row not compared (None: all)."""
    apart = compare_on_same_inputs(run_rows(run), run_rows(twin), _close, start=start)
    compare_evals(run_eval(run), run_eval(twin), trained_apart=apart is not None)
    return apart


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    return in_process_twin(tmp_path_factory, *RUN)


def _from(run, tag: str, dest):
    """A copy of ``run`` whose last checkpoint is ``tag`` (the later ones dropped): as if it stopped there."""
    shutil.copytree(run, dest)
    ck = dest / "checkpoints"
    for d in ck.glob("iter-*"):
        if d.name > tag:
            shutil.rmtree(d)
    (ck / "latest").write_text(tag)
    return dest


def _resumes_under_local(tmp_path) -> None:
    """The checkpoint after update 2 of the sharded run ``tmp_path/run`` resumes in process (``train.engine=local``,
    no Ray) and takes update 3 on the sharded run's own samples: its metrics within :data:`TOL` and eval.json
    (:func:`same_as` from step 2)."""
    same_as(_resumed_under_local(tmp_path, "iter-000002"), tmp_path / "run", start=2)


def _resumed_under_local(tmp_path, tag: str) -> Path:
    """A copy of the Ray run ``tmp_path/run`` stopped at checkpoint ``tag`` (``iter-00000N``, :func:`_from`),
    resumed in process (``train.engine=local``, no Ray) to its end at ``tmp_path/run2``: that folder."""
    run2 = _from(tmp_path / "run", tag, tmp_path / "run2")
    local = ["cluster.kind=local", "cluster.learners=local", "train.engine=local", "train.shards=1"]
    r = swarm("run", f"run_dir={run2}", "resume=true", *local, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed at phase rl iteration {int(tag.removeprefix('iter-'))}" in r.stderr
    return run2


@pytest.mark.ray
@pytest.mark.slow
def test_a_sharded_run_with_a_rank_killed_mid_update_regroups_rewinds_and_equals_the_in_process_run(
    in_process, ray_head, tmp_path
):
    """kill -9 of rank 1 of a learner while the second update (bid) is in flight: its other rank fails in its
    collective (seen: gloo's error comes back before the dead rank's) and is killed too, Ray restarts both, they form a
    new group, the run rewinds to iter-000001 (written under fsdp; loaded into the new shards) and plays update 2
    again: metrics.jsonl (no row twice, within :data:`TOL`) and eval.json as the unkilled in-process run's
    (:func:`same_as`); SFT ran on the ranks (each its own full copy) before they formed their groups and sharded the
    models; the last checkpoint's optimizer state, gathered from the shards, is the in-process optimizer's format and
    numbers; the checkpoint written under fsdp after update 2 resumes in process. (One run for what a plain sharded
    run and a killed one each checked: the killed run's end must equal the in-process twin anyway.)"""
    r, apart = _killed_rank_rewinds(tmp_path, in_process, FSDP, ray_head, "fsdp")
    _sft_ran_on_the_learners(r.stderr, {"Logger": "Logger", "Miner": "Miner", "Smith": "Smith"})
    assert "learners sharded after their SFT: 2 ranks each (fsdp)" in r.stderr
    updates = [row for row in run_rows(tmp_path / "run") if "kind" in row]
    assert updates[1]["charts/bid_pairs"] > 0 and any(k.startswith("charts/bid_ref_logodds_") for k in updates[1])
    if apart is None:  # the optimizer state after update 3 came from the in-process run's samples and pairs
        _same_training_states(tmp_path / "run", in_process, "iter-000003", rtol=1e-4)
    # the checkpoint written under fsdp after update 2 resumes in process (keep_checkpoints=2: iter-000001 pruned)
    _resumes_under_local(tmp_path)


def _killed_rank_rewinds(tmp_path, in_process, engine: list, head, name: str):
    """``RUN`` with ``engine``'s arguments (``train.engine=NAME``, 2 ranks a learner), the last rank of a learner
    killed in update 2 (test_learner_actors' killer; the run joins Ray ``head``): 3 learners of 2 ranks, one restart,
    one rewind to iter-000001, then the in-process run's metrics.jsonl (updates action, bid, action, the third's
    gradients not zero) and eval.json (:func:`same_as`). Its result, and the step of the first row not compared
    (None: all)."""
    r = _killed_run(tmp_path, 2, run=(*RUN, *engine), head=head)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "learners on Ray: 3" in r.stderr and f"2 ranks each ({name})" in r.stderr
    assert "KILLS 1" in r.stderr and r.stderr.count("restarted: pid") == 1, r.stderr[-3000:]
    rewound = [line for line in r.stderr.splitlines() if "rewinding to checkpoint" in line]
    assert len(rewound) == 1 and "lost at update 2" in rewound[0] and "iter-000001" in rewound[0], rewound
    rows = run_rows(tmp_path / "run")
    updates = [row for row in rows if "kind" in row]
    assert [u["step"] for u in updates] == [1, 2, 3]
    assert [u["kind"] for u in updates] == ["action", "bid", "action"]
    assert any(updates[2].get(f"charts/grad_norm_{r}", 0) > 0 for r in ("Logger", "Miner", "Smith"))
    return r, same_as(tmp_path / "run", in_process)


#: the run of :data:`RUN` with the roles LoRA adapters on one base, 2 updates (action, bid)
LORA_RUN = [*TINY_RUN, "algo.sft.epochs=12", "algo.kl_coef=0.1", "algo.bid_reference=sft", "model.adapter=lora"]


@pytest.mark.ray
@pytest.mark.slow
def test_a_base_with_its_adapters_sharded_runs_as_in_process_and_resumes_under_local(
    tmp_path_factory, ray_head, tmp_path
):
    """``model.adapter=lora``: one learner (the base with its 3 roles' adapters) of 2 FSDP2 ranks, frozen base weights
    and trainable adapters sharded together: metrics.jsonl and eval.json as the in-process run's (:func:`same_as`); its
    first checkpoint (adapters written by the driver, optimizer state gathered from the shards) resumes under
    ``train.engine=local`` and takes update 2 on the sharded run's pairs as the sharded run did."""
    args = [*LORA_RUN, "checkpoint_every=1"]
    here = in_process_twin(tmp_path_factory, *args)
    r = swarm("run", *args, *FSDP, *ray_head.args, f"run_dir={tmp_path / 'run'}", cwd=tmp_path, env=ray_head.env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "learners on Ray: 1" in r.stderr and "2 ranks each (fsdp)" in r.stderr
    rows = run_rows(tmp_path / "run")
    assert [u["kind"] for u in rows if "kind" in u] == ["action", "bid"]
    same_as(tmp_path / "run", here)
    same_as(_resumed_under_local(tmp_path, "iter-000001"), tmp_path / "run", start=1)


@pytest.mark.parametrize(
    "args, valid",
    [
        (["train.engine=fsdp", "train.shards=2"], "cluster.learners=ray"),
        # ZeRO-3 learners (cluster/deepspeed_shards.py): the same, and fp32 or bf16 full copies only (with or without
        # the package; fp16: DeepSpeed's loss scaling and skipped steps, which the in-process update has not)
        (["train.engine=deepspeed", "train.shards=2"], "cluster.learners=ray"),
        (["train.engine=deepspeed", "cluster.kind=ray", "cluster.learners=ray", "model.adapter=lora"], "adapter=none"),
        (["train.engine=deepspeed", "cluster.kind=ray", "cluster.learners=ray", "hardware.dtype=float16"], "bfloat16"),
    ],
)
def test_what_a_sharded_run_cannot_do_is_refused_before_writing(args, valid, tmp_path):
    if "cluster.kind=ray" in args:  # without the ray extra such a run is refused for it first (validation.needs_ray)
        pytest.importorskip("ray")
    r = swarm("run", *TINY_RUN, *args, f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert args[0] in last and valid in last, last
    assert not (tmp_path / "run").exists()
