"""Every hook of swarm-runtime, in one place, with how the core calls it.

Implement hooks with ``@swarm_runtime.hookimpl`` (a module or an object); a misspelled hook name fails loudly
when the plugin loads. Every hook here is *plain* (pluggy's default): every implementation is called, none is
``firstresult`` (no hook asks for one answer) and none is ``historic`` (the registry is built once, after every
plugin is registered, so no call needs replaying to a plugin registered later). What a hook returns is ignored.

=================================  ============  =====================================================  =====
Hook                               Kind          Called by, when                                        Order
=================================  ============  =====================================================  =====
swarm_register_domains             registration  build_registry; config.load.light_registry (precheck)  A; B
swarm_register_policy_backends     registration  build_registry                                         A
swarm_register_coordinators        registration  build_registry                                         A
swarm_register_credit_schemes      registration  build_registry                                         A
swarm_register_algorithms          registration  build_registry                                         A
swarm_register_experiments         registration  build_registry                                         A
swarm_register_config_rules        registration  build_registry; validate() with a light registry       A
swarm_register_conformance_suites  registration  build_registry; check_domain() without a registry      A
swarm_on_run_start                 observer      the trainer, before its first phase                    B
swarm_on_turn                      observer      the trainer, after each batched turn (RLCR: round)     B
swarm_on_episode_end               observer      the trainer, after each episode of a rollout           B
swarm_on_train_step                observer      the trainer, after each update (SFT's too)             B
swarm_on_run_end                   observer      the trainer, after the held-out evaluation             B
=================================  ============  =====================================================  =====

``build_registry`` is :func:`swarm_runtime.plugins.manager.build_registry`; it builds the registry every command
uses, once per process (:func:`~swarm_runtime.plugins.manager.get_registry`).

Order A: one plugin at a time, in the order plugins are registered (the core's own
:mod:`swarm_runtime.plugins.builtins` first, then the ``swarm_runtime`` entry points, then the plugins a test
passes to ``make_plugin_manager``), each given its own ``register`` so everything it registers is recorded as
its (``swarm plugins`` lists it). A name registered twice is a :class:`~swarm_runtime.plugins.manager.PluginError`
naming both plugins; an exception raised inside the hook becomes a ``PluginError`` naming the plugin and the hook.
Registration hooks should import lazily what they register: the registry is built before most commands start.

Order B: one call of every implementation, pluggy's order (the last registered plugin first, ``tryfirst`` /
``trylast`` respected). An exception propagates at once: later implementations are not called and the
command stops (an observer that must not stop a run catches its own errors).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("swarm_runtime")

# --------------------------------------------------------------------------- registration


@hookspec
def swarm_register_domains(register: Callable[[Any], None]) -> None:
    """Register domains (subclasses of :class:`swarm_runtime.Domain`).

    A domain brings its roles, tasks (YAML shipped in its package), prompts (bid,
    action, single-model), an env factory with snapshot/restore, rewards, a
    vocabulary, and scripted per-role experts (``DomainEnv.expert_action``).

    Called once per plugin by ``build_registry`` (order A of this module); also, every implementation in one
    plain call (order B), by ``swarm_runtime.config.load.light_registry``, which checks a command line before
    the heavy hooks run (there a name registered twice keeps one domain, unreported: ``build_registry`` refuses
    it next). Keep it light: construct the domain, import its simulator in ``make_env``.

    :param register: call ``register(domain)`` once per domain instance; its ``name`` is the key
        (an empty name or a name registered twice is a ``PluginError``).
    """


@hookspec
def swarm_register_policy_backends(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register policy backends (``transformers``, ``vllm``, an OpenAI-compatible API ...).

    Called once per plugin by ``build_registry`` (order A of this module).

    :param register: ``register(name, factory)``; ``factory(model_cfg, words, bid_levels, seed,
        flops=FlopCounter, init_path=str | None)`` returns a :class:`swarm_runtime.core.protocols.Policy`
        (``words``: the domain's vocabulary; ``init_path``: a checkpoint folder to load).
    """


