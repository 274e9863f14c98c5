"""The engine sampler's own seed stream across a resume (docs/reference/engine.md, section 5): rows without a
common-random-numbers key (``algo.common_random_numbers=false``, the default: every training and held-out row) get
their request ``seed`` from ``OpenAISampler.rng``; its state is saved in each checkpoint's ``rng.pt`` and put back
into the sampler a resumed run makes, so a run stopped after a checkpoint and resumed draws what the uninterrupted
run draws. On any CPU: ``rollout.engine=openai`` against :mod:`refserver` (which samples with the request's seed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT, TINY_RUN
from enginekit import learner_for, on_server, start_ref

from swarm_runtime.runs.checkpoint import load_tensors
from swarm_runtime.sampling.factory import write_base

#: ``swarm run`` that counts the seeds drawn for unkeyed rows, printed at each checkpoint.
COUNTER = textwrap.dedent("""
    import sys
    from swarm_runtime.runs import checkpoint
    from swarm_runtime.sampling import openai

    unkeyed = {"n": 0}
    row_seed = openai.row_seed
    def counting(key, rng):
        unkeyed["n"] += key is None
        return row_seed(key, rng)

    save = checkpoint.save_checkpoint
    def saving(run_dir, tag, *a, **kw):
        out = save(run_dir, tag, *a, **kw)
        print(f"CHECKPOINT {tag}: {unkeyed['n']} unkeyed seeds drawn", file=sys.stderr, flush=True)
        return out

    openai.row_seed, checkpoint.save_checkpoint = counting, saving
    from swarm_runtime.cli.main import main
    sys.exit(main(sys.argv[1:]))
