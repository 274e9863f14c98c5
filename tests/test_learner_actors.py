"""Learner actors (``cluster.learners=ray``, swarm_runtime/cluster/learners.py) on a local Ray bound to 127.0.0.1: a
real ``swarm run`` writes the same metrics.jsonl and eval.json as in process; a learner killed with kill -9 in the
middle of an update is restarted, the run rewinds to its last checkpoint and ends with the unkilled run's metrics
and eval; with its restarts used up the run stops with one line naming what was lost and how to resume; bad input
is one line and exit 2."""

import textwrap

import pytest

from tests.conftest import TINY_RUN, in_process_twin, patched_swarm, run_eval, run_rows, swarm

RAY_ARGS = ["cluster.kind=ray", "cluster.env_workers=2", "cluster.num_cpus=2", "cluster.learners=ray"]
#: TINY_RUN with SFT long enough for bid pairs, 3 updates (action, bid, action) and the reference policies in both
#: updates (the third's KL penalty differs per sample, so its advantages and gradients are not zero)
RUN = [*TINY_RUN, "algo.sft.epochs=12", "algo.iterations=3", "algo.kl_coef=0.1", "algo.bid_reference=sft"]


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    """RUN in process, with a checkpoint after every update: tests/test_sharded_learners.py's and
    test_deepspeed_learners.py's twin, computed once for all three (``in_process_twin``); its metrics, eval.json, SFT
    checkpoint and iter-000003 are RUN's (checkpoints change no number: measured equal)."""
    return in_process_twin(tmp_path_factory, *RUN, "checkpoint_every=1")


def _sft_ran_on_the_learners(log: str, learner_of: dict, restarted: tuple = ()) -> None:
    """The run's log says the learner actors started before SFT and that each role's SFT ran on its learner, in the
    process (pid) that the learner's start named, not the driver's (a learner of ``restarted``: in the process Ray
    restarted it as)."""
    import re

    lines = log.splitlines()
    start = next(i for i, line in enumerate(lines) if "learners on Ray:" in line)
    pids = dict(re.findall(r"([\w-]+): [\w+]+ pid (\d+)", lines[start]))
    for name in restarted:
        old, new = re.search(rf"learner {name} restarted: pid (\d+) -> (\d+)", log).groups()
        assert old == pids[name] and new != old, (name, old, new, pids)
        pids[name] = new
    first_sft = next(i for i, line in enumerate(lines) if re.search(r"SFT (shared )?\w+: \d+ examples", line))
    assert start < first_sft, "the learners started after SFT"
    ran = dict(re.findall(r"SFT of [\w+]+ ran on learner (\S+) \(pid (\d+)\)", log))
    assert ran == {n: pids[n] for n in set(learner_of.values())}, (ran, pids)
    for role, name in learner_of.items():
        assert re.search(rf"SFT of \S*{role}\S* ran on learner {name} ", log), role


def _same_sft_checkpoint(run, other) -> None:
    """``checkpoints/sft`` of ``run`` and ``other`` hold the same files, and every safetensors file (each role's model
    or adapter, a trained shared base) the same tensors, bit for bit: the RL start and the reference policies."""
    from safetensors.torch import load_file

    a, b = (d / "checkpoints" / "sft" for d in (run, other))
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    tensors = [f for f in files if f.suffix == ".safetensors"]
    assert tensors
    for f in tensors:
        mine, theirs = load_file(a / f), load_file(b / f)
        assert mine.keys() == theirs.keys() and all(mine[k].equal(theirs[k]) for k in mine), f


