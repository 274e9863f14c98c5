"""Episodes of the embedded simulator: seeds -> (layout, start pose, goal, instruction) and splits.

Seeds below ``unseen_seed_start`` are training episodes on layouts ``train-<i>``;
seeds from ``unseen_seed_start`` on are val_unseen episodes on layouts
``val_unseen-<i>``. Each layout hosts ``episodes_per_layout`` consecutive seeds,
so the two splits never share a layout (R2R's val_unseen likewise uses 11
scenes never seen in training; 88 episodes / 8 per layout = 11 layouts).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

from swarm_domains.vln_ce.instructions import route_instruction
from swarm_domains.vln_ce.layout import AGENT_RADIUS, Layout, Point, get_layout
from swarm_domains.vln_ce.metrics import resample

MIN_START_DISTANCE = 5.0  #: metres; R2R paths are ~10 m, VLN-CE success radius is 3 m
MAX_START_DISTANCE = 20.0
WAYPOINT_OFFSET = 0.75  #: the expert aims at points this far before/after each door


@dataclass(frozen=True)
class Episode:
    """One navigation episode (immutable, shared between snapshots)."""

    seed: int
    split: str
    layout_key: str
    start: Point
    start_heading: int  #: degrees, a multiple of 15
    goal: Point
    goal_name: str
    route: tuple[int, ...]  #: door indices of the shortest path
    shortest: float  #: geodesic start->goal distance (metres)
    reference: tuple[Point, ...]  #: shortest path sampled every 0.25 m (for nDTW)
    waypoints: tuple[Point, ...]  #: what the expert walks toward, in order
    instruction: str

    @property
    def layout(self) -> Layout:
        return get_layout(self.layout_key)


def split_of(seed: int, unseen_seed_start: int) -> str:
    return "val_unseen" if seed >= unseen_seed_start else "train"


def layout_key(seed: int, unseen_seed_start: int, episodes_per_layout: int) -> str:
    """Name of the layout episode ``seed`` takes place in."""
    if seed >= unseen_seed_start:
        return f"val_unseen-{(seed - unseen_seed_start) // episodes_per_layout}"
    return f"train-{seed // episodes_per_layout}"


def _goal_candidates(layout: Layout, room: int) -> list[tuple[Point, str]]:
    out: list[tuple[Point, str]] = [(lm.pos, lm.name) for lm in layout.landmarks_in(room)]
    for d in layout.doors_of(room):
        nx, ny = d.normal_from(room)
        out.append(((d.mid[0] - 0.6 * nx, d.mid[1] - 0.6 * ny), f"{layout.rooms[d.other(room)].type} door"))
    return out


@lru_cache(maxsize=8192)
def make_episode(seed: int, unseen_seed_start: int, episodes_per_layout: int, max_words: int = 20) -> Episode:
    """Sample episode ``seed`` (deterministic)."""
    key = layout_key(seed, unseen_seed_start, episodes_per_layout)
    layout = get_layout(key)
    rng = random.Random(f"vln-episode-{key}-{seed}")
    fallback = None
    for _attempt in range(400):
        goal_room = rng.randrange(len(layout.rooms))
        cands = _goal_candidates(layout, goal_room)
        goal, goal_name = cands[rng.randrange(len(cands))]
        # landmark names must be unique within the goal room to be unambiguous
        if sum(1 for _, n in cands if n == goal_name) > 1:
            continue
        start_room = layout.rooms[rng.randrange(len(layout.rooms))]
        x0, y0, x1, y1 = start_room.rect
        m = WAYPOINT_OFFSET + AGENT_RADIUS
        start = (round(rng.uniform(x0 + m, x1 - m), 2), round(rng.uniform(y0 + m, y1 - m), 2))
        heading = 15 * rng.randrange(24)
        field = layout.goal_field(goal)
        route = tuple(field.route(start))
        d0 = field.distance(start)
        ok = 1 <= len(route) <= 3 and MIN_START_DISTANCE <= d0 <= MAX_START_DISTANCE
        if ok or (fallback is None and route and d0 > 3.5):
            cand = (start, heading, goal, goal_name, route, d0)
            if ok:
                break
            fallback = cand
    else:
        if fallback is None:  # pragma: no cover - every generated layout has >= 4 connected rooms
            raise RuntimeError(f"could not sample an episode for seed {seed} on layout {key}")
        cand = fallback
    start, heading, goal, goal_name, route, d0 = cand

    waypoints: list[Point] = []
    room = layout.room_at(start)
    for d in route:
        door = layout.doors[d]
        nx, ny = door.normal_from(room)
        waypoints.append((door.mid[0] - WAYPOINT_OFFSET * nx, door.mid[1] - WAYPOINT_OFFSET * ny))
        waypoints.append((door.mid[0] + WAYPOINT_OFFSET * nx, door.mid[1] + WAYPOINT_OFFSET * ny))
        room = door.other(room)
    waypoints.append(goal)
    polyline = [start] + [layout.doors[d].mid for d in route] + [goal]
    return Episode(
        seed=seed,
        split=split_of(seed, unseen_seed_start),
        layout_key=key,
        start=start,
        start_heading=heading,
        goal=goal,
        goal_name=goal_name,
        route=route,
        shortest=d0,
        reference=tuple(resample(polyline, 0.25)),
        waypoints=tuple(waypoints),
        instruction=route_instruction(layout, start, heading, route, goal, goal_name, max_words),
    )
