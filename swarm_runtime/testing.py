"""Conformance kit for domains: call :func:`check_domain` from your own tests.

Like PettingZoo's ``api_test``, but aimed at what the runtime depends on most:
snapshot/restore, which counterfactual bid branches replay from every contested
turn. :func:`check_snapshots` drives several seeds with trajectories that mix
the scripted expert's actions, random listed (or otherwise valid) actions and
garbage, and at **every step** snapshots, steps, restores, compares the *full*
state (the env's optional ``state_digest()``, else a deep comparison of
``vars(env)``), and replays the step. It catches a restore that forgets part of
the state, a snapshot that shares live lists, state kept outside the snapshot,
an invalid action that changes state, a reward outside the task's bounds under
ordinary valid actions, and a ``step()`` observation that ``observation()``
then does not show. Further checks: determinism under a seed, fresh task
configs, disjoint train/dev/eval seeds, ``max_decisions`` long enough for the
expert, prompt words in the vocabulary, listed action choices.

Every failure is a :class:`ConformanceError` naming the domain, task, seed,
step, action and what differed.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from swarm_runtime.domain import REQUIRED_TASK_KEYS, SPLITS, Domain, Event
from swarm_runtime.env import StepResult, ValidatedEnv
from swarm_runtime.policy.tokenizer import build_tokenizer, split_words, unknown_words

GARBAGE = "zzqx florp"

#: Mixes of (expert, random listed/valid, garbage) action probabilities: expert-led trajectories reach
#: deep states; mostly-random ones probe reward bounds under ordinary valid actions.
EXPERT_LED, MOSTLY_RANDOM = (0.6, 0.25, 0.15), (0.1, 0.75, 0.15)
#: The trajectories :func:`check_snapshots` drives by default: (seed, mix).
TRAJECTORIES = ((0, EXPERT_LED), (1, EXPERT_LED), (2, MOSTLY_RANDOM))


class ConformanceError(AssertionError):
    """A domain broke the contract; the message names domain, task, seed, step and action."""


@dataclass
class Where:
    """Where a check is: its :meth:`fail` message names all of it."""

    domain: str
    task: str
    seed: int | None = None
    step: int | None = None
    action: str | None = None
    role: str | None = None

    def fail(self, what: str) -> None:
        at = [f"{self.domain}/{self.task}"]
        if self.seed is not None:
            at.append(f"seed {self.seed}")
        if self.step is not None:
            at.append(f"step {self.step}")
        if self.action is not None:
            at.append(f"action {self.action!r} by {self.role or 'the monolithic model'}")
        raise ConformanceError(", ".join(at) + ": " + what)


def _task_name(task: str | DictConfig) -> str:
    return task if isinstance(task, str) else str(task.get("name", "<task config>"))


def _task(domain: Domain, task: str | DictConfig) -> DictConfig:
    cfg = domain.task_config(task) if isinstance(task, str) else task
    missing = [k for k in REQUIRED_TASK_KEYS if k not in cfg]
    if missing:
        Where(domain.name, _task_name(task)).fail(f"the task config lacks {missing} (required: {list(REQUIRED_TASK_KEYS)})")
    return cfg


# ------------------------------------------------------------------ full state, compared
_PRIMITIVE = (str, int, float, bool, bytes, type(None))


def _identical(a: Any, b: Any, out: set[int], depth: int = 0) -> None:
    """Walk two envs' states side by side; record the non-primitive objects both hold by identity
    (without descending into them)."""
    if isinstance(a, _PRIMITIVE) or depth > 12:
        return
    if a is b:
        out.add(id(a))
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a.keys() & b.keys():
            _identical(a[k], b[k], out, depth + 1)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        for x, y in zip(a, b):
            _identical(x, y, out, depth + 1)
    elif type(a) is type(b) and hasattr(a, "__dict__") and not isinstance(a, type):
        _identical(vars(a), vars(b), out, depth + 1)


def shared_objects(env_a: Any, env_b: Any) -> set[int]:
    """ids of objects two separately made envs, reset with the same seed, hold by identity
    (memoised worlds, layouts, corpora, question pools): shared across envs by construction, so
    not per-episode state; the deep comparison leaves them out (a domain that mutates one breaks
    parallel envs, not just snapshots)."""
    out: set[int] = set()
    _identical(vars(env_a), vars(env_b), out)
    return out


def freeze(obj: Any, shared: set[int] = frozenset(), depth: int = 0) -> Any:
    """A comparable copy of ``obj``: containers and objects' ``vars()`` recursively, ``random.Random``
    by its state, tensors/arrays by their values; ``shared`` objects as a marker."""
    if isinstance(obj, float) and math.isnan(obj):
        return "nan"
    if isinstance(obj, _PRIMITIVE):
        return obj
    if id(obj) in shared:
        return SHARED
    if depth > 40:
        return repr(obj)
    if isinstance(obj, random.Random):
        return ("Random", obj.getstate())
    if isinstance(obj, dict):
        return {"__dict__": type(obj).__name__,
                **{str(k): freeze(v, shared, depth + 1) for k, v in obj.items()}}
    if isinstance(obj, (list, tuple)):
        return [type(obj).__name__] + [freeze(v, shared, depth + 1) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return ["set"] + sorted((freeze(v, shared, depth + 1) for v in obj), key=repr)
    if hasattr(obj, "tolist") and callable(obj.tolist):  # torch tensors, numpy arrays
        return ("array", obj.tolist())
    if hasattr(obj, "bit_generator"):  # numpy Generator
        return ("Generator", obj.bit_generator.state)
    if hasattr(obj, "__dict__"):
        return {"__class__": type(obj).__name__, **{k: freeze(v, shared, depth + 1) for k, v in vars(obj).items()}}
    if hasattr(obj, "__slots__"):
        return {"__class__": type(obj).__name__,
                **{k: freeze(getattr(obj, k, None), shared, depth + 1) for k in obj.__slots__}}
    return repr(obj)


#: How :func:`freeze` marks an object shared across envs (compared as equal to anything: a restore
#: may hand back a copy of a shared object, which is not a state change).
SHARED = "<shared across envs>"


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The first path where two :func:`freeze` values differ, with both values (short)."""
    if (isinstance(a, str) and a == SHARED) or (isinstance(b, str) and b == SHARED):
        return None
    if type(a) is not type(b):
        return f"{path or 'state'}: {_short(a)} vs {_short(b)}"
    if isinstance(a, dict):
        for k in list(dict.fromkeys(list(a) + list(b))):
            if k not in a or k not in b:
                return f"{path}.{k}: {'missing' if k not in a else _short(a[k])} vs {'missing' if k not in b else _short(b[k])}"
            d = first_difference(a[k], b[k], f"{path}.{k}" if k not in ("__class__", "__dict__") else path)
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path or 'state'}: length {len(a) - 1} vs {len(b) - 1} ({_short(a)} vs {_short(b)})"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i - 1}]" if i else path)
            if d:
                return d
        return None
    return None if a == b else f"{path or 'state'}: {_short(a)} vs {_short(b)}"


