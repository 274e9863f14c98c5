"""How much of the REINFORCE credit's variance a state-dependent baseline could remove.

The action step's advantage is ``c_k - mean_i`` (docs/reference/method.md, section 3): the agent's mean credit in
the batch, the same for every state. Whatever part of ``c_k`` the state predicts is
noise to that estimator, and a baseline that predicted it would remove that noise
without bias. This measures, for a checkpoint's own rollouts, how much of the variance of
``c_k - mean_i`` two such baselines remove:

- **group**: play every episode seed G times (``--group-size``, GRPO's "rollouts per
  prompt") and subtract the agent's mean credit in the *other* G - 1 rollouts of the same
  seed (leave-one-out, so it does not depend on the sample's own action);
- **text**: a ridge regression of the credit on hashed word uni- and bigrams of the action
  prompt (observation, instruction, public log), fitted per agent on half the episodes
  and applied to the other half (cross-fitted, so again no sample predicts itself).

A variance ratio below 1 is what the baseline would remove; at or above 1 it only adds
noise. Prints one table row per agent and baseline.

    python benchmarks/credit_baselines.py RUN_DIR/checkpoints/sft [--seeds 32] [--group-size 4] [key=value ...]

``key=value`` arguments are run config overrides, as for ``swarm run`` (the run's
``domain=``/``task=`` and task keys, ``model.temperature=...``).
"""

from __future__ import annotations

import random
import statistics as st
import zlib
from collections import defaultdict

import torch
from _checkpoint import load, parser  # benchmarks/_checkpoint.py

from swarm_runtime.core.loop import new_slots
from swarm_runtime.learn.action import credit_samples
from swarm_runtime.sampling.play import play

DIM = 4096  #: hashed feature dimension of the text baseline


def credit_rows(ctx, agents, rng: random.Random, n_seeds: int, group: int) -> list[tuple]:
    """``(episode index, seed, agent, action prompt, credit)`` for every acted turn of
    ``n_seeds`` training seeds played ``group`` times each."""
    seeds = [rng.choice(ctx.seeds("train")) for _ in range(n_seeds)]
    with torch.no_grad():
        eps = play(
            new_slots(ctx.domain, ctx.task, [s for s in seeds for _ in range(group)]),
            agents,
            ctx.coordinator(),
            ctx.domain,
            int(ctx.task.max_decisions),
            rng,
        )
    credit_fn, rows = ctx.credit_fn(), []
    for i, ep in enumerate(eps):  # one episode at a time, to keep its index
        rows += [(i, ep.seed, a, prompt, c) for a, prompt, _, c in credit_samples([ep], credit_fn, rng)]
    return rows


def group_residuals(rows: list[tuple]) -> list[float]:
    """``c - `` the agent's mean credit over the other rollouts of the same seed (its batch mean
    when no other rollout of the seed has a turn of that agent)."""
    per_ep: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0])
    for i, _, a, _, c in rows:
        per_ep[(i, a)][0] += c
        per_ep[(i, a)][1] += 1
    seed_of = {r[0]: r[1] for r in rows}
    by_seed: dict[tuple, list[tuple]] = defaultdict(list)
    for (i, a), v in per_ep.items():
        by_seed[(seed_of[i], a)].append((i, *v))
    mean = {a: st.mean(r[4] for r in rows if r[2] == a) for a in {r[2] for r in rows}}
    out = []
    for i, seed, a, _, c in rows:
        others = [(tot, n) for j, tot, n in by_seed[(seed, a)] if j != i]
        n = sum(o[1] for o in others)
        out.append(c - (sum(o[0] for o in others) / n if n else mean[a]))
    return out


def _features(text: str) -> torch.Tensor:
    words = text.lower().replace(".", " ").replace(",", " ").split()
    v = torch.zeros(DIM)
    for tok in words + [a + "_" + b for a, b in zip(words, words[1:])]:
        v[zlib.crc32(tok.encode()) % DIM] += 1.0
    return v / max(1.0, float(v.norm()))


def text_residuals(rows: list[tuple], lam: float) -> list[float]:
    """``c - `` a ridge prediction from the prompt's hashed n-grams, fitted on the episodes of the
    other parity (two folds, by episode)."""
    X = torch.stack([_features(r[3]) for r in rows])
    y = torch.tensor([r[4] for r in rows], dtype=torch.float32)
    fold = torch.tensor([r[0] % 2 for r in rows])
    pred = torch.full_like(y, float(y.mean()))
    for f in (0, 1):
        train, test = fold != f, fold == f
        if int(train.sum()) < 2 or not bool(test.any()):
            continue
        Xt, mu = X[train], y[train].mean()
        w = Xt.T @ torch.linalg.solve(Xt @ Xt.T + lam * torch.eye(len(Xt)), y[train] - mu)
        pred[test] = X[test] @ w + mu
    return (y - pred).tolist()


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, seed=5)
    ap.add_argument("--seeds", type=int, default=32, help="training episode seeds")
    ap.add_argument("--group-size", type=int, default=4, help="rollouts per seed (G)")
    ap.add_argument("--ridge", type=float, default=1.0, help="ridge penalty of the text baseline")
    args, overrides = ap.parse_known_args(argv)
    if args.group_size < 2:
        raise SystemExit(f"--group-size {args.group_size}: the group baseline needs at least 2 rollouts per seed")
    ctx, agents = load(args, overrides)
    rows = credit_rows(ctx, agents, random.Random(args.seed), args.seeds, args.group_size)
    if not rows:
        raise SystemExit("no acted turns: nothing to measure")
    group = group_residuals(rows)
    print(f"{args.seeds} seeds x {args.group_size} rollouts, {len(rows)} acted turns")
    print("| agent | turns | var(c - mean) | group / mean | text / mean |")
    print("|---|---|---|---|---|")
    for a in sorted({r[2] for r in rows}):
        idx = [k for k, r in enumerate(rows) if r[2] == a]
        if len(idx) < 2:
            continue
        c = [rows[k][4] for k in idx]
        mine_text = text_residuals([rows[k] for k in idx], args.ridge)
        base = st.pvariance(c)
        ratio = (lambda v: f"{v / base:.2f}") if base else (lambda v: "n/a")
        print(
            f"| {agents[a].name} | {len(idx)} | {base:.3g} | {ratio(st.pvariance([group[k] for k in idx]))} "
            f"| {ratio(st.pvariance(mine_text))} |"
        )


if __name__ == "__main__":
    main()
