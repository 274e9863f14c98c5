"""Did a change move the numbers? Compare two commits' outputs at the defaults (docs/notebook/engine.md, "Same
numbers on the in-process sampler").

Two parts, each run in a checkout of each commit with that checkout's virtualenv:

    python benchmarks/same_numbers.py episodes OUT.json    # play's episodes on briefly SFT'd models, as JSON
    python benchmarks/same_numbers.py compare RUN_A RUN_B  # two run folders: metrics.jsonl and eval.json

``episodes`` plays 8 training seeds of minecraft/wooden_pickaxe and iron_pickaxe (30-decision cap) with
the generators and with keyed draws, and writes every turn's bids, bid tokens, winner, action tokens and
text, rewards and sampler log-probs; two commits that play the same episodes write byte-identical files
(``cmp``). ``compare`` checks every key of RUN_A's ``metrics.jsonl`` rows but ``time/*`` for the same value
in RUN_B (keys RUN_B adds are listed, not compared) and ``eval.json`` without ``versions``; it exits 1 on a
difference. Uses only APIs both sides of the check had (``episode.play``, ``RunContext``, ``train.sft``).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path


def episodes(out: str) -> None:
    import torch
    from loguru import logger

    from swarm_runtime.config.load import resolve
    from swarm_runtime.core.loop import new_slots
    from swarm_runtime.learn.sft import collect_demos, sft
    from swarm_runtime.plugins.manager import get_registry
    from swarm_runtime.runs.context import RunContext
    from swarm_runtime.sampling.play import play

    logger.remove()
    torch.set_num_threads(1)
    pm, reg = get_registry()
    dump = {}
    for task in ("wooden_pickaxe", "iron_pickaxe"):
        cfg = resolve(["domain=minecraft", f"task={task}", "task.max_decisions=30"], reg)
        ctx = RunContext(cfg, pm, reg, None)
        agents, policies = ctx.build_swarm()
        demos = collect_demos(ctx.domain, ctx.task, ctx.seeds("train")[:4])
        for i, (role, pol) in enumerate(policies.items()):
            sft(pol, demos[role], 1, float(cfg.algo.sft.lr), 64, i, progress=False)
        coord, seeds = ctx.coordinator(), ctx.seeds("train")
        for keyed in (False, True):
            slots = new_slots(ctx.domain, ctx.task, seeds[:8])
            for k, s in enumerate(slots):
                s.episode.noise = k + 1 if keyed else None
            with torch.no_grad():
                eps = play(slots, agents, coord, ctx.domain, 30, random.Random(0))
            dump[f"{task}/keyed={keyed}"] = [
                {
                    "seed": e.seed,
                    "reward": e.reward,
                    "metrics": e.metrics,
                    "unparsed": e.unparsed_bids,
                    "invalid": e.invalid_actions,
                    "turns": [
                        {
                            "bids": t.bids,
                            "bid_tokens": t.bid_tokens,
                            "winner": t.auction.winner,
                            "action_tokens": t.action_tokens,
                            "text": t.action_text,
                            "reward": t.reward,
                            "valid": t.valid,
                            "action_logprobs": t.action_logprobs,
                            "bid_logprobs": t.bid_logprobs,
                        }
                        for t in e.turns
                    ],
                }
                for e in eps
            ]
    Path(out).write_text(json.dumps(dump, sort_keys=True))
    print(out, {k: f"{len(v)} episodes, {sum(len(e['turns']) for e in v)} turns" for k, v in dump.items()})


def _no_versions(o):
    if isinstance(o, dict):
        return {k: _no_versions(v) for k, v in o.items() if k != "versions"}
    if isinstance(o, list):
        return [_no_versions(v) for v in o]
    return o


def compare(a: str, b: str) -> int:
    rows = [[json.loads(line) for line in open(Path(d) / "metrics.jsonl")] for d in (a, b)]
    bad = [f"metrics.jsonl: {len(rows[0])} rows against {len(rows[1])}"] if len(rows[0]) != len(rows[1]) else []
    added: set[str] = set()
    for n, (x, y) in enumerate(zip(*rows), 1):
        bad += [
            f"row {n} {k}: {v!r} against {y.get(k, '<missing>')!r}"
            for k, v in x.items()
            if not k.startswith("time/") and y.get(k, object()) != v
        ]
        added |= {k for k in y if k not in x and not k.startswith("time/")}
    ea, eb = (_no_versions(json.loads((Path(d) / "eval.json").read_text())) for d in (a, b))
    bad += [f"eval.json {k}: differs" for k in sorted(set(ea) | set(eb)) if ea.get(k) != eb.get(k)]
    print(f"{len(rows[0])} metrics rows; keys only in {b}: {sorted(added) or 'none'}")
    print("\n".join(bad) if bad else "same metrics (all but time/*) and eval.json (all but versions)")
    return 1 if bad else 0


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["episodes"] and len(args) == 2:
        episodes(args[1])
        return 0
    if args[:1] == ["compare"] and len(args) == 3:
        return compare(args[1], args[2])
    print("usage: same_numbers.py episodes OUT.json | same_numbers.py compare RUN_A RUN_B", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