def _short(v: Any, n: int = 80) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 3] + "..."


def state_of(env: Any, shared: set[int] = frozenset(), drop: tuple[str, ...] = ()) -> Any:
    """The env's full state: its ``state_digest()`` if it defines one, else :func:`freeze` of
    ``vars(env)``; ``drop``: top-level names left out (``bookkeeping`` on an invalid action)."""
    digest = getattr(env, "state_digest", None)
    if callable(digest):
        d = digest()
        if isinstance(d, dict) and drop:
            d = {k: v for k, v in d.items() if k not in drop}
        return freeze(d, shared)
    return freeze({k: v for k, v in vars(env).items() if k not in drop}, shared)


# ------------------------------------------------------------------ trajectories
def _valid_pool(domain: Domain, cfg: DictConfig, seed: int) -> dict[str, list[str]]:
    """Random-action pool per role: the role's listed action choices, or (open action spaces)
    every action the expert takes on this seed, by any role (well-formed, often not possible now)."""
    roles = [r.name for r in domain.roles]
    listed = {r: list(domain.action_choices(cfg, r) or ()) for r in roles}
    if all(listed.values()):
        return listed
    env = domain.make_env(cfg)
    env.reset(seed)
    seen: list[str] = []
    for _ in range(int(cfg.max_decisions)):
        exp = env.expert_action()
        if exp is None:
            break
        seen.append(exp.action)
        if env.step(exp.action, exp.role).done:
            break
    seen = list(dict.fromkeys(seen)) or [GARBAGE]
    return {r: listed[r] or seen for r in roles}


