"""DeepSpeed ZeRO-3 learners (``train.engine=deepspeed train.shards=2 cluster.learners=ray``,
swarm_runtime/cluster/deepspeed_shards.py) on a local Ray bound to 127.0.0.1: a real ``swarm run`` whose learners are
two ZeRO-3 ranks each writes the in-process run's metrics.jsonl and eval.json (tests/test_sharded_learners.py
``same_as``: within its tolerance while the updates take the same samples); its checkpoints hold the optimizer state in
the in-process format and resume under ``train.engine=local``; a rank killed in an update regroups its learner and the
run rewinds (the checkpoint loaded into the ZeRO-3 partitions). Skipped without the deepspeed extra (it is not imported
here: 9 s); without the package a run is refused in one line."""

import importlib.util

import pytest

from swarm_runtime.config.errors import ConfigError
from tests.conftest import in_process_twin
from tests.test_learner_actors import RAY_ARGS, _same_training_states
from tests.test_sharded_learners import RUN, _killed_rank_rewinds, _resumes_under_local

DEEPSPEED = [*RAY_ARGS, "train.engine=deepspeed", "train.shards=2"]
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="the deepspeed extra")


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    return in_process_twin(tmp_path_factory, *RUN)


@pytest.mark.ray
@pytest.mark.slow
@needs_deepspeed
def test_a_deepspeed_run_with_a_rank_killed_mid_update_regroups_rewinds_and_equals_the_in_process_run(
    in_process, ray_head, tmp_path
):
    """kill -9 of the last rank of a learner in update 2 (bid): its learner's ranks come back as a new group (joined
    by deepspeed.init_distributed again), iter-000001 (written under deepspeed: the action moments) is loaded into
    the new ZeRO-3 partitions through safe_set_full_*, updates 2 and 3 are played: the in-process run's metrics (three
    updates, action, bid, action: both optimizer kinds of a role step the same ZeRO-3 partition, each with its own
    moments) and eval.json; the checkpoints after updates 2 and 3 hold the in-process optimizer state, and the one
    after update 2 resumes in process. (One run for what a plain DeepSpeed run and a killed one each checked: the
    killed run's end must equal the in-process twin anyway.)"""
    _, apart = _killed_rank_rewinds(tmp_path, in_process, DEEPSPEED, ray_head, "deepspeed")
    for step in (2, 3):  # gathered through safe_get_full_optimizer_state: the same format (on the same samples)
        if apart is None or apart > step:
            _same_training_states(tmp_path / "run", in_process, f"iter-{step:06d}", rtol=1e-4)
    _resumes_under_local(tmp_path)


def test_deepspeed_without_the_package_is_refused_in_one_line(registry, monkeypatch):
    """Where every command checks what it can train with (config/checks_cluster.py: check_engine_wired, run by
    validation), before anything is written; what else a ZeRO-3 run cannot do is refused as fsdp's is
    (tests/test_sharded_learners.py)."""
    from swarm_runtime.config.load import resolve

    pytest.importorskip("ray")  # without it, resolve refuses cluster.kind=ray for the extra (validation.needs_ray)
    real = importlib.util.find_spec
    if real("deepspeed") is not None:
        resolve([*RUN[:2], *DEEPSPEED], registry[1])  # with the package: wired
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    with pytest.raises(ConfigError) as err:
        resolve([*RUN[:2], *DEEPSPEED], registry[1])
    msg = str(err.value)
    assert "\n" not in msg and "'.[deepspeed]'" in msg and "DS_ACCELERATOR=cpu" in msg and "train.engine=fsdp" in msg