def _same_training_states(run, other, tag: str, rtol: float = 0.0) -> None:
    """Checkpoint ``tag`` of runs ``run`` and ``other``: each role's training state has the same entries, optimizer
    param groups and state keys, moments and steps (equal; ``rtol`` > 0: within it, same shape and dtype) and
    scheduler state."""
    import torch

    for role in ("Logger", "Miner", "Smith"):
        mine, theirs = (
            torch.load(d / "checkpoints" / tag / "agents" / role / "training_state.pt", weights_only=True)
            for d in (run, other)
        )
        assert list(mine) == list(theirs)
        for kind in ("action", "bid"):
            a, b = mine[f"optimizer_{kind}"], theirs[f"optimizer_{kind}"]
            assert a["param_groups"] == b["param_groups"] and a["state"].keys() == b["state"].keys()
            for k in a["state"]:
                for name, t in a["state"][k].items():
                    want = b["state"][k][name]
                    same = torch.equal(t, want) if not rtol else torch.allclose(t, want, rtol=rtol, atol=1e-9)
                    assert same and t.shape == want.shape and t.dtype == want.dtype, (role, kind, k, name)
            assert mine[f"scheduler_{kind}"] == theirs[f"scheduler_{kind}"]


#: TINY_RUN with the roles' LoRA adapters on one base (tests/test_learner_variants.py: on two learner actors)
LORA_RUN = [*TINY_RUN, "model.adapter=lora", "algo.sft.epochs=4", "algo.kl_coef=0.1", "algo.bid_reference=sft"]


KILLER = textwrap.dedent("""
    import os, signal, sys
    from swarm_runtime.cluster import learners as learner

    # the LearnerGroup calls whose n-th kills a learner: KILL_IN (update or sft) and KILL_AT, or KILL_PLAN
    # ("sft:1,update:2": each method's calls counted apart)
    PLAN = os.environ.get("KILL_PLAN") or f"{os.environ.get('KILL_IN', 'update')}:{os.environ['KILL_AT']}"
    kills = {"n": 0}

    def killing(method, at):
        call, seen = getattr(learner.LearnerGroup, method), {"n": 0}

        def killing_call(self, fn, *args):
            seen["n"] += 1
            if seen["n"] == at:  # the call is sent; kill its first learner before it answers
                get = self._get

                def get_after_kill(refs):
                    del self._get
                    name = next(iter(refs))
                    # the pid file the actor writes in the run folder (a sharded learner's: its last rank's)
                    sharded = hasattr(self, "ranks")
                    f = self._shard_pid_file(name, self.shards - 1) if sharded else self.pid_files[name]
                    pid = int(open(f).read())
                    os.kill(pid, signal.SIGKILL)
                    kills["n"] += 1
                    print(f"KILLED learner {name} pid {pid}", file=sys.stderr, flush=True)
                    return get(refs)

                self._get = get_after_kill
            return call(self, fn, *args)

        setattr(learner.LearnerGroup, method, killing_call)

    for step in PLAN.split(","):
        method, at = step.split(":")
        killing(method, int(at))
    from swarm_runtime.cli.main import main
    rc = main(sys.argv[1:])
    print(f"KILLS {kills['n']}", file=sys.stderr, flush=True)
    sys.exit(rc)
""")


def _killed_run(tmp_path, kill_at: int | str, *extra: str, run=(*RUN, *RAY_ARGS), kill_in: str = "update", head=None):
    """``swarm run`` (``run`` and ``extra``) under :data:`KILLER` (a learner killed in update ``kill_at``; ``kill_in``
    ``sft``: in the SFT cold start; ``kill_at`` a string: :data:`KILLER`'s plan, ``"sft:1,update:2"``), on a local Ray
    of its own, or joining ``head`` (a ``RayHead``)."""
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    run_dir = f"run_dir={tmp_path / 'run'}"
    plan = kill_at if isinstance(kill_at, str) else f"{kill_in}:{kill_at}"
    env = {"KILL_PLAN": plan, **(head.env if head else {})}
    joins = head.args if head else []
    return patched_swarm(script, "run", *run, *extra, *joins, run_dir, cwd=tmp_path, env=env)


def _stopped_during_sft(r, learner: str, tmp_path) -> list[str]:
    """``r``, a run whose learner ``learner`` was killed during the SFT cold start, stopped with one line naming it
    and the command that starts it again (exit 2, no checkpoint): that command's arguments (after ``swarm``)."""
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "KILLS 1" in r.stderr
    last = r.stderr.strip().splitlines()[-2]  # the last is the killer's KILLS line
    assert last.startswith(f"swarm: error: learner '{learner}' "), last
    assert f"'{learner}' lost (pid " in last or "was lost: its process (pid " in last, last
    assert "during the SFT cold start" in last and "no checkpoint yet" in last
    resume = f"swarm run run_dir={tmp_path / 'run'} resume=true"
    assert resume in last
    assert not (tmp_path / "run" / "checkpoints" / "latest").exists()
    return resume.split()[1:]


