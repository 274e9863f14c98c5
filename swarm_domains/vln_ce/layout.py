"""Procedural indoor layouts: a grid of rooms of named types, doors, walls that block, landmarks.

A layout is a rows x cols grid of axis-aligned rectangular rooms (3-5.5 m a side,
every room a distinct type). Neighbouring rooms share a zero-thickness wall; a
random spanning tree of the room graph (plus a few extra edges) gets 1 m wide
doors, so every room is reachable. Each room holds 2-3 landmark objects chosen
from its type (a kitchen gets a fridge, a stove ...). Landmarks are points: they
are seen and named but do not block; walls do.

Rooms are convex, so the shortest path between two points goes straight within a
room and through door midpoints between rooms; :meth:`Layout.goal_field` turns
this into an exact geodesic distance (via door midpoints) by Dijkstra over doors.
Layouts are immutable and cached by key.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from dataclasses import dataclass
from functools import lru_cache

Point = tuple[float, float]
Segment = tuple[float, float, float, float]

DOOR_WIDTH = 1.0
AGENT_RADIUS = 0.1

#: Room types and the landmarks each can hold (all single tokens for the word-level tokenizer).
ROOM_OBJECTS: dict[str, tuple[str, ...]] = {
    "bedroom": ("bed", "wardrobe", "nightstand", "dresser", "lamp"),
    "bathroom": ("toilet", "bathtub", "shower", "towel_rack", "mirror"),
    "kitchen": ("fridge", "stove", "sink", "oven", "counter"),
    "living_room": ("sofa", "tv", "armchair", "fireplace", "coffee_table"),
    "dining_room": ("dining_table", "cabinet", "painting", "chandelier"),
    "office": ("desk", "computer", "bookshelf", "printer"),
    "hallway": ("rug", "plant", "coat_rack", "bench"),
    "laundry_room": ("washer", "dryer", "basket", "shelf"),
    "garage": ("car", "bicycle", "workbench", "toolbox"),
}
ROOM_TYPES = tuple(ROOM_OBJECTS)
OBJECT_NAMES = tuple(sorted({o for objs in ROOM_OBJECTS.values() for o in objs}))
GRID_SHAPES = ((2, 2), (2, 3), (3, 2), (3, 3))


@dataclass(frozen=True)
class Room:
    index: int
    type: str
    rect: tuple[float, float, float, float]  #: x0, y0, x1, y1

    @property
    def center(self) -> Point:
        x0, y0, x1, y1 = self.rect
        return ((x0 + x1) / 2, (y0 + y1) / 2)


@dataclass(frozen=True)
class Door:
    index: int
    rooms: tuple[int, int]
    mid: Point
    normal: Point  #: unit vector from rooms[0] into rooms[1]

    def other(self, room: int) -> int:
        return self.rooms[1] if room == self.rooms[0] else self.rooms[0]

    def normal_from(self, room: int) -> Point:
        """Unit normal pointing out of ``room`` through the door."""
        nx, ny = self.normal
        return (nx, ny) if room == self.rooms[0] else (-nx, -ny)


@dataclass(frozen=True)
class Landmark:
    name: str
    room: int
    pos: Point


@dataclass(frozen=True)
class Layout:
    """One procedurally generated floor plan (immutable)."""

    key: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    rooms: tuple[Room, ...]
    doors: tuple[Door, ...]
    walls: tuple[Segment, ...]
    landmarks: tuple[Landmark, ...]

    @property
    def cols(self) -> int:
        return len(self.xs) - 1

    def room_at(self, p: Point) -> int:
        """Index of the room containing ``p`` (points on a shared wall line go to the higher index)."""
        c = min(max(bisect.bisect_right(self.xs, p[0]) - 1, 0), len(self.xs) - 2)
        r = min(max(bisect.bisect_right(self.ys, p[1]) - 1, 0), len(self.ys) - 2)
        return r * self.cols + c

    def doors_of(self, room: int) -> list[Door]:
        return [d for d in self.doors if room in d.rooms]

    def landmarks_in(self, room: int) -> list[Landmark]:
        return [lm for lm in self.landmarks if lm.room == room]

    # ---- geometry ---------------------------------------------------------------
    def blocked(self, a: Point, b: Point, radius: float = AGENT_RADIUS) -> bool:
        """Whether moving from ``a`` to ``b`` crosses a wall or ends closer than ``radius`` to one."""
        return any(segments_cross(a, b, w) or point_segment_distance(b, w) < radius for w in self.walls)

    def visible(self, a: Point, b: Point) -> bool:
        """Line of sight from ``a`` to ``b`` (walls occlude, door gaps do not)."""
        return not any(segments_cross(a, b, w) for w in self.walls)

    def ray_to_wall(self, p: Point, heading_deg: float, max_range: float = 10.0) -> float:
        """Distance from ``p`` to the first wall along ``heading_deg``."""
        h = math.radians(heading_deg)
        q = (p[0] + max_range * math.cos(h), p[1] + max_range * math.sin(h))
        best = max_range
        for w in self.walls:
            t = segment_hit(p, q, w)
            if t is not None:
                best = min(best, t * max_range)
        return best

    # ---- geodesic distance -------------------------------------------------------
    def goal_field(self, goal: Point) -> GoalField:
        """Shortest distances from every door midpoint to ``goal`` (Dijkstra over doors)."""
        goal_room = self.room_at(goal)
        dist = [math.inf] * len(self.doors)
        nxt: list[int] = [-1] * len(self.doors)  # next door toward the goal; -1 = the goal itself
        heap = []
        for d in self.doors_of(goal_room):
            dist[d.index] = _d(d.mid, goal)
            heap.append((dist[d.index], d.index))
        heapq.heapify(heap)
        done = [False] * len(self.doors)
        while heap:
            du, u = heapq.heappop(heap)
            if done[u]:
                continue
            done[u] = True
            for room in self.doors[u].rooms:
                for v in self.doors_of(room):
                    if v.index == u or done[v.index]:
                        continue
                    nd = du + _d(self.doors[u].mid, v.mid)
                    if nd < dist[v.index] - 1e-12:
                        dist[v.index], nxt[v.index] = nd, u
                        heapq.heappush(heap, (nd, v.index))
        return GoalField(self, goal, goal_room, tuple(dist), tuple(nxt))


@dataclass(frozen=True)
class GoalField:
    """Geodesic distance to one goal (paths through door midpoints)."""

    layout: Layout
    goal: Point
    goal_room: int
    door_dist: tuple[float, ...]
    door_next: tuple[int, ...]

    def first_door(self, p: Point) -> int:
        """The first door on the shortest path from ``p`` (-1 when ``p`` is in the goal room)."""
        room = self.layout.room_at(p)
        if room == self.goal_room:
            return -1
        best, arg = math.inf, -1
        for d in self.layout.doors_of(room):
            v = _d(p, d.mid) + self.door_dist[d.index]
            if v < best:
                best, arg = v, d.index
        return arg

    def distance(self, p: Point) -> float:
        """Geodesic distance from ``p`` to the goal."""
        d = self.first_door(p)
        if d < 0:
            return _d(p, self.goal)
        return _d(p, self.layout.doors[d].mid) + self.door_dist[d]

    def route(self, p: Point) -> list[int]:
        """Door indices along the shortest path from ``p``."""
        out: list[int] = []
        d = self.first_door(p)
        while d >= 0 and len(out) <= len(self.layout.doors):
            out.append(d)
            d = self.door_next[d]
        return out


# ---- pure geometry -----------------------------------------------------------------


def _d(a: Point, b: Point) -> float:
    return math.hypot(a[0] - b[0], a[1] - b[1])


def _cross(ox: float, oy: float, ax: float, ay: float, bx: float, by: float) -> float:
    return (ax - ox) * (by - oy) - (ay - oy) * (bx - ox)


def segment_hit(a: Point, b: Point, w: Segment) -> float | None:
    """Fraction t along a->b where it meets wall segment ``w`` (endpoints included), else ``None``."""
    x1, y1, x2, y2 = w
    rx, ry = b[0] - a[0], b[1] - a[1]
    sx, sy = x2 - x1, y2 - y1
    den = rx * sy - ry * sx
    if abs(den) < 1e-12:
        return None  # parallel (a collinear graze is handled by the radius test)
    qx, qy = x1 - a[0], y1 - a[1]
    t = (qx * sy - qy * sx) / den
    u = (qx * ry - qy * rx) / den
    if -1e-9 <= t <= 1 + 1e-9 and -1e-9 <= u <= 1 + 1e-9:
        return t
    return None


def segments_cross(a: Point, b: Point, w: Segment) -> bool:
    """Whether segment a-b touches wall segment ``w``."""
    return segment_hit(a, b, w) is not None


def point_segment_distance(p: Point, w: Segment) -> float:
    x1, y1, x2, y2 = w
    sx, sy = x2 - x1, y2 - y1
    L2 = sx * sx + sy * sy
    t = 0.0 if L2 == 0 else max(0.0, min(1.0, ((p[0] - x1) * sx + (p[1] - y1) * sy) / L2))
    return math.hypot(p[0] - (x1 + t * sx), p[1] - (y1 + t * sy))


# ---- generation ----------------------------------------------------------------------


def _sizes(rng: random.Random, n: int) -> list[float]:
    return [rng.choice([3.0 + 0.25 * k for k in range(11)]) for _ in range(n)]


def _place(rng: random.Random, rect, avoid: list[Point], margin: float, spacing: float) -> Point | None:
    x0, y0, x1, y1 = rect
    for _ in range(50):
        p = (round(rng.uniform(x0 + margin, x1 - margin), 2), round(rng.uniform(y0 + margin, y1 - margin), 2))
        if all(_d(p, q) >= spacing for q in avoid):
            return p
    return None


def generate_layout(key: str) -> Layout:
    """Build the layout named ``key`` (deterministic: the key seeds the generator)."""
    rng = random.Random(f"vln-layout-{key}")
    rows, cols = rng.choice(GRID_SHAPES)
    xs = [0.0]
    for w in _sizes(rng, cols):
        xs.append(xs[-1] + w)
    ys = [0.0]
    for h in _sizes(rng, rows):
        ys.append(ys[-1] + h)
    types = rng.sample(ROOM_TYPES, rows * cols)
    rooms = tuple(
        Room(r * cols + c, types[r * cols + c], (xs[c], ys[r], xs[c + 1], ys[r + 1]))
        for r in range(rows)
        for c in range(cols)
    )

    # neighbour pairs: (room a, room b, shared wall segment)
    pairs: list[tuple[int, int, Segment]] = []
    for r in range(rows):
        for c in range(cols):
            i = r * cols + c
            if c + 1 < cols:
                pairs.append((i, i + 1, (xs[c + 1], ys[r], xs[c + 1], ys[r + 1])))
            if r + 1 < rows:
                pairs.append((i, i + cols, (xs[c], ys[r + 1], xs[c + 1], ys[r + 1])))
    # random spanning tree (Kruskal on shuffled edges) plus extra doors
    order = list(range(len(pairs)))
    rng.shuffle(order)
    parent = list(range(len(rooms)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    with_door = set()
    for k in order:
        a, b, _ = pairs[k]
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb
            with_door.add(k)
        elif rng.random() < 0.25:
            with_door.add(k)

    doors: list[Door] = []
    walls: list[Segment] = []
    for k, (a, b, w) in enumerate(pairs):
        x1, y1, x2, y2 = w
        if k not in with_door:
            walls.append(w)
            continue
        vertical = x1 == x2
        lo, hi = (y1, y2) if vertical else (x1, x2)
        c = round(rng.uniform(lo + 0.9, hi - 0.9), 2)
        s, e = c - DOOR_WIDTH / 2, c + DOOR_WIDTH / 2
        if vertical:
            walls += [(x1, lo, x1, s), (x1, e, x1, hi)]
            doors.append(Door(len(doors), (a, b), (x1, c), (1.0, 0.0)))
        else:
            walls += [(lo, y1, s, y1), (e, y1, hi, y1)]
            doors.append(Door(len(doors), (a, b), (c, y1), (0.0, 1.0)))
    X, Y = xs[-1], ys[-1]
    walls += [(0.0, 0.0, X, 0.0), (X, 0.0, X, Y), (X, Y, 0.0, Y), (0.0, Y, 0.0, 0.0)]

    landmarks: list[Landmark] = []
    for room in rooms:
        names = rng.sample(ROOM_OBJECTS[room.type], rng.choice((2, 3)))
        taken = [d.mid for d in doors if room.index in d.rooms]
        for name in names:
            p = _place(rng, room.rect, taken, margin=0.6, spacing=1.0)
            if p is not None:
                taken.append(p)
                landmarks.append(Landmark(name, room.index, p))
    return Layout(key, tuple(xs), tuple(ys), rooms, tuple(doors), tuple(walls), tuple(landmarks))


@lru_cache(maxsize=4096)
def get_layout(key: str) -> Layout:
    """Cached :func:`generate_layout` (layouts are immutable)."""
    return generate_layout(key)
