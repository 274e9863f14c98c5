"""Edges of the method's arithmetic and glue (swarm_runtime/core/credit.py, core/auction.py, core/env.py's snapshots,
learn/losses.py, sampling/mismatch.py) that a one-token slip would change and the other tests do not pin: when the
auction draws from the turn's randomness, exact results, empty and degenerate inputs, which rows are
importance-weighted, precision, error texts. Pure Python and small tensors (a stand-in policy, a counting env): the
file costs ~0.1 s. benchmarks/mutation.py measures what these and the other tests catch."""

import math
import random

import pytest
import torch

from swarm_runtime import DomainEnv, StepResult
from swarm_runtime.core.auction import AuctionCoordinator, AuctionResult, RoundRobinCoordinator, auction, round_robin
from swarm_runtime.core.credit import discarded_passback
from swarm_runtime.core.env import EnvContractError, ValidatedEnv
from swarm_runtime.learn.losses import bradley_terry_loss, pair_weights


def test_no_turns_pass_nothing_back():
    assert discarded_passback([], []) == 0.0


def test_a_clear_winner_and_runner_up_draw_nothing_from_the_turns_randomness():
    """Ties are broken with the caller's rng; without a tie the auction draws nothing, so the turn's other draws
    (and so a run's numbers) do not depend on whether someone happened to tie elsewhere."""
    rng = random.Random(0)
    state = rng.getstate()
    assert auction([0.2, 0.8, None, 0.4], rng) == AuctionResult(1, 3, 0.8, 0.4)
    assert auction([None, 0.6, None], rng) == AuctionResult(1, None, 0.6, 0.0)  # a sole bidder: no runner-up
    assert rng.getstate() == state
    assert auction([0.6, 0.6, 0.2], rng).runner_up_bid == 0.6 and rng.getstate() != state  # a tie for first draws


def test_a_sole_bidders_result_is_exact():
    res = auction([None, 0.4], random.Random(0))
    assert (res.winner, res.runner_up, res.winning_bid, res.runner_up_bid) == (1, None, 0.4, 0.0)
    assert isinstance(res.runner_up_bid, float) and not res.contested


def test_a_tie_for_second_place_is_broken_at_random():
    seen = {auction([0.8, 0.4, 0.4, 0.4], random.Random(s)).runner_up for s in range(40)}
    assert seen == {1, 2, 3}
    seen = {auction([0.6, 0.6, 0.6], random.Random(s)).winner for s in range(40)}
    assert seen == {0, 1, 2}


def test_round_robin_results_are_exact():
    assert round_robin([None, None], 3) == AuctionResult(None, None, 0.0, 0.0)
    assert round_robin([0.4, None, 0.0], 3) == AuctionResult(2, None, 0.0, 0.0)  # present: 0 and 2; turn 3 -> 2
    assert round_robin([0.4, None, 0.0], 4) == AuctionResult(0, None, 0.0, 0.0)
    for res in (round_robin([0.4], 0), round_robin([None], 0)):
        assert isinstance(res.winning_bid, float) and isinstance(res.runner_up_bid, float) and res.runner_up is None


def test_coordinators_keep_their_config_and_break_ties_with_the_callers_randomness():
    cfg = {"name": "auction"}
    assert AuctionCoordinator(cfg).cfg is cfg and RoundRobinCoordinator(cfg).cfg is cfg
    bids = [0.6, 0.6, 0.6]
    got = [AuctionCoordinator().select(bids, random.Random(s), 0).winner for s in range(20)]
    assert got == [auction(bids, random.Random(s)).winner for s in range(20)] and len(set(got)) == 3


def test_bradley_terry_refuses_half_a_reference_in_one_line():
    t = torch.zeros(2)
    msg = r"^bradley_terry_loss needs both reference log-probs \(ref_winner, ref_loser\) or neither$"
    for half in ({"ref_winner": t}, {"ref_loser": t}):
        with pytest.raises(ValueError, match=msg):
            bradley_terry_loss(t, t, **half)


def test_margin_weights_of_pairs_that_all_tie_count_one_each():
    assert pair_weights([0.0, 0.0], "margin") == [1.0, 1.0]
    assert pair_weights([0.0, -3.0, 1.0], "margin") == [0.0, 2.25, 0.75]
    assert pair_weights([], "margin") == []


