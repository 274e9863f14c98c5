"""Bid learning (docs/reference/method.md, section 4): counterfactual branches and a Bradley-Terry loss.

For a contested turn, restore the env and every agent's state (the public log)
in a copy, re-sample the selected agent's bid until it falls below the
runner-up's (up to ``tries`` times, else drop the turn), let the runner-up act
and roll the branch to the end with the current policies. The bid response of
the branch with the higher score (sum of rewards from that turn on) is y_w.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from swarm_runtime.core.domain import Domain
from swarm_runtime.core.episode import Agent, Episode, ForcedTurn, Slot, Turn
from swarm_runtime.core.loop import make_env
from swarm_runtime.core.noise import key_hash
from swarm_runtime.learn.logprobs import logprobs_in_chunks, sampled_logprobs
from swarm_runtime.learn.losses import bradley_terry_loss, pair_weights
from swarm_runtime.learn.optim import accumulate_and_step
from swarm_runtime.sampling.mismatch import REPORT_CAP, Mismatch, importance_weight, token_deltas
from swarm_runtime.sampling.play import play


@dataclass
class BranchPair:
    agent: int
    prompt: str
    original: list[int]  #: the agent's bid response in the original episode
    counterfactual: list[int]  #: its re-sampled bid that hands the turn to the branch's actor
    original_score: float
    branch_score: float
    runner_up: bool = False  #: a pair of the runner-up's bids (``algo.bid_pairs=both``): its re-sampled bid is higher
    #: the sampler's per-token log-probs of ``original`` (drawn in the rollout; None: none reported)
    original_logprobs: list[float] | None = None


def pick_contested(episodes: Sequence[Episode], per_episode: int, rng: random.Random) -> list[tuple[Episode, Turn]]:
    chosen = []
    for ep in episodes:
        if ep.reward_missing:
            continue
        cands = [t for t in ep.turns if t.auction.contested and t.snapshot is not None]
        chosen += [(ep, t) for t in rng.sample(cands, min(per_episode, len(cands)))]
    return chosen


def resample_lower(agents: list[Agent], picks: list[tuple[Episode, Turn]], tries: int) -> list:
    """For each pick, a re-sampled bid of the selected agent below the runner-up's, or None."""
    return _resample(agents, picks, tries, lambda t: t.winner, lambda t, level: level < t.auction.runner_up_bid)


def resample_higher(agents: list[Agent], picks: list[tuple[Episode, Turn]], tries: int) -> list:
    """For each pick, a re-sampled bid of the runner-up above the selected agent's winning bid
    (so it would have won the turn: the branch's outcome), or None."""
    return _resample(
        agents, picks, tries, lambda t: t.auction.runner_up, lambda t, level: level > t.auction.winning_bid
    )


def _resample(agents, picks, tries: int, who, accept) -> list:
    found: list = [None] * len(picks)
    pending = list(range(len(picks)))
    for _ in range(tries):
        if not pending:
            break
        groups: dict[int, list[int]] = defaultdict(list)
        for i in pending:
            groups[id(agents[who(picks[i][1])].policy)].append(i)
        for idx in groups.values():
            policy = agents[who(picks[idx[0]][1])].policy
            bids = policy.bid([picks[i][1].bid_prompts[who(picks[i][1])] for i in idx])
            for i, b in zip(idx, bids):
                if b.parsed and accept(picks[i][1], b.level):
                    found[i] = b
        pending = [i for i in pending if found[i] is None]
    return found


def window_score(ep: Episode, t: int, horizon: int | None = None) -> float:
    """The original episode's rewards from turn ``t`` on: to its end, or over ``horizon`` decisions."""
    return sum(x.reward for x in ep.turns[t : None if horizon is None else t + int(horizon)])


def forced_turns(turn: Turn, lower) -> tuple[ForcedTurn, ForcedTurn]:
    """The two first turns a pick can be replayed with: the branch (the selected agent's bid
    replaced by its re-sampled ``lower`` bid, the runner-up acts) and the re-roll (the original
    bids, the selected agent acts again)."""
    sel = turn.winner
    bids, toks = list(turn.bids), list(turn.bid_tokens)
    bids[sel], toks[sel] = lower.level, lower.tokens
    branch = ForcedTurn(bids, toks, list(turn.bid_prompts), winner=turn.auction.runner_up)
    again = ForcedTurn(list(turn.bids), list(turn.bid_tokens), list(turn.bid_prompts), winner=sel)
    return branch, again


