"""Conformance kit for domains: call :func:`check_domain` from your own tests.

Like PettingZoo's ``api_test``, but aimed at what the runtime depends on most:
snapshot/restore, which counterfactual bid branches replay from every contested
turn, and the paths a trained policy finds that a scripted expert never takes.
:func:`check_snapshots` drives several seeds with trajectories that mix the
scripted expert's actions, random listed (or otherwise valid) actions of any
role, the expert's action sent by another role, ``role=None`` steps (as
``algo=monolithic`` and ``algo=rlcr`` take them) and garbage, and at **every
step** snapshots, steps, restores, compares the *full* state (the env's
optional ``state_digest()``, else a deep comparison of ``vars(env)``), and
replays the step. :func:`check_rare_paths` tries every listed action by every
role, ``role=None`` and many garbage texts at points along such trajectories
(one step each, from a snapshot): rewards outside the task's bounds, invalid
texts that change the state, and exceptions from env code. Further checks:
determinism under a seed (in this process and in two other processes with
other ``PYTHONHASHSEED`` values), a fresh env per ``make_env`` call, fresh task
configs, disjoint train/dev/eval seeds, ``max_decisions`` long enough for the
expert, the expert's actions valid with its role and with ``role=None``, every
prompt within the vocabulary and within ``model.max_prompt_tokens``, listed
action choices, ``close()`` (twice, before ``reset`` and mid-episode, with the
snapshot taken before it restorable into another env, no other env disturbed),
and then the conformance suites plugins register
(``swarm_register_conformance_suites``): the core's is the RLCR suite of
:mod:`swarm_runtime.conformance.rlcr`, for domains whose concurrent env has
``progress()``. The kit closes the envs it is done with and never uses a closed
one again.

Every failure is a :class:`ConformanceError` naming the domain, task, seed,
step, action, role and what differed; an exception raised by the domain's own
code is reported the same way (chained to the original).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from swarm_runtime.conformance.determinism import alongside_children, check_determinism
from swarm_runtime.conformance.env import (
    check_action_choices,
    check_close,
    check_expert,
    check_fresh_env,
    check_invalid_is_noop,
    check_max_decisions,
    check_rare_paths,
    check_snapshots,
)
from swarm_runtime.conformance.probe import TRAJECTORIES, load_task
from swarm_runtime.conformance.task import check_fresh_task_config, check_prompts, check_splits, model_field
from swarm_runtime.core.domain import Domain
from swarm_runtime.plugins.registry import ConformanceSuite
from swarm_runtime.plugins.suites import conformance_suites


def check_domain(
    domain: Domain,
    task: str | DictConfig,
    trajectories=TRAJECTORIES,
    max_tokens: int | None = None,
    processes: bool = True,
    registry: Any = None,
    model: Any = None,
) -> None:
    """Run every conformance check on ``domain``/``task``, then the plugins' suites; raises
    :class:`ConformanceError`. ``max_tokens``: the ``model.max_prompt_tokens`` prompts must fit (default:
    ``model``'s, else the task's overrides, else 256); ``model``: the run's ``model`` section (``resolve(...).model``
    or a mapping of ``path``, ``max_prompt_tokens``, ``chat_template``), whose tokenizer measures the prompts when it
    has a ``path`` (a checkpoint's BPE counts other lengths than the in-process word-level tokenizer);
    ``processes=False`` skips the determinism check in other processes (about a
    second); ``registry``: whose conformance suites run (one ``build_registry`` built; default: the installed
    plugins', the core's RLCR suite among them)."""
    load_task(domain, task)  # a task that cannot be loaded fails before anything starts
    suites = conformance_suites(registry)
    with alongside_children(domain, task, processes) as out:
        check_splits(domain, task)
        check_fresh_task_config(domain, task)
        check_fresh_env(domain, task)
        out["here"] = check_determinism(domain, task, processes=False)
        check_invalid_is_noop(domain, task)
        check_snapshots(domain, task, trajectories)
        check_rare_paths(domain, task)
        check_close(domain, task)  # after the snapshot checks: it restores a closed env's snapshot elsewhere
        check_expert(domain, task)
        check_max_decisions(domain, task)
        check_action_choices(domain, task)
        check_prompts(domain, task, max_tokens=max_tokens, model=model)
        limit = max_tokens or model_field(model, "max_prompt_tokens")
        run_suites(suites, domain, task, max_tokens=limit)


def run_suites(suites: list[ConformanceSuite], domain: Domain, task: str | DictConfig, **kw: Any) -> None:
    """Each suite that applies to ``domain`` (``suite.applies(domain, task)``, or always), in order, as
    ``suite.run(domain, task, **kw)``; an exception from either propagates with a note naming the suite and
    its plugin."""
    for suite in suites:
        try:
            if suite.applies is None or suite.applies(domain, task):
                suite.run(domain, task, **kw)
        except Exception as exc:
            if hasattr(exc, "add_note"):  # Python 3.11+
                exc.add_note(f"in conformance suite {suite.name!r} of plugin {suite.plugin!r}")
            raise