def test_a_two_way_tie_for_second_place_is_broken_at_random():
    assert {auction([0.8, 0.4, 0.4], random.Random(s)).runner_up for s in range(40)} == {1, 2}


class ScoredPolicy:
    """Stands in for a policy in :func:`reinforce_chunk`: each response's per-token log-probs are given (by its
    prompt and first token); it records whether it was asked for the action constraint and for per-token log-probs."""

    temperature = 1.0

    def __init__(self, per_token: dict[tuple[str, int], list[float]], action_trie=None):
        self.per_token, self.action_trie, self.calls = per_token, action_trie, []

    def logprobs(self, prompts, responses, actions=False, per_token_out=None):
        self.calls.append((actions, per_token_out is not None))
        rows = [torch.tensor(self.per_token[p, r[0]], dtype=torch.float32) for p, r in zip(prompts, responses)]
        if per_token_out is not None:
            per_token_out += rows
        return torch.stack([r.sum() for r in rows])


LEARNER = {("p", 1): [-0.5, -1.0], ("q", 2): [-2.0], ("p", 2): [-9.0]}  #: per-token log-probs by prompt, first token


def test_reinforce_chunk_weights_each_tracked_row_by_its_capped_ratio():
    from swarm_runtime.learn.losses import reinforce_chunk
    from swarm_runtime.sampling.mismatch import Mismatch

    pol = ScoredPolicy(LEARNER, action_trie=object())
    # learner minus sampler: row 1 +0.5 in all (ratio e^0.5 > 1.5: capped), row 2 -1 (ratio e^-1)
    rows = [("p", [1, 9], 2.0, [-1.0, -1.0]), ("q", [2], -1.0, [-1.0])]
    stats = Mismatch(cap=1.5)
    loss = reinforce_chunk(pol, rows, stats=stats, is_cap=1.5)
    w = [1.5, torch.exp(torch.tensor(-1.0)).item()]
    want = -(2.0 * w[0] * -1.5 + -1.0 * w[1] * -2.0) / 2
    assert float(loss) == pytest.approx(want, rel=1e-6)
    assert pol.calls == [(True, True)]  # under the action constraint, per token
    assert stats.tokens == 3 and stats.responses == 2 and stats.weights == pytest.approx(w)
    more = reinforce_chunk(pol, rows[1:], stats=stats, is_cap=1.5)  # a second chunk of the same update adds to it
    assert float(more) == pytest.approx(-w[1] * 2.0, rel=1e-6)
    assert stats.weights == pytest.approx([*w, w[1]]) and stats.tokens == 4


@pytest.mark.parametrize(
    "rows, stats",
    [
        ([("p", [1, 9], 2.0, [-1.0, -1.0]), ("q", [2], -1.0, [-1.0])], False),  # no stats: sampler log-probs unread
        ([("p", [1, 9], 2.0), ("q", [2], -1.0)], True),  # rows without sampler log-probs
        ([("p", [1, 9], 2.0, [-1.0, -1.0]), ("q", [2], -1.0, None)], True),  # one row without: none compared
        ([("p", [1, 9], 2.0, [-1.0]), ("q", [2], -1.0, [-1.0])], True),  # one row's are not one per token
    ],
    ids=["no-stats", "three-fields", "one-none", "one-short"],
)
def test_reinforce_chunk_without_sampler_log_probs_for_every_row_is_the_plain_loss(rows, stats):
    from swarm_runtime.learn.losses import reinforce_chunk
    from swarm_runtime.sampling.mismatch import Mismatch

    pol = ScoredPolicy(LEARNER)
    m = Mismatch(cap=1.5) if stats else None
    loss = reinforce_chunk(pol, rows, stats=m, is_cap=1.5)
    assert float(loss) == pytest.approx(-(2.0 * -1.5 + -1.0 * -2.0) / 2)
    assert pol.calls == [(False, False)]  # no action constraint on this policy, no per-token log-probs asked
    assert m is None or (m.tokens, m.weights) == (0, [])


