"""What a domain plugin registers: roles, tasks, prompts, an env factory, a vocabulary.

A domain subclasses :class:`Domain` and registers an instance from its
``swarm_register_domains`` hook. The core only talks to this interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from swarm_runtime.core.env import DomainEnv

#: Words the core's default prompt templates use (added to every tokenizer).
CORE_WORDS = ("you", "are", "log", "none", "bid", "action", "skip", "invalid", ";", ":", ".")

#: Episode-seed splits a task defines (``<split>_seeds`` in its YAML): train (SFT demos and RL),
#: dev (tuning), eval (reported numbers). ``dev_seeds`` is optional for third-party tasks.
SPLITS = ("train", "dev", "eval")

#: Task-config keys the core reads; every task YAML must define them.
REQUIRED_TASK_KEYS = ("max_decisions", "reward_max", "train_seeds", "eval_seeds")


@dataclass(frozen=True)
class Role:
    """An agent role (Logger, Miner, Smith ...). Each role gets its own model."""

    name: str
    description: str


@dataclass
class Event:
    """One entry of the public log every agent sees: who did what at which turn."""

    turn: int
    role: str | None  #: ``None`` when the turn was skipped (every bid was 0)
    action: str
    valid: bool = True
    reward: float = 0.0

    def render(self) -> str:
        if self.role is None:
            return "skip"
        return f"{self.role} {self.action}" + ("" if self.valid else " invalid")


class Domain(ABC):
    """Base class of a domain plugin's registration object.

    Subclasses set :attr:`name`, :attr:`roles`, :attr:`tasks_dir` (a folder of
    ``<task>.yaml`` files shipped in the domain's package) and implement
    :meth:`make_env` and :meth:`vocabulary`. Prompts have sensible defaults
    built from the observation and the last :attr:`log_window` log events.
    """

    name: str = ""
    description: str = ""
    roles: Sequence[Role] = ()
    tasks_dir: Path | None = None
    log_window: int = 4
    #: Environment variables the domain reads in its envs (an API key, a base URL): a run on a joined Ray cluster
    #: gives them, as the run has them, to its actors (swarm_runtime/cluster/actor_env.py; docs/guides/ray.md)
    env_vars: Sequence[str] = ()

    # ---- tasks -----------------------------------------------------------------
    def task_names(self) -> list[str]:
        if self.tasks_dir is None:
            return []
        return sorted(p.stem for p in Path(self.tasks_dir).glob("*.yaml"))

    def task_config(self, task: str) -> DictConfig:
        """The task's YAML as a config (the core validates :data:`REQUIRED_TASK_KEYS`)."""
        if task not in self.task_names():
            raise KeyError(task)
        return OmegaConf.load(Path(self.tasks_dir) / f"{task}.yaml")

    # ---- env -------------------------------------------------------------------
    @abstractmethod
    def make_env(self, task: DictConfig) -> DomainEnv:
        """A fresh env for ``task`` (the merged task config)."""

    def concurrent_env(self, task: DictConfig) -> DomainEnv:
        """The env of a concurrent episode (``algo=rlcr``: agents act at once on one shared world,
        against a simulated clock). Default: :meth:`make_env`. A domain whose turn-based env cannot
        take concurrent actions returns its parallel form here; either must implement
        ``DomainEnv.progress()`` (docs/guides/rlcr.md)."""
        return self.make_env(task)

    @abstractmethod
    def vocabulary(self, task: DictConfig) -> list[str]:
        """Every word the prompts and actions of ``task`` use. The core builds the
        default tiny models' tokenizer from it, in process, with no download."""

    def episode_seeds(self, task: DictConfig, split: str) -> list[int]:
        """Seeds of the ``train``, ``dev`` or ``eval`` split: the task YAML's ``train_seeds``,
        ``dev_seeds`` and ``eval_seeds`` (``{start, count}`` each; the conformance kit checks that
        they are disjoint). ``dev`` is for tuning, ``eval`` for reported numbers only."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
        spec = task.get(f"{split}_seeds")
        if spec is None:
            raise ValueError(
                f"task {task.get('name', '?')!r} of domain {self.name!r} defines no {split}_seeds "
                "({start: N, count: M} in its YAML)"
            )
        return list(range(int(spec.start), int(spec.start) + int(spec.count)))

    def action_choices(self, task: DictConfig, role: str | None) -> list[str] | None:
        """Every action text ``role`` may emit, when its action space is finite; ``None`` (the
        default) when it is open (free-text queries). ``role`` is ``None`` for the monolithic
        model, which may emit any role's action. With ``model.constrained_actions=true`` the
        role's model samples only among these texts. The texts must parse as valid actions of
        ``role`` and use the domain's vocabulary (the conformance kit checks both)."""
        return None

    # ---- evaluation ------------------------------------------------------------
    def eval_figures(self, episodes: Sequence[Any]) -> dict[str, tuple[float, float]]:
        """Figures of a held-out evaluation computed from all its episodes at once, beyond the mean of each
        per-episode metric (a benchmark's score over the success rates, say): ``{name: (value, standard
        error)}``. Each is stored in the summary as ``<name>_mean`` / ``<name>_se`` and shown, in this order, as
        a column of the held-out tables (``swarm eval``, a run's ``eval.md``). Default: none."""
        return {}

    def eval_report(self, summary: dict[str, Any]) -> str:
        """Markdown printed under the held-out table of an evaluation (``summary``: its means, ``eval_figures``
        included), e.g. per-achievement success rates; ``""`` (the default) prints nothing."""
        return ""

    # ---- prompts ---------------------------------------------------------------
    def render_log(self, log: Sequence[Event]) -> str:
        tail = [e.render() for e in log[-self.log_window :]] if self.log_window else []
        return " ; ".join(tail) if tail else "none"

    def bid_prompt(self, role: str, observation: str, log: Sequence[Event]) -> str:
        """Prompt after which the agent emits a bid (a bid-level token)."""
        return f"you are {role} . {observation} . log : {self.render_log(log)} . bid :"

    def action_prompt(self, role: str, observation: str, log: Sequence[Event]) -> str:
        """Prompt after which the winning agent emits its action text."""
        return f"you are {role} . {observation} . log : {self.render_log(log)} . action :"

    def single_prompt(self, observation: str, log: Sequence[Event]) -> str:
        """Prompt of a single (monolithic) model that acts every turn."""
        return f"{observation} . log : {self.render_log(log)} . action :"

    def all_words(self, task: DictConfig) -> list[str]:
        """Vocabulary + role names + the core's template words."""
        return list(self.vocabulary(task)) + [r.name for r in self.roles] + list(CORE_WORDS)

    def describe(self) -> dict[str, Any]:
        return {"roles": [r.name for r in self.roles], "tasks": self.task_names()}