def _choose(env: Any, rng: random.Random, roles: list[str], pool: dict[str, list[str]],
            mix: tuple[float, float, float]) -> tuple[str, str]:
    """Expert, random listed/valid, or garbage action (``mix`` probabilities), with its role."""
    u = rng.random()
    exp = env.expert_action()
    if u < mix[0] and exp is not None:
        return exp.action, exp.role
    if u < mix[0] + mix[1]:
        role = rng.choice(roles)
        return rng.choice(pool[role]), role
    return GARBAGE, rng.choice(roles)


def _policy_actions(env, rng: random.Random, roles: list[str], garbage_p: float):
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
    if a != b:
        i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y) if any(x != y for x, y in zip(a, b)) else min(len(a), len(b))
        step = a[i] if i < len(a) else b[i]
        Where(domain.name, _task_name(task), seed, i - 1 if i else None,
              step[0] if i and isinstance(step, tuple) else None, step[1] if i and isinstance(step, tuple) else None).fail(
            "two episodes from the same seed with the same actions differ here "
            f"({_short(a[i] if i < len(a) else 'ended')} vs {_short(b[i] if i < len(b) else 'ended')})")


def check_snapshots(domain: Domain, task: str | DictConfig, trajectories=TRAJECTORIES,
                    max_steps: int | None = None) -> int:
    """Snapshot / step / restore / replay at every step of each ``(seed, mix)`` trajectory (to the
    episode's end or ``max_decisions``), comparing the full state; invalid actions as no-ops, reward
    bounds and ``step()``/``observation()`` agreement on the way. Returns the steps checked."""
    cfg = _task(domain, task)
    name = _task_name(task)
    roles = [r.name for r in domain.roles]
    lo, hi = float(cfg.get("reward_min", 0.0)), float(cfg.reward_max)
    cap = int(max_steps or cfg.max_decisions)
    checked = 0
    for m, (seed, mix) in enumerate(trajectories):
        w = Where(domain.name, name, int(seed))
        pool = _valid_pool(domain, cfg, int(seed))
        env, twin = domain.make_env(cfg), domain.make_env(cfg)
        obs = env.reset(int(seed))
        twin.reset(int(seed))
        shared = shared_objects(env, twin)
        bookkeeping = tuple(getattr(env, "bookkeeping", ()) or ())
        if obs != env.observation():
            w.fail("reset() returned an observation that observation() does not show: "
                   f"{_short(obs)} vs {_short(env.observation())}")
        rng = random.Random(1000 * m + int(seed))
        total, done = 0.0, False
        for t in range(cap):
            if done:
                break
            action, role = _choose(env, rng, roles, pool, mix)
            w.step, w.action, w.role = t, action, role
            snap = env.snapshot()
            frozen_snap = freeze(snap, shared)
            before, obs0 = state_of(env, shared), env.observation()
            res = env.step(action, role)
            if not isinstance(res, StepResult):
                w.fail(f"step() returned {type(res).__name__}, not StepResult")
            if not isinstance(res.reward, (int, float)) or not math.isfinite(float(res.reward)):
                w.fail(f"step() returned a non-finite reward {res.reward!r}")
            if res.observation != env.observation():
                w.fail("step() returned an observation that observation() then does not show: "
                       f"{_short(res.observation)} vs {_short(env.observation())}")
            if not res.valid and not res.done:  # (an invalid action may end the episode at a decision cap)
                if float(res.reward) > 0:
                    w.fail(f"an invalid action earned reward {res.reward} (it must be a no-op: 0, or a penalty)")
                d = first_difference(state_of(env, shared, bookkeeping) if bookkeeping else state_of(env, shared),
                                     _drop(before, bookkeeping))
                if d:
                    w.fail(f"an invalid action changed the state (it must be a no-op; counters may be listed in "
                           f"the env's `bookkeeping`): {d} (after vs before)")
            total += float(res.reward)
            if not lo - 1e-6 <= total <= hi + 1e-6:
                w.fail(f"the episode reward {total:g} left the task's bounds [reward_min {lo:g}, reward_max {hi:g}] "
                       f"(this step's reward {float(res.reward):g})")
            after = state_of(env, shared)
            d = first_difference(freeze(snap, shared), frozen_snap)
            if d:
                w.fail(f"stepping changed the snapshot taken before it (it shares live state with the env): {d} "
                       "(after vs at snapshot time)")
            env.restore(snap)
            d = first_difference(state_of(env, shared), before)
            if d:
                w.fail("restore() did not bring back the state of snapshot time (state kept outside the snapshot, "
                       f"or a restore that forgets part of it): {d} (after restore vs at snapshot time)")
            if env.observation() != obs0:
                w.fail(f"observation after restore differs: {_short(env.observation())} vs {_short(obs0)}")
            res2 = env.step(action, role)
            one = (res.observation, round(float(res.reward), 9), bool(res.done), bool(res.valid))
            two = (res2.observation, round(float(res2.reward), 9), bool(res2.done), bool(res2.valid))
            if one != two:
                w.fail(f"the same action from the restored snapshot gave another result: {_short(two)} vs {_short(one)}")
            d = first_difference(state_of(env, shared), after)
            if d:
                w.fail(f"the same action from the restored snapshot left another state: {d} (replayed vs first)")
            d = first_difference(freeze(snap, shared), frozen_snap)
            if d:
                w.fail(f"restoring and stepping changed the snapshot (it must stay reusable): {d}")
            done = bool(res.done)
            checked += 1
    return checked