def forced_slot(
    domain: Domain, task, ep: Episode, turn: Turn, forced: ForcedTurn, sample: int, horizon: int | None = None
) -> Slot:
    """A slot restored to ``turn``'s snapshot whose first turn is ``forced``, ending after
    ``horizon`` decisions (None: at the episode's end). Under common random numbers continuation 0
    reuses the original episode's noise (it differs from the original only through the forced
    decision); continuation j > 0 gets its own, shared by both sides' j-th."""
    env = make_env(domain, task)
    env_snap, log = turn.snapshot
    env.restore(env_snap)
    noise = ep.noise if ep.noise is None or sample == 0 else key_hash(ep.noise, turn.t, sample)
    return Slot(
        env,
        Episode(ep.seed, noise=noise),
        list(log),
        t=turn.t,
        forced=forced,
        stop_at=None if horizon is None else turn.t + int(horizon),
    )


def run_branches(
    agents: list[Agent],
    coordinator,
    domain: Domain,
    task,
    picks,
    tries: int,
    rng: random.Random,
    presence=None,
    samples: int = 1,
    horizon: int | None = None,
    runner_up_pairs: bool = False,
    sampler=None,
    models=None,
) -> list[BranchPair]:
    """Roll counterfactual branches for the picks (batched, through ``sampler``: default in process) and
    pair the bid responses.

    ``samples`` = 1 (docs/reference/method.md, section 4): one branch per pick against the original episode's
    score. ``samples`` = k > 1: k branches where the runner-up acts, against the original
    score averaged with k - 1 re-rolls from the same snapshot where the selected agent
    acts again (its action and everything after re-sampled); both scores are means of k
    continuations, so their difference has ~1/k of the sampling variance.

    ``horizon`` = H: both sides score the rewards of the H decisions from the branched turn on
    (the branches stop there; the original's score is its rewards over the same window); None: to
    the end of the episode (docs/reference/method.md, section 4).

    ``runner_up_pairs``: the same two outcomes also train the runner-up's bid. Its original bid
    (lower than the winner's) goes with the original episode, a re-sampled bid above the winning
    one with the branch, where it acts; no extra rollouts, only extra bid samples.

    Episodes played with common random numbers (``Episode.noise``) pass their noise on:
    the j-th branch and the j-th continuation of the selected agent share a noise id
    (the 0-th is the original episode's), so each side-by-side difference is paired.
    """
    new_bids = resample_lower(agents, picks, tries)
    higher = [None] * len(picks)
    if runner_up_pairs:  # only for the picks that will be branched
        kept = [i for i, nb in enumerate(new_bids) if nb is not None]
        for i, hb in zip(kept, resample_higher(agents, [picks[i] for i in kept], tries)):
            higher[i] = hb
    branched, slots, owner = branch_slots(domain, task, picks, new_bids, higher, samples, horizon)
    if not slots:
        return []
    branches = play(
        slots,
        agents,
        coordinator,
        domain,
        int(task.max_decisions),
        rng,
        presence=presence,
        sampler=sampler,
        models=models,
    )
    return _branch_pairs(branched, owner, branches)


def branch_slots(domain: Domain, task, picks, new_bids, higher, samples: int, horizon: int | None):
    """The slots to play for the picks whose ``new_bids`` came (:func:`run_branches`): per pick, ``samples``
    branches (the runner-up acts) and ``samples`` - 1 re-rolls (the selected agent acts again). Returns the
    branched picks (:class:`_Pick`), the slots, and each slot's owner ``(pick index, side)`` (side 1: a branch,
    0: a re-roll)."""
    slots, branched, owner = [], [], []
    for (ep, turn), nb, hb in zip(picks, new_bids, higher):
        if nb is None:
            continue
        cf, again = forced_turns(turn, nb)
        for forced, side, j in [(cf, 1, j) for j in range(samples)] + [(again, 0, j) for j in range(1, samples)]:
            slots.append(forced_slot(domain, task, ep, turn, forced, j, horizon))
            owner.append((len(branched), side))
        branched.append(_Pick(turn, nb.tokens, None if hb is None else hb.tokens, window_score(ep, turn.t, horizon)))
    return branched, slots, owner


def _branch_pairs(branched: list[_Pick], owner: list[tuple[int, int]], branches: list[Episode]) -> list[BranchPair]:
    """The bid pairs of the played branches: per pick whose branches all have their reward, the original score
    (averaged with its re-rolls) against the branches' mean; the selected agent's pair, and the runner-up's
    when it has a higher bid."""
    scores: list[list[list[float]]] = [[[k.original_score], []] for k in branched]  # per pick: [original, branch]
    missing = set()
    for (i, side), br in zip(owner, branches):
        if br.reward_missing:
            missing.add(i)
        scores[i][side].append(br.reward)
    pairs = []
    for i, k in enumerate(branched):
        if i in missing:
            continue
        o, b = sum(scores[i][0]) / len(scores[i][0]), sum(scores[i][1]) / len(scores[i][1])
        t, sel, ru = k.turn, k.turn.winner, k.turn.auction.runner_up
        lps = t.bid_logprobs or [None] * len(t.bid_tokens)
        pairs.append(BranchPair(sel, t.bid_prompts[sel], t.bid_tokens[sel], k.lower, o, b, original_logprobs=lps[sel]))
        if k.higher is not None:
            pairs.append(
                BranchPair(
                    ru, t.bid_prompts[ru], t.bid_tokens[ru], k.higher, o, b, runner_up=True, original_logprobs=lps[ru]
                )
            )
    return pairs


