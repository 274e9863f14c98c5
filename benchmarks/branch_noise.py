"""How much of a bid branch pair's score difference is sampling noise, with and without
common random numbers (``algo.common_random_numbers``).

Rolls episodes from a checkpoint with noise ids, picks contested turns as a bid step
does (``pick_contested``, ``resample_lower``), and for every pick plays, from the
turn's snapshot:
- one branch (runner-up acts) with its own noise: ``d_ind = original - branch``;
- one branch with the original episode's noise: ``d_crn = original - branch``;
- K more branches and K re-rolls of the selected agent, all with their own noise:
  ``estimate = mean(original, re-rolls) - mean(branches)``, a less noisy estimate of
  what the forced decision is worth.

Prints, for both kinds of pair, the standard deviation of ``d`` over the picks (the
same picks, so a lower one means less noise), the share of ties (dropped by the
Bradley-Terry step), and the correlation of ``d`` with the estimate.

    python benchmarks/branch_noise.py RUN_DIR/checkpoints/sft [--iterations 6] [--samples 3] [--horizon H] [key=value ...]

``--horizon H`` scores every side over the H decisions from the branched turn on
(``algo.branch_horizon``) instead of to the end of the episode.

``key=value`` arguments are run config overrides (the run's ``domain=``/``task=``
and task keys, e.g. ``domain=vln_ce task=r2r task.bearings=true model.temperature=0.4``).
"""

from __future__ import annotations

import random
import statistics as st
import sys

import torch
from _checkpoint import add_batch_options, load, parser  # benchmarks/_checkpoint.py

from swarm_runtime.core.loop import new_slots
from swarm_runtime.learn.bid import forced_slot, forced_turns, pick_contested, resample_lower, window_score
from swarm_runtime.sampling.play import play


def measure(
    ctx, agents, rng: random.Random, samples: int, per_episode: int, envs: int, horizon: int | None = None
) -> list[tuple]:
    """One batch of episodes: ``(d_ind, d_crn, estimate)`` per pick that found a lower bid."""
    coord, cap = ctx.coordinator(), int(ctx.task.max_decisions)
    slots = new_slots(ctx.domain, ctx.task, [rng.choice(ctx.seeds("train")) for _ in range(envs)])
    for s in slots:
        s.episode.noise = rng.getrandbits(63)
    with torch.no_grad():
        eps = play(slots, agents, coord, ctx.domain, cap, rng, record_snapshots=True)
        picks = pick_contested(eps, per_episode, rng)
        lower = resample_lower(agents, picks, 3)
        batch, tags = [], []
        for i, ((ep, t), b) in enumerate(zip(picks, lower)):
            if b is None:
                continue
            branch, again = forced_turns(t, b)
            plan = [(branch, "crn", True), (branch, "ind", False)]
            plan += [(branch, "branch", False), (again, "again", False)] * samples
            for forced, tag, shared in plan:
                s = forced_slot(ctx.domain, ctx.task, ep, t, forced, 0, horizon)
                if not shared:
                    s.episode.noise = None  # the policies' generators: independent of the original
                batch.append(s)
                tags.append((i, tag))
        out = play(batch, agents, coord, ctx.domain, cap, rng) if batch else []
    scores: dict[int, dict] = {}
    for (i, tag), e in zip(tags, out):
        scores.setdefault(i, {"branch": [], "again": []})
        if tag in ("branch", "again"):
            scores[i][tag].append(e.reward)
        else:
            scores[i][tag] = e.reward
    rows = []
    for i, sc in scores.items():
        ep, t = picks[i]
        original = window_score(ep, t.t, horizon)
        estimate = (original + sum(sc["again"])) / (1 + len(sc["again"])) - st.mean(sc["branch"])
        rows.append((original - sc["ind"], original - sc["crn"], estimate))
    return rows


def _corr(a: list[float], b: list[float]) -> float:
    ma, mb = st.mean(a), st.mean(b)
    den = (sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b)) ** 0.5
    return sum((x - ma) * (y - mb) for x, y in zip(a, b)) / den if den else 0.0


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, seed=1)
    add_batch_options(ap, iterations=6)
    ap.add_argument("--samples", type=int, default=3, help="K: branches and re-rolls behind the estimate")
    args, overrides = ap.parse_known_args(argv)
    ctx, agents = load(args, overrides)
    rng = random.Random(args.seed)
    rows = []
    for it in range(args.iterations):
        rows += measure(ctx, agents, rng, args.samples, args.per_episode, args.envs, args.horizon)
        print(f"batch {it + 1}/{args.iterations}: {len(rows)} picks", file=sys.stderr, flush=True)
    if len(rows) < 3:
        raise SystemExit(f"only {len(rows)} picks: raise --iterations or --envs")
    est = [r[2] for r in rows]
    print(
        f"{len(rows)} picks, estimate from {args.samples} branches and {args.samples} re-rolls each, "
        f"scored {'to the end of the episode' if args.horizon is None else f'over {args.horizon} decisions'}"
    )
    print("| pairs | sd of original - branch | ties | correlation with the estimate |")
    print("|---|---|---|---|")
    for name, col in (("own noise (default)", 0), ("common random numbers", 1)):
        d = [r[col] for r in rows]
        print(f"| {name} | {st.pstdev(d):.3f} | {sum(x == 0 for x in d) / len(d):.2f} | {_corr(d, est):+.2f} |")
    ind, crn = st.pvariance([r[0] for r in rows]), st.pvariance([r[1] for r in rows])
    print(f"variance ratio common / own: {crn / ind:.2f}" if ind else "no variance: every pair tied")


if __name__ == "__main__":
    main()
