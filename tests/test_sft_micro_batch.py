"""SFT in micro-batches (``hardware.micro_batch``): the same loss and gradient as the whole batch, one slice's
activations at a time; and the C allocator's mmap threshold fixed for pretrained bases (models/allocator.py).
Tiny models built from the config: about 13 s in all (one shared core)."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import run_context

from swarm_runtime.learn.sft import batch_loss, collect_demos, sft


@pytest.fixture(scope="module")
def ctx(registry):
    return run_context(registry, "domain=minecraft", "task=wooden_pickaxe", "task.max_decisions=12")


def pairs_of(policy, examples):
    return [
        (e.prompt, policy.bid_target(e.target) if e.kind == "bid" else policy.action_target(e.target)) for e in examples
    ]


def clear_grads(policy) -> None:
    for p in policy.parameters():
        p.grad = None


def grads_of(policy) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in policy.parameters() if p.grad is not None]


def test_micro_batches_give_the_whole_batchs_loss_and_gradient(ctx):
    _, policies = ctx.build_swarm()
    policy = policies["Logger"]
    demos = collect_demos(ctx.domain, ctx.task, [0], rng=random.Random(0))["Logger"]
    batch = pairs_of(policy, demos)[:10]
    assert len({len(policy.encode_prompt(p)) for p, _ in batch}) > 1  # slices pad to other lengths than the whole
    policy.train()
    results = {}
    for micro in (None, 3, 1):
        clear_grads(policy)
        results[micro] = (batch_loss(policy, batch, micro), grads_of(policy))
    whole_loss, whole_grads = results[None]
    assert whole_loss > 0 and len(whole_grads) > 0
    for micro in (3, 1):
        loss, grads = results[micro]
        assert loss == pytest.approx(whole_loss, rel=1e-5)
        assert len(grads) == len(whole_grads)
        for g, w in zip(grads, whole_grads):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    # the slices really differ from the whole batch (the check above compares two computations, not one)
    one = pairs_of(policy, demos)[:1]
    clear_grads(policy)
    assert batch_loss(policy, one) != pytest.approx(whole_loss, rel=1e-3)


def test_sft_with_a_micro_batch_trains_to_the_same_weights(ctx):
    demos = collect_demos(ctx.domain, ctx.task, [0], rng=random.Random(0))["Miner"]
    weights, metrics = [], []
    for micro in (None, 2):
        _, policies = ctx.build_swarm()
        policy = policies["Miner"]
        metrics.append(sft(policy, demos, epochs=2, lr=3e-3, batch_size=8, seed=0, progress=False, micro_batch=micro))
        weights.append([p.detach().clone() for p in policy.parameters()])
    assert metrics[0]["steps"] == metrics[1]["steps"] > 1
    assert metrics[1]["loss"] == pytest.approx(metrics[0]["loss"], rel=1e-4)
    for a, b in zip(*weights):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)  # Adam scales near-zero gradients up


def test_the_mmap_threshold_is_set_once_and_a_users_setting_is_kept(monkeypatch):
    from swarm_runtime.models import allocator

    calls = []

    class Libc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

    monkeypatch.setattr(allocator, "_done", [])
    monkeypatch.setattr(allocator, "_glibc", lambda: Libc())
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert allocator.fix_mmap_threshold() and allocator.fix_mmap_threshold()
    assert calls == [(allocator.M_MMAP_THRESHOLD, 131072)]  # once per process
    monkeypatch.setattr(allocator, "_done", [])
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert not allocator.fix_mmap_threshold() and len(calls) == 1  # the user's own threshold stands
    monkeypatch.setattr(allocator, "_done", [])
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    monkeypatch.setattr(allocator, "_glibc", lambda: None)
    assert not allocator.fix_mmap_threshold()  # not glibc: nothing to set


def test_glibc_is_found_on_linux():
    import platform

    from swarm_runtime.models.allocator import _glibc

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("not a glibc system")
    assert _glibc() is not None
