"""The scripted executor: turns one instruction into Crafter's primitive actions, one env step at a time.

Pure functions of a :class:`View` of the world (the semantic map, the player, its inventory): walk to the nearest
named thing over the semantic map (breadth-first search through walkable cells), face it, then ``do``, place or
make. :func:`decide` returns the next primitive action, ``DONE`` or ``FAILED``; the env runs it for at most the
task's ``frames`` steps per instruction.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from swarm_domains.crafter.instructions import Instruction
from swarm_domains.crafter.tables import Tables

DONE, FAILED = "DONE", "FAILED"
DIRS = {(-1, 0): "move_left", (1, 0): "move_right", (0, -1): "move_up", (0, 1): "move_down"}


@dataclass(frozen=True)
class View:
    """The world as the executor sees it: ``sem`` (Crafter's ``info['semantic']``, indexed ``[x, y]``), the
    player's position and facing, its inventory, and how far (cells, each axis) it searches for a target."""

    sem: np.ndarray
    pos: tuple[int, int]
    facing: tuple[int, int]
    inventory: Mapping[str, int]
    sleeping: bool
    radius: int
    t: Tables

    def __post_init__(self):
        object.__setattr__(self, "_grid", self.sem.tolist())  # plain lists: cell look-ups without numpy's cost
        object.__setattr__(self, "_size", self.sem.shape)

    def name(self, cell: tuple[int, int]) -> str | None:
        x, y = cell
        if 0 <= x < self._size[0] and 0 <= y < self._size[1]:
            return self.t.names[self._grid[x][y]]
        return None

    @property
    def faced(self) -> tuple[int, int]:
        return (self.pos[0] + self.facing[0], self.pos[1] + self.facing[1])

    def near(self, names: set[str], cell: tuple[int, int] | None = None) -> set[str]:
        """Which of ``names`` lie in the 3x3 square around ``cell`` (the player's by default): Crafter's ``nearby``."""
        cx, cy = cell or self.pos
        return {n for dx in (-1, 0, 1) for dy in (-1, 0, 1) if (n := self.name((cx + dx, cy + dy))) in names}


def search(view: View, goal: Callable[[tuple[int, int]], bool]) -> tuple[int, int] | None:
    """Breadth-first search from the player through walkable cells within ``view.radius``: the first step
    (a direction) toward the nearest cell where ``goal`` holds, ``(0, 0)`` when the player stands on one,
    ``None`` when no such cell is in reach."""
    start = view.pos
    if goal(start):
        return (0, 0)
    first: dict[tuple[int, int], tuple[int, int]] = {start: (0, 0)}
    queue = deque([start])
    while queue:
        c = queue.popleft()
        for d in DIRS:
            n = (c[0] + d[0], c[1] + d[1])
            if n in first or max(abs(n[0] - start[0]), abs(n[1] - start[1])) > view.radius:
                continue
            if view.name(n) not in view.t.walkable:
                continue
            first[n] = first[c] if c != start else d
            if goal(n):
                return first[n]
            queue.append(n)
    return None


def approach(view: View, target: Callable[[tuple[int, int]], bool]) -> str:
    """The next action toward facing a cell where ``target`` holds (``do`` once facing one), or ``FAILED``."""
    if target(view.faced):
        return "do"
    for d, move in DIRS.items():  # next to one already: turn to it (a move onto a non-walkable cell only turns)
        if target((view.pos[0] + d[0], view.pos[1] + d[1])) and view.name((view.pos[0] + d[0], view.pos[1] + d[1])):
            return move
    step = search(view, lambda c: any(target((c[0] + d[0], c[1] + d[1])) for d in DIRS))
    return FAILED if step is None or step == (0, 0) else DIRS[step]


def has(view: View, uses: Mapping[str, int]) -> bool:
    return all(view.inventory.get(k, 0) >= v for k, v in uses.items())


def decide(ins: Instruction, view: View, progress: int) -> str:
    """The next primitive action of ``ins`` (``progress``: how many of its goal actions already succeeded)."""
    t = view.t
    if ins.verb == "primitive":
        return DONE if progress else ins.arg
    if progress:
        return DONE
    if ins.verb in ("collect", "attack"):
        rule = t.collect.get(ins.arg, {})
        if not has(view, rule.get("require", {})):
            return FAILED
        return approach(view, lambda c: view.name(c) == ins.arg)
    if ins.verb == "place":
        return _place(ins.arg, view)
    if ins.verb == "make":
        return _make(ins.arg, view)
    if ins.verb == "sleep":
        return "sleep" if view.inventory.get("energy", 0) < t.item_max.get("energy", 9) or view.sleeping else FAILED
    return FAILED  # explore is driven by the env (it needs a random direction)


def _place(what: str, view: View) -> str:
    """Place ``what`` on the faced cell once it may go there, next to the other stations in reach."""
    rule = view.t.place[what]
    if not has(view, rule["uses"]):
        return FAILED
    others = {s for s in view.t.stations if s != what}
    present = {s for s in others if search(view, lambda c, s=s: s in view.near({s}, c)) is not None}
    if present and not present <= view.near(others):
        step = search(view, lambda c: present <= view.near(others, c))
        if step not in (None, (0, 0)):
            return DIRS[step]

    def free(c: tuple[int, int]) -> bool:
        return view.name(c) in rule["where"]

    if free(view.faced):
        return f"place_{what}"
    for d, move in DIRS.items():
        if free((view.pos[0] + d[0], view.pos[1] + d[1])):
            return move  # onto a walkable cell (then face the next) or, for water and lava, only a turn
    return FAILED


def _make(what: str, view: View) -> str:
    """Make ``what`` where every station it needs is in the 3x3 square, walking to such a cell first."""
    rule = view.t.make[what]
    if not has(view, rule["uses"]):
        return FAILED
    need = set(rule.get("nearby", ()))
    if need <= view.near(need):
        return f"make_{what}"
    step = search(view, lambda c: need <= view.near(need, c))
    return FAILED if step is None or step == (0, 0) else DIRS[step]


def explore_move(view: View, direction: tuple[int, int], turn: Callable[[], tuple[int, int]]) -> tuple[str, tuple]:
    """Keep walking ``direction``; where the next cell is not walkable, take a new one from ``turn`` (up to 4 tries)."""
    for _ in range(4):
        nxt = (view.pos[0] + direction[0], view.pos[1] + direction[1])
        if view.name(nxt) in view.t.walkable:
            return DIRS[direction], direction
        direction = turn()
    return "noop", direction
