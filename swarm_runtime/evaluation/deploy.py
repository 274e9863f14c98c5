"""Deploying a trained swarm differently from how it was trained: population scaling, dropout and
participation.

- **Population scaling**: ``RunContext.build_swarm(init_dir, replicas=k)`` gives k
  agents per role that share one policy object (one copy of the weights) and sample
  independently; :func:`milestone_pass_at_k` scores the swarm by pass@k of the
  task's milestones.
- **Dropout**: :func:`dropout_presence` makes the active-agents mask that
  ``play()`` / ``evaluate()`` take as ``presence``: each agent is independently
  absent from a turn's auction with probability ``p``; a turn where every agent is
  absent is skipped (the auction has no bid).
- **Participation**: :func:`participation_by_decision` is each role's share of
  turns at each decision index (the paper's Figure 6), :func:`plot_participation`
  draws it.

Everything here is pure (no shared RNG is consumed) and names no domain.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import random
import struct
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.core.episode import Agent, Episode
from swarm_runtime.core.loop import Presence
from swarm_runtime.evaluation.heldout import mean_se

#: Valid values of ``dropout_presence(per=...)``.
DROPOUT_UNITS = ("turn", "episode")
#: Valid values of ``participation_by_decision(by=...)``.
PARTICIPATION_KEYS = ("role", "name")
#: Name of the series of turns that nobody won.
SKIPPED = "skipped"


# ---------------------------------------------------------------------------- dropout
def _uniforms(seed: int, episode_seed: int, turn: int, n: int) -> list[float]:
    """``n`` uniforms in [0, 1), the a-th a pure function of (seed, episode_seed, turn, a).

    A fresh ``random.Random`` seeded with a hash of the key, never a shared generator,
    so the draws do not depend on what else consumed random numbers, nor on ``n``
    (agent a's draw is the same in a 3-agent and a 12-agent swarm)."""
    digest = hashlib.blake2b(struct.pack("<qqq", seed, episode_seed, turn), digest_size=8).digest()
    rng = random.Random(int.from_bytes(digest, "little"))
    return [rng.random() for _ in range(n)]


def dropout_presence(p: float, n_agents: int, *, per: str = "turn", seed: int = 0) -> Presence | None:
    """Active-agents mask for ``play()`` / ``evaluate()`` (their ``presence`` argument).

    Each agent is independently absent with probability ``p``: per turn (default;
    a fresh draw every decision) or per episode (``per="episode"``: one draw per
    (episode seed, agent), the same at every turn). The mask is a pure function of
    ``(seed, episode seed, turn, agent index)`` through a hash-seeded RNG, not the
    run's shared RNG, so conditions (3 vs 12 agents, SFT vs MPT checkpoint) compare
    on identical draws: agent ``a``'s absence does not depend on ``n_agents``.
    Note that the runs of one held-out seed (``eval.runs``) therefore share their
    dropout draws; they differ in the sampled bids and actions only.

    A turn where every agent is absent has no bid, so the coordinator skips it
    (it still counts toward ``max_decisions``).

    :param p: absence probability in [0, 1]; ``p == 0`` returns ``None`` (everyone
        always present, exactly what ``play(presence=None)`` does).
    :param n_agents: swarm size the mask is made for; the returned function checks it.
    :param per: ``"turn"`` or ``"episode"``.
    :param seed: extra seed to draw a different (but again deterministic) pattern.
    :raises ConfigError: ``p`` outside [0, 1] or not a number, ``per`` not a valid
        unit, ``n_agents`` below 1.
    """
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= float(p) <= 1.0:
        raise ConfigError(f"dropout probability p={p!r} is not a number in [0, 1] (e.g. 0, 0.3, 0.6, 0.9)")
    if per not in DROPOUT_UNITS:
        raise ConfigError(f"dropout per={per!r} is not one of: {', '.join(DROPOUT_UNITS)}")
    if isinstance(n_agents, bool) or not isinstance(n_agents, numbers.Integral) or n_agents < 1:
        raise ConfigError(f"dropout n_agents={n_agents!r} must be a positive integer")
    p, seed, n_agents = float(p), int(seed), int(n_agents)
    if p == 0.0:
        return None

    def presence(episode_seed: int, turn: int, n: int) -> list[bool]:
        if n != n_agents:
            raise ValueError(f"dropout mask was made for {n_agents} agents, the swarm has {n}")
        key = int(turn) if per == "turn" else -1
        return [u >= p for u in _uniforms(seed, int(episode_seed), key, n)]

    presence.p, presence.per, presence.n_agents = p, per, n_agents  # for logs and reports
    return presence


# ---------------------------------------------------------------------------- pass@k
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator of pass@k (Chen et al. 2021): the probability that at least
    one of ``k`` of the ``n`` samples, drawn without replacement, is among the ``c``
    correct ones: ``1 - C(n - c, k) / C(n, k)``.

    :raises ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def milestone_pass_at_k(
    episodes: Sequence[Episode], milestones: Sequence[str], k: int
) -> dict[str, tuple[float, float]]:
    """Per milestone, mean ± standard error over seeds of pass@k.

    An episode reached milestone ``m`` when ``episode.metrics.get(f"has_{m}", 0) > 0``.
    The episodes of one seed are its sampled runs (``n`` of them, ``c`` reached m);
    each seed's :func:`pass_at_k` is one held-out instance, and the mean and SE are
    taken over seeds, as in :func:`swarm_runtime.evaluation.heldout.summarize`. Every episode
    counts, ``reward_missing`` ones included (milestones are env metrics, not judged).

    :raises ValueError: a seed with fewer than ``k`` runs, or a milestone whose
        ``has_<m>`` metric no episode reports (a misspelled name; the valid ones
        are listed).
    """
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got {k}")
    per_seed: dict[int, list[Episode]] = defaultdict(list)
    for ep in episodes:
        per_seed[ep.seed].append(ep)
    short = {s: len(eps) for s, eps in per_seed.items() if len(eps) < k}
    if short:
        raise ValueError(f"pass@{k} needs at least {k} runs per seed; seeds with fewer: {short}")
    reported = {key[4:] for ep in episodes for key in ep.metrics if key.startswith("has_")}
    unknown = [m for m in milestones if m not in reported]
    if episodes and unknown:
        raise ValueError(
            f"no episode reports a has_<milestone> metric for {unknown}; valid: {', '.join(sorted(reported)) or 'none'}"
        )
    out = {}
    for m in milestones:
        values = [
            pass_at_k(len(eps), sum(float(e.metrics.get(f"has_{m}", 0)) > 0 for e in eps), k)
            for eps in per_seed.values()
        ]
        out[m] = mean_se(values)
    return out


# ---------------------------------------------------------------------------- participation
def participation_by_decision(
    episodes: Sequence[Episode], agents: Sequence[Agent], max_decisions: int, by: str = "role"
) -> dict[str, list[float]]:
    """Share of episodes in which each role (or agent, ``by="name"``) won the turn at
    decision index ``t``, for ``t = 0 .. max_decisions - 1``, among the episodes still
    running at ``t`` (those with more than ``t`` turns).

    The ``"skipped"`` series is the share of running episodes whose turn ``t`` nobody
    won. At every ``t`` where some episode runs the series sum to 1; where none runs
    (every episode ended earlier) all series are 0. With ``by="role"`` the replicas
    of a role are pooled (keys in the order of ``agents``' roles); with ``by="name"``
    each agent has its own series.

    :raises ConfigError: ``by`` not ``"role"`` or ``"name"``.
    """
    if by not in PARTICIPATION_KEYS:
        raise ConfigError(f"participation by={by!r} is not one of: {', '.join(PARTICIPATION_KEYS)}")
    if max_decisions < 1:
        raise ConfigError(f"participation max_decisions={max_decisions!r} must be at least 1")
    keys = list(dict.fromkeys(a.role if by == "role" else a.name for a in agents))
    key_of = [a.role if by == "role" else a.name for a in agents]
    counts = {k: [0] * max_decisions for k in keys + [SKIPPED]}
    running = [0] * max_decisions
    for ep in episodes:
        for t, turn in enumerate(ep.turns[:max_decisions]):
            running[t] += 1
            counts[SKIPPED if turn.winner is None else key_of[turn.winner]][t] += 1
    return {k: [c / r if r else 0.0 for c, r in zip(cs, running)] for k, cs in counts.items()}


# ---------------------------------------------------------------------------- plots
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path) -> Path:
    """Lay out, write ``fig`` to the PNG ``path`` (creating its folder) and close it."""
    from swarm_runtime.runs.outputs import save_figure

    return save_figure(fig, path)


