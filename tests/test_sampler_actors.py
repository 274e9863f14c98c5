"""Sampler actors (``cluster.samplers=ray``, swarm_runtime/cluster/samplers.py): the actor's body in process, then on
a local Ray bound to 127.0.0.1: a real ``swarm run`` whose bids and actions are drawn in a sampler actor writes the
same metrics.jsonl and eval.json as in process, also when the actor's process is killed with kill -9 in the middle
of its calls; with its restarts spent, one line and a run that resumes from its last checkpoint."""

import os
import textwrap

import pytest

from tests.conftest import TINY_RUN, in_process_twin, patched_swarm, run_eval, run_rows, swarm

#: The tiny run, checkpointed after each update. Its episodes earn no reward, so its updates barely move what the
#: models draw: that a restarted actor gets the synced weights is checked by
#: test_a_restarted_actor_is_loaded_with_the_synced_weights (log-probs), not by these runs' metrics.
ARGS = [*TINY_RUN, "checkpoint_every=1"]
RAY_ARGS = ["cluster.kind=ray", "cluster.env_workers=1", "cluster.num_cpus=2", "cluster.samplers=ray"]


def _policies():
    """Two tiny policies on one FLOP counter (model name -> policy)."""
    from omegaconf import OmegaConf

    from swarm_runtime.models.flops import FlopCounter
    from swarm_runtime.models.tokenizer import build_tokenizer
    from swarm_runtime.models.transformers_backend import TransformersPolicy, build_tiny_model

    levels = [0.0, 0.5, 1.0]
    tok = build_tokenizer(["chop", "tree", "craft", "planks"], levels)
    flops = FlopCounter()
    shape = {"hidden_size": 16, "intermediate_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1}
    cfg = OmegaConf.create({**shape, "max_positions": 64})
    return {
        m: TransformersPolicy(build_tiny_model(len(tok), cfg, s), tok, levels, seed=s, flops=flops)
        for m, s in (("A", 1), ("B", 2))
    }


def _sample_rows():
    from swarm_runtime.core.protocols import Row

    return [Row("A", "chop tree"), Row("B", "craft planks"), Row("A", "tree")]


def _move(policy, by: float) -> None:
    import torch

    with torch.no_grad():
        for p in policy.parameters():
            p.add_(by)


def test_the_worker_draws_what_the_trainer_would_and_hands_back_its_state():
    """SamplerWorker on a pickled copy of two policies: the same actions and bids as the originals from the same
    generator state and temperature, the generator state after the call equal to the originals', the forwards'
    FLOPs logged for the trainer's counter, and a call from a trainer that synced more often answered lost."""
    import pickle

    import torch

    from swarm_runtime.cluster.learners import copy_params, params_of
    from swarm_runtime.cluster.samplers import LOST, SamplerWorker, flop_counters, sampling_state
    from swarm_runtime.sampling.local import LocalSampler

    policies, rows = _policies(), _sample_rows()
    flops = policies["A"].flops
    worker = SamplerWorker(pickle.dumps((policies, flop_counters(policies), LocalSampler)), 1)
    policies["B"].temperature = 0.7
    ok, (out, after, log) = worker.call("act", 0, rows, sampling_state(policies))
    want = LocalSampler(policies).act(rows)
    assert ok and [r.tokens for r in out] == [r.tokens for r in want]
    assert [r.logprobs for r in out] == [r.logprobs for r in want]
    assert all(torch.equal(after[m], policies[m].rng_state()) for m in policies)
    assert log and all(i == 0 for i, _, _ in log)
    assert sum(2.0 * n * t for _, n, t in log) == flops.by_category["rollout"]  # the forwards, counted once each
    _move(policies["A"], 0.5)
    assert worker.call("bid", 1, rows, sampling_state(policies)) == LOST  # the trainer synced; the actor did not
    copy_params(worker.policies["A"], params_of(policies["A"]))
    worker.synced = 1
    ok, (bids, _, _) = worker.call("bid", 1, rows, sampling_state(policies))
    assert ok and [b.level for b in bids] == [b.level for b in LocalSampler(policies).bid(rows)]


@pytest.mark.ray
def test_a_restarted_actor_is_loaded_with_the_synced_weights():
    """On a local Ray: a sync moves model A far, the actor's process is killed (SIGKILL) between two calls, and the
    next call finds the restarted actor behind, loads it with A's synced weights and answers what the trainer's
    policies draw, with the learner's versions."""
    import signal

    pytest.importorskip("ray")
    from swarm_runtime.cluster.samplers import RaySampler, sampling_state, set_sampling_state
    from swarm_runtime.sampling.local import LocalLearner, LocalSampler

    policies, rows = _policies(), _sample_rows()
    learner = LocalLearner(policies)
    sampler = RaySampler(learner, LocalSampler, num_cpus=2)
    try:
        sampler.act(rows)
        _move(policies["A"], 0.5)
        learner.bump(["A"])
        sampler.sync(learner, ["A"])
        os.kill(sampler.pid, signal.SIGKILL)
        state = sampling_state(policies)
        got = sampler.act(rows)
        set_sampling_state(policies, state)
        want = LocalSampler(policies).act(rows)
        assert [r.tokens for r in got] == [r.tokens for r in want]
        assert [r.logprobs for r in got] == [r.logprobs for r in want]  # A's moved weights (its tokens may agree)
        assert [r.version for r in got] == [1, 0, 1]
        assert sampler.restarts == 1
    finally:
        sampler.close()


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    """TINY_RUN in process: the session's ``tiny_run`` (``in_process_twin``); ARGS' metrics and eval.json are its
    (checkpoint_every=1 changes no number: measured equal)."""
    return in_process_twin(tmp_path_factory, *TINY_RUN)


@pytest.mark.ray
@pytest.mark.slow
def test_a_sampler_actor_writes_the_same_metrics_and_eval(in_process, ray_head, tmp_path):
    r = swarm("run", *ARGS, *RAY_ARGS, *ray_head.args, f"run_dir={tmp_path / 'run'}", cwd=tmp_path, env=ray_head.env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "sampler actor on Ray: pid" in r.stderr
    closed = next(line for line in r.stderr.splitlines() if "sampler actor closed" in line)
    assert "'restarts': 0" in closed and "'calls': 0" not in closed
    assert run_rows(tmp_path / "run") == run_rows(in_process) and len(run_rows(in_process)) >= 3
    assert run_eval(tmp_path / "run") == run_eval(in_process)


#: An actor body that kills its own process (kill -9) in the middle of chosen calls, after it has sampled (its
#: generators moved) and before it answers; a file counts the calls across restarts. Its ``COUNT`` (the file) and
#: ``KILL_AT`` are written above it (:func:`_killed_run`): an actor of a Ray the run joins does not see the run's
#: environment (its workers get the head's).
KILLING_WORKER = textwrap.dedent("""
    import os, signal
    from pathlib import Path
    from swarm_runtime.cluster.samplers import SamplerWorker

    class KillingWorker(SamplerWorker):
        def call(self, method, synced, rows, state):
            answer = super().call(method, synced, rows, state)
            count = Path(COUNT)
            n = int(count.read_text()) + 1 if count.exists() else 1
            count.write_text(str(n))
            if n in {int(k) for k in KILL_AT.split(",")}:
                with open(COUNT + ".kills", "a") as f:
                    f.write(f"{n}:{self.synced}\\n")  # the call's number, the syncs the actor had taken
                os.kill(os.getpid(), signal.SIGKILL)
            return answer
""")

DRIVER = textwrap.dedent("""
    import sys
    from swarm_runtime.cluster import samplers as sampler
    from killing_worker import KillingWorker
    sampler.SamplerWorker = KillingWorker
    from swarm_runtime.cli.main import main
    sys.exit(main(sys.argv[1:]))
""")


def _killed_run(tmp_path, kill_at: str, head, *args: str):
    """``swarm run`` (ARGS, RAY_ARGS, ``args``) joining Ray ``head``, its sampler actor killed in calls ``kill_at``
    (:data:`KILLING_WORKER`): the result and the kills as ``call:syncs``."""
    count = tmp_path / "calls"
    (tmp_path / "killing_worker.py").write_text(f"COUNT, KILL_AT = {str(count)!r}, {kill_at!r}\n" + KILLING_WORKER)
    (tmp_path / "driver.py").write_text(DRIVER)
    r = patched_swarm(
        tmp_path / "driver.py",
        "run",
        *ARGS,
        *RAY_ARGS,
        *args,
        *head.args,
        cwd=tmp_path,
        paths=[tmp_path],  # the actor imports the killing body too
        env=head.env,
    )
    kills = (tmp_path / "calls.kills").read_text().split() if (tmp_path / "calls.kills").exists() else []
    return r, kills


@pytest.mark.ray
@pytest.mark.slow
def test_a_sampler_actor_killed_mid_call_is_restarted_reloaded_and_the_call_retried(in_process, ray_head, tmp_path):
    """kill -9 of the sampler actor inside its 5th call (the evaluation after SFT: no sync yet), its 100th and its
    150th (after syncs: the restarted actor must be loaded with the synced weights, and the retried call draw with
    the generator state it was first sent): metrics.jsonl and eval.json equal the unkilled in-process run's."""
    r, kills = _killed_run(tmp_path, "5,100,150", ray_head, f"run_dir={tmp_path / 'run'}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert [k.split(":")[0] for k in kills] == ["5", "100", "150"]
    assert kills[0] == "5:0" and all(int(k.split(":")[1]) >= 1 for k in kills[1:])  # two kills after syncs
    assert r.stderr.count("sampler actor restarted: pid") == 3
    closed = next(line for line in r.stderr.splitlines() if "sampler actor closed" in line)
    assert "'restarts': 3" in closed and "'retried': 3" in closed
    assert run_rows(tmp_path / "run") == run_rows(in_process)  # no episode lost or counted twice
    assert run_eval(tmp_path / "run") == run_eval(in_process)


@pytest.mark.ray
@pytest.mark.slow
def test_restarts_spent_is_one_line_and_the_run_resumes_from_its_checkpoint(in_process, ray_head, tmp_path):
    """cluster.sampler_restarts=0 and the actor killed in the second update's rollout: exit 2 with one line that
    says to resume; ``resume=true`` (samplers in process) then finishes the run with the in-process numbers."""
    run = tmp_path / "run"
    r, kills = _killed_run(tmp_path, "120", ray_head, "cluster.sampler_restarts=0", f"run_dir={run}")
    assert [k.split(":")[0] for k in kills] == ["120"]
    assert r.returncode == 2 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("swarm: error: the sampler actor died and its restarts are spent"), last
    assert f"swarm run run_dir={run} resume=true" in last  # the exact command (it said "resume=true" alone before)
    r = swarm("run", f"run_dir={run}", "resume=true", "cluster.kind=local", "cluster.samplers=local", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert run_rows(run) == run_rows(in_process)
    assert run_eval(run) == run_eval(in_process)


ENGINE_RAY = ["model.adapter=lora", "rollout.engine=vllm", "cluster.kind=ray", "cluster.samplers=ray"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["cluster.samplers=gpu"], ["cluster.samplers", "local, ray"]),
        (["cluster.samplers=ray"], ["cluster.samplers=ray needs cluster.kind=ray", "cluster.kind=local"]),
        (["cluster.sampler_restarts=-1"], ["cluster.sampler_restarts", "0"]),
        (
            ["model.adapter=lora", "rollout.engine=openai", "cluster.kind=ray", "cluster.samplers=ray"],
            ["rollout.engine=openai", "not the run's to place", "rollout.engine=vllm", "cluster.samplers=local"],
        ),
        (  # the sampler actor of in-process policies cannot play ahead (docs/reference/cluster.md, "Staleness")
            ["rollout.max_staleness=1", "cluster.kind=ray", "cluster.samplers=ray"],
            ["rollout.max_staleness=1", "rollout.engine=local", "FLOPs", "rollout.engine=vllm"],
        ),
        (["cluster.sampler_replicas=0"], ["cluster.sampler_replicas=0", "[1, 1024] or per_node"]),
        (["cluster.sampler_replicas=two"], ["cluster.sampler_replicas='two'", "[1, 1024] or per_node"]),
        (  # replicas are engine sampler actors (sampling/replicas.py)
            ["cluster.sampler_replicas=2"],
            ["needs cluster.samplers=ray and rollout.engine=vllm", "not cluster.samplers=local", "replicas=1"],
        ),
        (
            [*ENGINE_RAY, "cluster.sampler_replicas=per_node", "cluster.placement=split"],
            ["sampler_replicas=per_node with cluster.placement=split", "valid: cluster.placement=none"],
        ),
        (  # the parallel sizes are the GPUs each engine actor asks Ray for (placement.py, server_gpus)
            [*ENGINE_RAY, "rollout.vllm.args=[-tp=x]"],
            ["rollout.vllm.args: --tensor-parallel-size (-tp) 'x' is not valid", "a positive integer"],
        ),
    ],
)
def test_bad_sampler_keys_are_refused(args, words, tmp_path):
    r = swarm("run", *TINY_RUN, *args, f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert all(w in last for w in words), last
