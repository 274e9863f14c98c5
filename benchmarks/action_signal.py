"""How much of what an action step sees is about the action: the action signal of a domain's
reward under a checkpoint's policies.

REINFORCE learns an action from ``score - baseline``. Even with a perfect state baseline,
the score of one sampled continuation mixes two things: how much the action itself is
worth, ``Q(s, a) - V(s)``, and how the rest of the episode happens to be sampled. This
measures both. For contested turns of a checkpoint's rollouts (``--per-episode`` per
episode) it restores the turn's snapshot, lets the acting agent sample two actions
``a1, a2`` on the same prompt, and plays each on ``K = 2`` times with the current
policies. With ``d_j = score(a1, j) - score(a2, j)``:

- ``Cov(d_1, d_2)`` over the turns estimates ``Var[Q(s, a1) - Q(s, a2)] = 2 Var_a Q(s, a)``,
  the **signal**: how much the sampled action changes the expected score;
- ``mean((score(a, 1) - score(a, 2))^2) / 2`` estimates ``Var[score | s, a]``, the **noise**
  of one continuation.

The **signal share** ``Var_a Q / (Var_a Q + noise)`` is the fraction of a REINFORCE sample's
variance, after a perfect state baseline, that is about the action; ``noise / signal`` is
about how many samples one unit of gradient signal-to-noise needs. Scores run to the end
of the episode, or over ``--horizon H`` decisions from the turn (as ``algo.branch_horizon``).

    python benchmarks/action_signal.py RUN_DIR/checkpoints/sft [--envs 32] [--per-episode 2] [--horizon H] [key=value ...]

``key=value`` arguments are run config overrides, as for ``swarm run``.
"""

from __future__ import annotations

import random
import statistics as st
import sys
from collections import defaultdict

import torch
from _checkpoint import add_batch_options, load, parser  # benchmarks/_checkpoint.py

from swarm_runtime.core.episode import ForcedTurn
from swarm_runtime.core.loop import new_slots
from swarm_runtime.learn.bid import forced_slot
from swarm_runtime.sampling.play import play

CONTINUATIONS = 2  #: K: continuations per sampled action (two are what the covariance needs)


def measure(ctx, agents, rng: random.Random, envs: int, per_episode: int, horizon: int | None) -> list[tuple]:
    """One batch of episodes: ``(role, [[score(a1, j)], [score(a2, j)]])`` per picked turn."""
    coord, cap = ctx.coordinator(), int(ctx.task.max_decisions)
    with torch.no_grad():
        eps = play(
            new_slots(ctx.domain, ctx.task, [rng.choice(ctx.seeds("train")) for _ in range(envs)]),
            agents,
            coord,
            ctx.domain,
            cap,
            rng,
            record_snapshots=True,
        )
        picks = []
        for ep in eps:
            cands = [t for t in ep.acted if t.snapshot is not None]
            picks += [(ep, t) for t in rng.sample(cands, min(per_episode, len(cands)))]
        by_agent: dict[int, list] = defaultdict(list)
        for i, (_, t) in enumerate(picks):
            by_agent[t.winner].append(i)
        actions: dict[int, list] = {}
        for a, idx in by_agent.items():
            out = agents[a].policy.act([picks[i][1].action_prompt for i in idx for _ in range(2)])
            for n, i in enumerate(idx):
                actions[i] = out[2 * n : 2 * n + 2]
        slots, tags = [], []
        for i, (ep, t) in enumerate(picks):
            for side, action in enumerate(actions[i]):
                forced = ForcedTurn(t.bids, t.bid_tokens, t.bid_prompts, t.winner, action=action)
                for j in range(CONTINUATIONS):
                    slots.append(forced_slot(ctx.domain, ctx.task, ep, t, forced, j, horizon))
                    tags.append((i, side))
        done = play(slots, agents, coord, ctx.domain, cap, rng)
    scores: dict[int, list] = {i: [[], []] for i in range(len(picks))}
    for (i, side), e in zip(tags, done):
        scores[i][side].append(sum(x.reward for x in e.turns))
    return [(agents[picks[i][1].winner].role, s) for i, s in scores.items()]


def signal_and_noise(rows: list[list]) -> tuple[float, float, float]:
    """``(Var_a Q(s, a), its standard error, Var[score | s, a])`` from ``[[a1 scores], [a2 scores]]`` rows."""
    d1 = [r[0][0] - r[1][0] for r in rows]
    d2 = [r[0][1] - r[1][1] for r in rows]
    m1, m2 = st.mean(d1), st.mean(d2)
    prods = [(x - m1) * (y - m2) for x, y in zip(d1, d2)]
    cov = sum(prods) / (len(rows) - 1)
    noise = st.mean((s[0] - s[1]) ** 2 / 2 for r in rows for s in r)
    return cov / 2, st.stdev(prods) / len(prods) ** 0.5 / 2, noise


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, seed=1)
    add_batch_options(ap, iterations=2)
    args, overrides = ap.parse_known_args(argv)
    ctx, agents = load(args, overrides)
    rng = random.Random(args.seed)
    rows: list[tuple] = []
    for it in range(args.iterations):
        rows += measure(ctx, agents, rng, args.envs, args.per_episode, args.horizon)
        print(f"batch {it + 1}/{args.iterations}: {len(rows)} turns", file=sys.stderr, flush=True)
    scope = "to the end of the episode" if args.horizon is None else f"over {args.horizon} decisions"
    print(f"{len(rows)} contested turns, 2 actions x {CONTINUATIONS} continuations each, scored {scope}")
    print("| role | turns | signal Var_a Q (± SE) | noise Var[score given s, a] | signal share | noise / signal |")
    print("|---|---|---|---|---|---|")
    by_role: dict[str, list] = defaultdict(list)
    for role, s in rows:
        by_role[role].append(s)
    for role, rs in sorted(by_role.items()):
        if len(rs) < 3:
            continue
        sig, se, noise = signal_and_noise(rs)
        share = sig / (sig + noise) if sig + noise > 0 else float("nan")
        ratio = f"{noise / sig:.0f}" if sig > 0 else "inf (no signal measured)"
        print(f"| {role} | {len(rs)} | {sig:.3g} ± {se:.2g} | {noise:.3g} | {share:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