@pytest.mark.ray
@pytest.mark.slow
def test_a_learner_that_cannot_be_restarted_stops_the_run_resumably_in_its_sft_and_in_an_update(
    in_process, ray_head, tmp_path
):
    """``cluster.learner_restarts=0`` (a node lost: no restart). A learner killed while the SFT cold start runs on it:
    the run stops with one line (there is no checkpoint to rewind to) naming the learner and the command that starts
    it again; exit 2. That resume does the SFT from the start on the learners; a learner killed in its second update:
    one line naming the learner and its roles, where the run stopped and the command that resumes it; exit 2. The
    checkpoint it names (iter-000001: its optimizer state taken from the actors) resumes in process
    (``cluster.learners=local``) to the unkilled run's metrics and eval. (One run for what a run killed during SFT
    and one killed in an update, each without restarts, checked: the first's resume is the second.)"""
    killed = _killed_run(tmp_path, 1, "cluster.learner_restarts=0", "checkpoint_every=1", kill_in="sft", head=ray_head)
    assert "cluster.learner_restarts=0" in killed.stderr.strip().splitlines()[-2]
    resume = _stopped_during_sft(killed, "Logger", tmp_path)
    script, env = tmp_path / "killer.py", {"KILL_PLAN": "update:2", **ray_head.env}
    r = patched_swarm(script, *resume, *ray_head.args, cwd=tmp_path, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "KILLS 1" in r.stderr
    _sft_ran_on_the_learners(r.stderr, {"Logger": "Logger", "Miner": "Miner", "Smith": "Smith"})
    last = r.stderr.strip().splitlines()[-2]  # the last is the script's KILLS line
    assert last.startswith("swarm: error: learner "), last
    assert "cluster.learner_restarts=0" in last and "stopped at update 2" in last
    assert "its last checkpoint is iter-000001" in last
    assert " ".join(["swarm", *resume]) in last
    r = swarm(*resume, "cluster.kind=local", "cluster.learners=local", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed at phase rl iteration 1" in r.stderr
    assert run_rows(tmp_path / "run") == run_rows(in_process)
    assert run_eval(tmp_path / "run") == run_eval(in_process)


@pytest.mark.ray
@pytest.mark.slow
def test_learner_actors_killed_during_sft_and_mid_update_restart_and_write_the_same_metrics_eval_and_checkpoints(
    in_process, ray_head, tmp_path
):
    """kill -9 of a learner actor while the SFT cold start runs on it: Ray restarts it (``cluster.learner_restarts``
    allows it), it does its SFT again from the weights it was made with while the other learners' SFT is kept; then
    kill -9 of a learner actor while the second update (a bid update) is in flight: Ray restarts it, the run rewinds to
    its last checkpoint (iter-000000) inside the same ``swarm run`` and plays updates 1 and 2 again. metrics.jsonl (no
    row twice), eval.json, the SFT checkpoint and the last checkpoint's optimizer state (from the actors) equal the
    unkilled in-process run's. (One run for what a plain Ray run, one killed during SFT and one killed in an update
    each checked: the killed run's end must equal the in-process twin anyway.)"""
    import re

    r = _killed_run(tmp_path, "sft:1,update:2", head=ray_head)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "learners on Ray: 3" in r.stderr  # one per role: full copies
    assert "KILLS 2" in r.stderr and r.stderr.count("restarted: pid") == 2, r.stderr[-3000:]
    again = re.findall(r"learner (\S+) lost during the SFT cold start: its SFT runs again", r.stderr)
    assert again == ["Logger"], again
    _sft_ran_on_the_learners(r.stderr, {"Logger": "Logger", "Miner": "Miner", "Smith": "Smith"}, restarted=("Logger",))
    rewound = [line for line in r.stderr.splitlines() if "rewinding to checkpoint" in line]
    assert len(rewound) == 1 and "lost at update 2" in rewound[0] and "iter-000000" in rewound[0], rewound
    rows = run_rows(tmp_path / "run")
    updates = [row for row in rows if "kind" in row]
    assert [u["step"] for u in updates] == [1, 2, 3]  # each update once
    assert [u["kind"] for u in updates] == ["action", "bid", "action"]
    assert updates[1]["charts/bid_pairs"] > 0 and any(k.startswith("charts/bid_ref_logodds_") for k in updates[1])
    assert any(k.startswith("charts/kl_") for k in updates[2])
    assert any(updates[2].get(f"charts/grad_norm_{r}", 0) > 0 for r in ("Logger", "Miner", "Smith"))
    assert rows == run_rows(in_process)
    assert run_eval(tmp_path / "run") == run_eval(in_process)
    _same_sft_checkpoint(tmp_path / "run", in_process)
    # the last checkpoint's optimizer state came from the actors (a restarted one among them): the in-process run's
    _same_training_states(tmp_path / "run", in_process, "iter-000003")


@pytest.mark.parametrize(
    "arg, valid",
    [
        ("cluster.learners=gpu", "local, ray"),
        ("cluster.learner_restarts=-1", "0"),
        ("cluster.learners=ray", "cluster.kind=ray"),  # without cluster.kind=ray
    ],
)
def test_bad_learner_keys_are_refused(arg, valid, tmp_path):
    r = swarm("run", *TINY_RUN, arg, f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert arg.split("=")[0] in last and valid in last, last


def _swarm_pair(registry, *args):
    """Two identical swarms (the same config and seed): the trainer's and a learner's copy."""
    from tests.conftest import run_context

    ctx = run_context(registry, "domain=minecraft", "task=wooden_pickaxe", *args)
    return ctx, ctx.build_swarm(), ctx.build_swarm()


def fixed_samples(agents) -> list:
    """8 action samples ``(agent index, prompt, action tokens, credit)`` over the 3 agents, with fixed texts and
    credits: the same inputs for an update in process and on a learner."""
    texts = ["chop tree", "craft planks", "mine stone", "explore"]
    return [
        (
            i % 3,
            f"you are {agents[i % 3].role} . goal wooden_pickaxe . step {i}",
            agents[i % 3].policy.action_target(t),
            c,
        )
        for i, (t, c) in enumerate(zip(texts * 2, [3.0, -1.0, 2.0, 0.5, -2.0, 1.0, 4.0, 0.0]))
    ]


@pytest.mark.parametrize("adapter", ["none", "lora"])
def test_a_learner_worker_updates_as_in_process_and_round_trips_its_state(registry, adapter):
    """No Ray: ``LearnerWorker`` (the actor's class) runs ``action_update`` on its roles' samples with its own
    optimizers: the same metrics, weights, optimizer state and FLOPs as the update in process; its state loads into
    a fresh worker (a restarted actor) unchanged; ``learner_groups`` puts adapters of one base in one learner."""
    from functools import partial

    import torch

    from swarm_runtime.cluster.learners import (
        LearnerWorker,
        copy_params,
        learner_groups,
        params_of,
        replay_flops,
        training_state,
    )
    from swarm_runtime.learn.action import action_update
    from swarm_runtime.learn.mpt import optimizer_settings, role_optimizers
    from swarm_runtime.models.flops import FlopCounter

    ctx, (agents, policies), (_, copies) = _swarm_pair(registry, f"model.adapter={adapter}")
    groups = learner_groups(copies)
    assert list(groups) == (["base-default"] if adapter == "lora" else ["Logger", "Miner", "Smith"])
    make = partial(role_optimizers, settings=optimizer_settings(ctx.cfg))
    samples = fixed_samples(agents)
    kw = dict(reward_scale=10.0, minibatch=3, grad_clip=1.0, kl_coef=0.0, behaviour=None, is_cap=None)
    ctx.flops.category = "update"
    here = FlopCounter(category="update")
    for p in policies.values():
        p.flops = here
    opts = make(policies)
    want = action_update(agents, samples, opts["action"], reference=None, **kw)
    assert want["charts/grad_norm_Logger"] > 0
    got, there = {}, FlopCounter(category="update")
    workers = {}
    for name, g in groups.items():
        w = workers[name] = LearnerWorker(name, g, [(a.name, a.role) for a in agents], make)
        mine = [s for s in samples if agents[s[0]].role in g]
        res = w.update(action_update, "action", mine, {**kw, "reference": False})
        got.update(res["metrics"])
        replay_flops(there, res["flops"])
        assert set(res["params"]) == set(g)  # every role of this learner stepped
    assert got == want and there.by_category == here.by_category
    for role in policies:
        for a, b in zip(policies[role].parameters(), copies[role].parameters()):
            assert torch.equal(a, b)
        theirs = training_state(policies[role], {k: t[role] for k, t in opts.items()})
        w = workers[next(n for n, g in groups.items() if role in g)]
        mine = w.training_states()[role]
        assert list(mine) == list(theirs)
        assert mine["scheduler_action"] == theirs["scheduler_action"]
        for k, st in mine["optimizer_action"]["state"].items():
            assert all(torch.equal(v, theirs["optimizer_action"]["state"][k][n]) for n, v in st.items())
    # a restarted worker (fresh from the same start) takes the state: the same weights and next update
    _, fresh = ctx.build_swarm()
    name, g = next(iter(learner_groups(fresh).items()))
    w2 = LearnerWorker(name, g, [(a.name, a.role) for a in agents], make)
    first = workers[name]
    w2.load({r: {"params": params_of(first.policies[r]), "state": first.training_states()[r]} for r in g})
    mine = [s for s in samples if agents[s[0]].role in g]
    a = first.update(action_update, "action", mine, {**kw, "reference": False})
    b = w2.update(action_update, "action", mine, {**kw, "reference": False})
    assert a["metrics"] == b["metrics"] and a["lrs"] == b["lrs"]
    for r in a["params"]:
        assert all(torch.equal(x, y) for x, y in zip(a["params"][r], b["params"][r]))
    copy_params(policies[next(iter(g))], a["params"][next(iter(g))])  # the trainer's sync
    assert all(torch.equal(x, y) for x, y in zip(policies[next(iter(g))].parameters(), g[next(iter(g))].parameters()))


@pytest.mark.parametrize("adapter", ["none", "lora"])
def test_a_learner_worker_runs_the_sft_cold_start_as_in_process(registry, adapter):
    """No Ray: ``LearnerWorker.sft`` (what a learner actor runs before RL) on a copy of the swarm gives the metrics,
    FLOPs, weights and (lora) trained shared base of ``sft_units`` in process; the driver's copy takes them."""
    import random
    from functools import partial

    import torch

    from swarm_runtime.cluster.learners import LearnerWorker, copy_params, learner_groups, replay_flops
    from swarm_runtime.learn.mpt import optimizer_settings, role_optimizers, sft_units
    from swarm_runtime.learn.sft import collect_demos
    from swarm_runtime.models.flops import FlopCounter

    ctx, (agents, policies), (_, copies) = _swarm_pair(registry, f"model.adapter={adapter}", "algo.sft.epochs=2")
    demos = collect_demos(ctx.domain, ctx.task, [0, 1], rng=random.Random(0))
    seeds = {r: 5 + i for i, r in enumerate(policies)}
    settings = dict(epochs=2, lr=1e-3, lr_scale=1.0, batch_size=8, action_epochs=None, seed=5, progress=False)

    here, cuts = FlopCounter(category="sft"), []
    for p in policies.values():
        p.flops = here
    want = sft_units(policies, demos=demos, seeds=seeds, after=lambda: cuts.append(here.training_total), **settings)
    assert [u[0] for u in want] == (["base"] if adapter == "lora" else []) + ["role"] * 3 and len(cuts) == len(want)
    got = []
    for name, g in learner_groups(copies).items():
        make = partial(role_optimizers, settings=optimizer_settings(ctx.cfg))
        w = LearnerWorker(name, g, [(a.name, a.role) for a in agents], make)
        res = w.sft(sft_units, {**settings, "demos": {r: demos[r] for r in g}, "seeds": {r: seeds[r] for r in g}})
        got += res["units"]
        assert set(res["params"]) == set(g) and bool(res["bases"]) == (adapter == "lora")
    assert repr([u[:4] for u in got]) == repr(want)  # metrics equal (NaN: an accuracy with no action demos), in order
    there = FlopCounter(category="sft")
    for u in got:
        replay_flops(there, u[4])
    assert there.by_category == here.by_category and there.training_total > 0
    for role in policies:
        assert all(torch.equal(a, b) for a, b in zip(policies[role].parameters(), copies[role].parameters()))
    if adapter == "lora":
        mine, theirs = (next(iter(ps.values())).shared_base._base_params for ps in (policies, copies))
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs))
        assert not all(torch.equal(a, b) for a, b in zip(mine, ctx.build_swarm()[1]["Logger"].shared_base._base_params))
    # a restarted actor (made from its creation arguments: the untrained swarm) loaded as at RL start or after a
    # rewind holds the trained weights, the shared base included (a lora role's params_of are its adapter's only)
    from swarm_runtime.cluster.learners import params_of, trained_bases, training_state

    bases = trained_bases(policies)
    assert set(bases) == ({"Logger"} if adapter == "lora" else set())
    _, untrained = ctx.build_swarm()
    for name, g in learner_groups(untrained).items():
        w = LearnerWorker(name, g, [(a.name, a.role) for a in agents], make)
        state = {r: {"params": params_of(policies[r]), "state": training_state(policies[r], {})} for r in g}
        w.load({r: {**st, **({"base": bases[r]} if r in bases else {})} for r, st in state.items()})
        for r in g:
            assert all(torch.equal(a, b) for a, b in zip(g[r].model.parameters(), policies[r].model.parameters())), r
    # the driver's sampling copy (a fresh, untrained build) takes the trained weights
    _, fresh = ctx.build_swarm()
    copy_params(fresh["Miner"], list(copies["Miner"].parameters()))
    assert all(torch.equal(a, b) for a, b in zip(fresh["Miner"].parameters(), policies["Miner"].parameters()))


def test_learner_group_sft_redoes_only_a_lost_learners_sft_and_keeps_the_others():
    """No Ray: :meth:`LearnerGroup.sft` with its calls faked. A learner lost and restarted (``LearnerLost`` with the
    others' answers) is asked again, alone; a learner that cannot be restarted (``LearnerGone``), or a loss that kept
    no answers, ends the SFT as before. Milliseconds."""
    from swarm_runtime.cluster.learners import LearnerGone, LearnerGroup, LearnerLost

    def group(outcomes):
        g, calls = object.__new__(LearnerGroup), []
        g._call = lambda name, method, fn, kw: calls.append((name, method, kw)) or name

        def get(refs):
            out = outcomes.pop(0)
            if isinstance(out, Exception):
                raise out
            return {n: out[n] for n in refs}

        g._get = get
        return g, calls

    def lost(name, answered=None):
        exc = LearnerLost(name, 10, 11)
        exc.answered = answered
        return exc

    payloads = {"Logger": {"seeds": 1}, "Miner": {"seeds": 2}, "Smith": {"seeds": 3}}
    g, calls = group([lost("Miner", {"Logger": "L", "Smith": "S"}), {"Miner": "M"}])
    assert g.sft(None, payloads) == {"Logger": "L", "Miner": "M", "Smith": "S"}
    assert [c[0] for c in calls] == ["Logger", "Miner", "Smith", "Miner"] and calls[-1] == (
        "Miner",
        "sft",
        {"seeds": 2},
    )
    g, calls = group([lost("Miner", {"Logger": "L", "Smith": "S"}), LearnerGone("restarts used up")])
    with pytest.raises(LearnerGone, match="restarts used up"):
        g.sft(None, payloads)
    g, calls = group([lost("Miner")])  # no answers kept: stops
    with pytest.raises(LearnerLost):
        g.sft(None, payloads)
    assert len(calls) == 3
