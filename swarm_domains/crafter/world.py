"""The crafter env: Crafter's own world driven by text instructions through the scripted executor."""

from __future__ import annotations

import pickle
import random
from typing import Any

import numpy as np
from loguru import logger

from swarm_domains.crafter import compat
from swarm_domains.crafter.executor import DIRS, DONE, FAILED, View, decide, explore_move
from swarm_domains.crafter.expert import CURRICULUM, expert_instruction
from swarm_domains.crafter.instructions import Instruction, owner, parse
from swarm_domains.crafter.observation import render
from swarm_domains.crafter.tables import Tables
from swarm_domains.crafter.task import TaskSpec
from swarm_runtime import DomainEnv, ExpertStep, StepResult

_LOGGED: set[str] = set()  # unparsable texts already logged by this process (each once, at most 100)


class CrafterEnv(DomainEnv):
    """One Crafter world (``crafter.Env`` with seed = the episode seed); each step runs one instruction.

    ``unparsed`` counts the unparsable instructions of the episode (their turns are wasted: no env step).
    """

    bookkeeping = ("unparsed",)

    def __init__(self, spec: TaskSpec, tables: Tables):
        self.spec, self.t = spec, tables
        self._env: Any = None
        self.obs, self.last, self.unparsed = "", "none", 0
        self.crafter_return, self.steps, self.executed = 0.0, 0, 0
        self.rng, self.direction = random.Random(0), (1, 0)

    # ---- the world ---------------------------------------------------------------
    def reset(self, seed: int) -> str:
        if self._env is None:
            from swarm_domains.crafter.sim import TextCrafter

            self._env = TextCrafter(length=self.spec.length, seed=int(seed))
        self._env._seed, self._env._episode = int(seed), 0  # Crafter seeds its world from (seed, episode 1)
        self._env.reset()
        self.last, self.unparsed, self.crafter_return, self.steps, self.executed = "none", 0, 0.0, 0, 0
        self.rng, self.direction = random.Random(int(seed)), (1, 0)
        self.obs = self._render()
        return self.obs

    @property
    def player(self):
        return self._env._player

    @property
    def unlocked(self) -> set[str]:
        return set(self._env._unlocked)

    def view(self) -> View:
        p = self.player
        return View(
            sem=self._env._sem_view(),
            pos=(int(p.pos[0]), int(p.pos[1])),
            facing=(int(p.facing[0]), int(p.facing[1])),
            inventory=dict(p.inventory),
            sleeping=bool(p.sleeping),
            radius=self.spec.radius,
            t=self.t,
        )

    def _render(self) -> str:
        v = self.view()
        return render(self.t, v.sem, v.pos, v.facing, v.inventory, self.unlocked, self.last, v.sleeping)

    def observation(self) -> str:
        return self.obs

    # ---- one instruction ---------------------------------------------------------
    def step(self, action: str, role: str | None = None) -> StepResult:
        ins = parse(action, self.t)
        if ins is None:
            self.unparsed += 1
            if len(_LOGGED) < 100 and str(action) not in _LOGGED:
                _LOGGED.add(str(action))
                logger.info(f"crafter: unparsable instruction {action!r} by {role}; the turn is wasted")
            return StepResult(self.obs, 0.0, False, valid=False, info={"unparsed": 1})
        reward, done, ok = self._execute(ins)
        self.executed += 1
        done = done or self.executed >= self.spec.instructions
        self.last = "ok" if ok else "failed"
        self.obs = self._render()
        return StepResult(self.obs, reward, done, info={"executed": ins.text})

    def _execute(self, ins: Instruction) -> tuple[float, bool, bool]:
        """Run ``ins`` for at most ``frames`` env steps: (task reward, episode over, instruction succeeded)."""
        reward, progress = 0.0, 0
        for _ in range(self.spec.frames):
            view = self.view()
            if ins.verb == "explore":
                act, self.direction = explore_move(view, self.direction, self._turn)
            else:
                act = decide(ins, view, progress)
            if act in (DONE, FAILED):
                return reward, False, act == DONE
            counts = dict(self.player.achievements)
            r, done = self._env_step(act)
            reward += r
            progress += int(ins.verb == "primitive" or self.player.achievements != counts)
            if done:
                return reward, True, bool(progress)
        return reward, False, ins.verb == "explore" or bool(progress)

    def _env_step(self, act: str) -> tuple[float, bool]:
        before = self.unlocked
        _, r, done, _ = self._env.step(self.t.actions.index(act))
        self.steps += 1
        self.crafter_return += float(r)
        new = self.unlocked - before
        if self.spec.reward == "crafter":
            task_r = float(r)
        else:
            task_r = float(sum(1 for a in new if a in self.spec.milestones))
        stop = self.spec.stop_at_goal and self.spec.goal in new
        return task_r, bool(done) or stop

    def _turn(self) -> tuple[int, int]:
        return self.rng.choice(list(DIRS))

    # ---- expert, metrics, snapshots ----------------------------------------------
    def expert_action(self) -> ExpertStep:
        goals = ("make_wood_sword", self.spec.goal) if self.spec.reward == "milestones" else CURRICULUM
        text = expert_instruction(self.view(), self.unlocked, goals)
        return ExpertStep(owner(text, self.t), text)

    def metrics(self) -> dict[str, float]:
        unlocked = self.unlocked if self._env is not None else set()
        out = {
            "success": float(self.spec.goal in unlocked),
            "achievements": float(len(unlocked)),
            "crafter_return": self.crafter_return,
            "env_steps": float(self.steps),
            "unparsed": float(self.unparsed),
        }
        out.update({f"ach_{a}": float(a in unlocked) for a in self.t.achievements})
        return out

    def snapshot(self) -> dict:
        return {
            "crafter": compat.installed_version(),
            "env": pickle.dumps(self._env),
            "own": (self.obs, self.last, self.unparsed, self.crafter_return, self.steps, self.executed, self.direction),
            "rng": self.rng.getstate(),
        }

    def restore(self, snapshot: dict) -> None:
        version = compat.installed_version()
        if snapshot.get("crafter") != version:
            raise ValueError(
                f"crafter snapshot from Crafter {snapshot.get('crafter')!r} refused: this env runs Crafter {version}"
            )
        self._env = pickle.loads(snapshot["env"])
        own = snapshot["own"]
        self.obs, self.last, self.unparsed, self.crafter_return, self.steps, self.executed, self.direction = own
        self.rng = random.Random()
        self.rng.setstate(snapshot["rng"])

    def state_digest(self) -> dict:
        """The full state, comparable (the kit's snapshot checks): the world's maps, every object's own fields,
        the world's random state and this env's own fields."""
        own = {
            "obs": self.obs,
            "last": self.last,
            "unparsed": self.unparsed,
            "crafter_return": self.crafter_return,
            "steps": self.steps,
            "executed": self.executed,
            "direction": self.direction,
            "rng": self.rng.getstate(),
        }
        if self._env is None:
            return own
        env, world = self._env, self._env._world
        rs = world.random.get_state()
        objects = [None if o is None else (type(o).__name__, _fields(o)) for o in world._objects]
        return {
            **own,
            "mat_map": world._mat_map.tobytes(),
            "obj_map": world._obj_map.tobytes(),
            "objects": objects,
            "random": (rs[0], rs[1].tobytes(), *rs[2:]),
            "daylight": float(world.daylight),
            "env": (env._step, env._last_health, sorted(env._unlocked), env._seed, env._episode),
        }

    def close(self) -> None:
        self._env = None


def _fields(obj: Any) -> dict:
    """An object's own plain fields (numbers, strings, containers, arrays; not its world, random state or player)."""
    out = {}
    for k, v in vars(obj).items():
        if isinstance(v, np.ndarray):
            out[k] = v.tolist()
        elif isinstance(v, (int, float, str, bool, tuple, list, dict, np.generic)):
            out[k] = v
    return out