def _drop(frozen: Any, names: tuple[str, ...]) -> Any:
    if not names or not isinstance(frozen, dict):
        return frozen
    return {k: v for k, v in frozen.items() if k not in names}


def check_snapshot_roundtrip(domain: Domain, task: str | DictConfig, seed: int = 0, at: int = 5, steps: int = 30) -> None:
    """One seed of :func:`check_snapshots` (kept for callers of the earlier kit)."""
    check_snapshots(domain, task, trajectories=((seed, EXPERT_LED),), max_steps=at + steps)


def check_reward_bounds(domain: Domain, task: str | DictConfig, seeds: range = range(3)) -> None:
    """Episode reward within ``[reward_min, reward_max]`` under mostly random valid actions."""
    check_snapshots(domain, task, trajectories=tuple((s, MOSTLY_RANDOM) for s in seeds))


def check_invalid_is_noop(domain: Domain, task: str | DictConfig, seed: int = 0) -> None:
    """Garbage is rejected, earns no reward and changes no state (``bookkeeping`` counters aside)."""
    cfg = _task(domain, task)
    env, twin = domain.make_env(cfg), domain.make_env(cfg)
    env.reset(seed)
    twin.reset(seed)
    shared = shared_objects(env, twin)
    drop = tuple(getattr(env, "bookkeeping", ()) or ())
    w = Where(domain.name, _task_name(task), seed, 0, GARBAGE, domain.roles[0].name)
    before = state_of(env, shared, drop)
    res = env.step(GARBAGE, domain.roles[0].name)
    if res.valid:
        w.fail("a garbage action was accepted as valid")
    if res.reward > 0.0:
        w.fail(f"a garbage action earned reward {res.reward}")
    d = first_difference(state_of(env, shared, drop), before)
    if d:
        w.fail(f"a garbage action changed the state: {d} (after vs before)")


