"""Conformance checks for domains that opt into ``algo=rlcr``: the anytime return (``progress()``) and
concurrent actions (``action_seconds``, ``concurrent_expert``, the event loop over the domain's concurrent env).
:func:`check_rlcr` is the core's conformance suite for ``algo=rlcr``, registered through
``swarm_register_conformance_suites`` (swarm_runtime/plugins/builtins.py):
:func:`swarm_runtime.conformance.suite.check_domain` runs it whenever the domain's concurrent env implements
``progress()`` (:func:`has_anytime_return`); each check can also be called alone. RLCR steps the concurrent env
with ``role=None`` (one shared policy acts for everyone), so these checks do too. Failures are
:class:`~swarm_runtime.conformance.probe.ConformanceError` naming domain, task, seed, step, action and role."""

from __future__ import annotations

import math
import random

from swarm_runtime.conformance.probe import (
    GARBAGE,
    MOSTLY_RANDOM,
    Mix,
    Probe,
    Where,
    action_pool,
    load_task,
    shorten,
    task_label,
)
from swarm_runtime.conformance.task import max_prompt_tokens, prompt_problem
from swarm_runtime.core.domain import Domain
from swarm_runtime.core.env import close_env, has_progress
from swarm_runtime.learn.rlcr.loop import RLCR_WORDS, LoopOptions, expert_decider, play_concurrent
from swarm_runtime.models.tokenizer import build_tokenizer, split_words

#: Trajectories of :func:`check_progress`: (seed, mix), every step with ``role=None``.
PROGRESS_TRAJECTORIES = (
    (0, Mix(0.7, 0.15, 0.15, monolithic=True)),
    (1, Mix(0.7, 0.15, 0.15, monolithic=True)),
    (2, Mix(*MOSTLY_RANDOM[:3], monolithic=True)),
)


class _WordCount:
    """Stands in for a policy's ``action_target``: one token per word plus an end token."""

    @staticmethod
    def action_target(text: str) -> list[int]:
        return list(range(len(split_words(text)) + 1))


def _progress(p: Probe) -> float:
    v = p.w.call("progress()", p.env.progress)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        p.w.fail(f"progress() returned {v!r}; it must be a finite number")
    return float(v)


def _expert_text(p: Probe) -> str | None:
    text = p.w.call("concurrent_expert()", p.env.concurrent_expert, "alpha", {})
    if text is None:
        exp = p.expert()
        text = exp.action if exp is not None else None
    return text


def check_progress(
    domain: Domain, task, trajectories=PROGRESS_TRAJECTORIES, rewind_every: int = 5, rewind_steps: int = 4
) -> int:
    """``progress()`` of the concurrent env is the episode's return so far in reward units: 0 after
    ``reset`` and, after every step, the sum of the step rewards so far (within the task's reward
    bounds). Every ``rewind_every`` steps: snapshot, play ``rewind_steps`` further steps, restore, and
    ``progress()`` must be back at its value at snapshot time, and replaying the same steps must give the
    same rewards and progress. Trajectories mix the scripted expert's actions, random listed/expert-seen
    actions and garbage, all with ``role=None`` as RLCR steps them; each is played twice (deterministic
    under a seed). Returns the steps checked."""
    cfg = load_task(domain, task)
    name = task_label(task)
    checked = 0
    for seed, mix in trajectories:
        mix = Mix(*mix)
        pool = action_pool(domain, cfg, int(seed), name)
        runs = []
        for _ in range(2):
            p = Probe(domain, cfg, name, concurrent=True)
            if not has_progress(p.env):
                p.w.fail(
                    f"{type(p.env).__name__} (concurrent_env()) does not implement DomainEnv.progress(), which "
                    "algo=rlcr needs (docs/guides/rlcr.md, section 7)"
                )
            p.reset(int(seed))
            rng = random.Random(int(seed) + 17)
            p0 = _progress(p)
            if abs(p0) > 1e-6:
                p.w.fail(f"progress() is {p0:g} right after reset(); it must be 0 (the return so far, in reward units)")
            run = [p0]
            for t in range(int(cfg.max_decisions)):
                if p.done:
                    break
                if rewind_every and t % rewind_every == rewind_every - 1:
                    _rewind(p, rng, pool, mix, rewind_steps)
                action, role = _pick(p, rng, pool, mix)
                res = p.step(action, role)
                got = _progress(p)
                w = p.w.at(t, action, role)
                if abs(got - p.total) > 1e-6 * max(1.0, abs(p.hi)):
                    w.fail(
                        f"progress() is {got:g} but the step rewards so far sum to {p.total:g} (this step's reward "
                        f"{float(res.reward):g}): the anytime return must be the summed step rewards, in reward "
                        "units, so RLCR's return and MPT's reward measure the same thing"
                    )
                run.append((action, round(got, 9)))
                checked += 1
            runs.append(run)
        if runs[0] != runs[1]:
            i = next(i for i, (a, b) in enumerate(zip(runs[0], runs[1])) if a != b)
            Where(domain.name, name, int(seed)).at(i - 1 if i else 0, *(runs[0][i][0], None) if i else ()).fail(
                f"progress() differs between two episodes from the same seed with the same actions: "
                f"{shorten(runs[0][i])} vs {shorten(runs[1][i])}"
            )
    return checked


def _pick(p: Probe, rng: random.Random, pool: dict, mix: Mix) -> tuple[str, None]:
    u = rng.random()
    if u < mix.expert:
        text = _expert_text(p)
        if text is not None:
            return text, None
    if u < mix.expert + mix.random:
        return rng.choice(pool[None]), None
    return GARBAGE, None


