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
and (when the concurrent env has ``progress()``) the RLCR checks of
:mod:`swarm_runtime.rlcr.conformance`. The kit closes the envs it is done with
and never uses a closed one again.

Every failure is a :class:`ConformanceError` naming the domain, task, seed,
step, action, role and what differed; an exception raised by the domain's own
code is reported the same way (chained to the original).
"""

from __future__ import annotations

import base64
import json
import math
import os
import pickle
import random
import subprocess
import sys
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from swarm_runtime.domain import REQUIRED_TASK_KEYS, SPLITS, Domain, Event
from swarm_runtime.env import ExpertStep, StepResult, close_env, has_progress
from swarm_runtime.policy.tokenizer import build_tokenizer, split_words, unknown_words

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
            at.append(f"action {_short(self.action, 60)} by {self.role if self.role is not None else 'role=None'}")
        raise ConformanceError(", ".join(at) + ": " + what) from cause

    def call(self, what: str, fn: Callable, *args) -> Any:
        """``fn(*args)``; an exception from the domain's code becomes a :class:`ConformanceError` here."""
        try:
            return fn(*args)
        except ConformanceError:
            raise
        except Exception as exc:
            self.fail(f"{what} raised {type(exc).__name__}: {_clip(str(exc), 200)}", exc)


def _task_name(task: str | DictConfig) -> str:
    return task if isinstance(task, str) else str(task.get("name", "<task config>"))


def _task(domain: Domain, task: str | DictConfig) -> DictConfig:
    w = Where(domain.name, _task_name(task))
    cfg = w.call(f"task_config({task!r})", domain.task_config, task) if isinstance(task, str) else task
    missing = [k for k in REQUIRED_TASK_KEYS if k not in cfg]
    if missing:
        w.fail(f"the task config lacks {missing} (required: {list(REQUIRED_TASK_KEYS)})")
    return cfg


def _bounds(cfg: DictConfig) -> tuple[float, float]:
    return float(cfg.get("reward_min", 0.0)), float(cfg.reward_max)


def _roles(domain: Domain) -> list[str]:
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


def _clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


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
                f"expert_action() returned {_short(exp)}; it must be None or ExpertStep(role, action) with two strings"
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
    roles = _roles(domain)
    name = name or _task_name(cfg)
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
    p = Probe(domain, cfg, name or _task_name(cfg))
    roles = _roles(domain)
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
    out.append(_metrics(p))
    p.close()
    return out


def _metrics(p: Probe) -> dict:
    return {
        str(k): (round(float(v), 9) if isinstance(v, (int, float)) else repr(v))
        for k, v in sorted(p.metrics().items(), key=lambda kv: str(kv[0]))
    }


def _first_mismatch(domain: Domain, task: str, seed: int, a: list, b: list, what: str) -> None:
    """Fail at the first step where two traces of one seed differ (``what`` says how they were made)."""
    if a == b:
        return
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    w = Where(domain.name, task, seed)
    x = a[i] if i < len(a) else "ended"
    y = b[i] if i < len(b) else "ended"
    if i == 0:
        w.at(0).fail(f"{what}: reset() gave another observation ({_short(x)} vs {_short(y)})")
    if isinstance(x, dict) or isinstance(y, dict):
        w.at(i - 1).fail(f"{what}: metrics() at the episode's end differ ({_short(x)} vs {_short(y)})")
    step = x if isinstance(x, list) else y
    w.at(i - 1, step[0], step[1]).fail(
        f"{what}: [action, role, observation, reward, done, valid] {_short(x, 240)} vs {_short(y, 240)}"
    )


# ------------------------------------------------------------------ determinism, in this process and across processes
def check_determinism(
    domain: Domain, task: str | DictConfig, seeds=(0, 1, 2), steps: int = 60, processes: bool = True
) -> dict[int, list]:
    """Two episodes from one seed with the same actions are identical, in this process and (with
    ``processes``) in two other Python processes with other ``PYTHONHASHSEED`` values: a ``reset`` or
    ``step`` that iterates a ``set`` of strings or uses ``hash()`` gives another world in another
    process (a resumed run, an evaluation, a served worker), while every check inside one process
    passes. Returns this process's traces (:func:`trace`) by seed."""
    cfg = _task(domain, task)
    name = _task_name(task)
    n = min(int(steps), int(cfg.max_decisions))
    with alongside_children(domain, task, processes, seeds, steps) as out:
        here = out["here"] = {int(s): trace(domain, cfg, int(s), n, name) for s in seeds}
        for s in seeds:
            _first_mismatch(
                domain,
                name,
                int(s),
                here[int(s)],
                trace(domain, cfg, int(s), n, name),
                "two episodes from the same seed with the same actions differ",
            )
    return here


