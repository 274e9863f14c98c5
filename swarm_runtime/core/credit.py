"""Credit assignment as pure functions over lists of floats (docs/reference/method.md, section 2)."""

from __future__ import annotations

import random
from collections.abc import Sequence


def bucket_brigade(rewards: Sequence[float], bids: Sequence[float]) -> list[float]:
    """Bucket-brigade credit over the K acted turns, in order.

    ``v_{K+1} = 0``; ``v_k = r_k + b_{k+1} v_{k+1}``; actor k keeps
    ``c_k = (1 - b_k) v_k`` and passes ``b_k v_k`` back to actor k-1. The first
    actor's pass-back ``b_1 v_1`` is discarded, so
    ``sum(c) == sum(r) - b_1 v_1``.

    :param rewards: env reward observed after each acted turn's action.
    :param bids: the winning bid of each acted turn (each in [0, 1)).
    :returns: the credit each actor keeps, one float per acted turn.
    """
    if len(rewards) != len(bids):
        raise ValueError(f"rewards and bids differ in length: {len(rewards)} != {len(bids)}")
    credit = [0.0] * len(rewards)
    v_next, b_next = 0.0, 0.0
    for k in range(len(rewards) - 1, -1, -1):
        v = float(rewards[k]) + b_next * v_next
        credit[k] = (1.0 - float(bids[k])) * v
        v_next, b_next = v, float(bids[k])
    return credit


def discarded_passback(rewards: Sequence[float], bids: Sequence[float]) -> float:
    """``b_1 * v_1``: what the first actor would pass back to nobody."""
    if not rewards:
        return 0.0
    credit = bucket_brigade(rewards, bids)
    b1 = float(bids[0])
    return 0.0 if b1 >= 1.0 else credit[0] * b1 / (1.0 - b1)


def fold_skipped_rewards(turn_rewards: Sequence[float], acted: Sequence[bool]) -> list[float]:
    """Rewards per acted turn: a reward seen during a skipped turn belongs to the
    most recent actor (dropped if nobody has acted yet)."""
    out: list[float] = []
    for r, a in zip(turn_rewards, acted):
        if a:
            out.append(float(r))
        elif out:
            out[-1] += float(r)
    return out


def random_bid_credit(
    rewards: Sequence[float],
    bids: Sequence[float],
    rng: random.Random,
    levels: Sequence[float] = (0.0, 0.2, 0.4, 0.6, 0.8),
) -> list[float]:
    """Credit ablation: bucket brigade with random levels in place of the bids."""
    return bucket_brigade(rewards, [rng.choice(list(levels)) for _ in bids])


def reward_to_go(rewards: Sequence[float]) -> list[float]:
    """Undiscounted return from each turn to the end (monolithic REINFORCE)."""
    out, acc = [0.0] * len(rewards), 0.0
    for k in range(len(rewards) - 1, -1, -1):
        acc += float(rewards[k])
        out[k] = acc
    return out