@dataclass
class _Pick:
    """A pick that will be branched: its turn, the re-sampled bid tokens (the selected agent's lower
    one; the runner-up's higher one or None) and the original episode's score over the window."""

    turn: Turn
    lower: list[int]
    higher: list[int] | None
    original_score: float


def bid_update(
    agents: list[Agent],
    pairs: list[BranchPair],
    optimizers: dict,
    minibatch: int,
    grad_clip: float,
    pair_weight: str = "uniform",
    reference: dict | None = None,
    beta: float = 1.0,
    is_cap: float | None = None,
) -> dict[str, float]:
    """Bradley-Terry update of each pair's agent's bid on its decisive pairs (ties dropped), each
    pair weighted by :func:`pair_weights` (``uniform``: the paper). The agent is the selected one,
    or the runner-up for ``runner_up`` pairs. ``reference`` (role -> frozen policy,
    ``algo.bid_reference=sft``): the log-odds are measured against that policy's (DPO form,
    :func:`bradley_terry_loss`); ``beta`` scales them.

    Off-policy (docs/reference/engine.md, "Off-policy terms"): a pair's original bid was drawn by the rollout's
    sampler, whose per-token log-probs it carries (``original_logprobs``); the learner's, computed for the loss anyway,
    are compared with them per role (``mismatch/bid_*``). The re-sampled bid was drawn in process by the learner's own
    weights of this update (:func:`resample_lower`), so its ratio is 1. ``is_cap`` = c: each pair's term is weighted by
    ``min(c, pi_learner(original) / pi_sampler(original))`` (no gradient through it); None: the plain loss."""
    by_policy = preference_rows(agents, pairs, pair_weight)
    metrics = pair_metrics(agents, pairs, by_policy)
    for agent in agents:
        batch = by_policy.pop(id(agent.policy), None)
        if not batch:
            continue
        shifts: list[float] = []
        if reference is not None:
            batch = _with_reference(reference[agent.role], batch, minibatch)
        stats = Mismatch(cap=is_cap or REPORT_CAP)
        loss, norm = accumulate_and_step(
            agent.policy,
            batch,
            minibatch,
            lambda policy, chunk: _bradley_terry_chunk(policy, chunk, beta, shifts, stats, is_cap),
            *optimizers[agent.role],
            grad_clip,
            side=(shifts, stats),
        )
        metrics.update(stats.metrics(agent.role, prefix="bid_"))
        if shifts:  # how far the bids already lean the pairs' way, beyond the reference (0 at the start)
            metrics[f"charts/bid_ref_logodds_{agent.role}"] = sum(shifts) / len(shifts)
        metrics[f"losses/bid_{agent.role}"] = loss
        metrics[f"charts/bid_grad_norm_{agent.role}"] = norm
    return metrics


def preference_rows(agents: list[Agent], pairs: list[BranchPair], pair_weight: str) -> dict[int, list]:
    """The decisive pairs (ties dropped) as Bradley-Terry rows, per policy (``id`` of the pair's agent's policy):
    the higher-scoring side's bid the winner, each row weighted by :func:`pair_weights` over its policy's pairs."""
    decisive: dict[int, list[BranchPair]] = defaultdict(list)
    for p in pairs:
        if p.original_score != p.branch_score:
            decisive[id(agents[p.agent].policy)].append(p)
    by_policy: dict[int, list] = {}
    for key, ps in decisive.items():
        weights = pair_weights([p.original_score - p.branch_score for p in ps], pair_weight)
        by_policy[key] = [
            _PreferenceRow(
                p.prompt,
                *(
                    (p.original, p.counterfactual)
                    if p.original_score > p.branch_score
                    else (p.counterfactual, p.original)
                ),
                w,
                behaviour=p.original_logprobs,
                original_won=p.original_score > p.branch_score,
            )
            for p, w in zip(ps, weights)
        ]
    return by_policy


