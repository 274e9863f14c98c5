"""The text an agent sees: the instruction plus what is visible ahead, left and right.

Example (about 40 words)::

    leave the bedroom , turn left into the hallway and stop at the plant . in bedroom .
    ahead : lamp 1 m , hallway door 3 m . left : bed 2 m . right : wall 1 m

Sectors are relative to the agent's heading: ahead within 30 degrees, left and
right from 30 to 120 degrees. A sector lists the nearest visible landmarks and
doors (walls occlude; ahead keeps two, left and right one), distances in whole
metres; an empty sector reports the distance to its wall, and a wall within
1 m straight ahead is always reported (a forward move would bump). ``bump`` is
appended after a forward move was blocked by a wall.
"""

from __future__ import annotations

import math

from swarm_domains.vln_ce.instructions import bearing, wrap
from swarm_domains.vln_ce.layout import Layout, Point

#: Words the observation adds to instructions, room types and landmark names.
OBSERVATION_WORDS = ("in", "ahead", "left", "right", "wall", "door", "m", "bump", ":", ",", ".")

AHEAD_HALF_ANGLE = 30.0
SIDE_MAX_ANGLE = 120.0


def metres(d: float) -> str:
    """A distance as whole metres (0-9) for the word-level models."""
    return f"{min(int(round(d)), 9)} m"


def door_label(layout: Layout, door_index: int, agent_room: int, pos: Point) -> str:
    """A door is named by the room it leads to (``kitchen door``), seen from the agent."""
    door = layout.doors[door_index]
    a, b = door.rooms
    if agent_room in door.rooms:
        far = door.other(agent_room)
    else:  # seen through another door: name the side farther from the agent
        ca, cb = layout.rooms[a].center, layout.rooms[b].center
        far = a if math.dist(pos, ca) > math.dist(pos, cb) else b
    return f"{layout.rooms[far].type} door"


def visible_items(layout: Layout, pos: Point, heading: float, view_range: float) -> dict[str, list[tuple[float, str]]]:
    """Visible landmarks and doors per sector (``ahead``/``left``/``right``), nearest first."""
    room = layout.room_at(pos)
    items: list[tuple[Point, str]] = [(lm.pos, lm.name) for lm in layout.landmarks]
    items += [(d.mid, door_label(layout, d.index, room, pos)) for d in layout.doors]
    out: dict[str, list[tuple[float, str]]] = {"ahead": [], "left": [], "right": []}
    for p, name in items:
        d = math.dist(pos, p)
        if d > view_range:
            continue
        rel = wrap(bearing(pos, p) - heading) if d > 1e-6 else 0.0
        if abs(rel) <= AHEAD_HALF_ANGLE:
            sector = "ahead"
        elif AHEAD_HALF_ANGLE < rel <= SIDE_MAX_ANGLE:
            sector = "left"
        elif -SIDE_MAX_ANGLE <= rel < -AHEAD_HALF_ANGLE:
            sector = "right"
        else:
            continue
        if layout.visible(pos, p):
            out[sector].append((d, name, rel))
    for v in out.values():
        v.sort()
    return out


def direction(rel: float) -> str:
    """A relative bearing as words in 15-degree steps: ``30 left``, ``15 right``, ``0``."""
    k = int(round(rel / 15.0)) * 15
    return "0" if k == 0 else f"{abs(k)} {'left' if k > 0 else 'right'}"


def render_view(layout: Layout, pos: Point, heading: float, view_range: float = 8.0, bearings: bool = False) -> str:
    """``in <room> . ahead : ... . left : ... . right : ...``"""
    items = visible_items(layout, pos, heading, view_range)
    parts = [f"in {layout.rooms[layout.room_at(pos)].type}"]
    for sector, keep, offset in (("ahead", 2, 0.0), ("left", 1, 90.0), ("right", 1, -90.0)):
        words = [
            f"{name} {metres(d)}" + (f" {direction(rel)}" if bearings else "") for d, name, rel in items[sector][:keep]
        ]
        wall = layout.ray_to_wall(pos, heading + offset)
        if not words or (sector == "ahead" and wall <= 1.0):
            words.append(f"wall {metres(wall)}")
        parts.append(f"{sector} : " + " , ".join(words))
    return " . ".join(parts)


def render_observation(
    layout: Layout,
    pos: Point,
    heading: float,
    instruction: str,
    bump: bool = False,
    view_range: float = 8.0,
    bearings: bool = False,
) -> str:
    """The full observation text (instruction first, then the view)."""
    text = f"{instruction} . {render_view(layout, pos, heading, view_range, bearings)}"
    return text + " . bump" if bump else text
