"""The sealed-bid auction (docs/reference/method.md, section 1) as pure functions.

Bids are floats from the bid levels (all < 1); ``None`` marks an agent that is
absent this turn (dropout, or not part of the swarm). The highest bid wins, ties
are broken uniformly at random with the caller's seeded ``rng``, and a turn
where every present bid is 0 is skipped.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class AuctionResult:
    """Outcome of one turn's auction.

    :param winner: index of the acting agent, ``None`` if the turn is skipped.
    :param runner_up: index of the best other bidder (``None`` if there is none).
    """

    winner: int | None
    runner_up: int | None
    winning_bid: float = 0.0
    runner_up_bid: float = 0.0

    @property
    def contested(self) -> bool:
        """A turn is contested when the runner-up bid is non-zero (docs/reference/method.md, section 1)."""
        return self.winner is not None and self.runner_up is not None and self.runner_up_bid > 0


def auction(bids: Sequence[float | None], rng: random.Random) -> AuctionResult:
    """Run one sealed-bid auction over ``bids``."""
    present = [(b, i) for i, b in enumerate(bids) if b is not None]
    if not present or max(b for b, _ in present) <= 0:
        return AuctionResult(None, None)
    top = max(b for b, _ in present)
    tied = [i for b, i in present if b == top]
    winner = tied[rng.randrange(len(tied))] if len(tied) > 1 else tied[0]
    others = [(b, i) for b, i in present if i != winner]
    if not others:
        return AuctionResult(winner, None, top, 0.0)
    second = max(b for b, _ in others)
    tied2 = [i for b, i in others if b == second]
    runner = tied2[rng.randrange(len(tied2))] if len(tied2) > 1 else tied2[0]
    return AuctionResult(winner, runner, top, second)


def round_robin(bids: Sequence[float | None], turn: int) -> AuctionResult:
    """Ignore the bids: the present agents act in turn order."""
    present = [i for i, b in enumerate(bids) if b is not None]
    if not present:
        return AuctionResult(None, None)
    return AuctionResult(present[turn % len(present)], None, 0.0, 0.0)


class AuctionCoordinator:
    """MPT's coordinator: the auction. No central scheduler, just the bids."""

    uses_bids = True

    def __init__(self, cfg=None):
        self.cfg = cfg

    def select(self, bids: Sequence[float | None], rng: random.Random, turn: int) -> AuctionResult:
        return auction(bids, rng)


class RoundRobinCoordinator:
    """Baseline coordinator: agents act in a fixed cyclic order regardless of bids."""

    uses_bids = False

    def __init__(self, cfg=None):
        self.cfg = cfg

    def select(self, bids: Sequence[float | None], rng: random.Random, turn: int) -> AuctionResult:
        return round_robin(bids, turn)
