"""habitat-lab adapter (``sim: habitat``): the real VLN-CE task on R2R_VLNCE_v1-3 data.

Uses habitat-lab's ``VLN-v0`` task (config ``benchmark/nav/vln_r2r.yaml`` by default,
dataset type ``R2RVLN-v1``) with episodes and scenes from local paths. Each NaVILA
action text goes through the same parser as the embedded simulator and is executed
as primitive habitat actions (``stop``, ``move_forward``, ``turn_left``, ``turn_right``).
RGB frames reach vision-language policies through :meth:`observation_images`.

Snapshot/restore has two modes (``habitat.restore``):

- ``state`` (default): ``sim.get_agent_state()`` / ``sim.set_agent_state()`` plus a
  copy of every habitat measure's plain state and of our own bookkeeping.
- ``replay``: reset to the episode and replay the primitive-action prefix (slower,
  exact even for measures that keep non-copyable state).

habitat-lab is imported lazily; without it, or without the episode/scene data, the
env refuses with an error naming what is missing and how to get it. Everything that
does not need habitat (action expansion, metric mapping, reward, bookkeeping) is
plain Python and tested with fakes.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loguru import logger

from swarm_domains.vln_ce import actions as A
from swarm_domains.vln_ce.config import EmbeddedConfig, HabitatConfig
from swarm_domains.vln_ce.metrics import dedup, is_success, ndtw, resample, spl
from swarm_domains.vln_ce.stepping import finish_decision, start_decision
from swarm_runtime.core.env import DomainEnv, ExpertStep, StepResult

INSTALL_HINT = (
    "install habitat-sim (conda install habitat-sim headless -c conda-forge -c aihabitat) and "
    "habitat-lab (pip install 'swarm-runtime[habitat]'); see docs/domains/vln_ce.md"
)
DATA_HINT = (
    "download R2R_VLNCE_v1-3_preprocessed.zip (https://drive.google.com/file/d/1fo8F4NKgZDH-bPSdVU3cONAkt5EW-tyr) "
    "into data/datasets/ and the Matterport3D habitat scenes (python download_mp.py --task habitat) into "
    "data/scene_datasets/mp3d/, or point task.habitat.data_path / task.habitat.scenes_dir at them"
)

#: Measure attributes that reference simulator objects rather than measure state.
_MEASURE_SKIP = {
    "_sim",
    "_config",
    "_task",
    "_dataset",
    "config",
    "sim",
    "task",
    "dataset",
    "gt_json",
    "_gt_json",
    "dtw_func",
    "_env",
}
_ROLE_OF = {A.TURN_LEFT: "Turner", A.TURN_RIGHT: "Turner", A.MOVE_FORWARD: "Mover", A.STOP: "Stopper"}


class HabitatUnavailable(ImportError):
    """habitat-lab (or its data) is missing; the message says what and how to get it."""


def require_habitat() -> Any:
    """Import habitat-lab or raise :class:`HabitatUnavailable` with install instructions."""
    try:
        import habitat  # noqa: F401
    except ImportError as exc:
        raise HabitatUnavailable(
            f"vln_ce sim=habitat needs habitat-lab, which is not installed ({exc}); {INSTALL_HINT}"
        ) from exc
    return habitat


def check_data(cfg: HabitatConfig, splits: tuple[str, ...]) -> None:
    """Raise :class:`HabitatUnavailable` when the episode files or the scene folder are missing."""
    missing = [cfg.data_path.format(split=s) for s in splits if not os.path.exists(cfg.data_path.format(split=s))]
    if not os.path.isdir(cfg.scenes_dir):
        missing.append(cfg.scenes_dir)
    if missing:
        raise HabitatUnavailable(f"vln_ce sim=habitat: missing data {missing}; {DATA_HINT}")


# ---- pure helpers (tested without habitat) -------------------------------------------------


def map_metrics(raw: dict[str, Any], own: dict[str, float]) -> dict[str, float]:
    """Merge habitat's measures into our metric names.

    habitat's values win for what it measures on the navmesh (``distance_to_goal``,
    ``success``, ``spl`` and VLN-CE's extras ``ndtw``, ``path_length``,
    ``oracle_success``, ``steps_taken`` when configured); ours fill the rest.
    Non-numeric habitat measures (top-down maps ...) are dropped.
    """
    out = dict(own)
    for key in ("distance_to_goal", "success", "spl", "ndtw", "path_length", "oracle_success", "steps_taken"):
        v = raw.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
            out[key] = float(v)
        elif isinstance(v, bool):
            out[key] = float(v)
    return out


def expert_step(primitive: str | None) -> ExpertStep:
    """The role and NaVILA text of one primitive of habitat's shortest-path follower (``None`` = stop)."""
    kind = primitive or A.STOP
    if kind not in _ROLE_OF:
        raise ValueError(f"unknown habitat action {primitive!r}; valid: {', '.join(A.PRIMITIVES)}")
    amount = {A.TURN_LEFT: A.TURN_STEP_DEG, A.TURN_RIGHT: A.TURN_STEP_DEG, A.MOVE_FORWARD: A.FORWARD_STEP_CM}.get(
        kind, 0
    )
    return ExpertStep(_ROLE_OF[kind], A.expert_text(kind, amount))