def plot_participation(series: Mapping[str, Mapping[str, Sequence[float]]], path, title: str) -> Path:
    """The paper's Figure 6: one panel per label (e.g. ``"after SFT"``, ``"after MPT"``),
    each the stacked share of turns per role (and of skipped turns, in grey) against
    the decision index.

    :param series: label -> :func:`participation_by_decision` output.
    :param path: PNG file to write (folders are created).
    :param title: figure title.
    :returns: ``path`` as a :class:`~pathlib.Path`.
    """
    if not series:
        raise ValueError("plot_participation needs at least one labelled series")
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(series), figsize=(5 * len(series), 3.8), sharey=True, squeeze=False)
    for ax, (label, shares) in zip(axes[0], series.items()):
        names = [k for k in shares if k != SKIPPED] + ([SKIPPED] if SKIPPED in shares else [])
        n = max(len(v) for v in shares.values())
        colors = [f"C{i}" for i in range(len(names))]
        if SKIPPED in shares:
            colors[-1] = "0.75"
        ax.stackplot(range(n), [list(shares[k]) for k in names], labels=names, colors=colors, alpha=0.9)
        ax.set_title(label)
        ax.set_xlabel("decision index")
        ax.set_ylim(0, 1)
        ax.set_xlim(0, max(1, n - 1))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("share of turns won")
    keys = [list(v) for v in series.values()]
    for ax, k in zip(axes[0], keys):
        if k != keys[-1] or ax is axes[0][-1]:  # one legend when every panel has the same series
            ax.legend(loc="upper right", fontsize=8, framealpha=0.8)
    fig.suptitle(title)
    return _save(plt, fig, path)


