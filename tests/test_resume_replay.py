"""A run resumed in process from its own checkpoint replays the run it resumes: a crash mid-run resumes to the same
run. With a bf16 base (``hardware.dtype=bfloat16``) it did not: the config-built base is cast to bf16 for the run,
but its trained copy (``checkpoints/<tag>/base``) was loaded back in fp32, and the cast had rounded the rotary
embedding's ``inv_freq`` (a buffer no checkpoint holds) to bf16, where a loaded model keeps it fp32; a config-built
full copy (fp32 whatever ``hardware.dtype`` says) was loaded back in bf16. Measured: the LoRA run resumed from its
``iter-000001`` drew another update-2 rollout (episode reward 5 vs 0)."""

import shutil

import pytest
import torch

from tests.conftest import TINY_RUN, copy_run, run_context, run_eval, run_rows, shared_run

#: tests/test_learner_variants.py's ``LORA_BF16`` (the same tuple: one run per session for both): LoRA adapters
#: (fp32) on the config-built base cast to bf16, SFT long enough for non-zero gradients, a checkpoint per update
LORA_BF16 = [
    *TINY_RUN,
    "algo.sft.epochs=12",
    "algo.kl_coef=0.1",
    "algo.bid_reference=sft",
    "model.adapter=lora",
    "hardware.dtype=bfloat16",
    "checkpoint_every=1",
]


def _state(model) -> dict:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


@pytest.mark.parametrize("adapter", ["lora", "none"])
def test_a_bf16_swarm_saved_and_loaded_back_is_the_same_model(registry, adapter, tmp_path):
    """Each role's model built with ``hardware.dtype=bfloat16``, written as a checkpoint writes it and built again
    from it (as a resume does): every parameter and buffer the same, in the same dtype (LoRA: the bf16 base with its
    fp32 ``inv_freq`` and the fp32 adapters; full copies: fp32, as built)."""
    args = ("domain=minecraft", "task=wooden_pickaxe", f"model.adapter={adapter}", "hardware.dtype=bfloat16")
    ctx = run_context(registry, *args)
    _, built = ctx.build_swarm()
    agents = tmp_path / "iter-000001" / "agents"
    for role, p in built.items():
        p.save(agents / role)
    _, loaded = ctx.build_swarm(agents)
    for role in built:
        want, got = _state(built[role].model), _state(loaded[role].model)
        assert set(got) == set(want), set(got) ^ set(want)
        for name, t in want.items():
            assert got[name].dtype == t.dtype, (role, name, got[name].dtype, t.dtype)
            assert torch.equal(got[name], t), (role, name)
    dtypes = {t.dtype for n, t in _state(built["Logger"].model).items() if "lora_" not in n and "inv_freq" not in n}
    assert dtypes == ({torch.bfloat16} if adapter == "lora" else {torch.float32})


def test_a_bf16_lora_run_resumed_in_process_replays_itself(tmp_path_factory, tmp_path, warm_swarm):
    """The run stopped after update 1 (its later checkpoints dropped, ``latest`` at ``iter-000001``) and resumed:
    metrics.jsonl and eval.json those of the uninterrupted run, exactly."""
    run, _ = shared_run(tmp_path_factory, *LORA_BF16)
    stopped = copy_run(run, tmp_path / "run")
    for d in (stopped / "checkpoints").glob("iter-*"):
        if d.name > "iter-000001":
            shutil.rmtree(d)
    (stopped / "checkpoints" / "latest").write_text("iter-000001")
    r = warm_swarm("run", f"run_dir={stopped}", "resume=true", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed at phase rl iteration 1" in (stopped / "run.log").read_text()
    rows = run_rows(run)
    assert any(row.get("step") == 2 and row.get("kind") == "bid" for row in rows)
    assert run_rows(stopped) == rows
    assert run_eval(stopped) == run_eval(run)
