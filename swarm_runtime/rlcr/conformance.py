"""Conformance checks for domains that opt into ``algo=rlcr`` (call them from your own tests, as
:func:`swarm_runtime.testing.check_domain` is called): the anytime return (``progress()``) and concurrent
actions (``action_seconds``, ``concurrent_expert``, the event loop over the domain's concurrent env)."""
from __future__ import annotations

import math

from omegaconf import DictConfig

from swarm_runtime.domain import Domain
from swarm_runtime.env import has_progress
from swarm_runtime.policy.tokenizer import split_words
from swarm_runtime.rlcr.loop import LoopOptions, expert_decider, play_concurrent

GARBAGE = "zzqx florp"


class _WordCount:
    """Stands in for a policy's ``action_target``: one token per word plus an end token."""

    @staticmethod
    def action_target(text: str) -> list[int]:
        return list(range(len(split_words(text)) + 1))


def _task(domain: Domain, task) -> DictConfig:
    return domain.task_config(task) if isinstance(task, str) else task


def check_progress(domain: Domain, task, seed: int = 0, steps: int = 30) -> None:
    """``progress()`` exists, is a finite number within the task's reward bounds at every step of an
    expert episode, is deterministic under a seed, survives snapshot/restore, and is not moved by an
    unparsable action."""
    cfg = _task(domain, task)
    lo, hi = float(cfg.get("reward_min", 0.0)), float(cfg.reward_max)
    traces = []
    for _ in range(2):
        env = domain.concurrent_env(cfg)
        assert has_progress(env), f"{domain.name}: {type(env).__name__} does not implement DomainEnv.progress()"
        env.reset(seed)
        trace = []
        for _ in range(steps):
            p = env.progress()
            assert isinstance(p, (int, float)) and math.isfinite(p), f"{domain.name}: progress() returned {p!r}"
            assert lo - 1e-6 <= p <= hi + 1e-6, f"{domain.name}: progress() {p} left the bounds [{lo}, {hi}]"
            trace.append(round(float(p), 9))
            exp = env.concurrent_expert("agent", {}) or getattr(env.expert_action(), "action", None)
            if exp is None:
                break
            snap = env.snapshot()
            env.restore(snap)
            assert round(float(env.progress()), 9) == trace[-1], f"{domain.name}: progress() changed across snapshot/restore"
            res = env.step(GARBAGE, None)
            assert not res.valid, f"{domain.name}: garbage action {GARBAGE!r} was accepted"
            assert round(float(env.progress()), 9) == trace[-1], f"{domain.name}: an unparsable action moved progress()"
            if res.done:
                break
            if env.step(exp, None).done:
                trace.append(round(float(env.progress()), 9))
                break
        traces.append(trace)
    assert traces[0] == traces[1], f"{domain.name}: progress() differs between two episodes from seed {seed}"


def check_concurrent(domain: Domain, task, seeds=(0, 1), agents: int = 2, t_max: float = 600.0) -> None:
    """The domain's concurrent env runs under the event loop: ``action_seconds`` is finite and >= 0
    (garbage included), the scripted collective's rollouts are deterministic, decisions happen in time
    order within ``T_max``, and the return at the stop is the env's progress within the reward bounds."""
    cfg = _task(domain, task)
    env = domain.concurrent_env(cfg)
    env.reset(int(seeds[0]))
    for text in (GARBAGE, getattr(env.expert_action(), "action", GARBAGE)):
        s = env.action_seconds(text, None)
        assert isinstance(s, (int, float)) and math.isfinite(s) and s >= 0, \
            f"{domain.name}: action_seconds({text!r}) returned {s!r}; it must be finite and >= 0"
    opts = LoopOptions(t_max=float(t_max), seconds_per_token=1.0, org="flat", agents=int(agents))
    runs = []
    for _ in range(2):
        rollouts = play_concurrent(domain, cfg, list(seeds), expert_decider(_WordCount(), agents), opts)
        runs.append([[(t.agent, t.t, t.text, t.ok) for t in r.turns] + [r.progress, r.duration] for r in rollouts])
        for r in rollouts:
            times = [t.t for t in r.turns]
            assert times == sorted(times), f"{domain.name}: decisions out of time order"
            assert r.duration <= t_max + 1e-9 and all(t <= t_max for t in times)
            assert float(cfg.get("reward_min", 0.0)) - 1e-6 <= r.progress <= float(cfg.reward_max) + 1e-6
            assert r.turns, f"{domain.name}: the scripted collective took no action"
    assert runs[0] == runs[1], f"{domain.name}: two concurrent rollouts from the same seeds differ"