def check_splits(domain: Domain, task: str | DictConfig) -> None:
    """train, dev (when the task defines one) and eval seeds are disjoint; and, when the domain
    defines ``instances(task, seeds)`` (what each seed picks: a question, a layout; hashables, one
    per seed), so are the instances the splits' seeds pick (distinct seeds may pick one instance,
    e.g. a question pool indexed by ``seed % len``)."""
    cfg = _task(domain, task)
    name = _task_name(task)
    got = {}
    for split in SPLITS:
        try:
            got[split] = set(domain.episode_seeds(cfg, split))
        except ValueError:
            if split != "dev":
                raise
    for i, a in enumerate(got):
        for b in list(got)[i + 1:]:
            both = got[a] & got[b]
            if both:
                Where(domain.name, name).fail(
                    f"{a} and {b} seeds overlap ({len(both)} shared, e.g. {sorted(both)[:5]}); tuning on dev or "
                    "training on held-out worlds would leak into the reported numbers")
    instances = getattr(domain, "instances", None)
    if not callable(instances):
        return
    picked: dict[str, dict[Any, int]] = {}
    for split, seeds in got.items():
        picked[split] = {}
        order = sorted(seeds)
        for seed, inst in zip(order, instances(cfg, order)):
            picked[split].setdefault(inst, seed)
    for i, a in enumerate(picked):
        for b in list(picked)[i + 1:]:
            both = picked[a].keys() & picked[b].keys()
            if both:
                inst = sorted(both, key=repr)[0]
                Where(domain.name, name, picked[b][inst]).fail(
                    f"{a} and {b} seeds pick the same instances ({len(both)} shared, e.g. {_short(inst)} by {a} seed "
                    f"{picked[a][inst]} and {b} seed {picked[b][inst]}); the seeds are disjoint but what they "
                    "pick is not")


def check_fresh_task_config(domain: Domain, task: str | DictConfig) -> None:
    """Each ``task_config()`` (what ``resolve()`` starts from) is a fresh object: a run that edits
    its config (``task.max_decisions=...``) must not leak into the next run."""
    if not isinstance(task, str):
        return
    a = domain.task_config(task)
    b = domain.task_config(task)
    w = Where(domain.name, task)
    if a is b:
        w.fail("task_config() returned the same object twice (configs must be fresh per call)")
    a.max_decisions = -12345
    if int(domain.task_config(task).max_decisions) == -12345:
        w.fail("editing one task_config() changed the next one (it shares a cached config)")


def check_max_decisions(domain: Domain, task: str | DictConfig, seeds: range = range(3)) -> None:
    """The scripted expert finishes (the episode ends, or it has nothing left to do) within
    ``max_decisions``: otherwise SFT demos are cut off and the reward cap is out of reach."""
    cfg = _task(domain, task)
    cap = int(cfg.max_decisions)
    for seed in seeds:
        env = domain.make_env(cfg)
        env.reset(seed)
        for t in range(cap):
            exp = env.expert_action()
            if exp is None:
                break
            if env.step(exp.action, exp.role).done:
                break
        else:
            exp = env.expert_action()
            if exp is not None:
                Where(domain.name, _task_name(task), seed, cap, exp.action, exp.role).fail(
                    f"max_decisions={cap} cut the expert off: it still has this action to take; raise max_decisions")


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
        if not (isinstance(t, str) and t):
            Where(domain.name, _task_name(task), seed).fail("a prompt is empty")
        unk = unknown_words(tok, t)
        if unk:
            Where(domain.name, _task_name(task), seed).fail(
                f"prompt words missing from vocabulary(): {sorted(set(unk))[:10]} in {_short(t)}")
    for t, (action, role, obs, *_) in enumerate(trace[1:]):
        unk = unknown_words(tok, obs)
        if unk:
            Where(domain.name, _task_name(task), seed, t, action, role).fail(
                f"observation words missing from vocabulary(): {sorted(set(unk))[:10]}")