""")


def _rows(run) -> list[dict]:
    return [
        {k: v for k, v in json.loads(x).items() if not k.startswith("time/")}
        for x in (run / "metrics.jsonl").read_text().splitlines()
    ]


def _sampler_rng(run):
    latest = (run / "checkpoints" / "latest").read_text().strip()
    return load_tensors(run / "checkpoints" / latest / "rng.pt").get("sampler")


@pytest.mark.slow
def test_a_run_stopped_after_a_checkpoint_and_resumed_draws_the_uninterrupted_runs_seeds(registry, tmp_path):
    script = tmp_path / "counter.py"
    script.write_text(COUNTER)
    _, learner = learner_for(registry)
    base = write_base(next(iter(learner.policies.values())).shared_base, tmp_path / "base")
    server = start_ref(base, tmp_path / "ref.log")

    def run(name: str, *extra: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        small = ("algo.iterations", "tensorboard", "task.max_decisions", "algo.envs_per_step", "eval.episodes")
        args = [a for a in TINY_RUN if not a.startswith(small)]
        return subprocess.run(
            [sys.executable, str(script), "run", *args]
            + [
                "algo.iterations=2",
                "task.max_decisions=4",
                "algo.envs_per_step=1",
                "eval.episodes=1",
                "checkpoint_every=1",
                "tensorboard=false",
                *on_server(base, server.url),
                f"run_dir={tmp_path / name}",
                *extra,
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )

    try:
        whole = run("whole")
        assert whole.returncode == 0, whole.stderr[-3000:]
        # the whole run as it was right after writing iter-000001: its checkpoints and metrics rows up to there,
        # no evaluation written
        stopped = shutil.copytree(tmp_path / "whole", tmp_path / "stopped")
        for ck in (stopped / "checkpoints").glob("iter-*"):
            if ck.name > "iter-000001":
                shutil.rmtree(ck)
        (stopped / "checkpoints" / "latest").write_text("iter-000001")
        rows = json.loads((stopped / "checkpoints" / "iter-000001" / "state.json").read_text())["metrics_rows"]
        lines = (stopped / "metrics.jsonl").read_text().splitlines(keepends=True)
        assert 0 < rows < len(lines)
        (stopped / "metrics.jsonl").write_text("".join(lines[:rows]))
        for written in ("eval.json", "eval.md"):
            (stopped / written).unlink(missing_ok=True)
        resumed = run("stopped", "resume=true")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        # without the evaluation after SFT: the evaluations draw from a stream of their own (evaluate), so the
        # training rows are the same (but the FLOPs of that evaluation)
        unevaluated = run("unevaluated", "skip_sft_eval=true")
        assert unevaluated.returncode == 0, unevaluated.stderr[-3000:]
    finally:
        server.stop()
    drawn = [ln for ln in whole.stderr.splitlines() if ln.startswith("CHECKPOINT iter-000001")]
    assert drawn and int(drawn[0].split(": ")[1].split()[0]) > 0, whole.stderr[-2000:]  # unkeyed rows were drawn
    assert "resumed at phase rl iteration 1" in (tmp_path / "stopped" / "run.log").read_text()
    assert _rows(tmp_path / "stopped") == _rows(tmp_path / "whole")
    assert _sampler_rng(tmp_path / "stopped") == _sampler_rng(tmp_path / "whole") is not None
    results = [json.loads((tmp_path / r / "eval.json").read_text())["results"] for r in ("whole", "stopped")]
    assert results[0] == results[1]
    updates = [
        [{k: v for k, v in u.items() if k != "flops/eval"} for u in _rows(tmp_path / r) if "kind" in u]
        for r in ("whole", "unevaluated")
    ]
    assert len(updates[0]) == 2 and updates[1] == updates[0]
    final = [json.loads((tmp_path / r / "eval.json").read_text())["results"] for r in ("whole", "unevaluated")]
    assert final[1]["MPT"] == final[0]["MPT"], final


def test_the_sampler_generators_state_goes_through_rng_pt(tmp_path):
    """``sampler_rng_state`` / ``restore_sampler_rng`` through a checkpoint's ``rng.pt``: one engine sampler (behind
    the lock of rollouts played ahead), one per base (``RoutedSampler``), and none (in process: nothing saved)."""
    import random

    from swarm_runtime.runs.checkpoint import sampler_rng, save_rng
    from swarm_runtime.sampling.factory import RoutedSampler
    from swarm_runtime.sampling.http import Client
    from swarm_runtime.sampling.local import LocalSampler, LockedSampler
    from swarm_runtime.sampling.openai import OpenAISampler, restore_sampler_rng, row_seed, sampler_rng_state

    def sampler(seed: int) -> OpenAISampler:
        s = OpenAISampler(Client("http://127.0.0.1:9"), {}, None, seed=seed)
        s.name, s.server = "openai", None
        return s

    def draws(s, n=5):
        return [row_seed(None, s.rng) for _ in range(n)]

    one, routed = sampler(3), RoutedSampler({"default": sampler(3), "small": sampler(4)}, {})
    draws(one), draws(routed.samplers["small"], 7)
    for made, fresh in (
        (LockedSampler(one), sampler(3)),
        (routed, RoutedSampler({"default": sampler(3), "small": sampler(4)}, {})),
    ):
        save_rng(tmp_path / "rng.pt", random.Random(0), sampler_rng_state(made))
        restore_sampler_rng(LockedSampler(fresh), sampler_rng(tmp_path))
        subs = getattr(made, "samplers", None) or {"": one}
        for name, s in subs.items():
            f = fresh.samplers[name] if name else fresh
            assert draws(f) == draws(s), name
    assert draws(sampler(3)) != draws(one)  # the restored streams went on; a fresh one starts over
    save_rng(tmp_path / "rng.pt", random.Random(0), sampler_rng_state(LocalSampler({}, None)))
    assert sampler_rng(tmp_path) is None


def test_an_evaluation_on_the_engine_neither_depends_on_nor_moves_the_samplers_stream(registry, tmp_path, monkeypatch):
    """``evaluate`` with an engine sampler (refserver): its unkeyed rows' seeds are drawn from a stream seeded from the
    evaluation's seed (``sampler_rng_seeded``), as the in-process policies' generators are, so the same evaluation
    from two positions of the training stream is the same evaluation; afterwards the stream stands where it stood, so
    the training draws after an evaluation are those made without it. Before, the held-out rows drew from the training
    stream and moved it."""
    from enginekit import LORA, openai_cfg, perturb

    from swarm_runtime.evaluation.heldout import evaluate
    from swarm_runtime.sampling import openai
    from swarm_runtime.sampling.factory import engine_folder, engine_sampler
    from swarm_runtime.sampling.local import LocalLearner, model_names
    from tests.conftest import run_context

    ctx = run_context(registry, *LORA, "task.max_decisions=4")
    agents, policies = ctx.build_swarm()
    perturb(policies)
    learner = LocalLearner(policies)
    base = write_base(next(iter(policies.values())).shared_base, engine_folder(tmp_path) / "base")
    server = start_ref(base, tmp_path / "ref.log")
    unkeyed = []
    row_seed = openai.row_seed
    monkeypatch.setattr(openai, "row_seed", lambda key, rng: unkeyed.append(key is None) or row_seed(key, rng))
    s = engine_sampler(openai_cfg(ctx.cfg, server.url), learner, tmp_path)
    try:

        def held_out() -> dict:
            res, _ = evaluate(
                agents,
                ctx.coordinator(),
                ctx.domain,
                ctx.task,
                ctx.seeds("eval")[:2],
                2,
                7919,
                sampler=s,
                models=model_names(agents),
            )
            return res

        stream = openai.sampler_rng_state(s)
        first = held_out()
        assert any(unkeyed), "the evaluation drew no unkeyed row"
        assert openai.sampler_rng_state(s) == stream  # put back: training draws on as without the evaluation
        for _ in range(5):  # training draws move the stream
            openai.row_seed(None, s.rng)
        moved = openai.sampler_rng_state(s)
        assert moved != stream
        assert held_out() == first
        assert openai.sampler_rng_state(s) == moved
    finally:
        s.close()
        server.stop()
