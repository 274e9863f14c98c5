"""The conformance kit's machinery: probes that drive an env through mixed trajectories (expert, random,
cross-role, monolithic), frozen states and their first difference, and the errors it raises.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from omegaconf import DictConfig

from swarm_runtime.core.domain import REQUIRED_TASK_KEYS, Domain
from swarm_runtime.core.env import ExpertStep, StepResult, close_env
from swarm_runtime.models.tokenizer import split_words

GARBAGE = "zzqx florp"


#: Texts no domain should accept from anyone, sent by every role and ``role=None``: each must be a
#: no-op (``valid=False``, no reward, no state change) or, where a domain does accept one, stay within
#: the reward bounds; none may raise. The kit's own words (:data:`KIT_WORDS`) never count as missing
#: from a domain's vocabulary.
GARBAGE_TEXTS = (
    GARBAGE,
    "",
    "   ",
    "\n\t",
    ".",
    ";",
    ":",
    "0",
    "-1",
    "3.5",
    "99999999999999999999",
    "None",
    "null",
    "( ) [ ] { }",
    "'",
    '"',
    "\\",
    "%s {0} {}",
    "ünï ☃ 字",
    "zzqx " * 60,
    "action :",
    "bid : <bid_0.4>",
)


#: Words of the kit's garbage texts (a log of garbage actions shows them in a prompt; the policy never
#: generates them, so a prompt check leaves them out).
KIT_WORDS = frozenset(w for t in GARBAGE_TEXTS for w in split_words(t))


class Mix(NamedTuple):
    """How a trajectory picks each action: probabilities of the expert's action, a random listed/valid
    action of a random role, garbage, and the expert's action sent by another role (``cross``); with
    ``monolithic`` every step is taken with ``role=None``."""

    expert: float
    random: float
    garbage: float
    cross: float = 0.0
    monolithic: bool = False


#: Expert-led trajectories reach deep states; mostly-random ones probe reward bounds under ordinary
#: valid actions; cross-role ones send the expert's action from the wrong role; monolithic ones step
#: with ``role=None`` throughout.
EXPERT_LED, MOSTLY_RANDOM = Mix(0.6, 0.25, 0.15), Mix(0.1, 0.75, 0.15)


CROSS_ROLE, MONOLITHIC = Mix(0.45, 0.1, 0.1, 0.35), Mix(0.6, 0.25, 0.15, monolithic=True)


#: The trajectories :func:`check_snapshots` drives by default: (seed, mix[, most steps checked]).
TRAJECTORIES = ((0, EXPERT_LED), (1, EXPERT_LED), (2, MOSTLY_RANDOM), (3, CROSS_ROLE, 40), (4, MONOLITHIC, 40))


#: Where :func:`check_rare_paths` branches: (seed, mix, points along the trajectory, one-step branches in all).
BRANCH_POINTS = ((0, EXPERT_LED, 6, 240), (2, MOSTLY_RANDOM, 3, 120), (4, MONOLITHIC, 3, 120))


#: ``model.max_prompt_tokens`` when the task's ``overrides:`` do not set it (``ModelConfig``'s default).
DEFAULT_MAX_PROMPT_TOKENS = 256


class ConformanceError(AssertionError):
    """A domain broke the contract; the message names domain, task, seed, step, action and role."""


class ConformanceWarning(UserWarning):
    """A check the kit could not run on this domain (it says why); the others ran."""


@dataclass
class Where:
    """Where a check is: its :meth:`fail` message names all of it."""

    domain: str
    task: str
    seed: int | None = None
    step: int | None = None
    action: str | None = None
    role: str | None = None

    def at(self, step: int | None, action: str | None = None, role: str | None = None) -> Where:
        self.step, self.action, self.role = step, action, role
        return self

    def fail(self, what: str, cause: BaseException | None = None) -> None:
        at = [f"{self.domain}/{self.task}"]
        if self.seed is not None:
            at.append(f"seed {self.seed}")
        if self.step is not None:
            at.append(f"step {self.step}")
        if self.action is not None:
            at.append(f"action {shorten(self.action, 60)} by {self.role if self.role is not None else 'role=None'}")
        raise ConformanceError(", ".join(at) + ": " + what) from cause

    def call(self, what: str, fn: Callable, *args) -> Any:
        """``fn(*args)``; an exception from the domain's code becomes a :class:`ConformanceError` here."""
        try:
            return fn(*args)
        except ConformanceError:
            raise
        except Exception as exc:
            self.fail(f"{what} raised {type(exc).__name__}: {_clip(str(exc), 200)}", exc)