def plot_dropout(
    curves: Mapping[str, Mapping[float, tuple[float, float]]], path, title: str, ylabel: str = "held-out reward"
) -> Path:
    """Reward against the dropout probability, one line per swarm (e.g. ``"3 agents"``,
    ``"12 agents"``), with standard-error bars.

    :param curves: label -> {p: (mean, se)}, e.g. ``{"3 agents": {0.0: (12.1, 0.8), 0.3: ...}}``
        (the ``reward_mean`` / ``reward_se`` of :func:`swarm_runtime.evaluation.heldout.summarize`).
    :param path: PNG file to write.
    :param title: figure title.
    :param ylabel: y-axis label.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in curves.items():
        ps = sorted(points)
        ax.errorbar(ps, [points[p][0] for p in ps], yerr=[points[p][1] for p in ps], marker="o", capsize=3, label=label)
    ax.set_xlabel("dropout probability p (each agent absent per turn)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(plt, fig, path)


def plot_population(
    bars: Mapping[str, Mapping[str, tuple[float, float]]], path, title: str, ylabel: str = "pass@k"
) -> Path:
    """Grouped bars: pass@k per milestone (x), one bar per population size, SE as error bars.

    :param bars: label (e.g. ``"3 agents"``) -> :func:`milestone_pass_at_k` output
        (milestone -> (mean, se)); milestones are taken in the first label's order.
    :param path: PNG file to write.
    :param title: figure title.
    :param ylabel: y-axis label (say which k).
    """
    if not bars:
        raise ValueError("plot_population needs at least one labelled result")
    plt = _pyplot()
    milestones = list(next(iter(bars.values())))
    width = 0.8 / len(bars)
    fig, ax = plt.subplots(figsize=(max(5, 1.5 * len(milestones) + 2), 4))
    for j, (label, res) in enumerate(bars.items()):
        xs = [i + (j - (len(bars) - 1) / 2) * width for i in range(len(milestones))]
        ax.bar(xs, [res[m][0] for m in milestones], width, yerr=[res[m][1] for m in milestones], capsize=3, label=label)
    ax.set_xticks(range(len(milestones)), milestones)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    return _save(plt, fig, path)