@contextmanager
def alongside_children(domain: Domain, task: str | DictConfig, enabled: bool = True, seeds=(0, 1, 2), steps: int = 60):
    """Start the other processes (:func:`start_children`), run the body, which stores this process's
    traces under ``"here"`` of the dict it gets, then compare (:func:`finish_children`); a body that
    fails ends the children first."""
    children = start_children(domain, task, seeds, steps) if enabled else None
    out: dict = {}
    try:
        yield out
    except BaseException:
        if children is not None:
            stop_children(children)
        raise
    if children is not None:
        finish_children(children, out["here"])


def _hash_seeds(k: int = 2) -> list[str]:
    """``k`` ``PYTHONHASHSEED`` values other than this process's (fixed, so a failure reproduces)."""
    mine = os.environ.get("PYTHONHASHSEED")
    return [v for v in ("1", "2", "3") if v != mine][:k]


def _payload(domain: Domain, task: str | DictConfig) -> bytes | str:
    """What a child process needs to rebuild ``domain`` (pickled by reference to its class, or by its
    registered name), or why it cannot (a class defined in ``__main__`` or inside a function)."""
    cls = type(domain)
    how: tuple | None = ("pickle", domain)
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        how = None
        try:
            from swarm_runtime.plugins import get_registry

            if type(get_registry()[1].domains.get(domain.name)) is cls:
                how = ("registry", domain.name)
        except Exception:
            pass
        if how is None:
            where = "__main__" if cls.__module__ == "__main__" else "a function"
            return (
                f"its class {cls.__qualname__} is defined in {where}, so another process cannot import it "
                "(define it at module level)"
            )
    try:
        return pickle.dumps({"how": how, "task": task if isinstance(task, str) else OmegaConf.to_container(task)})
    except Exception as exc:
        return f"the domain object cannot be pickled ({type(exc).__name__}: {_short(str(exc), 120)})"


@dataclass
class Children:
    """Child processes replaying a domain's traces under other hash seeds (:func:`start_children`)."""

    domain: Domain
    task: str | DictConfig
    seeds: tuple
    procs: list  #: (PYTHONHASHSEED, Popen)