def test_token_deltas_take_the_samplers_log_probs_at_full_precision():
    from swarm_runtime.sampling.mismatch import token_deltas

    d = token_deltas(torch.tensor([-0.1, -2.3], dtype=torch.float64), [-0.1, -2.3])
    assert d.dtype == torch.float64 and d.tolist() == [0.0, 0.0]  # -0.1 in float32 would leave ~1.5e-9


def test_a_token_exactly_at_the_cap_is_not_past_it():
    from swarm_runtime.sampling.mismatch import Mismatch

    m = Mismatch(cap=2.0)
    m.add(torch.tensor([math.log(2.0), -math.log(2.0), 0.75, 0.0], dtype=torch.float64))
    assert m.past == 1 and m.tokens == 4 and m.responses == 1


def test_merged_mismatch_sums_are_the_parts_sums():
    from swarm_runtime.sampling.mismatch import Mismatch

    a, b = Mismatch(), Mismatch()
    a.add(torch.tensor([0.5, -1.0], dtype=torch.float64))
    b.add(torch.tensor([2.0], dtype=torch.float64))
    a.weights, b.weights = [1.0, 0.5], [2.0]
    m = Mismatch()
    m.merge([a, b])
    assert (m.tokens, m.responses, m.past, m.max_abs, m.weights) == (3, 2, a.past + b.past, 2.0, [1.0, 0.5, 2.0])
    assert m.k3 == pytest.approx(a.k3 + b.k3) and m.k3 > 0
    m.merge([])
    assert (m.tokens, m.responses, m.k3, m.past, m.max_abs, m.weights) == (0, 0, 0, 0, 0.0, [])


class Counter(DomainEnv):
    """Counts its steps; each pays ``pays``, the ``steps``-th ends the episode."""

    pays, steps = 1.5, 3

    def reset(self, seed: int) -> str:
        self.n = 0
        return self.observation()

    def observation(self) -> str:
        return f"count {self.n}"

    def step(self, action: str, role: str | None = None) -> StepResult:
        self.n += 1
        return StepResult(self.observation(), reward=self.pays, done=self.n >= self.steps)


def test_a_validated_envs_snapshot_restores_its_own_counters_and_is_refused_after_close():
    env = ValidatedEnv(Counter(), "counter", (0.0, 10.0), task="count")
    env.reset(7)
    env.step("add")
    snap = env.snapshot()
    env.step("add")
    env.step("add")
    assert (env.done, env.total_reward, env.t, env.env.n) == (True, 4.5, 3, 3)
    for target in (env, ValidatedEnv(Counter(), "counter", (0.0, 10.0), task="count")):
        target.restore(snap)  # into itself, and into a fresh env; the snapshot stays reusable
        assert (target.done, target.total_reward, target.t, target.env.n) == (False, 1.5, 1, 1)
    env.close()
    with pytest.raises(EnvContractError, match=r"^counter/count, seed 7, step 1: restore\(\) called after close\(\)"):
        env.restore(snap)


def test_a_bradley_terry_chunk_weights_only_the_rows_whose_original_bid_was_tracked():
    """Rows without the sampler's log-probs of their original bid count with weight 1, wherever they sit in the
    chunk; a tracked row's weight is its capped ratio, on the side its original bid is (the loser here)."""
    import torch.nn.functional as F

    from swarm_runtime.learn.bid import _bradley_terry_chunk, _PreferenceRow
    from swarm_runtime.sampling.mismatch import Mismatch

    pol = ScoredPolicy({("b", 5): [-1.0], ("b", 6): [-3.0], ("c", 5): [-2.0], ("c", 6): [-0.5]})
    rows = [
        _PreferenceRow("b", [5], [6], 1.0),
        _PreferenceRow("c", [5], [6], 0.5, behaviour=[-1.25], original_won=False),  # original: [6], d = 0.75
        _PreferenceRow("b", [6], [5], 2.0, behaviour=[-2.0, -1.0]),  # not one per token: untracked
    ]
    stats = Mismatch(cap=3.0)
    loss = _bradley_terry_chunk(pol, rows, stats=stats, is_cap=3.0)
    iw = [1.0, math.exp(0.75), 1.0]
    z = torch.tensor([-1.0 - -3.0, -2.0 - -0.5, -3.0 - -1.0])
    want = -(torch.tensor([1.0, 0.5, 2.0]) * torch.tensor(iw) * F.logsigmoid(z)).mean()
    assert float(loss) == pytest.approx(float(want), rel=1e-6)
    assert stats.tokens == 1 and stats.weights == pytest.approx([math.exp(0.75)])


