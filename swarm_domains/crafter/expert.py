"""The scripted expert over the executor (SFT demonstrations): survive, then climb the tech tree.

:func:`expert_instruction` is a pure function of the executor's :class:`~swarm_domains.crafter.executor.View` and
the achievements unlocked so far. It drinks, eats and sleeps when a vital runs low, then works on the first goal
it can make progress on: each goal's prerequisites are planned depth first from Crafter's recipe tables
(``collect``, ``place``, ``make``), and an instruction whose target is not in reach becomes ``explore``.
"""

from __future__ import annotations

from collections.abc import Iterable

from swarm_domains.crafter.executor import DIRS, View, search
from swarm_domains.crafter.tables import Tables

#: The order in which the expert of the ``achievements`` task pursues Crafter's achievements.
CURRICULUM = (
    "collect_wood",
    "place_table",
    "make_wood_pickaxe",
    "make_wood_sword",
    "collect_drink",
    "collect_sapling",
    "place_plant",
    "collect_stone",
    "place_stone",
    "make_stone_pickaxe",
    "make_stone_sword",
    "place_furnace",
    "collect_coal",
    "collect_iron",
    "make_iron_pickaxe",
    "make_iron_sword",
    "collect_diamond",
    "eat_cow",
    "defeat_zombie",
    "defeat_skeleton",
    "wake_up",
)
#: Achievements reached by one instruction of their own (not a recipe).
DIRECT = {
    "eat_cow": "attack cow",
    "defeat_zombie": "attack zombie",
    "defeat_skeleton": "attack skeleton",
    "wake_up": "sleep",
    "eat_plant": "collect plant",
}
#: Creatures the expert fights when they stand next to the player.
THREATS = ("zombie", "skeleton")
#: A vital at or below this level comes first: vital -> the instruction that restores it.
LOW, RESTORE = 3, {"drink": "collect water", "food": "attack cow", "energy": "sleep"}


def in_reach(view: View, name: str) -> bool:
    """Whether the executor can walk next to a ``name`` cell (within its search radius)."""
    return search(view, lambda c: any(view.name((c[0] + d[0], c[1] + d[1])) == name for d in DIRS)) is not None


class Planner:
    """Depth-first plan of one goal from Crafter's tables; ``inv`` is the inventory not yet reserved by an
    earlier branch of the plan (so replanning every turn is stable)."""

    def __init__(self, view: View):
        self.view, self.t, self.inv = view, view.t, dict(view.inventory)

    def item(self, name: str, qty: int) -> str | None:
        have = min(self.inv.get(name, 0), qty)
        self.inv[name] = self.inv.get(name, 0) - have
        if qty - have <= 0:
            return None
        source = next((m for m, rule in self.t.collect.items() if name in rule["receive"]), None)
        if source is not None:
            for tool, n in self.t.collect[source]["require"].items():
                if step := self.item(tool, n):
                    return step
            return f"collect {source}"
        rule = self.t.make[name]
        for station in rule.get("nearby", ()):
            if not in_reach(self.view, station) and (step := self.place(station)):
                return step
        for ing, n in rule["uses"].items():
            if step := self.item(ing, n):
                return step
        return f"make {name}"

    def place(self, name: str) -> str | None:
        for ing, n in self.t.place[name]["uses"].items():
            if step := self.item(ing, n):
                return step
        return f"place {name}"

    def achievement(self, name: str) -> str | None:
        verb, _, arg = name.partition("_")
        if name in DIRECT:
            return DIRECT[name]
        if verb == "place":
            return self.place(arg)
        if verb == "make":
            return self.item(arg, self.inv.get(arg, 0) + 1)
        if verb == "collect":
            return self.item(arg, self.inv.get(arg, 0) + 1)
        return None


def target_of(instruction: str) -> str | None:
    """The thing an instruction walks to (``None``: it walks to nothing named)."""
    verb, _, arg = instruction.partition(" ")
    return arg if verb in ("collect", "attack") else None


def feasible(view: View, instruction: str) -> bool:
    target = target_of(instruction)
    return target is None or in_reach(view, target)


def expert_instruction(view: View, unlocked: Iterable[str], goals: Iterable[str]) -> str:
    """The expert's next instruction: restore a low vital, else the first step toward the first goal not yet
    unlocked whose target is in reach (``explore`` when none is)."""
    t: Tables = view.t
    if view.near(set(THREATS)):  # a zombie or skeleton next to the player: fight it first
        return f"attack {sorted(view.near(set(THREATS)))[0]}"
    for vital, instruction in RESTORE.items():
        if view.inventory.get(vital, t.item_max.get(vital, 9)) <= LOW and feasible(view, instruction):
            return instruction
    done = set(unlocked)
    for goal in goals:
        if goal in done:
            continue
        step = Planner(view).achievement(goal)
        if step is not None and feasible(view, step):
            return step
    return "explore"
