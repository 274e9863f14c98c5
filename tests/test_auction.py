import random
from collections import Counter

from swarm_runtime.core.auction import AuctionCoordinator, RoundRobinCoordinator, auction


def test_highest_bid_wins_and_runner_up():
    r = auction([0.2, 0.8, 0.4], random.Random(0))
    assert (r.winner, r.runner_up, r.winning_bid, r.runner_up_bid) == (1, 2, 0.8, 0.4)
    assert r.contested


def test_all_zero_skips():
    r = auction([0.0, 0.0, 0.0], random.Random(0))
    assert r.winner is None and not r.contested


def test_absent_agents_do_not_bid():
    r = auction([None, 0.2, None], random.Random(0))
    assert r.winner == 1 and r.runner_up is None and not r.contested
    assert auction([None, None], random.Random(0)).winner is None


def test_uncontested_when_runner_up_bids_zero():
    r = auction([0.6, 0.0, 0.0], random.Random(0))
    assert r.winner == 0 and not r.contested


def test_ties_broken_uniformly_and_seeded():
    rng = random.Random(123)
    wins = Counter(auction([0.6, 0.6, 0.2, 0.6], rng).winner for _ in range(3000))
    assert set(wins) == {0, 1, 3}
    assert all(900 < wins[i] < 1100 for i in (0, 1, 3))
    a = [auction([0.4, 0.4], random.Random(7)).winner for _ in range(5)]
    b = [auction([0.4, 0.4], random.Random(7)).winner for _ in range(5)]
    assert a == b
    tie = auction([0.4, 0.4], random.Random(1))
    assert tie.runner_up_bid == 0.4 and tie.contested


def test_coordinators():
    assert AuctionCoordinator().select([0.2, 0.4], random.Random(0), 0).winner == 1
    rr = RoundRobinCoordinator()
    assert [rr.select([0, 0, 0], random.Random(0), t).winner for t in range(4)] == [0, 1, 2, 0]
    assert rr.select([None, 0, 0], random.Random(0), 0).winner == 1