def task_label(task: str | DictConfig) -> str:
    """The task as failures name it: its name, or a task config's ``name`` key."""
    return task if isinstance(task, str) else str(task.get("name", "<task config>"))


def load_task(domain: Domain, task: str | DictConfig) -> DictConfig:
    """The task's config (``domain.task_config(task)`` for a name), with every key of ``REQUIRED_TASK_KEYS``."""
    w = Where(domain.name, task_label(task))
    cfg = w.call(f"task_config({task!r})", domain.task_config, task) if isinstance(task, str) else task
    missing = [k for k in REQUIRED_TASK_KEYS if k not in cfg]
    if missing:
        w.fail(f"the task config lacks {missing} (required: {list(REQUIRED_TASK_KEYS)})")
    return cfg


def _bounds(cfg: DictConfig) -> tuple[float, float]:
    return float(cfg.get("reward_min", 0.0)), float(cfg.reward_max)


def role_names(domain: Domain) -> list[str]:
    """The names of ``domain``'s roles, in order."""
    return [r.name for r in domain.roles]


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
        return {"__dict__": type(obj).__name__, **{str(k): freeze(v, shared, depth + 1) for k, v in obj.items()}}
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
        return {
            "__class__": type(obj).__name__,
            **{k: freeze(getattr(obj, k, None), shared, depth + 1) for k in obj.__slots__},
        }
    return repr(obj)


