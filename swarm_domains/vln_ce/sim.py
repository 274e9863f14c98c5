"""The embedded VLN-CE simulator: continuous pose, VLN-CE actions, shaped reward, exact snapshots.

The agent has a continuous position (metres) and a heading in whole degrees (a
multiple of 15). Primitive actions follow VLN-CE: turn 15 degrees, move forward
0.25 m (blocked by walls: the agent stays put and ``bump`` shows in the next
observation), stop (ends the episode). One NaVILA action expands into several
primitive steps (``move forward 75 cm`` = three forward steps).

Snapshots copy only the mutable state (pose, counters, path, measure state);
the episode and its layout are immutable and shared, so a snapshot is exact
and cheap and restores into any env of the same task.
"""

from __future__ import annotations

import math
from typing import Any

from swarm_domains.vln_ce import actions as A
from swarm_domains.vln_ce.config import EmbeddedConfig
from swarm_domains.vln_ce.episodes import WAYPOINT_OFFSET, Episode, make_episode
from swarm_domains.vln_ce.instructions import bearing, wrap
from swarm_domains.vln_ce.layout import GoalField, Point
from swarm_domains.vln_ce.metrics import dedup, is_success, ndtw, spl
from swarm_domains.vln_ce.observation import render_observation
from swarm_domains.vln_ce.stepping import finish_decision, start_decision
from swarm_runtime.core.env import DomainEnv, ExpertStep, StepResult

STEP_M = A.FORWARD_STEP_CM / 100.0

#: Mutable state captured by snapshot() (everything else is immutable and shared).
_STATE = (
    "x",
    "y",
    "heading",
    "decisions",
    "steps",
    "stopped",
    "done",
    "path",
    "path_len",
    "min_dist",
    "dist",
    "collisions",
    "invalid",
    "bump",
    "obs",
)


