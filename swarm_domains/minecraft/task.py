"""Task spec of the minecraft domain: the validated, plain-Python view of a task YAML."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from swarm_domains.minecraft.recipes import ITEMS

SIMS = ("embedded", "minestudio")


@dataclass(frozen=True)
class TaskSpec:
    """What an env needs from the task config (immutable, shared by snapshots).

    :param target: the item whose first acquisition ends the episode with success.
    :param milestones: item -> reward paid the first time the item is obtained.
    :param sim: ``embedded`` (text world) or ``minestudio`` (real Minecraft).
    :param backend: extra keys of the real backend (``minestudio:`` mapping).
    """

    target: str
    milestones: Mapping[str, float]
    sim: str = "embedded"
    backend: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __deepcopy__(self, memo: dict) -> TaskSpec:  # immutable: snapshots share it
        return self

    @property
    def reward_max(self) -> float:
        return float(sum(self.milestones.values()))

    @classmethod
    def from_config(cls, cfg: Any) -> TaskSpec:
        """Validate a task config (DictConfig or dict); errors name the bad value and the valid ones."""
        from omegaconf import DictConfig, OmegaConf

        data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
        target = data.get("target")
        if target not in ITEMS:
            raise ValueError(f"minecraft task: target {target!r} is not an item; valid: {', '.join(ITEMS)}")
        sim = data.get("sim", "embedded")
        if sim not in SIMS:
            raise ValueError(f"minecraft task: sim {sim!r} is unknown; valid: {', '.join(SIMS)}")
        raw = data.get("milestones")
        if not isinstance(raw, dict) or not raw:
            raise ValueError(f"minecraft task: milestones must be a mapping item -> reward, got {raw!r}")
        bad = [k for k in raw if k not in ITEMS]
        if bad:
            raise ValueError(f"minecraft task: unknown milestone items {bad}; valid: {', '.join(ITEMS)}")
        for k, v in raw.items():
            if not isinstance(v, (int, float)) or v <= 0:
                raise ValueError(f"minecraft task: milestone {k!r} reward must be a positive number, got {v!r}")
        if target not in raw:
            raise ValueError(f"minecraft task: milestones must include the target {target!r}")
        spec = cls(
            target,
            MappingProxyType({k: float(v) for k, v in raw.items()}),
            sim,
            MappingProxyType(dict(data.get("minestudio") or {})),
        )
        if "reward_max" in data and abs(float(data["reward_max"]) - spec.reward_max) > 1e-9:
            raise ValueError(
                f"minecraft task: reward_max {data['reward_max']!r} must equal the sum of the "
                f"milestone rewards ({spec.reward_max:g})"
            )
        return spec
