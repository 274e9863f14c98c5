"""Typed, validated views of the vln_ce task config (``tasks/r2r.yaml``).

Bad values raise :class:`VLNConfigError` naming the key, the bad value and what is valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from swarm_domains.vln_ce.metrics import reward_bounds

SIMS = ("embedded", "habitat")
RESTORE_MODES = ("state", "replay")


class VLNConfigError(ValueError):
    """A vln_ce task-config value is invalid."""


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    if hasattr(cfg, "get"):
        v = cfg.get(key, default)
    else:
        v = getattr(cfg, key, default)
    return default if v is None else v


def _num(cfg: Any, key: str, default: float, lo: float, kind=float) -> Any:
    raw = _get(cfg, key, default)
    try:
        v = kind(raw)
    except (TypeError, ValueError):
        raise VLNConfigError(f"vln_ce: {key}={raw!r} is not a {kind.__name__}") from None
    if v < lo:
        raise VLNConfigError(f"vln_ce: {key}={raw!r} must be >= {lo}")
    return v


def sim_name(task: Any) -> str:
    """The ``sim`` switch of the task config, validated."""
    sim = str(_get(task, "sim", "embedded"))
    if sim not in SIMS:
        raise VLNConfigError(f"vln_ce: unknown sim {sim!r}; valid: {', '.join(SIMS)}")
    return sim


@dataclass(frozen=True)
class EmbeddedConfig:
    """Settings of the embedded simulator."""

    max_decisions: int = 64  #: decision cap (the env also ends the episode there)
    success_distance: float = 3.0  #: metres (VLN-CE)
    success_bonus: float = 1.0  #: reward added on a successful stop
    unseen_seed_start: int = 1_000_000  #: seeds from here on use val_unseen layouts
    episodes_per_layout: int = 8  #: consecutive seeds sharing a layout
    max_instruction_words: int = 18  #: instruction length cap (tokens)
    view_range: float = 8.0  #: metres an agent can see
    bearings: bool = False  #: give each seen item's direction (15-degree steps) after its distance
    invalid_penalty: float = 0.0  #: reward -invalid_penalty for each invalid action (0 = a free no-op)

    @classmethod
    def from_task(cls, task: Any) -> EmbeddedConfig:
        c = cls(
            max_decisions=_num(task, "max_decisions", 64, 1, int),
            success_distance=_num(task, "success_distance", 3.0, 0.01),
            success_bonus=_num(task, "success_bonus", 1.0, 0.0),
            unseen_seed_start=_num(task, "unseen_seed_start", 1_000_000, 1, int),
            episodes_per_layout=_num(task, "episodes_per_layout", 8, 1, int),
            max_instruction_words=_num(task, "max_instruction_words", 18, 8, int),
            view_range=_num(task, "view_range", 8.0, 1.0),
            bearings=bool(_get(task, "bearings", False)),
            invalid_penalty=_num(task, "invalid_penalty", 0.0, 0.0),
        )
        c.check_splits(task)
        c.check_reward_bounds(task)
        return c

    def check_splits(self, task: Any) -> None:
        """Training seeds must stay below ``unseen_seed_start`` and eval seeds at or above it."""
        tr, ev = _get(task, "train_seeds"), _get(task, "eval_seeds")
        if tr is not None:
            end = int(_get(tr, "start", 0)) + int(_get(tr, "count", 0))
            if end > self.unseen_seed_start:
                raise VLNConfigError(
                    f"vln_ce: train_seeds end at {end} but seeds >= unseen_seed_start={self.unseen_seed_start} "
                    "are val_unseen layouts; lower train_seeds.count or raise unseen_seed_start"
                )
        if ev is not None and int(_get(ev, "start", 0)) < self.unseen_seed_start:
            raise VLNConfigError(
                f"vln_ce: eval_seeds.start={int(_get(ev, 'start', 0))} is below "
                f"unseen_seed_start={self.unseen_seed_start}; eval episodes must use unseen layouts"
            )

    def check_reward_bounds(self, task: Any) -> None:
        """``reward_min``/``reward_max`` must contain the episode reward range
        [-1 - max_decisions * invalid_penalty, 1 + success_bonus]."""
        lo, hi = reward_bounds(self.success_bonus, self.invalid_penalty, self.max_decisions)
        rmin, rmax = float(_get(task, "reward_min", 0.0)), float(_get(task, "reward_max", hi))
        if rmin > lo or rmax < hi:
            raise VLNConfigError(
                f"vln_ce: reward bounds [{rmin}, {rmax}] do not contain the episode reward range "
                f"[{lo}, {hi}] (success_bonus={self.success_bonus}, invalid_penalty={self.invalid_penalty}, "
                f"max_decisions={self.max_decisions}); set reward_min: {lo}, reward_max: {hi}"
            )


def _seed_range(spec: Any) -> tuple[int, int] | None:
    """``(start, count)`` of a ``{start, count}`` seed spec (None when absent)."""
    if not spec:
        return None
    return int(_get(spec, "start", 0)), int(_get(spec, "count", 0))


@dataclass(frozen=True)
class HabitatConfig:
    """Settings of the habitat-lab adapter (``habitat:`` block of the task YAML)."""

    config: str = "benchmark/nav/vln_r2r.yaml"  #: habitat config (path or packaged name)
    data_path: str = "data/datasets/R2R_VLNCE_v1-3_preprocessed/{split}/{split}.json.gz"
    scenes_dir: str = "data/scene_datasets/"
    dataset_type: str = "R2RVLN-v1"
    train_split: str = "train"
    eval_split: str = "val_unseen"
    #: split behind the dev (tuning) seeds: R2R-CE's val_seen (new paths in the training scenes), so that dev
    #: shares no episode, path or scene with eval (val_unseen) and no episode or path with train
    dev_split: str = "val_seen"
    dev_seeds: tuple[int, int] | None = None  #: (start, count) of the task's ``dev_seeds`` (None: no dev split)
    restore: str = "state"  #: ``state`` (set_agent_state + measure copy) or ``replay`` (reset + replay)
    rgb: bool = True  #: pass RGB frames to vision-language policies
    max_instruction_words: int = 0  #: 0 = keep the full instruction (real tokenizers)
    overrides: tuple[str, ...] = field(default_factory=tuple)  #: extra habitat config overrides

    @classmethod
    def from_task(cls, task: Any) -> HabitatConfig:
        h = _get(task, "habitat", {}) or {}
        d = cls()
        restore = str(_get(h, "restore", d.restore))
        if restore not in RESTORE_MODES:
            raise VLNConfigError(f"vln_ce: habitat.restore={restore!r}; valid: {', '.join(RESTORE_MODES)}")
        overrides = _get(h, "overrides", ()) or ()
        if isinstance(overrides, str) or not all(isinstance(o, str) for o in overrides):
            raise VLNConfigError(f"vln_ce: habitat.overrides={overrides!r} must be a list of 'key=value' strings")
        return cls(
            config=str(_get(h, "config", d.config)),
            data_path=str(_get(h, "data_path", d.data_path)),
            scenes_dir=str(_get(h, "scenes_dir", d.scenes_dir)),
            dataset_type=str(_get(h, "dataset_type", d.dataset_type)),
            train_split=str(_get(h, "train_split", d.train_split)),
            eval_split=str(_get(h, "eval_split", d.eval_split)),
            dev_split=str(_get(h, "dev_split", d.dev_split)),
            dev_seeds=_seed_range(_get(task, "dev_seeds", None)),
            restore=restore,
            rgb=bool(_get(h, "rgb", d.rgb)),
            max_instruction_words=_num(h, "max_instruction_words", 0, 0, int),
            overrides=tuple(overrides),
        )