#: How :func:`freeze` marks an object shared across envs (compared as equal to anything: a restore
#: may hand back a copy of a shared object, which is not a state change).
SHARED = "<shared across envs>"


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The first path where two :func:`freeze` values differ, with both values (short)."""
    if (isinstance(a, str) and a == SHARED) or (isinstance(b, str) and b == SHARED):
        return None
    if type(a) is not type(b):
        return f"{path or 'state'}: {shorten(a)} vs {shorten(b)}"
    if isinstance(a, dict):
        for k in list(dict.fromkeys(list(a) + list(b))):
            if k not in a or k not in b:
                return f"{path}.{k}: {'missing' if k not in a else shorten(a[k])} vs {'missing' if k not in b else shorten(b[k])}"
            d = first_difference(a[k], b[k], f"{path}.{k}" if k not in ("__class__", "__dict__") else path)
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path or 'state'}: length {len(a) - 1} vs {len(b) - 1} ({shorten(a)} vs {shorten(b)})"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i - 1}]" if i else path)
            if d:
                return d
        return None
    return None if a == b else f"{path or 'state'}: {shorten(a)} vs {shorten(b)}"


def _clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def shorten(v: Any, n: int = 80) -> str:
    """``repr(v)``, cut to ``n`` characters."""
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


# ------------------------------------------------------------------ the env, driven by the kit
class Probe:
    """A domain's env as the kit drives it: every call guarded (an exception from the domain's code
    names domain, task, seed, step, action and role), every step's result checked (a ``StepResult``, a
    finite reward, no reward for an invalid action, the episode reward within ``[reward_min,
    reward_max]``). ``env`` is the domain's own env object (its state is compared directly)."""

    def __init__(self, domain: Domain, cfg: DictConfig, task_name: str, env: Any = None, concurrent: bool = False):
        self.w = Where(domain.name, task_name)
        make = domain.concurrent_env if concurrent else domain.make_env
        self.env = env if env is not None else self.w.call(f"{make.__name__}()", make, cfg)
        self.lo, self.hi = _bounds(cfg)
        self.total, self.done, self.t = 0.0, False, 0
        self.closed = False

    def _open(self, what: str) -> None:
        if self.closed:  # the kit's own rule: a closed env is never used again
            raise AssertionError(f"conformance kit: {what} on an env the kit closed")

    def close(self) -> None:
        """``close()`` the env (the kit's first call; a second is :func:`check_close`'s)."""
        if not self.closed:
            self.closed = True
            self.here().call("close()", close_env, self.env)

    def reset(self, seed: int) -> str:
        self._open("reset()")
        self.w.seed = int(seed)
        self.w.at(0)
        obs = self.w.call(f"reset({int(seed)})", self.env.reset, int(seed))
        if not isinstance(obs, str):
            self.w.fail(f"reset() returned {type(obs).__name__}, not str")
        self.total, self.done, self.t = 0.0, False, 0
        return obs

    def here(self) -> Where:
        """This step, before its action (what a failure of ``observation()`` or ``expert_action()`` names)."""
        return Where(self.w.domain, self.w.task, self.w.seed, self.t)

    def observation(self) -> str:
        return self.here().call("observation()", self.env.observation)

    def expert(self) -> ExpertStep | None:
        exp = self.here().call("expert_action()", self.env.expert_action)
        if exp is not None and not (
            isinstance(getattr(exp, "action", None), str) and isinstance(getattr(exp, "role", None), str)
        ):
            self.here().fail(
                f"expert_action() returned {shorten(exp)}; it must be None or ExpertStep(role, action) with two strings"
            )
        return exp

    def step(self, action: str, role: str | None, bounds: bool = True) -> StepResult:
        self._open("step()")
        w = self.w.at(self.t, action, role)
        res = w.call("step()", self.env.step, action, role)
        if not isinstance(res, StepResult):
            w.fail(f"step() returned {type(res).__name__}, not StepResult")
        r = res.reward
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(float(r)):
            w.fail(f"step() returned a reward {r!r}; it must be a finite number")
        if not res.valid and not res.done and float(r) > 0:  # (an invalid action may end the episode at a cap)
            w.fail(f"an invalid action earned reward {r} (it must be a no-op: 0, or a penalty)")
        self.total += float(r)
        if bounds and not self.lo - 1e-6 <= self.total <= self.hi + 1e-6:
            w.fail(
                f"the episode reward {self.total:g} left the task's bounds [reward_min {self.lo:g}, reward_max "
                f"{self.hi:g}] (this step's reward {float(r):g})"
            )
        self.done = bool(res.done)
        self.t += 1
        return res

    def snapshot(self) -> tuple:
        self._open("snapshot()")
        return self.w.call("snapshot()", self.env.snapshot), self.total, self.done, self.t

    def restore(self, snap: tuple) -> None:
        self._open("restore()")
        inner, self.total, self.done, self.t = snap
        self.w.call("restore()", self.env.restore, inner)
        self.w.at(self.t)

    def metrics(self) -> dict:
        m = self.here().call("metrics()", self.env.metrics)
        if not isinstance(m, dict):
            self.here().fail(f"metrics() returned {type(m).__name__}, not a dict")
        return m