class EmbeddedVLNEnv(DomainEnv):
    """One R2R-style episode in a procedurally generated house (CPU only, no downloads)."""

    #: counters an invalid action still advances (the conformance kit allows them to change)
    bookkeeping = ("decisions", "invalid")

    def __init__(self, cfg: EmbeddedConfig):
        self.cfg = cfg
        self.ep: Episode | None = None
        self.field: GoalField | None = None

    # ---- episode ------------------------------------------------------------------
    def reset(self, seed: int) -> str:
        c = self.cfg
        self.ep = make_episode(int(seed), c.unseen_seed_start, c.episodes_per_layout, c.max_instruction_words)
        self.field = self.ep.layout.goal_field(self.ep.goal)
        self.x, self.y = self.ep.start
        self.heading = self.ep.start_heading
        self.decisions = self.steps = self.collisions = self.invalid = 0
        self.stopped = self.done = self.bump = False
        self.path: list[Point] = [self.ep.start]
        self.path_len = 0.0
        self.dist = self.min_dist = self.field.distance(self.ep.start)
        self.obs = self._render()
        return self.obs

    @property
    def pos(self) -> Point:
        return (self.x, self.y)

    def _render(self) -> str:
        return render_observation(
            self.ep.layout,
            self.pos,
            self.heading,
            self.ep.instruction,
            self.bump,
            self.cfg.view_range,
            self.cfg.bearings,
        )

    def observation(self) -> str:
        self._require_reset()
        return self.obs

    def _require_reset(self) -> None:
        if self.ep is None:
            raise RuntimeError("vln_ce: call reset(seed) (or restore a snapshot) before using the env")

    # ---- dynamics -----------------------------------------------------------------
    def _forward(self) -> bool:
        h = math.radians(self.heading)
        new = (self.x + STEP_M * math.cos(h), self.y + STEP_M * math.sin(h))
        if self.ep.layout.blocked(self.pos, new):
            return False
        self.x, self.y = new
        self.path.append(new)
        self.path_len += STEP_M
        return True

    def _apply(self, act: A.ParsedAction) -> bool:
        """Run the primitive steps of ``act``; returns whether a wall blocked a forward step."""
        collided = False
        for prim in act.primitives():
            self.steps += 1
            if prim == A.TURN_LEFT:
                self.heading = (self.heading + A.TURN_STEP_DEG) % 360
            elif prim == A.TURN_RIGHT:
                self.heading = (self.heading - A.TURN_STEP_DEG) % 360
            elif prim == A.MOVE_FORWARD:
                if not self._forward():
                    collided = True
                    break  # the remaining steps face the same wall
            elif prim == A.STOP:
                self.stopped = True
        return collided

    def step(self, action: str, role: str | None = None) -> StepResult:
        self._require_reset()
        act, early = start_decision(self, action, role, self.cfg.max_decisions, self.cfg.invalid_penalty)
        if act is None:
            return early
        before = self.dist
        collided = self._apply(act)
        return finish_decision(
            self,
            act,
            before,
            self.field.distance(self.pos),
            self.ep.shortest,
            collided,
            self.cfg,
            self._render,
            self.metrics,
        )

    # ---- measures -----------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """VLN-CE measures of the episode so far (success needs a stop)."""
        if self.ep is None:
            return {}
        success = is_success(self.stopped, self.dist, self.cfg.success_distance)
        return {
            "success": float(success),
            "spl": spl(success, self.ep.shortest, self.path_len),
            "ndtw": ndtw(dedup(self.path), self.ep.reference, self.cfg.success_distance),
            "distance_to_goal": self.dist,
            "path_length": self.path_len,
            "oracle_success": float(self.min_dist <= self.cfg.success_distance),
            "steps_taken": float(self.steps),
            "decisions": float(self.decisions),
            "collisions": float(self.collisions),
            "invalid_actions": float(self.invalid),
        }

    # ---- snapshot -----------------------------------------------------------------
    def snapshot(self) -> Any:
        self._require_reset()
        state = {k: getattr(self, k) for k in _STATE}
        state["path"] = list(self.path)
        return {"ep": self.ep, "field": self.field, "state": state}

    def restore(self, snapshot: Any) -> None:
        self.ep, self.field = snapshot["ep"], snapshot["field"]
        for k, v in snapshot["state"].items():
            setattr(self, k, list(v) if k == "path" else v)

    # ---- scripted expert ----------------------------------------------------------
    def _expert_target(self) -> Point | None:
        """Where the shortest-path expert heads now (``None`` = stop here)."""
        layout, pos = self.ep.layout, self.pos
        room = layout.room_at(pos)
        route = self.field.route(pos)
        nxt = route[0] if route else -1
        # just through a door (or hugging one): first step well into the room
        for d in layout.doors_of(room):
            if d.index == nxt:
                continue
            nx, ny = d.normal_from(room)
            depth = (d.mid[0] - pos[0]) * nx + (d.mid[1] - pos[1]) * ny
            lateral = abs((pos[0] - d.mid[0]) * -ny + (pos[1] - d.mid[1]) * nx)
            if depth < 0.45 and lateral < 0.6:
                return (d.mid[0] - WAYPOINT_OFFSET * nx, d.mid[1] - WAYPOINT_OFFSET * ny)
        if nxt < 0:
            return None if math.dist(pos, self.ep.goal) <= 0.4 else self.ep.goal
        d = layout.doors[nxt]
        nx, ny = d.normal_from(room)
        pre = (d.mid[0] - WAYPOINT_OFFSET * nx, d.mid[1] - WAYPOINT_OFFSET * ny)
        post = (d.mid[0] + WAYPOINT_OFFSET * nx, d.mid[1] + WAYPOINT_OFFSET * ny)
        depth = (d.mid[0] - pos[0]) * nx + (d.mid[1] - pos[1]) * ny
        lateral = abs((pos[0] - d.mid[0]) * -ny + (pos[1] - d.mid[1]) * nx)
        if math.dist(pos, pre) <= 0.35 or (lateral <= 0.3 and depth <= 0.9):
            return post
        return pre

    def _free_turn(self, prefer: int) -> float:
        """Smallest turn (degrees, sign = direction) after which a forward step is not blocked."""
        for k in range(1, 12):
            for sgn in (prefer, -prefer):
                h = math.radians(self.heading + sgn * A.TURN_STEP_DEG * k)
                q = (self.x + STEP_M * math.cos(h), self.y + STEP_M * math.sin(h))
                if not self.ep.layout.blocked(self.pos, q):
                    return float(sgn * A.TURN_STEP_DEG * k)
        return 180.0

    def expert_action(self) -> ExpertStep | None:
        """Follow the shortest path: Turner turns toward the next waypoint, Mover walks, Stopper stops."""
        if self.ep is None or self.done:
            return None
        target = self._expert_target()
        if target is None:
            return ExpertStep("Stopper", A.expert_text(A.STOP))
        err = wrap(bearing(self.pos, target) - self.heading)
        h = math.radians(self.heading)
        ahead = (self.x + STEP_M * math.cos(h), self.y + STEP_M * math.sin(h))
        if abs(err) <= A.TURN_STEP_DEG / 2 + 1e-6 and self.ep.layout.blocked(self.pos, ahead):
            err = self._free_turn(1 if err >= 0 else -1)
        if abs(err) > A.TURN_STEP_DEG / 2 + 1e-6:
            n = min(3, max(1, int(round(abs(err) / A.TURN_STEP_DEG))))
            kind = A.TURN_LEFT if err > 0 else A.TURN_RIGHT
            return ExpertStep("Turner", A.expert_text(kind, n * A.TURN_STEP_DEG))
        n = min(3, max(1, int(round(math.dist(self.pos, target) / STEP_M))))
        return ExpertStep("Mover", A.expert_text(A.MOVE_FORWARD, n * A.FORWARD_STEP_CM))