def test_only_contested_turns_with_a_snapshot_are_picked_and_episodes_without_a_reward_are_skipped():
    from swarm_runtime.core.episode import Episode, Turn
    from swarm_runtime.learn.bid import pick_contested

    def turn(t: int, runner_up_bid: float, snapshot=("world", [])) -> Turn:
        return Turn(
            t, [0.8, runner_up_bid], [[1], [2]], ["a", "b"], AuctionResult(0, 1, 0.8, runner_up_bid), snapshot=snapshot
        )

    missing = Episode(1, [turn(0, 0.4), turn(1, 0.6)], reward_missing=True)
    ep = Episode(2, [turn(0, 0.4), turn(1, 0.0), turn(2, 0.2, snapshot=None), turn(3, 0.6), turn(4, 0.2)])
    picks = pick_contested([missing, ep], 5, random.Random(0))
    assert sorted(t.t for _, t in picks) == [0, 3, 4] and all(e is ep for e, _ in picks)
    assert len(pick_contested([missing, ep], 2, random.Random(0))) == 2


def test_a_pick_whose_branch_lost_its_reward_makes_no_pair_and_the_others_still_do():
    from swarm_runtime.core.episode import Episode, Turn
    from swarm_runtime.learn.bid import _branch_pairs, _Pick

    def pick(t: int, score: float, logprobs=None) -> _Pick:
        turn = Turn(t, [0.8, 0.4], [[1], [2]], [f"a{t}", f"b{t}"], AuctionResult(0, 1, 0.8, 0.4))
        turn.bid_logprobs = logprobs  # the rollout sampler's, per agent (None: none reported)
        return _Pick(turn, [3], [4], score)

    picks = [pick(0, 1.0, [[-0.1], [-0.2]]), pick(1, 2.0), pick(2, 3.0)]
    branches = [Episode(0, reward=5.0), Episode(0, reward=6.0, reward_missing=True), Episode(0, reward=7.0)]
    pairs = _branch_pairs(picks, [(0, 1), (1, 1), (2, 1)], branches)
    got = [
        (p.agent, p.prompt, p.original, p.counterfactual, p.original_score, p.branch_score, p.runner_up) for p in pairs
    ]
    assert got == [
        (0, "a0", [1], [3], 1.0, 5.0, False),
        (1, "b0", [2], [4], 1.0, 5.0, True),
        (0, "a2", [1], [3], 3.0, 7.0, False),
        (1, "b2", [2], [4], 3.0, 7.0, True),
    ]
    assert [p.original_logprobs for p in pairs] == [[-0.1], [-0.2], None, None]


def test_preference_rows_put_the_better_side_first_with_its_margin_weight_and_the_samplers_log_probs():
    from types import SimpleNamespace

    from swarm_runtime.learn.bid import BranchPair, preference_rows

    pol = object()
    agents = [SimpleNamespace(policy=pol), SimpleNamespace(policy=pol)]
    pairs = [
        BranchPair(0, "a", [1], [2], 3.0, 1.0, original_logprobs=[-0.5]),  # the original did better by 2
        BranchPair(1, "b", [3], [4], 0.0, 6.0, runner_up=True, original_logprobs=[-0.25]),  # the branch, by 6
        BranchPair(0, "c", [5], [6], 2.0, 2.0),  # a tie: dropped
    ]
    (rows,) = preference_rows(agents, pairs, "margin").values()
    got = [(r.prompt, r.winner, r.loser, r.weight, r.behaviour, r.original_won) for r in rows]
    assert got == [("a", [1], [2], 0.5, [-0.5], True), ("b", [4], [3], 1.5, [-0.25], False)]
    assert [r.weight for r in preference_rows(agents, pairs, "uniform")[id(pol)]] == [1.0, 1.0]
