"""DeepSpeed ZeRO-3 learners with bf16 weights (swarm_runtime/cluster/deepspeed_shards.py): each role's
bf16 full copy is a ZeRO-3 engine in DeepSpeed's bf16 mode (the module computing in bf16, ZeRO's fp32 partition
holding the run's fp32 masters, gradients reduced and accumulated in fp32: learn/sharded.py ``zero3_config``). A real
``swarm run`` on the shared test Ray against its in-process twin (bf16 weights, ``MasterWeightAdamW``), its
checkpoint resumed under ``train.engine=local``.

A config-built full copy trains in fp32 whatever ``hardware.dtype`` says (models/transformers_backend.py:
``make_transformers_policy``); bf16 full copies are checkpoints loaded with ``model.path``: here the run's own
config-built model, saved as a checkpoint saves it, so that the SFT and RL of the tiny run train it as they train the
fp32 one."""

import importlib.util

import pytest

from tests.conftest import in_process_twin, run_context, run_rows, swarm
from tests.test_deepspeed_learners import DEEPSPEED
from tests.test_learner_variants import _near, same_as_bf16
from tests.test_sharded_learners import RUN, _resumed_under_local

needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="the deepspeed extra")


#: the largest gap of a sampled token's log-prob between the sampler and the learner: in bf16 the max over tokens of
#: rounding noise, about one bf16 step of a logit (1.6e-2 at 2 to 4). Measured: 1.18e-2 in process (Smith, update
#: 3: the sampler's batched forward against the learner's chunk), 4.5e-4 in the deepspeed run
MAX_DLOGP, BF16_DLOGP = "mismatch/max_abs_dlogp_", 2e-2


def _near_bf16(got: dict, exp: dict) -> None:
    """test_learner_variants' ``_near`` (``BF16_TOL``) but for the ``MAX_DLOGP`` maxima, within ``BF16_DLOGP``."""
    for k in (k for k in exp if k.startswith(MAX_DLOGP)):
        assert got[k] == pytest.approx(exp[k], rel=0, abs=BF16_DLOGP), (exp.get("step"), k, got[k], exp[k])
    _near(*({k: v for k, v in r.items() if not k.startswith(MAX_DLOGP)} for r in (got, exp)))


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory, registry):
    """``RUN`` (action, bid, action; a checkpoint after each) on bf16 full copies, and its in-process twin."""
    ctx = run_context(registry, *RUN[:2])
    _, policies = ctx.build_swarm()
    ckpt = tmp_path_factory.mktemp("bf16-base") / "Logger"
    policies["Logger"].save(ckpt)
    # constrained actions: valid ones, whose rewards and KL give the action updates gradients (every action of the
    # tiny run is invalid otherwise, and in bf16 the bid update moves no weight the KL sees: every grad norm was 0)
    run = [*RUN, f"model.path={ckpt}", "hardware.dtype=bfloat16", "model.constrained_actions=true"]
    return run, in_process_twin(tmp_path_factory, *run)


@pytest.mark.ray
@pytest.mark.slow
@needs_deepspeed
def test_a_bf16_deepspeed_run_is_the_in_process_run_and_resumes_under_local(bf16_run, ray_head, tmp_path):
    """3 learners of 2 ZeRO-3 ranks in bf16: the SFT and the action update on the SFT weights' samples are the
    in-process run's within test_learner_variants' bf16 tolerance (``same_as_bf16``); the checkpoint after update 2
    holds the fp32 masters (gathered from ZeRO's partition) and resumes in process, where update 3 on the samples the
    DeepSpeed run drew from the same weights gives its metrics and, within bf16's noise, its fp32 masters."""
    import torch

    run, here = bf16_run
    args = (*run, *DEEPSPEED, *ray_head.args, f"run_dir={tmp_path / 'run'}")
    r = swarm("run", *args, cwd=tmp_path, env=ray_head.env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "learners on Ray: 3" in r.stderr and "2 ranks each (deepspeed)" in r.stderr
    updates = [u for u in run_rows(tmp_path / "run") if "kind" in u]
    assert [u["kind"] for u in updates] == ["action", "bid", "action"]
    assert all(updates[2].get(f"charts/grad_norm_{r}", 0) > 0 for r in ("Logger", "Miner", "Smith"))
    same_as_bf16(tmp_path / "run", here, close=_near_bf16)
    run2 = _resumed_under_local(tmp_path, "iter-000002")
    same_as_bf16(run2, tmp_path / "run", start=2, close=_near_bf16)

    def masters(folder, tag: str):
        path = folder / "checkpoints" / tag / "agents" / "Logger" / "training_state.pt"
        return torch.load(path, weights_only=False)["master_weights"]

    before, got, exp = (
        masters(run2, "iter-000002"),
        masters(tmp_path / "run", "iter-000003"),
        masters(run2, "iter-000003"),
    )
    assert len(got) == len(exp) and all(g.dtype == torch.float32 and g.shape == e.shape for g, e in zip(got, exp))
    gap = max(float((g - e).abs().max()) for g, e in zip(got, exp))
    moved = max(float((e - b).abs().max()) for e, b in zip(exp, before))
    print(
        f"fp32 masters after update 3, deepspeed vs in process from one checkpoint: {gap:.3g} apart, moved {moved:.3g}"
    )
    # AdamW's step on an element whose gradient differs at bf16's resolution moves it by up to the step itself
    assert moved > 0 and gap <= moved


def test_the_zero3_config_of_a_bf16_model_reduces_and_accumulates_in_fp32():
    """DeepSpeed 0.19.8's bf16 mode reduces and accumulates gradients in bf16 unless told (measured: 0.1% further
    from the in-process update, docs/reference/cluster.md), and its own linear rounds before the bias; fp32 engines keep
    the config they had; fp16 is not a mode."""
    import torch

    from swarm_runtime.learn.sharded import zero3_config

    bf16 = zero3_config(torch.bfloat16)
    assert bf16["bf16"] == {"enabled": True} and "fp16" not in bf16
    assert bf16["communication_data_type"] == "fp32" and bf16["data_types"] == {"grad_accum_dtype": "fp32"}
    assert bf16["zero_optimization"] == {"stage": 3, "memory_efficient_linear": False}  # torch's linear: the sampler's
    fp32 = {k: v for k, v in bf16.items() if k not in ("bf16", "communication_data_type", "data_types")}
    assert zero3_config() == {**fp32, "zero_optimization": {"stage": 3}}
    with pytest.raises(ValueError, match="float16"):
        zero3_config(torch.float16)
