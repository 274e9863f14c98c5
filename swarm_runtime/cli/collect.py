"""``swarm collect RUN URL --episodes N``: served traffic on training seeds, to train on (docs/guides/serve.md,
"Training on served traffic").

Plays ``--episodes`` server-side episodes through the running ``swarm serve`` at ``URL`` on seeds drawn (with
``--seed``) from the run's training split, each with a noise id of its own (``split: train``: never a held-out seed,
so the held-out evaluation before and after training on them stays clean). The gateway keeps every episode it
plays in ``RUN/serve/episodes.jsonl`` with its samples (swarm_runtime/serve/answerer.py); ``swarm run resume=true
run_dir=RUN 'algo.served=[RUN]' ...`` trains on them (swarm_runtime/learn/served.py). Prints how the episodes
ended and their reward (mean ± standard error); exit 1 when none ended ``done`` or ``degraded``, 2 when the
service cannot be reached or serves another task.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

from swarm_runtime.config.errors import ConfigError


def pick_seeds(train_seeds: list[int], n: int, seed: int) -> list[tuple[int, int]]:
    """``n`` (episode seed, noise id) pairs: seeds drawn from ``train_seeds`` with replacement, noise ids fresh."""
    rng = random.Random(seed)
    return [(rng.choice(train_seeds), rng.getrandbits(63)) for _ in range(n)]


async def collect(url: str, plan: list[tuple[int, int]], concurrency: int, domain_task: tuple[str, str]) -> list[dict]:
    """Each (seed, noise) of ``plan`` played as a server-side episode at ``url`` (which must serve ``domain_task``):
    the service's answers."""
    from swarm_runtime.serve.client import SwarmClient, check_serves

    sem = asyncio.Semaphore(max(1, int(concurrency)))
    async with SwarmClient(url) as c:
        await check_serves(c, url, *domain_task)

        async def one(seed: int, noise: int) -> dict:
            async with sem:
                return await c.episode(seed=int(seed), noise=str(noise), split="train")

        return list(await asyncio.gather(*(one(s, z) for s, z in plan)))


def cmd_collect(args) -> int:
    from statistics import mean, stdev

    from swarm_runtime.cli.serve import served_run
    from swarm_runtime.runs.context import RunContext
    from swarm_runtime.serve import require_serve_extra
    from swarm_runtime.serve.client import run_against

    require_serve_extra()
    if args.episodes < 1:
        raise ConfigError(f"--episodes {args.episodes}: give at least 1")
    run_dir = Path(args.run_dir)
    cfg, pm, reg, _ = served_run(run_dir, [])
    plan = pick_seeds(RunContext(cfg, pm, reg, run_dir).seeds("train"), args.episodes, args.seed)
    bodies = run_against(args.url, collect(args.url, plan, args.concurrency, (cfg.domain, cfg.task_name)))
    statuses = Counter(b.get("status") for b in bodies)
    rewards = [float(b["reward"]) for b in bodies if b.get("status") in ("done", "degraded")]
    se = stdev(rewards) / len(rewards) ** 0.5 if len(rewards) > 1 else 0.0
    shown = ", ".join(f"{n} {s}" for s, n in statuses.most_common())
    print(
        f"collected {len(bodies)} served episodes on training seeds of {cfg.domain}/{cfg.task_name} ({shown}); "
        f"reward {mean(rewards) if rewards else 0.0:.2f} ± {se:.2f}; kept in {run_dir / 'serve' / 'episodes.jsonl'}",
        flush=True,
    )
    if not rewards:
        print(f"no episode ended done or degraded: {bodies[0].get('error')}", flush=True)
        return 1
    return 0


def add_parser(sub) -> None:
    c = sub.add_parser("collect", help="play episodes on training seeds through a running `swarm serve`, to train on")
    c.add_argument("run_dir", help="the run folder the service serves")
    c.add_argument("url", help="the gateway, e.g. http://127.0.0.1:8000 (SWARM_API_KEY: its key)")
    c.add_argument("--episodes", type=int, default=64, help="how many (default 64)")
    c.add_argument("--concurrency", type=int, default=8, help="episodes in flight at once (default 8)")
    c.add_argument("--seed", type=int, default=0, help="draws the training seeds and noise ids (default 0)")
    c.set_defaults(func=cmd_collect)
