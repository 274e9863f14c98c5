"""Conformance kit for domains: call :func:`check_domain` from your own tests.

Like PettingZoo's ``api_test``: snapshot/restore round trip, determinism under
a seed, reward bounds, prompt rendering and expert roles. Every check drives
the env with its scripted expert plus garbage text (which must be a no-op).
"""
from __future__ import annotations

import random
from typing import Any

from omegaconf import DictConfig

from swarm_runtime.domain import REQUIRED_TASK_KEYS, Domain, Event
from swarm_runtime.env import StepResult, ValidatedEnv
from swarm_runtime.policy.tokenizer import build_tokenizer, split_words, unknown_words

GARBAGE = "zzqx florp"


def _task(domain: Domain, task: str | DictConfig) -> DictConfig:
    cfg = domain.task_config(task) if isinstance(task, str) else task
    missing = [k for k in REQUIRED_TASK_KEYS if k not in cfg]
    assert not missing, f"task config of {domain.name} lacks {missing}"
    return cfg


def _policy_actions(env: ValidatedEnv, rng: random.Random, roles: list[str], garbage_p: float):
    """Expert action most of the time, else garbage or an expert action given to the wrong role."""
    exp = env.expert_action()
    if exp is None or rng.random() < garbage_p:
        return GARBAGE, rng.choice(roles)
    if rng.random() < 0.1:
        return exp.action, rng.choice(roles)
    return exp.action, exp.role


def _trace(domain: Domain, cfg: DictConfig, seed: int, n: int, garbage_p=0.15, env=None, rng_seed=0):
    env = env or ValidatedEnv(domain.make_env(cfg), domain.name, (float(cfg.get("reward_min", 0.0)), float(cfg.reward_max)))
    roles = [r.name for r in domain.roles]
    rng = random.Random(rng_seed)
    out: list[Any] = [env.reset(seed)]
    for _ in range(n):
        if env.done:
            break
        action, role = _policy_actions(env, rng, roles, garbage_p)
        res: StepResult = env.step(action, role)
        out.append((action, role, res.observation, round(res.reward, 9), res.done, res.valid))
    return env, out


def check_determinism(domain: Domain, task: str | DictConfig, seed: int = 0, steps: int = 40) -> None:
    cfg = _task(domain, task)
    _, a = _trace(domain, cfg, seed, steps)
    _, b = _trace(domain, cfg, seed, steps)
    assert a == b, f"{domain.name}: two episodes from seed {seed} with the same actions differ"


def check_snapshot_roundtrip(domain: Domain, task: str | DictConfig, seed: int = 0, at: int = 5, steps: int = 30) -> None:
    cfg = _task(domain, task)
    env, _ = _trace(domain, cfg, seed, at, garbage_p=0.0)
    snap = env.snapshot()
    obs0 = env.observation()
    env.restore(snap)
    assert env.observation() == obs0, f"{domain.name}: observation changed across snapshot/restore"
    rng = random.Random(1)
    roles = [r.name for r in domain.roles]
    runs = []
    for _ in range(2):
        env.restore(snap)
        rng = random.Random(1)
        trace = []
        for _ in range(steps):
            if env.done:
                break
            action, role = _policy_actions(env, rng, roles, 0.1)
            r = env.step(action, role)
            trace.append((r.observation, round(r.reward, 9), r.done, r.valid))
        runs.append(trace)
    assert runs[0] == runs[1], f"{domain.name}: rolling twice from one snapshot gave different results"
    env.restore(snap)
    assert env.observation() == obs0, f"{domain.name}: snapshot was mutated by restore/step"


def check_reward_bounds(domain: Domain, task: str | DictConfig, seeds: range = range(5)) -> None:
    cfg = _task(domain, task)
    cap = int(cfg.max_decisions)
    for seed in seeds:
        for gp in (0.0, 0.5, 1.0):
            env, _ = _trace(domain, cfg, seed, cap, garbage_p=gp, rng_seed=seed)  # ValidatedEnv enforces bounds
            assert env.total_reward <= float(cfg.reward_max) + 1e-6


def check_invalid_is_noop(domain: Domain, task: str | DictConfig, seed: int = 0) -> None:
    cfg = _task(domain, task)
    env = domain.make_env(cfg)
    env.reset(seed)
    before = env.snapshot()
    obs = env.observation()
    res = env.step(GARBAGE, domain.roles[0].name)
    assert not res.valid, f"{domain.name}: garbage action {GARBAGE!r} was accepted"
    assert res.reward <= 0.0, f"{domain.name}: garbage action earned reward {res.reward}"  # 0, or a penalty
    env2 = domain.make_env(cfg)
    env2.restore(before)
    assert env2.observation() == obs


