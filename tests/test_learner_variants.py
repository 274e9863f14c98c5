"""Learner-actor variants on a local Ray bound to 127.0.0.1, each a real ``swarm run`` against its in-process twin:
LoRA adapters on a bf16 base sharded by FSDP2 (``train.engine=fsdp``: the base frozen in bf16, the fp32 adapters
trained as they are, learn/sharded.py: ``lora_units``), a rank killed during the SFT cold start and restarted; two bases
(``model.bases``) on two learner actors. Without Ray: the sharded LoRA learner's updates on fixed samples and pairs,
and a restarted rank of a LoRA learner given its trained base."""

from pathlib import Path

import pytest

from tests.conftest import compare_evals, compare_on_same_inputs, in_process_twin, run_eval, run_rows, swarm
from tests.test_bases import SMALL
from tests.test_learner_actors import LORA_RUN as ACTORS_LORA_RUN
from tests.test_learner_actors import (
    RAY_ARGS,
    _killed_run,
    _same_sft_checkpoint,
    _sft_ran_on_the_learners,
    fixed_samples,
)
from tests.test_sharded_learners import FSDP, LOGP_GAPS, LORA_RUN, _resumed_under_local

#: test_sharded_learners' LoRA run (2 updates: action, bid) on a bf16 base, a checkpoint after each update
LORA_BF16 = [*LORA_RUN, "hardware.dtype=bfloat16", "checkpoint_every=1"]


#: relative tolerance of a bf16 run's metric against the in-process run's, and the absolute one of a gap of two
#: log-probs (test_sharded_learners' ``LOGP_GAPS``: ``mismatch/*`` is 0 in process, where the sampler is the learner).
#: Measured (docs/reference/cluster.md): bf16 sums in another order (each rank's share of the rows, FSDP's units) move the
#: gradient norms by up to 8.8e-4 relative and the log-probs by up to 5.7e-5; once an update has moved two copies'
#: weights a rounding apart, a bf16 logit can round the other way: a log-prob moves by a bf16 step (1.6e-2 at 2 to 4;
#: measured 3.4e-3 on ``charts/bid_ref_logodds_*`` after one action update)
BF16_TOL, BF16_LOGP = 1e-2, 2e-2


def _near(got: dict, exp: dict, tol: float = BF16_TOL) -> None:
    """Row ``got`` as ``exp`` (the same keys, the same non-float values), floats within ``tol`` relative (gaps of
    log-probs within :data:`BF16_LOGP` absolute); every difference printed (the measurement of the tolerance) before
    the first one out of bounds fails."""
    assert set(got) == set(exp), set(got) ^ set(exp)
    bad = []
    for k, v in exp.items():
        if isinstance(v, float) and got[k] != v:
            gap = k.startswith(LOGP_GAPS)
            rel = abs(got[k] - v) / max(abs(v), 1e-30)
            print(f"step {exp.get('step')} {k}: {got[k]!r} vs {v!r}, rel {rel:.2g}, abs {abs(got[k] - v):.2g}")
            if got[k] != pytest.approx(v, rel=0 if gap else tol, abs=BF16_LOGP if gap else 1e-9):
                bad.append((exp.get("step"), k, got[k], v))
        elif got[k] != v:
            bad.append((exp.get("step"), k, got[k], v))
    assert not bad, bad


def same_as_bf16(run: Path, twin: Path, start: int = 0, close=_near) -> None:
    """``run``'s metrics.jsonl and eval.json against ``twin``'s (bf16, another order of sums) from their common state
    after update ``start``: the first update after it on the same samples or pairs within ``close``'s tolerance, the
    later rows by their shape only, the trained policy's evaluation by its keys and counts (tests/conftest.py
    ``compare_on_same_inputs`` without ``agree``: in bf16 the weights a rounding apart may draw other episodes)."""
    apart = compare_on_same_inputs(run_rows(run), run_rows(twin), close, start=start, agree=False)
    compare_evals(run_eval(run), run_eval(twin), trained_apart=apart is not None)


