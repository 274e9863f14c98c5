"""``rollout.max_staleness=1`` end to end on any CPU: ``swarm run ... rollout.engine=openai`` against our own serve
worker (``python -m swarm_runtime.serve.worker --enable-lora``, which speaks vLLM's token-level fields) trains with
the next update's rollout played while this one trains, each update's actions at most one update of their
model behind the learner (``charts/staleness``), compared with the learner's log-probs (``mismatch/*``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from conftest import ROOT, TINY_RUN
from enginekit import learner_for, on_server, start_worker

from swarm_runtime.sampling.factory import write_base

#: A `swarm run` whose ``_synced`` (the end of an update: the learner's new version goes to the sampler)
#: waits until the rollout of the next update has drawn actions on the rollout thread.
WAITER = textwrap.dedent("""
    import sys, threading
    from swarm_runtime.sampling import local
    from swarm_runtime.learn import mpt

    plays, drew = {"n": 0}, {}
    play = mpt.play
    def counting_play(*a, **kw):
        if threading.current_thread().name.startswith("rollout"):
            plays["n"] += 1  # the rollout thread's n-th rollout: update n - 1's
            drew.setdefault(plays["n"] - 1, threading.Event())
        return play(*a, **kw)

    act = local.LockedSampler.act
    def marking_act(self, rows):
        out = act(self, rows)
        if threading.current_thread().name.startswith("rollout"):
            drew.setdefault(plays["n"] - 1, threading.Event()).set()
        return out

    synced = mpt.MPTTrainer._synced
    def waiting_synced(self, it, m):
        if it == 0:  # update 0's roles surely move (an update of zero advantages leaves the weights as they were)
            import torch
            g = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for role in [r for r in self.policies if f"losses/action_{r}" in m]:
                    for p in self.policies[role].parameters():
                        if p.requires_grad:
                            p.add_(torch.randn(p.shape, generator=g) * 0.05)
        if it + 1 < int(self.cfg.algo.iterations):
            ev = drew.setdefault(it + 1, threading.Event())
            ok = ev.wait(120)
            print(f"UPDATE {it}: rollout {it + 1} drew before the sync: {ok}", file=sys.stderr, flush=True)
        return synced(self, it, m)

    mpt.play, local.LockedSampler.act, mpt.MPTTrainer._synced = counting_play, marking_act, waiting_synced
    from swarm_runtime.cli.main import main
    sys.exit(main(sys.argv[1:]))
""")


def test_a_run_plays_rollouts_ahead_on_our_worker_within_max_staleness(registry, tmp_path):
    """Three updates with max_staleness=1: the rollouts of updates 1 and 2 draw their first actions before
    updates 0 and 1 sync (the run waits for it: with nothing played ahead it would time out and say False), so
    each lags by more than 0 and at most 1 update (charts/staleness) when the update before it changed a model
    (a bid update with no contested pair changes none); update 0's is on the initial weights. The learner's scores
    of update 0's actions equal the server's up to rounding (approx KL ~1e-14); update 1's, some drawn on the
    weights before update 0 (which moves them by 0.05 noise), differ by far more (~1e-3). Without the wait, whether a rollout is drawn before the previous sync depends on the threads'
    timing (1.0 in a loaded run, all 0.0 in an idle CI run)."""
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    _, learner = learner_for(registry)
    base = write_base(next(iter(learner.policies.values())).shared_base, tmp_path / "base")
    server = start_worker(base, tmp_path / "worker.log")
    try:
        args = [a for a in TINY_RUN if not a.startswith(("algo.iterations", "algo.action_steps", "tensorboard"))]
        res = subprocess.run(
            [sys.executable, str(script), "run"]
            + args
            + [
                "algo.iterations=3",
                "algo.action_steps=2",
                "tensorboard=false",
                *on_server(base, server.url),
                "rollout.max_staleness=1",
                f"run_dir={tmp_path / 'run'}",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        server.stop()
    assert res.returncode == 0, res.stderr[-3000:]
    for it in (0, 1):
        assert f"UPDATE {it}: rollout {it + 1} drew before the sync: True" in res.stderr, res.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "kind" in r]
    stale = [r["charts/staleness"] for r in steps]
    assert len(stale) == 3 and stale[0] == 0.0 and all(0.0 <= s <= 1.0 for s in stale), stale
    for it in (0, 1):  # a rollout drawn before update it's sync lags iff that update changed a model
        changed = any(k.startswith(("losses/action_", "losses/bid_")) for k in steps[it])
        assert (stale[it + 1] > 0) == changed, (it, stale, sorted(steps[it]))
    assert stale[1] > 0  # update 0 is an action update: it always changes the models
    assert all(r["time/step_s"] > 0 for r in steps)
    # the server's answers against the learner's scores (updates 0 and 1 are action updates): update 0's rollout was
    # drawn on the weights the learner scores it with (equal up to float rounding); update 1's lagged by update 0
    # (which WAITER makes move the weights), so its actions drawn on the old weights differ by far more than rounding
    kl = [{k: v for k, v in r.items() if k.startswith("mismatch/approx_kl_")} for r in steps]
    assert kl[0] and max(kl[0].values()) < 1e-10, kl
    assert kl[1] and max(kl[1].values()) > 1e-6, kl
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["results"]["MPT"]["seeds"] == 2