# ------------------------------------------------------------------ trajectories
def action_pool(domain: Domain, cfg: DictConfig, seed: int, name: str | None = None) -> dict[str | None, list[str]]:
    """Random-action pool per role (and ``None``: every role's): the role's listed action choices, or
    (open action spaces) every action the expert takes on this seed, by any role (well-formed, often
    not possible now)."""
    roles = role_names(domain)
    name = name or task_label(cfg)
    w = Where(domain.name, name, int(seed))
    listed = {r: list(w.call("action_choices()", domain.action_choices, cfg, r) or ()) for r in roles}
    if all(listed.values()):
        pool: dict[str | None, list[str]] = dict(listed)
    else:
        p = Probe(domain, cfg, name)
        p.reset(seed)
        seen: list[str] = []
        for _ in range(int(cfg.max_decisions)):
            exp = p.expert()
            if exp is None:
                break
            seen.append(exp.action)
            if p.step(exp.action, exp.role, bounds=False).done:
                break
        p.close()
        seen = list(dict.fromkeys(seen)) or [GARBAGE]
        pool = {r: listed[r] or seen for r in roles}
    pool[None] = list(dict.fromkeys(a for r in roles for a in pool[r]))
    return pool


def choose(
    p: Probe, rng: random.Random, roles: list[str], pool: dict, mix: Mix, garbage: tuple[str, ...] = GARBAGE_TEXTS
) -> tuple[str, str | None]:
    """The next ``(action, role)`` of a ``mix`` trajectory (garbage drawn from ``garbage``)."""
    u = rng.random()
    exp = p.expert()
    mono = mix.monolithic
    if u < mix.expert and exp is not None:
        return exp.action, None if mono else exp.role
    if u < mix.expert + mix.random:
        role = None if mono else rng.choice(roles)
        return rng.choice(pool[role]), role
    if u < mix.expert + mix.random + mix.cross and exp is not None:
        return exp.action, rng.choice([r for r in roles if r != exp.role] + [None])
    return rng.choice(garbage), None if mono else rng.choice(roles + [None])


def trace(domain: Domain, cfg: DictConfig, seed: int, n: int, name: str | None = None, rng_seed: int = 0) -> list:
    """A seed's observable trajectory as plain data: the reset observation, then per step ``[action,
    role, observation, reward, done, valid]`` (expert actions mostly; garbage and wrong-role ones),
    then the final ``metrics()``: what two runs of a deterministic env agree on."""
    p = Probe(domain, cfg, name or task_label(cfg))
    roles = role_names(domain)
    rng = random.Random(rng_seed)
    out: list[Any] = [p.reset(seed)]
    for _ in range(n):
        exp = p.expert()
        if exp is None or rng.random() < 0.15:
            action, role = rng.choice(GARBAGE_TEXTS[:3]), rng.choice(roles + [None])
        elif rng.random() < 0.1:
            action, role = exp.action, rng.choice(roles + [None])
        else:
            action, role = exp.action, exp.role
        res = p.step(action, role, bounds=False)
        out.append([action, role, res.observation, round(float(res.reward), 9), bool(res.done), bool(res.valid)])
        if res.done:
            break
    out.append(probe_metrics(p))
    p.close()
    return out


def probe_metrics(p: Probe) -> dict:
    """The env's ``metrics()``, sorted by key and rounded, so two runs compare exactly."""
    return {
        str(k): (round(float(v), 9) if isinstance(v, (int, float)) else repr(v))
        for k, v in sorted(p.metrics().items(), key=lambda kv: str(kv[0]))
    }


def first_mismatch(domain: Domain, task: str, seed: int, a: list, b: list, what: str) -> None:
    """Fail at the first step where two traces of one seed differ (``what`` says how they were made)."""
    if a == b:
        return
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    w = Where(domain.name, task, seed)
    x = a[i] if i < len(a) else "ended"
    y = b[i] if i < len(b) else "ended"
    if i == 0:
        w.at(0).fail(f"{what}: reset() gave another observation ({shorten(x)} vs {shorten(y)})")
    if isinstance(x, dict) or isinstance(y, dict):
        w.at(i - 1).fail(f"{what}: metrics() at the episode's end differ ({shorten(x)} vs {shorten(y)})")
    step = x if isinstance(x, list) else y
    w.at(i - 1, step[0], step[1]).fail(
        f"{what}: [action, role, observation, reward, done, valid] {shorten(x, 240)} vs {shorten(y, 240)}"
    )