def start_children(domain: Domain, task: str | DictConfig, seeds=(0, 1, 2), steps: int = 60) -> Children | None:
    """Start two Python processes, each with another ``PYTHONHASHSEED``, that rebuild the domain and
    compute the traces of ``seeds`` (they run while this process goes on); None, with a
    :class:`ConformanceWarning`, when another process cannot rebuild the domain."""
    cfg = _task(domain, task)
    body = _payload(domain, task)
    if isinstance(body, str):
        warnings.warn(
            f"{domain.name}/{_task_name(task)}: determinism across processes not checked: {body}",
            ConformanceWarning,
            stacklevel=2,
        )
        return None
    header = json.dumps(
        {
            "path": [p for p in sys.path if isinstance(p, str)],
            "seeds": [int(s) for s in seeds],
            "steps": min(int(steps), int(cfg.max_decisions)),
        }
    )
    procs = []
    for hs in _hash_seeds():
        env = {**os.environ, "PYTHONHASHSEED": hs, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-c", "from swarm_runtime.testing import _child; _child()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        proc.stdin.write(header.encode() + b"\n" + base64.b64encode(body))
        proc.stdin.close()
        proc.stdin = None  # written in full; communicate() later only reads
        procs.append((hs, proc))
    return Children(domain, task, tuple(int(s) for s in seeds), procs)


def stop_children(children: Children) -> None:
    """End the children that are still running (a check failed first) and close their pipes."""
    for _, proc in children.procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in (proc.stdout, proc.stderr):
            if f is not None and not f.closed:
                f.close()


def finish_children(children: Children, here: dict[int, list], timeout: float = 300.0) -> None:
    """Compare the children's traces with ``here`` (this process's, by seed): the first difference
    fails, naming the seed, step, action and role, and the other process's hash seed."""
    domain, name = children.domain, _task_name(children.task)
    results = []
    try:
        for hs, proc in children.procs:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                Where(domain.name, name).fail(
                    f"another process (PYTHONHASHSEED={hs}) did not replay seeds "
                    f"{list(children.seeds)} within {timeout:g} s"
                )
            results.append((hs, proc.returncode, out, err))
    finally:
        stop_children(children)
    for hs, rc, out, err in results:
        lines = out.decode(errors="replace").strip().splitlines()
        try:
            got = json.loads(lines[-1])
        except (IndexError, ValueError):
            got = {"error": "crash", "message": err.decode(errors="replace").strip()[-400:] or f"exit code {rc}"}
        if got.get("error") == "load":
            warnings.warn(
                f"{domain.name}/{name}: determinism across processes not checked: another process could "
                f"not rebuild the domain ({got['message']})",
                ConformanceWarning,
                stacklevel=2,
            )
            return
        if "error" in got:
            Where(domain.name, name).fail(
                f"in another process (PYTHONHASHSEED={hs}) replaying seeds "
                f"{list(children.seeds)} failed where this process passes: {got['message']}"
            )
        for s in children.seeds:
            _first_mismatch(
                domain,
                name,
                s,
                json.loads(json.dumps(here[s])),
                got["traces"][str(s)],
                f"another process (PYTHONHASHSEED={hs}) gave another episode for the same seed and "
                "actions (this process vs that one): the env depends on the hash seed (iterating a "
                "set() of strings, hash()); use sorted(), a seeded random.Random or hashlib",
            )


def _child() -> None:
    """Entry point of the processes :func:`start_children` starts: rebuild the domain, print its traces."""
    header, body = sys.stdin.buffer.read().split(b"\n", 1)
    head = json.loads(header)
    for p in reversed(head["path"]):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        spec = pickle.loads(base64.b64decode(body))
        kind, what = spec["how"]
        if kind == "registry":
            from swarm_runtime.plugins import get_registry

            what = get_registry()[1].domains[what]
        task = spec["task"] if isinstance(spec["task"], str) else OmegaConf.create(spec["task"])
        cfg = _task(what, task)
    except Exception as exc:
        print(json.dumps({"error": "load", "message": f"{type(exc).__name__}: {_short(str(exc), 200)}"}))
        return
    try:
        traces = {str(s): trace(what, cfg, int(s), int(head["steps"]), _task_name(task)) for s in head["seeds"]}
    except Exception as exc:
        print(json.dumps({"error": "run", "message": f"{type(exc).__name__}: {_short(str(exc), 300)}"}))
        return
    print(json.dumps({"traces": traces}))


# ------------------------------------------------------------------ one env per make_env call
def check_fresh_env(domain: Domain, task: str | DictConfig, steps: int = 12) -> None:
    """Each ``make_env()`` call returns its own env: an episode played while another env of the task
    plays another seed (as the ``algo.envs_per_step`` episodes of an update do) is the same as one
    played alone. Catches a cached env handed out twice and world state kept in class attributes or
    module globals."""
    cfg = _task(domain, task)
    name = _task_name(task)
    w = Where(domain.name, name, 0, 0)
    a, b = w.call("make_env()", domain.make_env, cfg), w.call("make_env()", domain.make_env, cfg)
    if a is b:
        w.fail(
            "make_env() returned the same env object twice: parallel episodes would share one world "
            "(return a fresh env per call; share only read-only data such as a corpus)"
        )
    alone = trace(domain, cfg, 0, min(int(steps), int(cfg.max_decisions)), name)
    pa, pb = Probe(domain, cfg, name, a), Probe(domain, cfg, name, b)
    pa.reset(0)
    pb.reset(1)
    beside: list[Any] = [pa.observation()]
    roles = _roles(domain)
    for k, (action, role, *_) in enumerate(alone[1:-1]):
        res = pa.step(action, role, bounds=False)
        beside.append([action, role, res.observation, round(float(res.reward), 9), bool(res.done), bool(res.valid)])
        if not pb.done:
            exp = pb.expert()
            pb.step(exp.action if exp else GARBAGE, exp.role if exp else roles[k % len(roles)], bounds=False)
    beside.append(_metrics(pa))
    pa.close()
    pb.close()
    _first_mismatch(
        domain,
        name,
        0,
        alone,
        beside,
        "the episode played beside another env of the task (seed 1) differs from the same episode played "
        "alone (alone vs beside): the envs share state (a cached env, class attributes, module globals)",
    )


# ------------------------------------------------------------------ close()
def check_close(domain: Domain, task: str | DictConfig, seed: int = 0, steps: int = 8) -> None:
    """``close()`` (the runtime calls it when an episode batch, evaluation or run ends; optional, the
    default does nothing) raises nothing, twice in a row, on an env never reset (an env pool may close
    one it never used) and on one mid-episode; a snapshot taken before ``close()`` restores exactly into
    another env of the task and plays on (counterfactual branches restore a closed episode's snapshots);
    and closing envs leaves the task's other envs as they were (nothing shared, such as a corpus or a
    simulator server, torn down): a seed's episode played after the closes is the one played before."""
    cfg = _task(domain, task)
    name = _task_name(task)
    n = min(int(steps), int(cfg.max_decisions))
    before_closes = trace(domain, cfg, seed, 2 * n, name)
    idle = Probe(domain, cfg, name)
    idle.close()
    idle.here().call("a second close() (of an env never reset)", close_env, idle.env)
    p, q = Probe(domain, cfg, name), Probe(domain, cfg, name)
    p.reset(seed)
    q.reset(seed)
    shared = shared_objects(p.env, q.env)
    for _ in range(n):
        exp = p.expert()
        if exp is None or p.step(exp.action, exp.role, bounds=False).done:
            break
    snap, state, obs = p.snapshot(), state_of(p.env, shared), p.observation()
    p.close()
    p.here().call("a second close()", close_env, p.env)
    q.restore(snap)
    d = first_difference(state_of(q.env, shared), state)
    if d:
        q.here().fail(
            f"a snapshot taken before close() restored into another env of the task differs from the "
            f"state it was taken in: {d} (restored vs taken); a snapshot must not share what close() "
            "drops"
        )
    if q.observation() != obs:
        q.here().fail(
            f"a snapshot taken before close() restored into another env shows {_short(q.observation())}, "
            f"not {_short(obs)}"
        )
    for _ in range(n):  # it plays on
        exp = q.expert()
        if exp is None or q.step(exp.action, exp.role, bounds=False).done:
            break
    q.close()
    _first_mismatch(
        domain,
        name,
        seed,
        before_closes,
        trace(domain, cfg, seed, 2 * n, name),
        "the episode played after other envs of the task were closed differs from the one played before "
        "(before vs after): close() tore down something the task's envs share",
    )


# ------------------------------------------------------------------ invalid actions, snapshots, rare paths
def _bookkeeping(env: Any) -> tuple[str, ...]:
    return tuple(getattr(env, "bookkeeping", ()) or ())


def _noop(
    w: Where, p: Probe, shared: set[int], before_kept: Any, res: StepResult, what: str = "an invalid action"
) -> None:
    """After an invalid step: the state (``bookkeeping`` aside) is the one before it."""
    if res.valid or res.done:
        return
    keep = _bookkeeping(p.env)
    d = first_difference(state_of(p.env, shared, keep), before_kept)
    if d:
        w.fail(
            f"{what} changed the state (it must be a no-op; counters may be listed in the env's "
            f"`bookkeeping`): {d} (after vs before)"
        )


def check_invalid_is_noop(domain: Domain, task: str | DictConfig, seed: int = 0) -> None:
    """Every garbage text (:data:`GARBAGE_TEXTS`), sent by every role and by ``role=None`` from the
    start state, raises nothing and, when invalid, earns no reward and changes no state
    (``bookkeeping`` counters aside); :data:`GARBAGE` itself must be invalid."""
    cfg = _task(domain, task)
    name = _task_name(task)
    p, twin = Probe(domain, cfg, name), Probe(domain, cfg, name)
    p.reset(seed)
    twin.reset(seed)
    shared = shared_objects(p.env, twin.env)
    start = p.snapshot()
    before = state_of(p.env, shared, _bookkeeping(p.env))
    for role in _roles(domain) + [None]:
        for text in GARBAGE_TEXTS:
            p.restore(start)
            res = p.step(text, role)
            w = p.w.at(0, text, role)
            if res.valid and text == GARBAGE:
                w.fail(
                    "a garbage text was accepted as a valid action (any role may send any text; text that is no "
                    "action of the role must be a no-op with valid=False)"
                )
            _noop(w, p, shared, before, res, "a garbage text")
    p.restore(start)


def check_snapshots(
    domain: Domain, task: str | DictConfig, trajectories=TRAJECTORIES, max_steps: int | None = None
) -> int:
    """Snapshot / step / restore / replay at every step of each ``(seed, mix)`` trajectory (to the
    episode's end or ``max_decisions``), comparing the full state; invalid actions as no-ops, reward
    bounds, exceptions from env code and ``step()``/``observation()`` agreement on the way. Returns the
    steps checked."""
    cfg = _task(domain, task)
    name = _task_name(task)
    roles = _roles(domain)
    checked = 0
    for m, (seed, mix, *most) in enumerate(trajectories):
        mix = Mix(*mix)
        cap = min(int(max_steps or cfg.max_decisions), *(int(x) for x in most[:1]), int(cfg.max_decisions))
        pool = action_pool(domain, cfg, int(seed), name)
        p, twin = Probe(domain, cfg, name), Probe(domain, cfg, name)
        obs = p.reset(int(seed))
        twin.reset(int(seed))
        w = p.w
        shared = shared_objects(p.env, twin.env)
        keep = _bookkeeping(p.env)
        if obs != p.observation():
            w.fail(
                "reset() returned an observation that observation() does not show: "
                f"{_short(obs)} vs {_short(p.observation())}"
            )
        rng = random.Random(1000 * m + int(seed))
        for t in range(cap):
            if p.done:
                break
            action, role = choose(p, rng, roles, pool, mix)
            w.at(t, action, role)
            snap = p.snapshot()
            frozen_snap = freeze(snap[0], shared)
            before, obs0 = state_of(p.env, shared), p.observation()
            before_kept = _drop(before, keep)
            res = p.step(action, role)
            w.at(t, action, role)
            if res.observation != p.observation():
                w.fail(
                    "step() returned an observation that observation() then does not show: "
                    f"{_short(res.observation)} vs {_short(p.observation())}"
                )
            _noop(w, p, shared, before_kept, res)
            after = state_of(p.env, shared)
            d = first_difference(freeze(snap[0], shared), frozen_snap)
            if d:
                w.fail(
                    f"stepping changed the snapshot taken before it (it shares live state with the env): {d} "
                    "(after vs at snapshot time)"
                )
            p.restore(snap)
            w.at(t, action, role)
            d = first_difference(state_of(p.env, shared), before)
            if d:
                w.fail(
                    "restore() did not bring back the state of snapshot time (state kept outside the snapshot, "
                    f"or a restore that forgets part of it): {d} (after restore vs at snapshot time)"
                )
            if p.observation() != obs0:
                w.fail(f"observation after restore differs: {_short(p.observation())} vs {_short(obs0)}")
            res2 = p.step(action, role)
            w.at(t, action, role)
            one = (res.observation, round(float(res.reward), 9), bool(res.done), bool(res.valid))
            two = (res2.observation, round(float(res2.reward), 9), bool(res2.done), bool(res2.valid))
            if one != two:
                w.fail(
                    f"the same action from the restored snapshot gave another result: {_short(two)} vs {_short(one)}"
                )
            d = first_difference(state_of(p.env, shared), after)
            if d:
                w.fail(f"the same action from the restored snapshot left another state: {d} (replayed vs first)")
            d = first_difference(freeze(snap[0], shared), frozen_snap)
            if d:
                w.fail(f"restoring and stepping changed the snapshot (it must stay reusable): {d}")
            checked += 1
    return checked


def _drop(frozen: Any, names: tuple[str, ...]) -> Any:
    if not names or not isinstance(frozen, dict):
        return frozen
    return {k: v for k, v in frozen.items() if k not in names}


def _points(n_steps: int, k: int) -> list[int]:
    """``k`` steps of a trajectory to branch at: the first three and the rest spread evenly."""
    if n_steps <= k:
        return list(range(n_steps))
    first = list(range(min(3, k)))
    rest = k - len(first)
    return sorted(set(first + [3 + (n_steps - 4) * (i + 1) // rest for i in range(rest)]))


def check_rare_paths(domain: Domain, task: str | DictConfig, points=BRANCH_POINTS) -> int:
    """Paths a trained policy may take and a scripted expert never does. Along each ``(seed, mix, k,
    n)`` trajectory, at ``k`` points (its first steps and some spread over the episode), from a
    snapshot, ``n`` one-step branches in all: every listed (or expert-seen) action sent by every role and
    by ``role=None`` (cross-role actions, early stops, a monolithic model) and every garbage text by one
    sender each, spread over the points (each pair at least once when ``n`` allows). Every such step
    must return a ``StepResult`` with a finite reward without raising, keep the episode reward within
    ``[reward_min, reward_max]``, and be a no-op when invalid. Returns the branches tried."""
    cfg = _task(domain, task)
    name = _task_name(task)
    roles = _roles(domain)
    senders: list[str | None] = roles + [None]
    tried = 0
    for m, (seed, mix, k, n) in enumerate(points):
        mix = Mix(*mix)
        pool = action_pool(domain, cfg, int(seed), name)
        p, twin = Probe(domain, cfg, name), Probe(domain, cfg, name)
        p.reset(int(seed))
        twin.reset(int(seed))
        shared = shared_objects(p.env, twin.env)
        keep = _bookkeeping(p.env)
        rng = random.Random(7000 + 1000 * m + int(seed))
        path: list[tuple[str, str | None]] = []  # the trajectory first; then branch at some of its steps
        start = p.snapshot()
        while not p.done and len(path) < int(cfg.max_decisions):
            a, r = choose(p, rng, roles, pool, mix)
            p.step(a, r)
            path.append((a, r))
        at = _points(len(path), int(k))
        pairs = [(a, r) for a in pool[None] for r in senders]
        pairs += [(g, senders[i % len(senders)]) for i, g in enumerate(GARBAGE_TEXTS)]
        rng.shuffle(pairs)
        per = max(1, int(n) // max(1, len(at)))
        p.restore(start)
        for t, (a, r) in enumerate(path):
            if t in at:
                j = at.index(t)
                snap = p.snapshot()
                before_kept = state_of(p.env, shared, keep)
                for i in range(min(per, len(pairs))):
                    text, role = pairs[(j * per + i) % len(pairs)]
                    res = p.step(text, role)
                    _noop(p.w.at(t, text, role), p, shared, before_kept, res)
                    p.restore(snap)
                    tried += 1
            p.step(a, r)
    return tried


def check_snapshot_roundtrip(
    domain: Domain, task: str | DictConfig, seed: int = 0, at: int = 5, steps: int = 30
) -> None:
    """One seed of :func:`check_snapshots` (kept for callers of the earlier kit)."""
    check_snapshots(domain, task, trajectories=((seed, EXPERT_LED),), max_steps=at + steps)


def check_reward_bounds(domain: Domain, task: str | DictConfig, seeds: range = range(3)) -> None:
    """Episode reward within ``[reward_min, reward_max]`` under mostly random valid actions."""
    check_snapshots(domain, task, trajectories=tuple((s, MOSTLY_RANDOM) for s in seeds))


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
        for b in list(got)[i + 1 :]:
            both = got[a] & got[b]
            if both:
                Where(domain.name, name).fail(
                    f"{a} and {b} seeds overlap ({len(both)} shared, e.g. {sorted(both)[:5]}); tuning on dev or "
                    "training on held-out worlds would leak into the reported numbers"
                )
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
        for b in list(picked)[i + 1 :]:
            both = picked[a].keys() & picked[b].keys()
            if both:
                inst = sorted(both, key=repr)[0]
                Where(domain.name, name, picked[b][inst]).fail(
                    f"{a} and {b} seeds pick the same instances ({len(both)} shared, e.g. {_short(inst)} by {a} seed "
                    f"{picked[a][inst]} and {b} seed {picked[b][inst]}); the seeds are disjoint but what they "
                    "pick is not"
                )


def check_fresh_task_config(domain: Domain, task: str | DictConfig) -> None:
    """Each ``task_config()`` (what ``resolve()`` starts from) is a fresh object: a run that edits
    its config (``task.max_decisions=...``) must not leak into the next run."""
    if not isinstance(task, str):
        return
    w = Where(domain.name, task)
    a = w.call("task_config()", domain.task_config, task)
    b = w.call("task_config()", domain.task_config, task)
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
        p = Probe(domain, cfg, _task_name(task))
        p.reset(seed)
        for _ in range(cap):
            exp = p.expert()
            if exp is None or p.step(exp.action, exp.role, bounds=False).done:
                break
        else:
            exp = p.expert()
            if exp is not None:
                p.w.at(cap, exp.action, exp.role).fail(
                    f"max_decisions={cap} cut the expert off: it still has this action to take; raise max_decisions"
                )


def max_prompt_tokens(cfg: DictConfig) -> int:
    """``model.max_prompt_tokens`` a run of this task gets unless the command line sets it: the task's
    ``overrides: {model: {max_prompt_tokens: N}}``, else the default (:data:`DEFAULT_MAX_PROMPT_TOKENS`)."""
    over = cfg.get("overrides") or {}
    model = over.get("model") if hasattr(over, "get") else None
    n = model.get("max_prompt_tokens") if model is not None and hasattr(model, "get") else None
    return int(n) if n is not None else DEFAULT_MAX_PROMPT_TOKENS


def prompt_problem(
    tok, text: str, limit: int, ids: list[int] | None = None, vocab: set[str] | None = None
) -> str | None:
    """What is wrong with a prompt for the in-process word-level tokenizer ``tok``: empty, words
    missing from the vocabulary (the kit's own garbage words aside), or longer than ``limit`` tokens
    (the beginning of sequence included), as the policy would encode it; ``None`` when it is fine.
    ``ids``: the prompt's token ids when already encoded (a batch); ``vocab``: ``set(tok.get_vocab())``."""
    if not (isinstance(text, str) and text.strip()):
        return f"the prompt is empty ({text!r})"
    if ids is None:
        ids = tok(text, add_special_tokens=False).input_ids
    if tok.unk_token_id in ids:
        words = {w for w in split_words(text) if w not in vocab} if vocab is not None else set(unknown_words(tok, text))
        unk = sorted(words - KIT_WORDS)
        if unk:
            return f"prompt words missing from vocabulary(): {unk[:10]} in {_short(text)}"
    n = len(ids) + 1
    if n > limit:
        return (
            f"the prompt is {n} tokens long (beginning of sequence included), more than model.max_prompt_tokens="
            f"{limit}: the policy refuses it at run time (SWARM_PROMPT_OVERFLOW=warn would cut it from the left, "
            f"losing its opening {_short(' '.join(text.split()[:6]))}); shorten the observation or log_window, "
            "or raise max_prompt_tokens in the task's overrides"
        )
    return None


def check_prompts(
    domain: Domain,
    task: str | DictConfig,
    trajectories=((0, EXPERT_LED), (2, MOSTLY_RANDOM)),
    bid_levels=(0, 0.2, 0.4, 0.6, 0.8),
    max_tokens: int | None = None,
) -> int:
    """At every step of each ``(seed, mix)`` trajectory, the observation and every prompt the core
    would build from it (bid and action prompt of every role, the single model's prompt, with the log
    so far) use only vocabulary words and fit ``max_tokens`` (default: :func:`max_prompt_tokens` of the
    task). Returns the prompts checked."""
    cfg = _task(domain, task)
    name = _task_name(task)
    tok = build_tokenizer(domain.all_words(cfg), bid_levels)
    limit = int(max_tokens or max_prompt_tokens(cfg))
    roles = _roles(domain)
    checked = 0
    for m, (seed, mix) in enumerate(trajectories):
        mix = Mix(*mix)
        pool = action_pool(domain, cfg, int(seed), name)
        p = Probe(domain, cfg, name)
        obs = p.reset(int(seed))
        rng = random.Random(3000 + 1000 * m + int(seed))
        log: list[Event] = []
        last: tuple[str | None, str | None] = (None, None)
        shown: list[tuple[int, str | None, str | None, str, str]] = []  # (step, action, role, what, text)
        for t in range(int(cfg.max_decisions) + 1):
            w = p.w.at(t, *last)
            shown.append((t, *last, "the observation", obs))
            shown.append((t, *last, "the single prompt", w.call("single_prompt()", domain.single_prompt, obs, log)))
            for role in roles:
                shown.append(
                    (t, *last, f"{role}'s bid prompt", w.call("bid_prompt()", domain.bid_prompt, role, obs, log))
                )
                shown.append(
                    (
                        t,
                        *last,
                        f"{role}'s action prompt",
                        w.call("action_prompt()", domain.action_prompt, role, obs, log),
                    )
                )
            if p.done or t == int(cfg.max_decisions):
                break
            action, role = choose(p, rng, roles, pool, mix, garbage=(GARBAGE,))
            res = p.step(action, role, bounds=False)
            log.append(Event(t, role if role is not None else "you", action, bool(res.valid), float(res.reward)))
            obs, last = res.observation, (action, role)
        texts = [x[4] if isinstance(x[4], str) else "" for x in shown]
        vocab = set(tok.get_vocab())
        for (t, action, role, what, text), ids in zip(shown, tok(texts, add_special_tokens=False).input_ids):
            bad = prompt_problem(tok, text, (1 << 30) if what == "the observation" else limit, ids, vocab)
            if bad:
                p.w.at(t, action, role).fail(f"{what}: {bad}")
            checked += what != "the observation"
    return checked


def check_expert(domain: Domain, task: str | DictConfig, seeds: range = range(3)) -> None:
    """The expert names known roles, its actions are valid and it earns reward; stepped with
    ``role=None`` (as ``algo=monolithic`` and ``algo=rlcr`` step the env: one model may take any
    role's action) the same actions are valid too."""
    cfg = _task(domain, task)
    roles = set(_roles(domain))
    for monolithic in (False, True):
        for seed in seeds:
            p = Probe(domain, cfg, _task_name(task))
            p.reset(seed)
            for t in range(int(cfg.max_decisions)):
                exp = p.expert()
                if exp is None or p.done:
                    break
                w = p.w.at(t, exp.action, None if monolithic else exp.role)
                if exp.role not in roles:
                    w.fail(f"the expert names role {exp.role!r}, not one of {sorted(roles)}")
                if not p.step(exp.action, None if monolithic else exp.role).valid:
                    w.at(t, exp.action, None if monolithic else exp.role).fail(
                        "the expert's action was invalid"
                        + (
                            f" when stepped with role=None (it is {exp.role}'s; algo=monolithic and algo=rlcr step "
                            "the env with role=None, and one model may take any role's action)"
                            if monolithic
                            else ""
                        )
                    )
            if p.total <= 0:
                p.w.at(None).fail(
                    "the expert earned no reward"
                    + (" when its actions were stepped with role=None" if monolithic else "")
                )


def check_action_choices(domain: Domain, task: str | DictConfig, seeds: range = range(3)) -> None:
    """Listed action choices (``Domain.action_choices``, for ``model.constrained_actions``): each
    is a non-empty text, spelled in the vocabulary and a valid action of its role (well-formed and
    the role's, from the first seed's start), and the expert acts only among its role's choices
    (and the monolithic model's, ``action_choices(task, None)``), else a constrained model could
    never take the expert's action. Failures name domain, task, seed, step, action and role."""
    cfg = _task(domain, task)
    name = _task_name(task)
    w0 = Where(domain.name, name)
    listed = {r.name: w0.call("action_choices()", domain.action_choices, cfg, r.name) for r in domain.roles}
    if not any(listed.values()):
        return
    tok = build_tokenizer(domain.all_words(cfg), (0.0,))
    env = Probe(domain, cfg, name)
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
                w.fail(
                    f"the listed action choice has words missing from vocabulary(): {sorted(set(unk))[:10]} "
                    "(a constrained model could not spell it)"
                )
            env.restore(start)
            res = env.step(text, role, bounds=False)
            if not res.valid:
                w.fail(
                    f"the listed action choice is not a valid action of {role} at the start of the episode "
                    "(valid means well-formed and the role's, even when it cannot succeed now); step() returned "
                    f"valid=False, observation {_short(res.observation)}"
                )
    words = {role: {tuple(split_words(t)) for t in c} for role, c in listed.items() if c}
    mono_list = list(domain.action_choices(cfg, None) or ())
    mono = {tuple(split_words(t)) for t in mono_list}
    for seed in seeds:
        env.reset(int(seed))
        for t in range(int(cfg.max_decisions)):
            exp = env.expert()
            if exp is None or env.done:
                break
            w = Where(domain.name, name, int(seed), t, exp.action, exp.role)
            if exp.role in words and tuple(split_words(exp.action)) not in words[exp.role]:
                w.fail(
                    f"the expert's action is not among {exp.role}'s {len(words[exp.role])} listed action choices "
                    f"(e.g. {_short(sorted(listed[exp.role])[:4])}): with model.constrained_actions=true its "
                    "model could never take it"
                )
            if mono and tuple(split_words(exp.action)) not in mono:
                w.fail(
                    f"the expert's action is not among the monolithic model's {len(mono)} listed action choices "
                    f"(action_choices(task, None), e.g. {_short(sorted(mono_list)[:4])})"
                )
            env.step(exp.action, exp.role, bounds=False)


def check_domain(
    domain: Domain,
    task: str | DictConfig,
    trajectories=TRAJECTORIES,
    max_tokens: int | None = None,
    processes: bool = True,
) -> None:
    """Run every conformance check on ``domain``/``task``; raises :class:`ConformanceError`.
    ``max_tokens``: the ``model.max_prompt_tokens`` prompts must fit (default: the task's overrides, else
    256); ``processes=False`` skips the determinism check in other processes (about a second)."""
    cfg = _task(domain, task)
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
        check_prompts(domain, task, max_tokens=max_tokens)
        env = Where(domain.name, _task_name(task)).call("concurrent_env()", domain.concurrent_env, cfg)
        if has_progress(env):
            from swarm_runtime.rlcr.conformance import check_rlcr

            check_rlcr(domain, task, max_tokens=max_tokens)
