"""Throughput and reward against ``rollout.max_staleness`` (docs/notebook/engine.md, "Rollouts played ahead").

For each ``k`` the same short adapter run (``model.adapter=lora``, the tiny base, the same seed) trains on an
engine sampler with ``rollout.max_staleness=k``: 0 plays each update's rollout after the update before it
(on-policy), k > 0 plays the rollouts of the next k updates on a thread, on the server's weights of their time,
while this process trains. From each run's ``metrics.jsonl`` and ``eval.json`` it prints:

- decisions/s: the RL updates' decisions over their wall (``time/step_s``: waiting for the rollout, and
  training), the throughput the overlap is for; rollout decisions/s: over ``time/rollout_s`` alone;
- s/update: the mean ``time/step_s``;
- staleness: the mean of ``charts/staleness`` (updates the acting weights lagged the learner);
- action KL, bid KL: the largest ``mismatch/approx_kl_<Role>`` and ``mismatch/bid_approx_kl_<Role>`` over the
  roles and updates (sampler against learner, per token);
- train return: the mean ``charts/episode_reward`` over the updates; eval: the held-out reward after RL.

    SWARM_VLLM_PYTHON=~/.venvs/vllm/bin/python python benchmarks/staleness.py --ks 0 1 2 --iterations 6

Each run starts its own vLLM server (``rollout.engine=vllm``); ``--engine openai`` with ``rollout.url=...`` in
the overrides samples on a server you started instead (docs/guides/vllm.md, "Or start it yourself").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_args(k: int, a, run_dir: Path) -> list[str]:
    """The ``swarm run`` arguments of the run with ``rollout.max_staleness=k``."""
    return [
        f"domain={a.domain}",
        f"task={a.task}",
        "model.adapter=lora",
        f"rollout.engine={a.engine}",
        f"rollout.max_staleness={k}",
        f"algo.iterations={a.iterations}",
        f"algo.envs_per_step={a.envs}",
        f"eval.episodes={a.eval_episodes}",
        "eval.runs=1",
        "skip_sft_eval=true",
        "progress=false",
        "hardware.threads=1",
        f"seed={a.seed}",
        f"run_dir={run_dir}",
        *a.overrides,
    ]


def summarize(run_dir: Path, envs: int) -> dict:
    """The figures of one finished run (module docstring)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "kind" in r]
    decisions = sum(r["charts/decisions"] * envs for r in steps)
    wall = sum(r["time/step_s"] for r in steps)
    rollout = sum(r["time/rollout_s"] for r in steps)
    ev = json.loads((run_dir / "eval.json").read_text())["results"]["MPT"]
    stale = [r.get("charts/staleness", 0.0) for r in steps]

    def worst(prefix: str) -> float:
        return max([v for r in steps for k, v in r.items() if k.startswith(prefix)], default=float("nan"))

    return {
        "updates": len(steps),
        "decisions": decisions,
        "decisions_per_s": decisions / wall,
        "rollout_decisions_per_s": decisions / rollout,
        "s_per_update": wall / len(steps),
        "staleness": sum(stale) / len(stale),
        "action_kl": worst("mismatch/approx_kl_"),
        "bid_kl": worst("mismatch/bid_approx_kl_"),
        "train_return": sum(r["charts/episode_reward"] for r in steps) / len(steps),
        "eval": ev["reward_mean"],
        "eval_se": ev["reward_se"],
    }


def table(results: dict[int, dict]) -> str:
    head = (
        "k",
        "decisions/s",
        "vs k=0",
        "rollout dec/s",
        "s/update",
        "staleness",
        "action KL",
        "bid KL",
        "train return",
        "eval (± se)",
        "run wall s",
    )
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    base = results[min(results)]["decisions_per_s"]
    for k, r in sorted(results.items()):
        lines.append(
            " | ".join(
                [
                    str(k),
                    f"{r['decisions_per_s']:.1f}",
                    f"{r['decisions_per_s'] / base:.2f}x",
                    f"{r['rollout_decisions_per_s']:.1f}",
                    f"{r['s_per_update']:.1f}",
                    f"{r['staleness']:.2f}",
                    f"{r['action_kl']:.1e}",
                    f"{r['bid_kl']:.1e}",
                    f"{r['train_return']:.2f}",
                    f"{r['eval']:.2f} ± {r['eval_se']:.2f}",
                    "-" if r.get("wall") is None else f"{r['wall']:.0f}",
                ]
            )
        )
    return "\n".join("| " + x + " |" for x in lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--engine", default="vllm", choices=["vllm", "openai"])
    ap.add_argument("--domain", default="minecraft")
    ap.add_argument("--task", default="wooden_pickaxe")
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--eval-episodes", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="where the runs go (default: a temporary folder)")
    ap.add_argument("--summarize", action="store_true", help="only print the table of the runs already in --out")
    ap.add_argument("overrides", nargs="*", help="more swarm run arguments (key=value)")
    a = ap.parse_args(argv)
    if a.summarize:
        if a.out is None:
            print("benchmarks/staleness.py: --summarize needs --out (the folder of the runs)", file=sys.stderr)
            return 2
        print(table({k: summarize(Path(a.out) / f"k{k}", a.envs) for k in a.ks}))
        return 0
    if a.engine == "vllm" and not os.environ.get("SWARM_VLLM_PYTHON"):
        print(
            "benchmarks/staleness.py: set SWARM_VLLM_PYTHON to the python of a virtualenv with vLLM "
            "(docs/guides/vllm.md), or give --engine openai rollout.url=...",
            file=sys.stderr,
        )
        return 2
    out = Path(a.out or tempfile.mkdtemp(prefix="staleness-"))
    results = {}
    for k in a.ks:
        run_dir = out / f"k{k}"
        t0 = time.perf_counter()
        res = subprocess.run(
            [sys.executable, "-m", "swarm_runtime.cli.main", "run", *run_args(k, a, run_dir)],
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            print(
                f"rollout.max_staleness={k}: the run failed (exit {res.returncode}):\n{res.stderr[-3000:]}",
                file=sys.stderr,
            )
            return 1
        results[k] = {**summarize(run_dir, a.envs), "wall": time.perf_counter() - t0}
        print(f"k={k}: {json.dumps(results[k])}", flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