@hookspec
def swarm_register_coordinators(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register coordinators that decide which agent acts each turn (the auction is one).

    Called once per plugin by ``build_registry`` (order A of this module).

    :param register: ``register(name, factory)``; ``factory(cfg)`` returns an object with a
        ``uses_bids`` attribute (False: agents are not asked to bid, every present agent's bid
        reads 0.0) and ``select(bids, rng, turn) -> swarm_runtime.core.auction.AuctionResult``
        (``bids[i] is None`` when agent i is absent).
    """


@hookspec
def swarm_register_credit_schemes(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register credit schemes (``bucket_brigade`` is one).

    Called once per plugin by ``build_registry`` (order A of this module).

    :param register: ``register(name, fn)``; ``fn(rewards, bids, rng) -> list[float]``, the
        credit each actor of the acted turns keeps, in order.
    """


@hookspec
def swarm_register_algorithms(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register training algorithms (``mpt`` is one; baselines come as plugins).

    Called once per plugin by ``build_registry`` (order A of this module).

    :param register: ``register(name, factory)``; ``factory(run)`` returns an object with
        ``train()``. A factory with an ``evaluate_checkpoint(run, checkpoint_dir)`` attribute returning
        ``(results, markdown table)`` evaluates its runs' checkpoints in ``swarm eval`` (``algo=rlcr``
        does; ``eval_measure`` names what its table shows); the others are evaluated as swarms.
    """


@hookspec
def swarm_register_experiments(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register experiments run by ``swarm experiment NAME`` (``heldout``, ``dropout`` ... are built in).

    Called once per plugin by ``build_registry`` (order A of this module).

    :param register: ``register(name, experiment)``; ``experiment(x)`` receives a
        :class:`swarm_runtime.experiments.ExperimentContext` (config, run folder, resumable cells,
        trainings, evaluations) and returns a :class:`swarm_runtime.experiments.Report`; the first
        line of its docstring is what ``swarm experiment --list`` shows.
    """


@hookspec
def swarm_register_config_rules(register: Callable[..., None], register_check: Callable[..., None]) -> None:
    """Register config rules for a domain's task keys, and cross-key checks.

    The only config section a plugin owns is ``task``: it is the domain's task YAML, merged in whole by
    ``swarm_runtime.config.load.resolve`` (a bare ``key=value`` of the command line sets ``task.key``). Every
    other section is a fixed schema of the core (``swarm_runtime/config/schema.py``; its open sections,
    ``model.bases`` and the like, hold names the user picks, with the core's meaning), so a rule may name
    ``task.*`` keys only, each for one domain: two domains may give one key different meanings
    (``task.sim``). A cross-key check sees the whole config and may refuse any combination.
    :func:`swarm_runtime.config.validation.validate` runs them after the core's own rules and checks (through
    :func:`swarm_runtime.plugins.rules.run_plugin_rules`): on a resolved config, a loaded run's, and a command
    line's precheck, before torch is imported. So keep this hook and what it registers light.

    Called once per plugin by ``build_registry`` (order A of this module), and again, alone, when a precheck's
    light registry is validated.

    :param register: ``register(rule, domain="NAME")``: ``rule`` a
        :class:`swarm_runtime.config.rules.Rule` whose ``key`` starts with ``task.``, checked on the configs of
        domain ``NAME`` that have the key; its error names the key, the value, what is valid and this plugin.
        One plugin per (domain, key): a second is a ``PluginError`` naming both.
    :param register_check: ``register_check(fn)``: ``fn(cfg, registry)`` raises
        :class:`swarm_runtime.config.errors.ConfigError` for a bad combination (its message gets this plugin's
        name); ``registry`` is the full one, or a light one (``registry.light``: domains only) in a precheck, where
        a check that needs more returns. A function registered twice is a ``PluginError``.
    """


@hookspec
def swarm_register_conformance_suites(register: Callable[..., None]) -> None:
    """Register conformance suites that :func:`swarm_runtime.check_domain` runs after its own checks.

    Called once per plugin by ``build_registry`` (order A of this module), or, when ``check_domain`` is given no
    registry, by :func:`swarm_runtime.plugins.suites.conformance_suites` for the installed plugins. The core's
    RLCR suite comes through this hook too (``swarm_runtime/plugins/builtins.py``).

    :param register: ``register(name, suite, applies=None)``; ``suite(domain, task, max_tokens=N | None)`` raises
        :class:`swarm_runtime.conformance.probe.ConformanceError` naming what failed (accept ``**kw``: later
        versions may pass more); ``applies(domain, task) -> bool`` says whether the suite concerns this domain
        (None: every domain; a domain plugin's own suite tests ``domain.name``). Suites run in registration order;
        an exception from either propagates out of ``check_domain`` with a note naming the suite and the plugin.
        A name registered twice is a ``PluginError`` naming both plugins.
    """


# --------------------------------------------------------------------------- observers


@hookspec
def swarm_on_run_start(config: Any, run_dir: str) -> None:
    """A run starts: called by the trainer (``swarm_runtime/learn/phases.py``) before its first phase, every
    implementation once (order B of this module).

    :param config: the resolved config. :param run_dir: its output folder."""


@hookspec
def swarm_on_episode_end(domain: str, seed: int, reward: float, metrics: dict) -> None:
    """An episode of a training rollout ended: called by the trainer after each rollout, once per episode, every
    implementation once (order B of this module).

    :param domain: domain name. :param seed: the episode's seed.
    :param reward: its total env reward (``algo=rlcr``: the anytime return). :param metrics: the env's episode
        metrics.
    """


@hookspec
def swarm_on_turn(turn: int, bids: list, winners: list) -> None:
    """One batched turn of a training rollout was played (``algo=rlcr``: one round). Called by the trainer,
    every implementation once (order B of this module); when no plugin implements it the trainer does not
    gather its arguments at all.

    :param turn: decision index.
    :param bids: per env, the bids of every agent (``None`` = absent).
    :param winners: per env, the winning agent index or ``None`` (skipped / finished)."""


@hookspec
def swarm_on_train_step(step: int, kind: str, metrics: dict) -> None:
    """A training update finished: called by the trainer after each update (SFT updates with ``step=0``),
    every implementation once (order B of this module).

    :param step: global update index. :param kind: ``sft``, ``action`` or ``bid``.
    :param metrics: what the update logged (losses, rewards, FLOPs).
    """


@hookspec
def swarm_on_run_end(config: Any, run_dir: str, results: dict) -> None:
    """A run finished: called by the trainer after the held-out evaluation, every implementation once (order B
    of this module). :param config: the resolved config. :param run_dir: its output folder.
    :param results: the held-out evaluation table."""
