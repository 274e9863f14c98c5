"""The environment contract every domain implements, and the validating wrapper.

A :class:`DomainEnv` is one episode world. The core drives it turn by turn:
``reset(seed)`` -> text observation; ``step(action_text, role)`` ->
:class:`StepResult`; ``snapshot()`` / ``restore(snap)`` give exact copies of the
world so counterfactual branches can be rolled from any turn; ``close()`` releases
what the env holds (a simulator process, a socket) once the runtime is done with it.
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from loguru import logger


@dataclass
class StepResult:
    """What one env step returns.

    :param observation: text observation after the step (what agents see next).
    :param reward: env reward for this step (milestones, progress, a judged answer ...).
    :param done: the episode ended (task solved, terminal action, failure).
    :param valid: False when the action text could not be parsed or is not
        allowed for the role; the env then did nothing (a no-op) and the core counts it.
    :param info: free-form per-step data (metrics such as ``success``).
    """

    observation: str
    reward: float = 0.0
    done: bool = False
    valid: bool = True
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExpertStep:
    """One step of a scripted expert: which role owns the action and its text."""

    role: str
    action: str


class DomainEnv(ABC):
    """Base class for a domain's world. Subclasses keep *all* state that
    ``snapshot`` must capture in plain Python data, so a deep copy is exact."""

    @abstractmethod
    def reset(self, seed: int) -> str:
        """Start a new episode from ``seed`` (deterministic) and return the observation."""

    @abstractmethod
    def step(self, action: str, role: str | None = None) -> StepResult:
        """Apply ``action`` (raw text emitted by the acting agent, whose role is
        ``role``; ``None`` for a single monolithic model). Unparsable or
        disallowed text is a no-op with ``valid=False``."""

    @abstractmethod
    def observation(self) -> str:
        """The current text observation (same as the last reset/step returned)."""

    #: Attributes an *invalid* action may still change (turn counters, a last-error text): the
    #: conformance kit leaves them out when it checks that an invalid action is a no-op. Optional.
    bookkeeping: tuple[str, ...] = ()

    # Optional: ``state_digest(self) -> Any``, the full episode state as plain data. When defined,
    # the conformance kit compares it (instead of a deep comparison of ``vars(env)``) before a
    # snapshot and after the restore.

    def snapshot(self) -> Any:
        """An exact, independent copy of the world state (default: deep copy of ``__dict__``)."""
        return copy.deepcopy(self.__dict__)

    def restore(self, snapshot: Any) -> None:
        """Put the world back exactly into ``snapshot`` (which stays reusable)."""
        self.__dict__.clear()
        self.__dict__.update(copy.deepcopy(snapshot))

    def expert_action(self) -> ExpertStep | None:
        """What the scripted expert does now (role + action text), or ``None``
        when the expert has nothing to do. Used for SFT cold-start demos."""
        return None

    def observation_images(self) -> list | None:
        """Optional image observations (e.g. RGB frames for vision-language
        policies); ``None`` for text-only domains."""
        return None

    def metrics(self) -> dict[str, float]:
        """Episode-level metrics so far (e.g. ``success``, ``spl``); reported at episode end."""
        return {}

    # ---- concurrent episodes (``algo=rlcr``, docs/guides/rlcr.md); optional ---------------------
    def progress(self) -> float:
        """Anytime return: the episode's return so far, valid at any moment (milestones paid, tests
        passed ...). A domain opts into ``algo=rlcr`` by overriding it; a rollout stopped at
        ``T_max`` scores this value. The default raises (no anytime return)."""
        raise NotImplementedError(f"{type(self).__name__} has no progress() (anytime return)")

    def action_seconds(self, action: str, role: str | None = None) -> float:
        """Simulated seconds the env itself needs for ``action`` (walking, mining, a test run), added
        to the generation time ``tokens * rlcr.seconds_per_token`` under ``algo=rlcr``; default 0."""
        return 0.0

    def concurrent_expert(self, agent: str, busy: dict[str, str]) -> str | None:
        """The scripted expert of a concurrent episode: what ``agent`` does now while the other
        agents carry out ``busy`` (agent -> action text in flight); ``None`` = fall back to
        :meth:`expert_action`. Used for the RLCR cold start (SFT)."""
        return None

    # ---- lifetime; optional -----------------------------------------------------------
    def close(self) -> None:
        """Release what the env holds (a simulator, a process, a connection); default: nothing. The
        runtime calls it once it is done with the env (the episode batch, evaluation or run ended, or
        raised), possibly before ``reset`` ever ran and possibly twice; the env is not used after it.
        Snapshots taken before it must stay restorable into another env of the task (counterfactual
        branches restore them after the original episode's env was closed)."""


def close_env(env) -> None:
    """``env.close()`` when the env has one (a duck-typed env without it is left alone)."""
    close = getattr(env, "close", None)
    if callable(close):
        close()


def close_all(envs, quiet: bool = False) -> None:
    """Close every env of ``envs``, each even when closing another raised; then re-raise the first error
    (``quiet``: log it instead, for a caller already unwinding from another exception, which matters more)."""
    first = None
    for env in envs:
        try:
            close_env(env)
        except Exception as exc:  # closing the others matters more than the order of errors
            first = first or exc
    if first is not None:
        if not quiet:
            raise first
        logger.warning("closing an env raised {}: {}", type(first).__name__, first)


@contextmanager
def closing_all(envs: list):
    """Yields ``envs`` (a list the body may add to) and closes every env in it when the body ends, also
    when it raised (then a failure to close is logged, and the body's exception goes on)."""
    try:
        yield envs
    except BaseException:
        close_all(envs, quiet=True)
        raise
    close_all(envs)


def has_progress(env: DomainEnv) -> bool:
    """Whether ``env`` (unwrapped) implements :meth:`DomainEnv.progress`."""
    return type(env).progress is not DomainEnv.progress


class EnvContractError(RuntimeError):
    """A domain env broke the :class:`DomainEnv` contract."""


class ValidatedEnv:
    """Wraps a :class:`DomainEnv` and checks the contract on every call, with
    messages that name the domain (and task), the seed, the step and the action."""

    def __init__(
        self, env: DomainEnv, name: str, reward_bounds: tuple[float, float] | None = None, task: str | None = None
    ):
        self.env, self.name, self.reward_bounds, self.task = env, name, reward_bounds, task
        self.done = False
        self.total_reward = 0.0
        self.seed: int | None = None
        self.t = 0  #: steps since reset (restore brings back the snapshot's)
        self.closed = False

    def _open(self, what: str, action: str | None = None, role: str | None = None) -> None:
        if self.closed:
            raise EnvContractError(
                f"{self._where(action, role)}: {what} called after close() (a closed env is "
                "not used again; make a new one)"
            )

    def _where(self, action: str | None = None, role: str | None = None) -> str:
        at = self.name + (f"/{self.task}" if self.task else "")
        if self.seed is not None:
            at += f", seed {self.seed}, step {self.t}"
        if action is not None:
            at += f", action {action!r} by {role or 'the monolithic model'}"
        return at

    def reset(self, seed: int) -> str:
        self._open("reset()")
        self.seed, self.t = int(seed), 0
        obs = self.env.reset(int(seed))
        if not isinstance(obs, str):
            raise EnvContractError(f"{self._where()}: reset() must return str, got {type(obs).__name__}")
        self.done, self.total_reward = False, 0.0
        return obs

    def step(self, action: str, role: str | None = None) -> StepResult:
        self._open("step()", action, role)
        if self.done:
            raise EnvContractError(f"{self._where(action, role)}: step() called after the episode ended")
        res = self.env.step(action, role)
        if not isinstance(res, StepResult):
            raise EnvContractError(
                f"{self._where(action, role)}: step() must return StepResult, got {type(res).__name__}"
            )
        if not isinstance(res.reward, (int, float)) or not math.isfinite(res.reward):
            raise EnvContractError(f"{self._where(action, role)}: step() returned a non-finite reward {res.reward!r}")
        self.total_reward += float(res.reward)
        if self.reward_bounds is not None:
            lo, hi = self.reward_bounds
            if not (lo - 1e-6 <= self.total_reward <= hi + 1e-6):
                raise EnvContractError(
                    f"{self._where(action, role)}: episode reward {self.total_reward} left its bounds [{lo}, {hi}] "
                    f"(this step's reward {float(res.reward)})"
                )
        self.done = bool(res.done)
        self.t += 1
        return res

    def observation(self) -> str:
        return self.env.observation()

    def snapshot(self) -> Any:
        return (self.env.snapshot(), self.done, self.total_reward, self.t)

    def restore(self, snapshot: Any) -> None:
        self._open("restore()")
        inner, self.done, self.total_reward, self.t = snapshot
        self.env.restore(inner)

    def expert_action(self) -> ExpertStep | None:
        return self.env.expert_action()

    def metrics(self) -> dict[str, float]:
        return self.env.metrics()

    def close(self) -> None:
        """Close the domain's env once (a second call does nothing); ``reset``, ``step`` and ``restore``
        are refused afterwards."""
        if not self.closed:
            self.closed = True
            close_env(self.env)
