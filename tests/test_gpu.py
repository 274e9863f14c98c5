"""The CUDA paths (``hardware=h200`` and the other GPU presets): the policy, the training steps,
the CLI on a GPU, and a GPU run's checkpoints on a machine without one.

Marked ``gpu`` and skipped where torch sees no CUDA device (CI). Run them on a GPU machine with
``python -m pytest -m gpu tests/test_gpu.py``.
"""

import random

import pytest
import torch
from conftest import TINY_RUN, make_local_checkpoint, swarm

from swarm_runtime.config.load import resolve
from swarm_runtime.core.loop import new_slots
from swarm_runtime.learn.action import action_update, credit_samples
from swarm_runtime.learn.bid import BranchPair, bid_update
from swarm_runtime.learn.optim import make_optimizer
from swarm_runtime.learn.sft import collect_demos, sft
from swarm_runtime.runs.context import RunContext
from swarm_runtime.sampling.play import play

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU")]

BASE = ["domain=minecraft", "task=iron_pickaxe", "task.max_decisions=24"]


@pytest.fixture(scope="module")
def contexts(registry):
    pm, reg = registry
    return {hw: RunContext(resolve(BASE + [f"hardware={hw}"], reg), pm, reg, None) for hw in ("cpu", "h200")}


def _episodes(ctx, agents, seeds, **kw):
    with torch.no_grad():
        return play(
            new_slots(ctx.domain, ctx.task, seeds), agents, ctx.coordinator(), ctx.domain, 24, random.Random(0), **kw
        )


def test_policy_on_the_gpu_scores_and_samples_as_on_the_cpu(contexts):
    _, gpu = contexts["h200"].build_swarm()
    _, cpu = contexts["cpu"].build_swarm()
    g, c = gpu["Logger"], cpu["Logger"]
    assert all(p.is_cuda for p in g.parameters()) and not any(p.is_cuda for p in c.parameters())
    assert all(torch.equal(a.cpu(), b) for a, b in zip(g.parameters(), c.parameters()))  # same seed, same init
    agents, _ = contexts["h200"].build_swarm()
    eps = _episodes(contexts["h200"], agents, [0, 1])
    turns = [t for e in eps for t in e.acted][:8]
    assert turns, "no agent acted"
    prompts = [t.action_prompt for t in turns]
    responses = [g.action_target("chop tree"), g.action_target("explore")] * (len(prompts) // 2) + [
        g.action_target("chop tree")
    ] * (len(prompts) % 2)
    for temperature in (1.0, 0.4):
        lg = g.logprobs(prompts, responses, temperature=temperature)
        assert lg.is_cuda
        torch.testing.assert_close(
            lg.detach().cpu(), c.logprobs(prompts, responses, temperature=temperature).detach(), atol=2e-3, rtol=1e-4
        )
    bids = g.bid(prompts)
    assert all(b.level in g.bid_levels for b in bids)
    acts = g.act(prompts)
    assert len(acts) == len(prompts) and all(isinstance(a.text, str) for a in acts)
    # keyed sampling (common random numbers): a row's draw depends on its key, not on its batch
    keys = [(7, i, 0, 1) for i in range(len(prompts))]
    together = g.act(prompts, keys=keys)
    alone = g.act(prompts[-1:], keys=keys[-1:])
    assert together[-1].tokens == alone[0].tokens
    assert [b.level for b in g.bid(prompts, keys=keys)][-1] == g.bid(prompts[-1:], keys=keys[-1:])[0].level


def test_sft_action_and_bid_steps_train_on_the_gpu(contexts):
    ctx = contexts["h200"]
    agents, policies = ctx.build_swarm()
    demos = collect_demos(ctx.domain, ctx.task, [0, 1], rng=random.Random(0))
    pol = policies["Logger"]
    m = sft(pol, demos["Logger"], epochs=10, lr=3e-3, batch_size=32, seed=0, progress=False)
    assert m["loss"] < 0.5 * m["first_loss"]
    opts = {r: make_optimizer(p.parameters(), 1e-3, 0.0, 10) for r, p in policies.items()}
    eps = _episodes(ctx, agents, [0, 1, 2], record_snapshots=True)
    samples = credit_samples(eps, ctx.credit_fn(), random.Random(0))
    samples[0] = (*samples[0][:3], samples[0][3] + 10.0)
    role = agents[samples[0][0]].role
    before = [p.detach().clone() for p in policies[role].parameters()]
    action_update(agents, samples, opts, reward_scale=10.0, minibatch=16, grad_clip=1.0)
    assert any(not torch.equal(a, b) for a, b in zip(before, policies[role].parameters()))
    opt = opts[role][0]
    assert all(s["exp_avg"].is_cuda for s in opt.state.values())
    ep, turn = next((e, t) for e in eps for t in e.acted)
    sel = turn.winner
    p = agents[sel].policy
    with torch.no_grad():
        lw0 = float(p.logprobs([turn.bid_prompts[sel]], [turn.bid_tokens[sel]]))
    bid_update(
        agents,
        [BranchPair(sel, turn.bid_prompts[sel], turn.bid_tokens[sel], p.bid_target(0.0), 5.0, 0.0)],
        opts,
        minibatch=16,
        grad_clip=1.0,
    )
    with torch.no_grad():
        assert float(p.logprobs([turn.bid_prompts[sel]], [turn.bid_tokens[sel]])) > lw0


def test_cli_run_on_the_gpu_then_eval_and_resume_without_one(tmp_path):
    """``swarm run hardware=h200`` trains on the GPU; its checkpoints (optimizer state saved from
    CUDA tensors) evaluate and resume on a machine whose torch sees no GPU, with ``hardware=cpu``."""
    run = tmp_path / "run"
    res = swarm("run", *TINY_RUN, "hardware=h200", "checkpoint_every=1", f"run_dir={run}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "MPT" in res.stdout and "device: cuda" in (run / "config.yaml").read_text()
    no_gpu = {"env": {"CUDA_VISIBLE_DEVICES": ""}}
    bad = swarm("eval", str(run), "eval.runs=1", cwd=tmp_path, **no_gpu)
    assert bad.returncode == 2 and "use hardware=cpu" in bad.stderr, bad.stderr[-2000:]
    res = swarm("eval", str(run), "eval.runs=1", "hardware=cpu", cwd=tmp_path, **no_gpu)
    assert res.returncode == 0, res.stderr[-3000:]
    # as if killed after the first update: the second runs on the CPU from the GPU's optimizer state
    (run / "checkpoints" / "latest").write_text("iter-000001")
    res = swarm("run", "resume=true", f"run_dir={run}", "hardware=cpu", cwd=tmp_path, **no_gpu)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed at phase rl iteration 1" in (run / "run.log").read_text()
    assert (run / "checkpoints" / "latest").read_text().strip() == "iter-000002"


def test_a_bf16_local_checkpoint_trains_on_the_gpu(tmp_path):
    """``model=local`` (bfloat16 weights, fp32 masters) with ``hardware=h200``: the paper's setting."""
    ckpt = make_local_checkpoint(tmp_path / "ckpt")
    run = tmp_path / "run"
    res = swarm("run", *TINY_RUN, "model=local", f"model.path={ckpt}", "hardware=h200", f"run_dir={run}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    latest = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    state = torch.load(latest / "agents" / "Logger" / "training_state.pt", weights_only=False, map_location="cpu")
    assert any(m is not None and m.dtype == torch.float32 for m in state["master_weights"])