@pytest.fixture(scope="module")
def lora_bf16(tmp_path_factory):
    return in_process_twin(tmp_path_factory, *LORA_BF16)


@pytest.mark.ray
@pytest.mark.slow
def test_lora_on_a_bf16_base_sharded_with_a_rank_killed_during_sft_redoes_it_as_in_process_and_resumes_under_local(
    lora_bf16, ray_head, tmp_path
):
    """kill -9 of the last rank of the (LoRA, bf16 base) learner while the SFT cold start runs on its ranks (each its
    own full copy, before the group forms): Ray restarts both ranks (``cluster.learner_restarts`` allows it), they do
    the SFT again from the weights they were made with and then form their group, and the same ``swarm run`` goes on:
    one learner (the bf16 base with its 3 roles' fp32 adapters) of 2 FSDP2 ranks, each LoRA layer's base Linear and its
    adapters units of their own dtype. Its SFT and the action update on the SFT weights' samples are the in-process
    run's (within the bf16 tolerance, :func:`same_as_bf16`); its checkpoint after update 1 (no masters: the adapters
    are fp32) resumes under ``train.engine=local``, where the bid update on the sharded run's pairs gives the sharded
    run's metrics. (One run for what a plain sharded bf16 LoRA run and one killed during SFT each checked.)"""
    import re

    r = _killed_run(tmp_path, 1, kill_in="sft", run=(*LORA_BF16, *FSDP), head=ray_head)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "KILLS 1" in r.stderr and r.stderr.count("restarted: pid") == 1, r.stderr[-3000:]
    again = re.findall(r"learner (\S+) lost during the SFT cold start: its SFT runs again", r.stderr)
    assert again == ["base-default"], again
    assert "learners on Ray: 1" in r.stderr and "2 ranks each (fsdp)" in r.stderr
    learner_of = {"Logger": "base-default", "Miner": "base-default", "Smith": "base-default"}
    _sft_ran_on_the_learners(r.stderr, learner_of, restarted=("base-default",))
    assert "learners sharded after their SFT: 2 ranks each (fsdp)" in r.stderr
    assert r.stderr.index("restarted: pid") < r.stderr.index("learners sharded after their SFT")  # joined after
    updates = [u for u in run_rows(tmp_path / "run") if "kind" in u]
    assert [u["kind"] for u in updates] == ["action", "bid"]
    assert any(updates[0].get(f"charts/grad_norm_{r}", 0) > 0 for r in ("Logger", "Miner", "Smith"))
    same_as_bf16(tmp_path / "run", lora_bf16)
    # its checkpoint after update 1 (adapters written by the driver, optimizer state gathered from the shards)
    # resumes in process and plays update 2 on the pairs the sharded run drew from the same weights
    run2 = _resumed_under_local(tmp_path, "iter-000001")
    assert [u["kind"] for u in run_rows(run2) if "kind" in u] == ["action", "bid"]
    same_as_bf16(run2, tmp_path / "run", start=1)


#: test_learner_actors' LoRA run with Smith's adapter on a second, smaller base (tests/test_bases.py)
TWO_BASES = [*ACTORS_LORA_RUN, *SMALL]