def check_expert(domain: Domain, task: str | DictConfig, seeds: range = range(3)) -> None:
    """The expert names known roles, its actions are valid and it earns reward."""
    cfg = _task(domain, task)
    roles = {r.name for r in domain.roles}
    for seed in seeds:
        env = ValidatedEnv(domain.make_env(cfg), domain.name)
        env.reset(seed)
        for t in range(int(cfg.max_decisions)):
            exp = env.expert_action()
            if exp is None or env.done:
                break
            w = Where(domain.name, _task_name(task), seed, t, exp.action, exp.role)
            if exp.role not in roles:
                w.fail(f"the expert names role {exp.role!r}, not one of {sorted(roles)}")
            if not env.step(exp.action, exp.role).valid:
                w.fail("the expert's action was invalid")
        if env.total_reward <= 0:
            Where(domain.name, _task_name(task), seed).fail("the expert earned no reward")


def check_action_choices(domain: Domain, task: str | DictConfig, seeds: range = range(3)) -> None:
    """Listed action choices (``Domain.action_choices``, for ``model.constrained_actions``): each
    is a non-empty text, spelled in the vocabulary and a valid action of its role (well-formed and
    the role's, from the first seed's start), and the expert acts only among its role's choices
    (and the monolithic model's, ``action_choices(task, None)``), else a constrained model could
    never take the expert's action. Failures name domain, task, seed, step, action and role."""
    cfg = _task(domain, task)
    name = _task_name(task)
    listed = {r.name: domain.action_choices(cfg, r.name) for r in domain.roles}
    if not any(listed.values()):
        return
    tok = build_tokenizer(domain.all_words(cfg), (0.0,))
    env = ValidatedEnv(domain.make_env(cfg), domain.name, task=name)
    first = int(seeds[0])
    env.reset(first)
    start = env.snapshot()
    for role, choices in listed.items():
        for text in choices or ():
            w = Where(domain.name, name, first, 0, text if isinstance(text, str) else repr(text), role)
            if not isinstance(text, str) or not text.strip():
                w.fail(f"action_choices() listed {text!r} for {role}; choices must be non-empty strings")
            unk = unknown_words(tok, text)
            if unk:
                w.fail(f"the listed action choice has words missing from vocabulary(): {sorted(set(unk))[:10]} "
                       "(a constrained model could not spell it)")
            env.restore(start)
            res = env.step(text, role)
            if not res.valid:
                w.fail(f"the listed action choice is not a valid action of {role} at the start of the episode "
                       "(valid means well-formed and the role's, even when it cannot succeed now); step() returned "
                       f"valid=False, observation {_short(res.observation)}")
    words = {role: {tuple(split_words(t)) for t in c} for role, c in listed.items() if c}
    mono_list = list(domain.action_choices(cfg, None) or ())
    mono = {tuple(split_words(t)) for t in mono_list}
    for seed in seeds:
        env.reset(int(seed))
        for t in range(int(cfg.max_decisions)):
            exp = env.expert_action()
            if exp is None or env.done:
                break
            w = Where(domain.name, name, int(seed), t, exp.action, exp.role)
            if exp.role in words and tuple(split_words(exp.action)) not in words[exp.role]:
                w.fail(f"the expert's action is not among {exp.role}'s {len(words[exp.role])} listed action choices "
                       f"(e.g. {_short(sorted(listed[exp.role])[:4])}): with model.constrained_actions=true its "
                       "model could never take it")
            if mono and tuple(split_words(exp.action)) not in mono:
                w.fail(f"the expert's action is not among the monolithic model's {len(mono)} listed action choices "
                       f"(action_choices(task, None), e.g. {_short(sorted(mono_list)[:4])})")
            env.step(exp.action, exp.role)


def check_domain(domain: Domain, task: str, trajectories=TRAJECTORIES) -> None:
    """Run every conformance check on ``domain``/``task``; raises :class:`ConformanceError`."""
    check_splits(domain, task)
    check_fresh_task_config(domain, task)
    check_determinism(domain, task)
    check_invalid_is_noop(domain, task)
    check_snapshots(domain, task, trajectories)
    check_prompts(domain, task)
    check_expert(domain, task)
    check_max_decisions(domain, task)
    check_action_choices(domain, task)
