"""Core behaviour registered through the same public hooks a third-party plugin uses:
the auction, round-robin, Graph-of-Agents and AgentNet coordinators, the credit
schemes, the transformers policy backend, the MPT, monolithic and RLCR algorithms,
the experiments of ``swarm experiment`` and the RLCR conformance suite. The core's
config rules are not here: they live with the config (swarm_runtime/config/keys.py and the checks modules)."""

from __future__ import annotations

from swarm_runtime import hookimpl


@hookimpl
def swarm_register_coordinators(register):
    from swarm_runtime.core.auction import AuctionCoordinator, RoundRobinCoordinator
    from swarm_runtime.core.coordinators import AgentNetCoordinator, GraphOfAgentsCoordinator

    register("auction", AuctionCoordinator)
    register("round_robin", RoundRobinCoordinator)
    register("graph_of_agents", GraphOfAgentsCoordinator)
    register("agentnet", AgentNetCoordinator)


@hookimpl
def swarm_register_credit_schemes(register):
    from swarm_runtime.core.credit import bucket_brigade, random_bid_credit

    register("bucket_brigade", lambda rewards, bids, rng: bucket_brigade(rewards, bids))
    register("random_bids", random_bid_credit)
    from swarm_runtime.learn.monolithic import reward_to_go_credit

    register("reward_to_go", reward_to_go_credit)


@hookimpl
def swarm_register_policy_backends(register):
    from swarm_runtime.models.transformers_backend import make_transformers_policy

    register("transformers", make_transformers_policy)


@hookimpl
def swarm_register_algorithms(register):
    from swarm_runtime.learn.monolithic import MonolithicTrainer
    from swarm_runtime.learn.mpt import MPTTrainer

    register("mpt", MPTTrainer)
    register("monolithic", MonolithicTrainer)
    from swarm_runtime.learn.rlcr.trainer import RLCRTrainer  # collective-reward RL (docs/guides/rlcr.md)

    register("rlcr", RLCRTrainer)


@hookimpl
def swarm_register_experiments(register):
    from swarm_runtime.experiments import BUILTIN_EXPERIMENTS

    for name, experiment in BUILTIN_EXPERIMENTS.items():
        register(name, experiment)
    from swarm_runtime.experiments.rlcr import rlcr_org, rlcr_teams  # docs/guides/rlcr.md

    register("rlcr_teams", rlcr_teams)
    register("rlcr_org", rlcr_org)


@hookimpl
def swarm_register_conformance_suites(register):
    from swarm_runtime.conformance.rlcr import check_rlcr, has_anytime_return

    register("rlcr", check_rlcr, applies=has_anytime_return)  # domains whose concurrent env has progress()
