"""R2R-style English route instructions generated from the shortest path.

The route is the sequence of rooms and doors of the geodesic path. Each door
crossing becomes a clause whose verb depends on the turn the path makes there
("turn left into the hallway", "go through the office past the desk"), and the
instruction ends with where to stop ("enter the kitchen and stop at the fridge").
Instructions longer than ``max_words`` tokens are shortened by dropping detail
(landmarks passed, the first turn, intermediate rooms), never the goal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from swarm_domains.vln_ce.layout import Layout, Point, point_segment_distance
from swarm_runtime.models.tokenizer import split_words

#: Every word an instruction can use besides room types and landmark names.
INSTRUCTION_WORDS = (
    "leave",
    "the",
    "and",
    "turn",
    "left",
    "right",
    "around",
    "into",
    "go",
    "through",
    "past",
    "enter",
    "stop",
    "at",
    "door",
    "walk",
    "to",
    "straight",
    ",",
)


def bearing(a: Point, b: Point) -> float:
    """Direction from ``a`` to ``b`` in degrees (0 = +x, counter-clockwise)."""
    return math.degrees(math.atan2(b[1] - a[1], b[0] - a[0]))


def wrap(deg: float) -> float:
    """Angle wrapped to (-180, 180]."""
    d = (deg + 180.0) % 360.0 - 180.0
    return 180.0 if d == -180.0 else d


def turn_word(delta: float) -> str | None:
    """``left``/``right``/``around`` for a heading change of ``delta`` degrees; ``None`` if about straight."""
    d = wrap(delta)
    if abs(d) <= 40:
        return None
    if abs(d) > 140:
        return "around"
    return "left" if d > 0 else "right"


def _words(text: str) -> int:
    return len(split_words(text))


def _passed_landmark(layout: Layout, room: int, a: Point, b: Point, exclude: str) -> str | None:
    best, name = 1.5, None
    for lm in layout.landmarks_in(room):
        d = point_segment_distance(lm.pos, (a[0], a[1], b[0], b[1]))
        if d < best and lm.name != exclude:
            best, name = d, lm.name
    return name


def route_instruction(
    layout: Layout, start: Point, heading: float, route: Sequence[int], goal: Point, goal_name: str, max_words: int = 20
) -> str:
    """The instruction for walking ``route`` (door indices) from ``start`` to ``goal``."""
    rooms = [layout.room_at(start)]
    for d in route:
        rooms.append(layout.doors[d].other(rooms[-1]))
    points = [start] + [layout.doors[d].mid for d in route] + [goal]
    tname = lambda i: layout.rooms[rooms[i]].type  # noqa: E731
    k = len(route)

    first_turn = turn_word(bearing(start, points[1]) - heading)
    # at a door only left/right are phrased as turns (a path doubling back reads as "enter")
    turns = [turn_word(bearing(points[i], points[i + 1]) - bearing(points[i - 1], points[i])) for i in range(1, k + 1)]
    turns = [t if t in ("left", "right") else None for t in turns]
    passed = [_passed_landmark(layout, rooms[i], points[i], points[i + 1], goal_name) for i in range(k + 1)]

    def build(with_past: bool, with_first_turn: bool, with_middle: bool) -> str:
        if k == 0:
            head = "walk to the " + goal_name
            if with_first_turn and first_turn:
                head = f"turn {first_turn} and " + head
            return head
        clauses = []
        lead = f"leave the {tname(0)}"
        if with_past and passed[0]:
            lead += f" past the {passed[0]}"
        if with_first_turn and first_turn:
            lead = f"turn {first_turn} and " + lead
        clauses.append(lead)
        if with_middle:
            for i in range(1, k):
                t = turns[i - 1]
                c = f"turn {t} into the {tname(i)}" if t else f"go through the {tname(i)}"
                if with_past and passed[i]:
                    c += f" past the {passed[i]}"
                clauses.append(c)
        t = turns[k - 1]
        clauses.append(
            (f"turn {t} into the {tname(k)}" if t else f"enter the {tname(k)}") + f" and stop at the {goal_name}"
        )
        return " , ".join(clauses)

    for past, first, middle in ((True, True, True), (False, True, True), (False, False, True), (False, False, False)):
        text = build(past, first, middle)
        if _words(text) <= max_words:
            return text
    return f"go to the {tname(k)} and stop at the {goal_name}"