@pytest.mark.ray
@pytest.mark.slow
def test_two_bases_on_two_learner_actors_run_as_in_process(tmp_path_factory, ray_head, tmp_path):
    """``model.bases``: one learner actor per base (Logger and Miner's adapters on the default base, Smith's on
    ``small``), each base's SFT (the shared base, then its adapters) on its own learner, before RL: metrics.jsonl
    (sft/* rows included), eval.json and the SFT checkpoint (the adapters and the trained bases) equal the in-process
    run's."""
    here = in_process_twin(tmp_path_factory, *TWO_BASES)
    r = swarm(
        "run", *TWO_BASES, *RAY_ARGS, *ray_head.args, f"run_dir={tmp_path / 'run'}", cwd=tmp_path, env=ray_head.env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "learners on Ray: 2" in r.stderr, r.stderr[-3000:]
    _sft_ran_on_the_learners(r.stderr, {"Logger": "base-default", "Miner": "base-default", "Smith": "base-small"})
    rows = run_rows(tmp_path / "run")
    bases = sorted(k for row in rows for k in row if k.startswith("sft/loss_base"))
    assert len(bases) == 2, bases  # each base's own SFT
    assert rows == run_rows(here)
    assert run_eval(tmp_path / "run") == run_eval(here)
    _same_sft_checkpoint(tmp_path / "run", here)


def test_a_sharded_learner_lost_during_sft_restarts_its_ranks_unjoined_and_keeps_the_others_answers():
    """No Ray: ``ShardedLearnerGroup._get`` with Ray's calls faked. Rank 1 of learner ``a`` lost while the SFT cold
    start runs (the ranks not joined yet): its other rank is killed, both are waited for from new processes, no group
    is formed, later calls name the new pids, and ``LearnerLost`` carries learner ``b``'s answer (so that
    ``LearnerGroup.sft`` asks ``a`` alone again). After the ranks joined, the same loss forms ``a``'s group again; with
    its restarts used up it is ``LearnerGone``. Milliseconds."""
    from types import SimpleNamespace

    from swarm_runtime.cluster.learners import LearnerGone, LearnerLost
    from swarm_runtime.cluster.sharded_learners import ShardedLearnerGroup

    class ActorDied(Exception):
        pass

    def get(ref, timeout=None):
        if isinstance(answers[ref], Exception):
            raise answers[ref]
        return answers[ref]

    killed, joins = [], []
    ray = SimpleNamespace(
        exceptions=SimpleNamespace(RayActorError=ActorDied, RayTaskError=KeyError, RayError=Exception),
        wait=lambda refs, num_returns: (refs[:num_returns], refs[num_returns:]),
        get=get,
        kill=lambda actor, no_restart: killed.append((actor, no_restart)),
    )
    g = object.__new__(ShardedLearnerGroup)
    g.__dict__.update(
        ray=ray,
        ranks={"a": ["A0", "A1"], "b": ["B0", "B1"]},
        rank_pids={"a": [10, 11], "b": [20, 21]},
        pids={"a": 10, "b": 20},
        roles={"a": ["Logger"], "b": ["Miner"]},
        restarts={"a": 0, "b": 0},
        max_restarts=2,
        restart_wait_s=5.0,
        _unjoined=True,
    )
    restarted = iter([30, 31, 40, 41])
    g.await_restart = lambda actor, old, timeout: next(restarted)

    def join(*names):  # as ShardedLearnerGroup._join: the group formed, the ranks' pids as they answer
        joins.append(names)
        g.rank_pids[names[-1]] = [50, 51]
        return [50, 51]

    g._join = join
    g.kill = lambda actors: killed.append(("for good", list(actors)))
    answers = {"a0": {"a": 1}, "a1": ActorDied(), "b0": {"b": 2}, "b1": {}}
    refs = {"a": ["a0", "a1"], "b": ["b0", "b1"]}
    with pytest.raises(LearnerLost) as lost:
        g._get(refs)
    assert (lost.value.name, lost.value.pid, lost.value.new_pid) == ("a", 11, 31)
    assert lost.value.answered == {"b": {"b": 2}}
    assert killed == [("A0", False)] and joins == []
    assert g.rank_pids == {"a": [30, 31], "b": [20, 21]} and g.pids["a"] == 30 and g.restarts["a"] == 1
    answers["a1"] = {}
    assert g._get(refs) == {"a": {"a": 1}, "b": {"b": 2}}  # every rank answered: rank 0's answer per learner
    g._unjoined, answers["a1"] = False, ActorDied()
    with pytest.raises(LearnerLost):
        g._get(refs)
    assert joins == [("a",)] and g.rank_pids["a"] == [50, 51] and g.pids["a"] == 50 and g.restarts["a"] == 2
    with pytest.raises(LearnerGone, match="cluster.learner_restarts=2"):
        g._get(refs)
    assert killed[-1] == ("for good", ["A0", "A1"])


def _rank_loads(rank, world, port, name, group, agents, make, states, out):
    """Rank ``rank`` of a LoRA learner (``ShardWorker`` without Ray, as a restarted rank: made with the untrained
    base) joins its group and loads ``states``; rank 0 saves the base weights gathered from the shards."""
    import torch
    import torch.distributed as dist

    from swarm_runtime.cluster.shards import ShardWorker
    from swarm_runtime.learn.sharded import full_params

    torch.set_num_threads(1)
    w = ShardWorker(name, rank, world, group, agents, make)
    w.join("127.0.0.1", port)
    try:
        w.load(states)
        shared = next(iter(group.values())).shared_base
        base = [t.cpu() for t in full_params(shared.model, shared.base_params())]
        if rank == 0:
            torch.save(base, out)
    finally:
        dist.destroy_process_group()


def test_a_restarted_sharded_lora_learner_loads_the_trained_base(registry, tmp_path):
    """A rank of a LoRA learner restarted after the SFT cold start is made with the untrained base; the rewind's
    ``load`` carries the trained base (``learner.trained_bases``) and the ranks shard it (ShardWorker.load ignored it
    before: the rewound run went on with the untrained base). 2 forked gloo ranks, no Ray."""
    import functools

    import torch
    import torch.multiprocessing as mp

    from swarm_runtime.cluster.learners import learner_groups, params_of, trained_bases
    from swarm_runtime.learn.mpt import optimizer_settings, role_optimizers
    from swarm_runtime.learn.sharded import free_port
    from tests.conftest import run_context

    ctx = run_context(registry, "domain=minecraft", "task=wooden_pickaxe", "model.adapter=lora")
    (agents, trained), (_, fresh) = ctx.build_swarm(), ctx.build_swarm()
    shared = next(iter(trained.values())).shared_base
    with torch.no_grad():  # as the SFT of the base would: every base weight moved
        for i, p in enumerate(shared.base_params()):
            p.add_(0.01 * (i + 1))
    want = [t.clone() for t in shared.base_params()]
    base = trained_bases(trained)
    states = {
        r: {"params": params_of(p), "state": {}, **({"base": base[r]} if r in base else {})} for r, p in trained.items()
    }
    ((name, group),) = learner_groups(fresh).items()
    assert not torch.equal(next(iter(group.values())).shared_base.base_params()[0], want[0])
    make = functools.partial(role_optimizers, settings=optimizer_settings(ctx.cfg))
    out = str(tmp_path / "base.pt")
    args = (2, free_port(), name, group, [(a.name, a.role) for a in agents], make, states, out)
    mp.start_processes(_rank_loads, args=args, nprocs=2, join=True, start_method="fork")
    got = torch.load(out, weights_only=False)
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


def _rank_updates(rank, world, port, name, group, agents, make, reference, steps, out):
    """Rank ``rank`` of a learner of ``world`` (``ShardWorker``, the actor's class, without Ray) with ``reference``
    (its frozen reference policies) joins its gloo group and takes ``steps`` (``(fn, kind, payload, kwargs)``) in
    order; rank 0 saves its answers."""
    import torch
    import torch.distributed as dist

    from swarm_runtime.cluster.shards import ShardWorker

    torch.set_num_threads(1)
    w = ShardWorker(name, rank, world, group, agents, make)
    w.set_reference(reference)
    w.join("127.0.0.1", port)
    try:
        answers = [w.update(*step) for step in steps]
        if rank == 0:
            torch.save(answers, out)
    finally:
        dist.destroy_process_group()


def test_lora_on_a_bf16_base_sharded_takes_the_in_process_action_and_bid_updates_on_the_same_samples_and_pairs(
    registry, tmp_path
):
    """The learner of a bf16 base with its 3 roles' fp32 LoRA adapters as 2 forked gloo ranks of ``ShardWorker``
    (FSDP2, no Ray) against ``LearnerWorker`` in process, on fixed inputs: an action update of 8 samples (minibatch 3:
    a rank pads) with the KL to the reference, then a bid update on decisive pairs of every agent against the
    reference (``algo.bid_reference=sft``; one tie, dropped). The metrics are the in-process ones within the bf16
    tolerance (:func:`_near`), and the adapters after both updates are within a fraction of their move. A whole run
    compares the bid update only where its rollouts drew the same pairs (:func:`same_as_bf16`), which in bf16 depends
    on the machine's rounding; here the pairs are given."""
    import copy
    import functools

    import torch
    import torch.multiprocessing as mp

    from swarm_runtime.cluster.learners import LearnerWorker, learner_groups
    from swarm_runtime.learn.action import action_update
    from swarm_runtime.learn.bid import BranchPair, bid_update
    from swarm_runtime.learn.mpt import optimizer_settings, role_optimizers
    from swarm_runtime.learn.sharded import free_port
    from tests.conftest import run_context

    ctx = run_context(
        registry, "domain=minecraft", "task=wooden_pickaxe", "model.adapter=lora", "hardware.dtype=bfloat16"
    )
    (agents, policies), (_, copies) = ctx.build_swarm(), ctx.build_swarm()
    ((name, group),) = learner_groups(copies).items()
    assert {p.dtype for p in group["Logger"].shared_base.base_params()} == {torch.bfloat16}
    reference = copy.deepcopy(policies)
    for policy in reference.values():
        policy.eval()
        for p in policy.parameters():
            p.requires_grad_(False)
    make = functools.partial(role_optimizers, settings=optimizer_settings(ctx.cfg))
    samples = fixed_samples(agents)
    high, low = agents[0].policy.bid_target(0.8), agents[0].policy.bid_target(0.2)
    pairs = [
        BranchPair(a % 3, f"you are {agents[a % 3].role} . goal wooden_pickaxe . bid {a}", high, low, o, b)
        for a, (o, b) in enumerate([(1.0, 0.0), (0.0, 1.0), (1.0, 0.0), (0.0, 2.0), (1.0, 1.0), (2.0, 0.0)])
    ]
    steps = [
        (action_update, "action", samples, dict(reward_scale=10.0, minibatch=3, grad_clip=1.0, kl_coef=0.1,
                                                behaviour=None, is_cap=None, reference=True)),
        (bid_update, "bid", pairs, dict(minibatch=2, grad_clip=1.0, pair_weight="uniform", reference=True, beta=1.0,
                                         is_cap=None)),
    ]  # fmt: skip
    named = [(a.name, a.role) for a in agents]
    one = LearnerWorker(name, policies, named, make, reference=reference)
    want = [one.update(*step) for step in steps]
    assert want[1]["metrics"]["charts/bid_pairs"] == 5 and all(f"losses/bid_{r}" in want[1]["metrics"] for r in group)

    out = str(tmp_path / "rank0.pt")
    args = (2, free_port(), name, group, named, make, reference, steps, out)
    mp.start_processes(_rank_updates, args=args, nprocs=2, join=True, start_method="fork")
    got = torch.load(out, weights_only=False)
    for g, w in zip(got, want):
        _near(g["metrics"], w["metrics"])
        assert g["lrs"] == w["lrs"] and set(g["params"]) == set(w["params"]) == set(group)
    diff = moved = 0.0  # squared L2 norms over every adapter: the two updates' difference, and their move
    for role, p in policies.items():
        ours, start = got[-1]["params"][role], [q.detach() for q in reference[role].parameters()]
        mine = [q.detach() for q in p.parameters()]
        diff += sum(float((a - b).square().sum()) for a, b in zip(ours, mine))
        moved += sum(float((a - b).square().sum()) for a, b in zip(mine, start))
    print(
        f"lora on a bf16 base, 2 ranks vs 1 process: adapters {diff**0.5:.3g} apart (L2) after moving {moved**0.5:.3g}"
    )
    # AdamW steps an element whose gradient differs at bf16's resolution by up to its whole step: the largest
    # element differs as much as it moved, the whole update does not
    assert moved > 0 and diff**0.5 < 0.1 * moved**0.5