def pair_metrics(agents: list[Agent], pairs: list[BranchPair], by_policy: dict[int, list]) -> dict[str, float]:
    """The pairs' counts: decisive rows, how often keeping the selected agent's higher bid scored better (in
    all, and per agent), and the runner-up's pairs."""
    selected = [p for p in pairs if not p.runner_up]
    metrics: dict[str, float] = {
        "charts/bid_pairs": float(sum(len(v) for v in by_policy.values())),
        "charts/bid_pairs_higher_won": float(sum(p.original_score > p.branch_score for p in selected)),
    }
    if len(selected) < len(pairs):
        metrics["charts/bid_pairs_runner_up"] = float(len(pairs) - len(selected))
    for a, agent in enumerate(agents):  # per agent: how often keeping its higher bid scored better
        mine = [p for p in selected if p.agent == a and p.original_score != p.branch_score]
        if mine:
            metrics[f"charts/bid_higher_won_{agent.name}"] = sum(p.original_score > p.branch_score for p in mine) / len(
                mine
            )
    return metrics


@dataclass
class _PreferenceRow:
    """One decisive pair as the Bradley-Terry loss sees it: the bid prompt, the winning and losing
    bid responses, the pair's weight, (``algo.bid_reference=sft``) the reference's log-probs
    of the two responses, and the sampler's per-token log-probs of the original bid (the winner when
    ``original_won``, else the loser)."""

    prompt: str
    winner: list[int]
    loser: list[int]
    weight: float
    ref_winner: float | None = None
    ref_loser: float | None = None
    behaviour: list[float] | None = None
    original_won: bool = True

    @property
    def original(self) -> list[int]:
        return self.winner if self.original_won else self.loser


def _pair_logprobs(
    policy, chunk: list[_PreferenceRow], per_token: tuple[list, list] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probs of the winners and the losers; ``per_token`` (two lists): gets each one's per-token
    log-probs (detached)."""
    prompts = [r.prompt for r in chunk]
    pw, pl = per_token if per_token is not None else (None, None)
    return (
        sampled_logprobs(policy, prompts, [r.winner for r in chunk], per_token_out=pw),
        sampled_logprobs(policy, prompts, [r.loser for r in chunk], per_token_out=pl),
    )


def _tracked(r: _PreferenceRow) -> bool:
    """Whether the row's original bid came with the sampler's log-probs, one per token."""
    return r.behaviour is not None and len(r.behaviour) == len(r.original)


def _importance(
    chunk: list[_PreferenceRow], per_token: tuple[list, list], stats: Mismatch, is_cap: float | None
) -> list[float]:
    """Each row's original bid compared with its sampler log-probs (into ``stats``), and each row's truncated
    importance weight (1 for a row without them; all 1 without ``is_cap``)."""
    out = []
    for i, r in enumerate(chunk):
        if not _tracked(r):
            out.append(1.0)
            continue
        d = token_deltas(per_token[0 if r.original_won else 1][i], r.behaviour)
        stats.add(d)
        out.append(1.0 if is_cap is None else importance_weight(d, is_cap))
        if is_cap is not None:
            stats.weights.append(out[-1])
    return out


def _with_reference(ref_policy, batch: list[_PreferenceRow], minibatch: int) -> list[_PreferenceRow]:
    """Each row with the reference policy's log-probs of its two bid responses filled in."""
    prompts = [r.prompt for r in batch]
    ref_w = logprobs_in_chunks(ref_policy, prompts, [r.winner for r in batch], minibatch)
    ref_l = logprobs_in_chunks(ref_policy, prompts, [r.loser for r in batch], minibatch)
    return [replace(r, ref_winner=w, ref_loser=l) for r, w, l in zip(batch, ref_w, ref_l)]


def _bradley_terry_chunk(
    policy,
    chunk: list[_PreferenceRow],
    beta: float = 1.0,
    shifts: list | None = None,
    stats: Mismatch | None = None,
    is_cap: float | None = None,
) -> torch.Tensor:
    """Loss of the rows; rows with reference log-probs (:func:`_with_reference`) take the DPO form,
    each row's log-odds shift beyond the reference going into ``shifts``. Rows whose original bid has
    sampler log-probs feed ``stats`` and, with ``is_cap``, are importance-weighted (:func:`bid_update`)."""
    per_token = ([], []) if stats is not None and any(_tracked(r) for r in chunk) else None
    lw, ll = _pair_logprobs(policy, chunk, per_token)
    weights = torch.tensor([r.weight for r in chunk])
    if per_token is not None:
        iw = _importance(chunk, per_token, stats, is_cap)
        if is_cap is not None:
            weights = weights * torch.tensor(iw, dtype=weights.dtype)
    if chunk[0].ref_winner is None:
        return bradley_terry_loss(lw, ll, weights, beta=beta)
    rw, rl = torch.tensor([r.ref_winner for r in chunk]), torch.tensor([r.ref_loser for r in chunk])
    if shifts is not None:
        shifts += ((lw - ll).detach().cpu() - (rw - rl)).tolist()
    return bradley_terry_loss(lw, ll, weights, rw, rl, beta=beta)
