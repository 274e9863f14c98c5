"""Core behaviour registered through the same public hooks a third-party plugin uses:
the auction and round-robin coordinators, the credit schemes, the transformers
policy backend and the MPT algorithm."""
from __future__ import annotations

from swarm_runtime import hookimpl


@hookimpl
def swarm_register_coordinators(register):
    from swarm_runtime.auction import AuctionCoordinator, RoundRobinCoordinator

    register("auction", AuctionCoordinator)
    register("round_robin", RoundRobinCoordinator)


@hookimpl
def swarm_register_credit_schemes(register):
    from swarm_runtime.credit import bucket_brigade, random_bid_credit

    register("bucket_brigade", lambda rewards, bids, rng: bucket_brigade(rewards, bids))
    register("random_bids", random_bid_credit)


@hookimpl
def swarm_register_policy_backends(register):
    from swarm_runtime.policy.transformers_backend import make_transformers_policy

    register("transformers", make_transformers_policy)


@hookimpl
def swarm_register_algorithms(register):
    from swarm_runtime.train.mpt import MPTTrainer

    register("mpt", MPTTrainer)