def check_prompts(domain: Domain, task: str | DictConfig, seed: int = 0, bid_levels=(0, 0.2, 0.4, 0.6, 0.8)) -> None:
    cfg = _task(domain, task)
    tok = build_tokenizer(domain.all_words(cfg), bid_levels)
    env, trace = _trace(domain, cfg, seed, 10, garbage_p=0.0)
    roles = [r.name for r in domain.roles]
    log = [Event(i, roles[i % len(roles)], step[0]) for i, step in enumerate(trace[1:])]
    texts = [domain.single_prompt(env.observation(), log)]
    for role in roles:
        texts += [domain.bid_prompt(role, env.observation(), log), domain.action_prompt(role, env.observation(), log)]
    for t in texts:
        assert isinstance(t, str) and t, f"{domain.name}: empty prompt"
        unk = unknown_words(tok, t)
        assert not unk, f"{domain.name}: prompt words missing from vocabulary(): {sorted(set(unk))[:10]}"
    for _, _, obs, *_ in trace[1:]:
        unk = unknown_words(tok, obs)
        assert not unk, f"{domain.name}: observation words missing from vocabulary(): {sorted(set(unk))[:10]}"


def check_expert(domain: Domain, task: str | DictConfig, seeds: range = range(3)) -> None:
    """The expert names known roles, its actions are valid and it earns reward."""
    cfg = _task(domain, task)
    roles = {r.name for r in domain.roles}
    for seed in seeds:
        env = ValidatedEnv(domain.make_env(cfg), domain.name)
        env.reset(seed)
        for _ in range(int(cfg.max_decisions)):
            exp = env.expert_action()
            if exp is None or env.done:
                break
            assert exp.role in roles, f"{domain.name}: expert role {exp.role!r} not in {sorted(roles)}"
            res = env.step(exp.action, exp.role)
            assert res.valid, f"{domain.name}: expert action {exp.action!r} ({exp.role}) was invalid"
        assert env.total_reward > 0, f"{domain.name}: expert earned no reward on seed {seed}"


def check_action_choices(domain: Domain, task: str | DictConfig, seeds: range = range(3)) -> None:
    """Listed action choices (``Domain.action_choices``, for ``model.constrained_actions``): each
    is a valid action of its role, spelled in the vocabulary, and the expert acts only among them."""
    cfg = _task(domain, task)
    listed = {r.name: domain.action_choices(cfg, r.name) for r in domain.roles}
    if not any(listed.values()):
        return
    tok = build_tokenizer(domain.all_words(cfg), (0.0,))
    env = ValidatedEnv(domain.make_env(cfg), domain.name)
    env.reset(seeds[0])
    start = env.snapshot()
    for role, choices in listed.items():
        for text in choices or ():
            unk = unknown_words(tok, text)
            assert not unk, f"{domain.name}: action choice {text!r} of {role} has words missing from vocabulary(): {unk}"
            env.restore(start)
            assert env.step(text, role).valid, f"{domain.name}: action choice {text!r} is not a valid action of {role}"
    words = {role: {tuple(split_words(t)) for t in c} for role, c in listed.items() if c}
    mono = {tuple(split_words(t)) for t in domain.action_choices(cfg, None) or ()}
    for seed in seeds:
        env.reset(seed)
        for _ in range(int(cfg.max_decisions)):
            exp = env.expert_action()
            if exp is None or env.done:
                break
            if exp.role in words:
                assert tuple(split_words(exp.action)) in words[exp.role], (
                    f"{domain.name}: expert action {exp.action!r} of {exp.role} is not among its action choices")
            if mono:
                assert tuple(split_words(exp.action)) in mono, (
                    f"{domain.name}: expert action {exp.action!r} is not among the monolithic action choices")
            env.step(exp.action, exp.role)


def check_domain(domain: Domain, task: str) -> None:
    """Run every conformance check on ``domain``/``task``."""
    check_determinism(domain, task)
    check_snapshot_roundtrip(domain, task)
    check_reward_bounds(domain, task)
    check_invalid_is_noop(domain, task)
    check_prompts(domain, task)
    check_expert(domain, task)
    check_action_choices(domain, task)
