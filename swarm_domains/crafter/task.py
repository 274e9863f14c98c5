"""Task spec of the crafter domain: the validated, plain-Python view of a task YAML."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REWARDS = ("crafter", "milestones")


@dataclass(frozen=True)
class TaskSpec:
    """What an env needs from the task config.

    :param goal: the achievement whose unlock is ``success`` (and, with ``stop_at_goal``, ends the episode).
    :param reward: ``crafter`` (Crafter's own: +1 per first unlock of any achievement, +-0.1 per health point) or
        ``milestones`` (+1 per first unlock of an achievement in ``milestones``).
    :param frames: the most env steps one instruction runs (the executor's bound).
    :param radius: how far (cells, each axis) the executor searches the semantic map for a named thing.
    :param instructions: the episode ends after this many executed instructions (unparsable ones aside).
    :param length: Crafter's episode length in env steps (its default, 10000, ends no episode of ours).
    :param primitive_actions: also list Crafter's 17 primitive actions among the action choices.
    """

    goal: str
    reward: str
    milestones: tuple[str, ...]
    stop_at_goal: bool
    frames: int
    radius: int
    instructions: int
    length: int
    primitive_actions: bool

    def __deepcopy__(self, memo: dict) -> TaskSpec:  # immutable: snapshots share it
        return self

    @classmethod
    def from_config(cls, cfg: Any) -> TaskSpec:
        """Validate a task config (DictConfig or dict); errors name the bad value and the valid ones."""
        from omegaconf import DictConfig, OmegaConf

        data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
        reward = data.get("reward", "crafter")
        if reward not in REWARDS:
            raise ValueError(f"crafter task: reward {reward!r} is unknown; valid: {', '.join(REWARDS)}")
        ints = {}
        for key, lo in (("frames", 1), ("radius", 1), ("instructions", 1), ("length", 1)):
            v = data.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"crafter task: {key} must be an integer >= {lo}, got {v!r}")
            ints[key] = v
        milestones = tuple(data.get("milestones") or ())
        if reward == "milestones" and not milestones:
            raise ValueError("crafter task: reward 'milestones' needs a non-empty milestones list of achievements")
        return cls(
            goal=str(data.get("goal", "make_iron_pickaxe")),
            reward=reward,
            milestones=milestones,
            stop_at_goal=bool(data.get("stop_at_goal", False)),
            primitive_actions=bool(data.get("primitive_actions", False)),
            **ints,
        )

    def check_names(self, achievements: tuple[str, ...]) -> None:
        """Refuse a goal or milestone that is not one of Crafter's achievements."""
        for name in (self.goal, *self.milestones):
            if name not in achievements:
                raise ValueError(
                    f"crafter task: {name!r} is not a Crafter achievement; valid: {', '.join(achievements)}"
                )
