"""Held-out statistics: mean ± SE over seeds, and the paired MPT - SFT difference."""

import math

import pytest

from swarm_runtime.core.episode import Episode
from swarm_runtime.evaluation.heldout import mean_se, paired_difference, summarize


def _eps(rewards_by_seed):
    return [Episode(seed, reward=r) for seed, rs in rewards_by_seed.items() for r in rs]


def test_mean_se_hand_computed():
    m, se = mean_se([1.0, 2.0, 3.0, 6.0])
    assert m == 3.0
    assert se == pytest.approx(math.sqrt(14 / 3 / 4))
    assert mean_se([5.0]) == (5.0, 0.0)


def test_summarize_averages_runs_per_seed_first():
    res = summarize(_eps({1: [10, 20], 2: [0, 0], 3: [30, 50]}), runs=2, agents=[])
    assert res["seed_rewards"] == {"1": 15.0, "2": 0.0, "3": 40.0}
    assert res["reward_mean"] == pytest.approx(55 / 3)
    assert res["reward_se"] == pytest.approx(mean_se([15.0, 0.0, 40.0])[1])


def test_paired_difference_removes_seed_spread():
    before = summarize(_eps({1: [10], 2: [100], 3: [50]}), runs=1, agents=[])
    after = summarize(_eps({1: [12], 2: [103], 3: [54]}), runs=1, agents=[])
    d, se, n = paired_difference(after, before)
    assert (d, n) == (3.0, 3)
    assert se == pytest.approx(mean_se([2.0, 3.0, 4.0])[1])  # 0.577, far below either run's own SE (~26)
    assert se < 0.1 * before["reward_se"]
    assert paired_difference(after, {"seed_rewards": {"9": 1.0}})[2] == 0


def test_paired_success_difference():
    def eps(success_by_seed):
        return [
            Episode(seed, reward=0.5 * s, metrics={"success": float(s)})
            for seed, ss in success_by_seed.items()
            for s in ss
        ]

    before = summarize(eps({1: [0, 0], 2: [1, 0], 3: [0, 0]}), runs=2, agents=[])
    after = summarize(eps({1: [1, 0], 2: [1, 1], 3: [0, 0]}), runs=2, agents=[])
    assert after["seed_success"] == {"1": 0.5, "2": 1.0, "3": 0.0}
    d, se, n = paired_difference(after, before, "seed_success")
    assert (d, n) == (pytest.approx(1 / 3), 3) and se == pytest.approx(mean_se([0.5, 0.5, 0.0])[1])
    assert "seed_success" not in summarize(_eps({1: [1.0]}), runs=1, agents=[])  # no success metric, no pairing
