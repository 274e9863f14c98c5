"""Population scaling memory: 3 agents against 12 (each role replicated 4 times).

Replicas of a role share one policy object, so growing the swarm should add only
per-replica context (bid prompts, activations of a larger batch), not weights.
For each size, in a FRESH subprocess (so peaks do not mix): build the swarm from the
same weights (fresh tiny models from the same seed, or ``--checkpoint``), play
``--episodes`` held-out episodes in one batch, and report

- peak resident memory of the process (``getrusage(RUSAGE_SELF).ru_maxrss``),
- resident memory after building the swarm, before playing,
- parameter bytes counted once per unique policy object, and what they would be
  with one copy of the weights per agent,

then the ratio of the peaks, 12 agents / 3 agents (the target: within 10%).

    python benchmarks/population_memory.py [--model tiny|small] [--episodes 32] [--decisions 120]
        [--replicas 1 4] [--checkpoint RUN_DIR/checkpoints/TAG/agents] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

MiB = 1024 * 1024


def rss_now() -> int:
    """Current resident set size in bytes (Linux ``/proc``; 0 elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def peak_rss() -> int:
    """Peak resident set size of this process in bytes (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def measure(args) -> dict:
    """One swarm size, in this process: build, play, measure."""
    import torch
    from loguru import logger

    from swarm_runtime.config.load import resolve
    from swarm_runtime.core.episode import Agent
    from swarm_runtime.evaluation.heldout import evaluate
    from swarm_runtime.plugins.manager import get_registry
    from swarm_runtime.runs.context import RunContext

    logger.remove()
    torch.set_num_threads(args.threads)
    pm, reg = get_registry()
    overrides = [f"domain={args.domain}", f"task={args.task}", f"model={args.model}", f"hardware.device={args.device}"]
    if args.decisions:
        overrides.append(f"task.max_decisions={args.decisions}")
    cfg = resolve(overrides, reg)
    ctx = RunContext(cfg, pm, reg, None)
    init_dir = Path(args.checkpoint) if args.checkpoint else None
    agents, policies = ctx.build_swarm(init_dir, replicas=args.child)
    if args.unshared:
        # Control: the same swarm with one copy of the weights per agent (same seed or checkpoint, so the
        # same weights), i.e. what population scaling would cost without sharing.
        roles = [r.name for r in ctx.domain.roles]
        agents = [
            Agent(
                a.name,
                a.role,
                a.policy
                if k % args.child == 0
                else ctx.make_policy(
                    int(cfg.seed) * 100 + roles.index(a.role), init_dir / a.role if init_dir else None
                ),
            )
            for k, a in enumerate(agents)
        ]
    unique = {id(a.policy): a.policy for a in agents}
    param_bytes = sum(p.numel() * p.element_size() for pol in unique.values() for p in pol.parameters())
    per_agent_bytes = sum(p.numel() * p.element_size() for a in agents for p in a.policy.parameters())
    rss_built = rss_now()
    eval_seeds = ctx.seeds("eval")
    seeds = [eval_seeds[i % len(eval_seeds)] for i in range(args.episodes)]
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    summary, episodes = evaluate(agents, ctx.coordinator(), ctx.domain, ctx.task, seeds, 1, int(cfg.seed))
    wall = time.perf_counter() - t0
    out = {
        "agents": len(agents),
        "replicas": args.child,
        "shared": not args.unshared,
        "policies": len(unique),
        "params": sum(p.numel() for pol in unique.values() for p in pol.parameters()),
        "param_bytes": param_bytes,
        "param_bytes_if_unshared": per_agent_bytes,
        "rss_built": rss_built,
        "peak_rss": peak_rss(),
        "episodes": len(episodes),
        "decisions": sum(len(e.turns) for e in episodes),
        "wall_s": wall,
        "reward_mean": summary["reward_mean"],
        "model": cfg.model.name,
        "task": f"{cfg.domain}/{cfg.task_name}",
        "max_decisions": int(ctx.task.max_decisions),
    }
    if args.device.startswith("cuda"):
        out["cuda_peak"] = torch.cuda.max_memory_allocated()
    return out


def run_child(replicas: int, argv: list[str], unshared: bool = False) -> dict:
    """Measure one size in a fresh interpreter; its last stdout line is the JSON result."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [sys.executable, __file__, *argv, "--child", str(replicas)] + (["--unshared"] if unshared else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"measuring replicas={replicas} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domain", default="minecraft")
    ap.add_argument("--task", default="iron_pickaxe")
    ap.add_argument("--model", default="tiny", help="model preset: tiny (default) or small")
    ap.add_argument("--episodes", type=int, default=32, help="held-out episodes played at each size (one batch)")
    ap.add_argument("--decisions", type=int, default=0, help="decision cap (0 = the task's max_decisions)")
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 4], help="replicas per role to compare")
    ap.add_argument("--checkpoint", default=None, help="RUN_DIR/checkpoints/TAG/agents: trained weights")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--no-control",
        action="store_true",
        help="skip the control run: the largest swarm with one copy of the weights per agent",
    )
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--unshared", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args)))
        return
    if args.checkpoint and not any(Path(args.checkpoint).glob("*/config.json")):
        ap.error(f"--checkpoint {args.checkpoint!r} holds no <Role>/config.json; give RUN_DIR/checkpoints/TAG/agents")
    if args.episodes < 1 or min(args.replicas) < 1:
        ap.error("--episodes and --replicas must be positive")
    argv = sys.argv[1:]
    results = []
    for k in args.replicas:
        print(f"measuring replicas={k} in a fresh process ...", flush=True)
        results.append(run_child(k, argv))
    if not args.no_control and max(args.replicas) > 1:
        print(f"measuring replicas={max(args.replicas)} with one weight copy per agent (control) ...", flush=True)
        results.append(run_child(max(args.replicas), argv, unshared=True))
    r0 = results[0]
    print(
        f"\n{r0['task']}, model {r0['model']} ({r0['params'] / r0['policies'] / 1e6:.2f}M params per role), "
        f"{r0['episodes']} held-out episodes per size in one batch, decision cap {r0['max_decisions']}, "
        f"device {args.device}, torch threads {args.threads}"
        + (f", weights from {args.checkpoint}" if args.checkpoint else ", fresh weights (same seed)")
    )
    head = (
        f"{'agents':>6} {'weights':>8} {'policies':>8} {'params MiB':>10} {'if unshared':>11} {'RSS built MiB':>13} "
        f"{'peak RSS MiB':>12} {'decisions':>9} {'play s':>7}"
    )
    print(head + ("  cuda peak MiB" if "cuda_peak" in r0 else ""))
    for r in results:
        line = (
            f"{r['agents']:>6} {'shared' if r['shared'] else 'copied':>8} {r['policies']:>8} {r['param_bytes'] / MiB:>10.2f} "
            f"{r['param_bytes_if_unshared'] / MiB:>11.2f} {r['rss_built'] / MiB:>13.1f} "
            f"{r['peak_rss'] / MiB:>12.1f} {r['decisions']:>9} {r['wall_s']:>7.1f}"
        )
        print(line + (f"  {r['cuda_peak'] / MiB:>13.1f}" if "cuda_peak" in r else ""))
    for r in results[1:]:
        ratio = r["peak_rss"] / r0["peak_rss"]
        what = f"{r['agents']} agents" + ("" if r["shared"] else " (copied weights, control)")
        print(
            f"peak RSS {what} / {r0['agents']} agents: {ratio:.3f}"
            + (f" ({'within' if ratio <= 1.10 else 'NOT within'} the 10% target); " if r["shared"] else "; ")
            + f"peak {(r['peak_rss'] - r0['peak_rss']) / MiB:+.1f} MiB, "
            f"after building the swarm {(r['rss_built'] - r0['rss_built']) / MiB:+.1f} MiB"
        )
        if "cuda_peak" in r:
            print(f"CUDA peak allocated {r['agents']} / {r0['agents']} agents: {r['cuda_peak'] / r0['cuda_peak']:.3f}")


if __name__ == "__main__":
    main()