def truncate_words(text: str, n: int) -> str:
    """The first ``n`` words of ``text`` (``n`` = 0 keeps it all)."""
    words = text.split()
    return text if n <= 0 or len(words) <= n else " ".join(words[:n])


def _plain(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if type(v).__name__ in ("ndarray", "quaternion"):
        return True
    if isinstance(v, (list, tuple)):
        return all(_plain(x) for x in v)
    if isinstance(v, dict):
        return all(_plain(x) for x in v.values())
    return False


def measure_state(measures: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A deep copy of every measure's plain attributes (its metric and bookkeeping)."""
    return {
        name: {k: copy.deepcopy(v) for k, v in vars(m).items() if k not in _MEASURE_SKIP and _plain(v)}
        for name, m in measures.items()
    }


def restore_measure_state(measures: dict[str, Any], state: dict[str, dict[str, Any]]) -> None:
    """Put the copied measure state back (a fresh copy, so the snapshot stays reusable)."""
    for name, attrs in state.items():
        if name in measures:
            vars(measures[name]).update(copy.deepcopy(attrs))


def which_split(seed: int, unseen_seed_start: int, dev_seeds: tuple[int, int] | None = None) -> str:
    """``dev`` for the task's dev seeds, ``eval`` from ``unseen_seed_start`` on, else ``train``."""
    if dev_seeds is not None and dev_seeds[0] <= seed < dev_seeds[0] + dev_seeds[1]:
        return "dev"
    return "eval" if seed >= unseen_seed_start else "train"


def episode_index(
    seed: int, unseen_seed_start: int, count: int, dev_seeds: tuple[int, int] | None = None
) -> tuple[str, int]:
    """Map a seed to (``train`` | ``dev`` | ``eval``, episode index) like the embedded splits:
    dev seeds index the dev split (val_seen) from its first episode, other seeds from
    ``unseen_seed_start`` on the eval split (val_unseen), the rest the train split."""
    if count <= 0:
        raise ValueError("vln_ce: the habitat dataset split has no episodes")
    which = which_split(seed, unseen_seed_start, dev_seeds)
    if which == "dev":
        return "dev", (seed - dev_seeds[0]) % count
    if which == "eval":
        return "eval", (seed - unseen_seed_start) % count
    return "train", seed % count


def _current_id(env: Any) -> Any:
    """The id of the habitat env's current episode (``None`` before the first reset)."""
    try:
        ep = env.current_episode
    except AssertionError:  # habitat asserts an episode exists
        return None
    return None if ep is None else ep.episode_id


def _xyz(p: Any) -> tuple[float, ...]:
    return tuple(float(x) for x in p)


@dataclass
class _Bookkeeping:
    """Our own measure state (copied by snapshots)."""

    seed: int = 0
    decisions: int = 0
    steps: int = 0
    stopped: bool = False
    done: bool = False
    d0: float = 0.0
    dist: float = 0.0
    min_dist: float = 0.0
    path_len: float = 0.0
    collisions: int = 0
    invalid: int = 0  #: decisions whose action was unparsable or not the acting role's
    bump: bool = False
    obs: str = ""
    path: tuple = ()
    prefix: tuple = ()  #: primitive actions since reset (for replay restores)


class HabitatVLNEnv(DomainEnv):
    """VLN-CE on habitat-lab. ``env_factory(split)`` builds the habitat env of a split
    (the default makes a ``habitat.Env``; tests pass fakes)."""

    def __init__(
        self,
        cfg: HabitatConfig,
        emb: EmbeddedConfig,
        env_factory: Callable[[str], Any] | None = None,
        follower_factory: Callable[[Any], Any] | None = None,
    ):
        self.cfg, self.emb = cfg, emb
        self._check_splits = env_factory is None  # real habitat: the dev split's files are checked when first used
        if env_factory is None:
            require_habitat()
            check_data(cfg, (cfg.train_split, cfg.eval_split))
            env_factory = self._make_habitat_env
        self._factory = env_factory
        self._follower_factory = follower_factory or _default_follower
        self._envs: dict[str, Any] = {}
        self._split = ""
        self._last_obs: dict = {}
        self._follower = None
        self.bk = _Bookkeeping()
        self._reference: tuple = ()

    # ---- habitat plumbing -----------------------------------------------------------
    def _make_habitat_env(self, split: str) -> Any:  # pragma: no cover - needs habitat-lab and data
        habitat = require_habitat()
        from habitat.config import read_write

        overrides = [
            f"habitat.dataset.split={split}",
            f"habitat.dataset.data_path={self.cfg.data_path}",
            f"habitat.dataset.scenes_dir={self.cfg.scenes_dir}",
            f"habitat.dataset.type={self.cfg.dataset_type}",
            *self.cfg.overrides,
        ]
        hcfg = habitat.get_config(self.cfg.config, overrides=overrides)
        with read_write(hcfg):
            hcfg.habitat.environment.iterator_options.shuffle = False
        logger.info("vln_ce: habitat env for split {} ({})", split, self.cfg.data_path.format(split=split))
        return habitat.Env(config=hcfg)

    def _env_for(self, which: str) -> Any:
        split = {"train": self.cfg.train_split, "dev": self.cfg.dev_split}.get(which, self.cfg.eval_split)
        if split not in self._envs:
            if self._check_splits:
                check_data(self.cfg, (split,))
            self._envs[split] = self._factory(split)
        self._split = split
        return self._envs[split]

    @property
    def env(self) -> Any:
        return self._envs[self._split]

    def _which(self, seed: int) -> str:
        return which_split(seed, self.emb.unseen_seed_start, self.cfg.dev_seeds)

    def _reset_to(self, seed: int) -> dict:
        env = self._env_for(self._which(seed))
        _, idx = episode_index(seed, self.emb.unseen_seed_start, len(env.episodes), self.cfg.dev_seeds)
        env.episode_iterator = iter([env.episodes[idx]])
        obs = env.reset()
        self._follower = None
        return obs

    def _gt_locations(self, episode: Any) -> tuple:
        """Dense reference path: the episode's ``reference_path`` resampled every 0.25 m
        (stands in for VLN-CE's ``{split}_gt.json.gz`` locations)."""
        return tuple(resample([_xyz(p) for p in getattr(episode, "reference_path", []) or []], 0.25))

    def _distance(self) -> float:
        d = self.env.get_metrics().get("distance_to_goal")
        if d is None or not math.isfinite(float(d)):
            goal = _xyz(self.env.current_episode.goals[0].position)
            return math.dist(self._position(), goal)
        return float(d)

    def _position(self) -> tuple[float, ...]:
        return _xyz(self.env.sim.get_agent_state().position)

    def _text(self) -> str:
        instr = self.env.current_episode.instruction.instruction_text
        text = truncate_words(instr, self.cfg.max_instruction_words)
        return text + " . bump" if self.bk.bump else text

    # ---- DomainEnv --------------------------------------------------------------------
    def reset(self, seed: int) -> str:
        self._last_obs = self._reset_to(int(seed))
        self._reference = self._gt_locations(self.env.current_episode)
        d0 = self._distance()
        self.bk = _Bookkeeping(seed=int(seed), d0=max(d0, 1e-6), dist=d0, min_dist=d0, path=(self._position(),))
        self.bk.obs = self._text()
        return self.bk.obs

    def observation(self) -> str:
        return self.bk.obs

    def observation_images(self) -> list | None:
        if not self.cfg.rgb or "rgb" not in self._last_obs:
            return None
        return [self._last_obs["rgb"]]

    def step(self, action: str, role: str | None = None) -> StepResult:
        bk = self.bk
        act, early = start_decision(bk, action, role, self.emb.max_decisions, self.emb.invalid_penalty)
        if act is None:
            return early
        before, collided = bk.dist, False
        for prim in act.primitives():
            if getattr(self.env, "episode_over", False):
                break
            start = self._position()
            self._last_obs = self.env.step(prim)
            bk.steps += 1
            bk.prefix = bk.prefix + (prim,)
            pos = self._position()
            if prim == A.MOVE_FORWARD:
                moved = math.dist(start, pos)
                bk.path_len += moved
                collided = collided or bool(getattr(self.env.sim, "previous_step_collided", False))
                if moved > 1e-9:
                    bk.path = bk.path + (pos,)
            if prim == A.STOP:
                bk.stopped = True
        return finish_decision(
            bk,
            act,
            before,
            self._distance(),
            bk.d0,
            collided,
            self.emb,
            self._text,
            self.metrics,
            over=bool(getattr(self.env, "episode_over", False)),
        )

    def metrics(self) -> dict[str, float]:
        if self._split not in self._envs:
            return {}
        bk = self.bk
        success = is_success(bk.stopped, bk.dist, self.emb.success_distance)
        own = {
            "success": float(success),
            "spl": spl(success, bk.d0, bk.path_len),
            "ndtw": ndtw(dedup(list(bk.path)), self._reference, self.emb.success_distance) if self._reference else 0.0,
            "distance_to_goal": bk.dist,
            "path_length": bk.path_len,
            "oracle_success": float(bk.min_dist <= self.emb.success_distance),
            "steps_taken": float(bk.steps),
            "decisions": float(bk.decisions),
            "collisions": float(bk.collisions),
            "invalid_actions": float(bk.invalid),
        }
        return map_metrics(self.env.get_metrics(), own)

    # ---- snapshot / restore ------------------------------------------------------------
    def snapshot(self) -> Any:
        state = self.env.sim.get_agent_state()
        return {
            "split": self._split,
            "episode_id": self.env.current_episode.episode_id,
            "position": copy.deepcopy(state.position),
            "rotation": copy.deepcopy(state.rotation),
            "measures": measure_state(self.env.task.measurements.measures),
            "stop_called": bool(getattr(self.env.task, "is_stop_called", False)),
            "elapsed": getattr(self.env, "_elapsed_steps", None),
            "episode_over": getattr(self.env, "_episode_over", None),
            "bk": copy.deepcopy(self.bk),
            "reference": self._reference,
            "last_obs": self._last_obs,
        }

    def restore(self, snapshot: Any) -> None:
        bk: _Bookkeeping = copy.deepcopy(snapshot["bk"])
        if self.cfg.restore == "replay":
            self._last_obs = self._reset_to(bk.seed)
            for prim in bk.prefix:
                self._last_obs = self.env.step(prim)
            got = self._position()
            want = _xyz(snapshot["position"])
            if math.dist(got, want) > 1e-3:
                logger.warning("vln_ce: replay restore ended at {} instead of {}", got, want)
        else:
            env = self._env_for(self._which(bk.seed))
            if _current_id(env) != snapshot["episode_id"]:
                self._reset_to(bk.seed)
            self.env.sim.set_agent_state(copy.deepcopy(snapshot["position"]), copy.deepcopy(snapshot["rotation"]))
            restore_measure_state(self.env.task.measurements.measures, snapshot["measures"])
            if hasattr(self.env.task, "is_stop_called"):
                self.env.task.is_stop_called = snapshot["stop_called"]
            if snapshot["elapsed"] is not None:
                self.env._elapsed_steps = snapshot["elapsed"]
            if snapshot["episode_over"] is not None:
                self.env._episode_over = snapshot["episode_over"]
            self._last_obs = snapshot["last_obs"]
        self.bk = bk
        self._reference = snapshot["reference"]
        self._follower = None

    # ---- expert ---------------------------------------------------------------------------
    def expert_action(self) -> ExpertStep | None:
        """One primitive of habitat's ``ShortestPathFollower`` toward the goal, as NaVILA text."""
        if self.bk.done:
            return None
        if self._follower is None:
            self._follower = self._follower_factory(self.env)
        goal = self.env.current_episode.goals[0].position
        return expert_step(self._follower(goal))

    def close(self) -> None:
        """Close every split's habitat env (and drop the follower bound to one); a second call does nothing."""
        envs, self._envs, self._follower = list(self._envs.values()), {}, None
        for env in envs:
            close = getattr(env, "close", None)
            if close:
                close()


def _default_follower(env: Any) -> Callable[[Any], str | None]:  # pragma: no cover - needs habitat-lab
    """habitat's ShortestPathFollower, returning primitive action names."""
    from habitat.sims.habitat_simulator.actions import HabitatSimActions
    from habitat.tasks.nav.shortest_path_follower import ShortestPathFollower

    follower = ShortestPathFollower(env.sim, goal_radius=0.5, return_one_hot=False)
    names = {int(getattr(HabitatSimActions, n)): n for n in A.PRIMITIVES if hasattr(HabitatSimActions, n)}

    def next_action(goal: Any) -> str | None:
        a = follower.get_next_action(goal)
        return None if a is None else names.get(int(a), A.STOP)

    return next_action
