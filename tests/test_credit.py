import random

import pytest

from swarm_runtime.core.credit import (
    bucket_brigade,
    discarded_passback,
    fold_skipped_rewards,
    random_bid_credit,
    reward_to_go,
)


def test_design_worked_example():
    # docs/reference/method.md, section 2: bids (0.4, 0.6, 0.2), rewards (0, 10, 5)
    c = bucket_brigade([0, 10, 5], [0.4, 0.6, 0.2])
    assert c == pytest.approx([3.96, 4.4, 4.0])
    assert discarded_passback([0, 10, 5], [0.4, 0.6, 0.2]) == pytest.approx(2.64)
    assert sum(c) == pytest.approx(15 - 2.64)


def test_single_actor_keeps_one_minus_bid():
    assert bucket_brigade([7.0], [0.2]) == pytest.approx([5.6])


def test_zero_bids_keep_own_reward():
    assert bucket_brigade([1, 2, 3], [0, 0, 0]) == pytest.approx([1, 2, 3])


def test_hand_computed_four_turns():
    # v4 = 2; v3 = 0 + 0.8*2 = 1.6; v2 = 4 + 0.2*1.6 = 4.32; v1 = 1 + 0.6*4.32 = 3.592
    c = bucket_brigade([1, 4, 0, 2], [0.4, 0.6, 0.2, 0.8])
    assert c == pytest.approx([0.6 * 3.592, 0.4 * 4.32, 0.8 * 1.6, 0.2 * 2])


@pytest.mark.parametrize("seed", range(20))
def test_invariant_sum(seed):
    rng = random.Random(seed)
    k = rng.randint(1, 12)
    r = [rng.uniform(-5, 20) for _ in range(k)]
    b = [rng.choice([0, 0.2, 0.4, 0.6, 0.8]) for _ in range(k)]
    assert sum(bucket_brigade(r, b)) == pytest.approx(sum(r) - discarded_passback(r, b))


def test_empty_and_mismatch():
    assert bucket_brigade([], []) == []
    with pytest.raises(ValueError, match="differ in length"):
        bucket_brigade([1, 2], [0.2])


def test_returns_list_of_floats():
    out = bucket_brigade((0, 10, 5), (0.4, 0.6, 0.2))
    assert isinstance(out, list) and all(isinstance(x, float) for x in out)


def test_fold_skipped_rewards():
    # a reward seen on a skipped turn goes to the most recent actor; none before the first actor
    assert fold_skipped_rewards([3, 1, 0, 2, 5], [False, True, False, True, False]) == [1 + 0, 2 + 5]


def test_random_bid_credit_and_reward_to_go():
    c = random_bid_credit([1, 1], [0.8, 0.8], random.Random(0), levels=[0.0])
    assert c == pytest.approx([1, 1])
    assert reward_to_go([1, 2, 3]) == [6, 5, 3]
