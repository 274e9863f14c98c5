"""The sharded learner (swarm_runtime/train/sharded.py): FSDP2 over 2 gloo processes on 127.0.0.1 takes the
update the in-process learner takes (a real tiny Qwen2 TransformersPolicy, the REINFORCE loss, real AdamW)."""

from __future__ import annotations

import functools
import time

import pytest
from omegaconf import OmegaConf

from swarm_runtime.policy.transformers_backend import make_transformers_policy
from swarm_runtime.train.action import _reinforce_chunk
from swarm_runtime.train.optim import accumulate_and_step, make_optimizer
from swarm_runtime.train.sharded import OptimSettings, rank_chunks, shard_slices, spawn_update

WORDS = [
    "chop",
    "tree",
    "craft",
    "planks",
    "stick",
    "table",
    "goal",
    "inventory",
    "you",
    "are",
    "log",
    "none",
    "bid",
    "action",
    ":",
    ".",
    "Logger",
    "Smith",
]
MODEL = OmegaConf.create(
    dict(
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_positions=128,
        bid_mode="logits",
        temperature=1.0,
        max_action_tokens=4,
        max_bid_tokens=2,
        max_prompt_tokens=64,
    )
)
make_policy = functools.partial(make_transformers_policy, MODEL, WORDS, (0.0, 0.2, 0.4, 0.6, 0.8), 0)


def test_shards_and_chunks_cover_the_batch_once_with_equal_chunk_counts():
    assert [(s.start, s.stop) for s in shard_slices(7, 2)] == [(0, 4), (4, 7)]
    assert [s.stop - s.start for s in shard_slices(2, 3)] == [1, 1, 0]
    batch = list(range(7))
    for world, mb in ((1, 3), (2, 3), (3, 2), (4, 1)):
        per_rank = [rank_chunks(batch, r, world, mb) for r in range(world)]
        assert len({len(c) for c in per_rank}) == 1  # each forward/backward is a collective
        real = [x for chunks in per_rank for chunk, w in chunks if w > 0 for x in chunk]
        assert sorted(real) == batch
        assert sum(w for chunks in per_rank for _, w in chunks) == pytest.approx(1.0)
        assert all(len(chunk) <= mb for chunks in per_rank for chunk, _ in chunks)
    with pytest.raises(ValueError, match="world=0"):
        shard_slices(3, 0)


def test_fsdp_on_two_gloo_processes_takes_the_one_process_update():
    """7 samples over 2 ranks, minibatch 3 (rank 1 runs a zero-weight padding chunk), gradient clipped at 1.0
    from a global norm of about 9, AdamW with eps 1e-3 (so the step follows the gradient's size, not only its
    sign): the 2-process parameters equal the 1-process ones within 1e-6 (measured: about 1e-8 against moves
    of about 1e-2), the loss and the global gradient norm agree, and each rank holds about half the weights."""
    pol = make_policy()
    texts = ["chop tree", "craft planks", "craft stick", "chop tree", "craft table", "craft planks", "chop tree"]
    adv = [1.0, -0.5, 0.3, 2.0, -1.0, 0.7, -0.2]
    batch = [
        (f"you are {r} . goal {w} . action :", pol.action_target(t), a)
        for r, w, t, a in zip(["Logger", "Smith"] * 4, WORDS[:7], texts, adv)
    ]
    s = OptimSettings(lr=1e-2, weight_decay=0.01, total_steps=10, eps=1e-3, minibatch=3, grad_clip=1.0)
    before = {k: v.clone() for k, v in pol.model.state_dict().items()}
    opt, sched = make_optimizer(pol.parameters(), s.lr, s.weight_decay, s.total_steps, s.warmup, eps=s.eps)
    loss, norm = accumulate_and_step(pol, batch, s.minibatch, _reinforce_chunk, opt, sched, s.grad_clip)
    one = pol.model.state_dict()

    t0 = time.time()
    state, m = spawn_update(make_policy, batch, s, world=2, start_method="fork")
    took = time.time() - t0
    assert set(state) == set(one)
    diff = max(float((state[k] - one[k]).abs().max()) for k in one)
    moved = max(float((before[k] - one[k]).abs().max()) for k in one)
    print(f"2 ranks vs 1 process: max abs diff {diff:.3g}, max move {moved:.3g}, {took:.1f}s")
    assert moved > 1e-3 and diff < 1e-6
    assert norm > s.grad_clip and m["grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert m["loss"] == pytest.approx(loss, rel=1e-5, abs=1e-6)
    total = sum(p.numel() for p in pol.model.parameters())
    assert sum(m["shard_params_by_rank"]) == total and max(m["shard_params_by_rank"]) < 0.6 * total


def test_the_benchmark_compares_the_engines_update_on_a_real_role_model(capsys):
    """benchmarks/sharded_update.py (docs/distributed.md) on the minecraft expert's actions of one seed."""
    import importlib.util
    import re

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("sharded_update", ROOT / "benchmarks" / "sharded_update.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--engine", "fsdp", "--world", "2", "--seeds", "1"])
    out = capsys.readouterr().out
    diff, moved = map(
        float,
        re.search(
            r"max abs diff vs 1 process: (\S+) \(the update moved parameters by up to "
            r"(\S+)\)",
            out,
        ).groups(),
    )
    assert moved > 1e-6 and diff < 1e-3 * moved, out
    loss, loss1, norm, norm1 = map(float, re.search(r"loss (\S+) vs (\S+); grad norm (\S+) vs (\S+)", out).groups())
    assert loss == pytest.approx(loss1, rel=1e-5) and norm == pytest.approx(norm1, rel=1e-5), out
