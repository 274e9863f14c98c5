"""Every hook of swarm-runtime, in one place.

Hooks are grouped by phase. *Registration* hooks receive a ``register``
callable; the core owns the registries and rejects duplicates. *Observer* hooks
are told about events and return nothing. Implement hooks with
``@swarm_runtime.hookimpl``; a misspelled hook name fails loudly at load time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("swarm_runtime")

# --------------------------------------------------------------------------- registration


@hookspec
def swarm_register_domains(register: Callable[[Any], None]) -> None:
    """Register domains (subclasses of :class:`swarm_runtime.core.domain.Domain`).

    A domain brings its roles, tasks (YAML shipped in its package), prompts (bid,
    action, single-model), an env factory with snapshot/restore, rewards, a
    vocabulary, and scripted per-role experts (``DomainEnv.expert_action``).

    :param register: call ``register(domain)`` once per domain instance.
    """


@hookspec
def swarm_register_policy_backends(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register policy backends (``transformers``, ``vllm``, an OpenAI-compatible API ...).

    :param register: ``register(name, factory)``; ``factory(model_cfg, words, bid_levels, seed,
        flops=FlopCounter, init_path=str | None)`` returns a :class:`swarm_runtime.core.protocols.Policy`
        (``words``: the domain's vocabulary; ``init_path``: a checkpoint folder to load).
    """


@hookspec
def swarm_register_coordinators(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register coordinators that decide which agent acts each turn (the auction is one).

    :param register: ``register(name, factory)``; ``factory(cfg)`` returns an object with a
        ``uses_bids`` attribute (False: agents are not asked to bid, every present agent's bid
        reads 0.0) and ``select(bids, rng, turn) -> swarm_runtime.core.auction.AuctionResult``
        (``bids[i] is None`` when agent i is absent).
    """


@hookspec
def swarm_register_credit_schemes(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register credit schemes (``bucket_brigade`` is one).

    :param register: ``register(name, fn)``; ``fn(rewards, bids, rng) -> list[float]``, the
        credit each actor of the acted turns keeps, in order.
    """


@hookspec
def swarm_register_algorithms(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register training algorithms (``mpt`` is one; baselines come as plugins).

    :param register: ``register(name, factory)``; ``factory(run)`` returns an object with
        ``train()``. A factory with an ``evaluate_checkpoint(run, checkpoint_dir)`` attribute returning
        ``(results, markdown table)`` evaluates its runs' checkpoints in ``swarm eval`` (``algo=rlcr``
        does; ``eval_measure`` names what its table shows); the others are evaluated as swarms.
    """


@hookspec
def swarm_register_experiments(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register experiments run by ``swarm experiment NAME`` (``heldout``, ``dropout`` ... are built in).

    :param register: ``register(name, experiment)``; ``experiment(x)`` receives a
        :class:`swarm_runtime.experiments.ExperimentContext` (config, run folder, resumable cells,
        trainings, evaluations) and returns a :class:`swarm_runtime.experiments.Report`; the first
        line of its docstring is what ``swarm experiment --list`` shows.
    """


# --------------------------------------------------------------------------- observers


@hookspec
def swarm_on_run_start(config: Any, run_dir: str) -> None:
    """A run starts. :param config: the resolved config. :param run_dir: its output folder."""


@hookspec
def swarm_on_episode_end(domain: str, seed: int, reward: float, metrics: dict) -> None:
    """An episode of a rollout ended.

    :param domain: domain name. :param seed: the episode's seed.
    :param reward: its total env reward. :param metrics: the env's episode metrics.
    """


@hookspec
def swarm_on_turn(turn: int, bids: list, winners: list) -> None:
    """One batched turn was played. :param turn: decision index.
    :param bids: per env, the bids of every agent (``None`` = absent).
    :param winners: per env, the winning agent index or ``None`` (skipped / finished)."""


@hookspec
def swarm_on_train_step(step: int, kind: str, metrics: dict) -> None:
    """A training update finished.

    :param step: global update index. :param kind: ``sft``, ``action`` or ``bid``.
    :param metrics: what the update logged (losses, rewards, FLOPs).
    """


@hookspec
def swarm_on_run_end(config: Any, run_dir: str, results: dict) -> None:
    """A run finished. :param results: the held-out evaluation table."""