def _rewind(p: Probe, rng: random.Random, pool: dict, mix: Mix, steps: int) -> None:
    """Snapshot, play ``steps`` further steps, restore: ``progress()`` and the state's future must be back."""
    t0 = p.t
    snap = p.snapshot()
    at_snap = _progress(p)
    played = []
    for _ in range(steps):
        if p.done:
            break
        action, role = _pick(p, random.Random(rng.random()), pool, mix)
        res = p.step(action, role)
        played.append((action, round(float(res.reward), 9), round(_progress(p), 9)))
    p.restore(snap)
    back = _progress(p)
    w = p.w.at(t0, played[0][0] if played else None, None)
    if abs(back - at_snap) > 1e-9:
        w.fail(
            f"progress() after snapshot, {len(played)} more steps and restore is {back:g}, not {at_snap:g} as at "
            "snapshot time: progress() reads state the snapshot does not hold"
        )
    for k, (action, reward, prog) in enumerate(played):
        res = p.step(action, None)
        again = (action, round(float(res.reward), 9), round(_progress(p), 9))
        if again != (action, reward, prog):
            p.w.at(t0 + k, action, None).fail(
                f"replaying a step after restore gave another (action, reward, progress): {again} vs {(action, reward, prog)}"
            )
    p.restore(snap)


def check_concurrent(
    domain: Domain, task, seeds=(0, 1), agents: int = 2, t_max: float = 600.0, max_tokens: int | None = None
) -> None:
    """The domain's concurrent env runs under the event loop: ``action_seconds`` is finite and >= 0
    (garbage included), the scripted collective's rollouts are deterministic, decisions happen in time
    order within ``T_max``, the return at the stop is the env's progress within the reward bounds, and
    every prompt the loop builds fits ``max_tokens`` (default: the task's ``model.max_prompt_tokens``) in
    the shared policy's vocabulary (the domain's words and the RLCR words)."""
    cfg = load_task(domain, task)
    name = task_label(task)
    lo, hi = float(cfg.get("reward_min", 0.0)), float(cfg.reward_max)
    p = Probe(domain, cfg, name, concurrent=True)
    p.reset(int(seeds[0]))
    for text in (GARBAGE, _expert_text(p) or GARBAGE):
        w = p.w.at(0, text, None)
        s = w.call("action_seconds()", p.env.action_seconds, text, None)
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s < 0:
            w.fail(f"action_seconds() returned {s!r}; it must be a finite number >= 0")
    tok = build_tokenizer(list(domain.all_words(cfg)) + list(RLCR_WORDS), (0.0,))
    limit = int(max_tokens or max_prompt_tokens(cfg))
    opts = LoopOptions(t_max=float(t_max), seconds_per_token=1.0, org="flat", agents=int(agents))
    runs = []
    for _ in range(2):
        prompts: list = []
        w = Where(domain.name, name, int(seeds[0]))
        rollouts = w.call(
            "the concurrent loop",
            play_concurrent,
            domain,
            cfg,
            list(seeds),
            expert_decider(_WordCount(), agents),
            opts,
            None,
            lambda n, reqs: prompts.extend(
                (r.slot.rollout.seed, len(r.slot.rollout.turns), r.agent, r.prompt) for r in reqs
            ),
        )
        for seed, t, agent, prompt in prompts:
            bad = prompt_problem(tok, prompt, limit)
            if bad:
                Where(domain.name, name, seed).at(t, None, None).fail(f"{agent}'s RLCR prompt: {bad}")
        runs.append([[(t.agent, t.t, t.text, t.ok) for t in r.turns] + [r.progress, r.duration] for r in rollouts])
        for r in rollouts:
            w = Where(domain.name, name, r.seed)
            times = [t.t for t in r.turns]
            if times != sorted(times):
                w.fail("decisions out of time order")
            if r.duration > t_max + 1e-9 or any(t > t_max for t in times):
                w.fail(f"a rollout ran past T_max={t_max:g} s (duration {r.duration:g})")
            if not lo - 1e-6 <= r.progress <= hi + 1e-6:
                w.fail(f"the return at the stop {r.progress:g} left the bounds [{lo:g}, {hi:g}]")
            if not r.turns:
                w.fail("the scripted collective took no action")
    if runs[0] != runs[1]:
        i = next(i for i, (a, b) in enumerate(zip(runs[0], runs[1])) if a != b)
        Where(domain.name, name, int(seeds[i])).fail("two concurrent rollouts from the same seed differ")


def has_anytime_return(domain: Domain, task) -> bool:
    """Whether ``domain``'s concurrent env implements ``progress()``: the domains :func:`check_rlcr` applies to
    (an exception from ``concurrent_env()`` is a :class:`~swarm_runtime.conformance.probe.ConformanceError`)."""
    w = Where(domain.name, task_label(task))
    env = w.call("concurrent_env()", domain.concurrent_env, load_task(domain, task))
    w.call("close()", close_env, env)
    return has_progress(env)


def check_rlcr(domain: Domain, task, max_tokens: int | None = None, **kw) -> None:
    """Both checks: the core's RLCR conformance suite (registered in swarm_runtime/plugins/builtins.py), which
    :func:`swarm_runtime.conformance.suite.check_domain` runs when :func:`has_anytime_return`."""
    check_progress(domain, task)
    check_concurrent(domain, task, max_tokens=max_tokens)
