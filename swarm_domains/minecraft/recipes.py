"""The real Minecraft recipe tree used by the embedded world (pure data + pure functions).

Items are gathered (``log``, ``cobblestone``, ``coal``, ``iron_ore``), crafted
(optionally at a ``crafting_table``) or smelted in a ``furnace`` with one fuel
(``coal`` or, failing that, ``planks``). Mining needs a pickaxe of a given tier.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

ITEMS: tuple[str, ...] = (
    "log",
    "planks",
    "stick",
    "crafting_table",
    "wooden_pickaxe",
    "cobblestone",
    "stone_pickaxe",
    "furnace",
    "coal",
    "iron_ore",
    "iron_ingot",
    "iron_pickaxe",
    "stone",
    "stone_bricks",
    "torch",
)

#: Pickaxe tier of each pickaxe (mining needs a tier at least the resource's).
PICKAXE_TIER: Mapping[str, int] = MappingProxyType({"wooden_pickaxe": 1, "stone_pickaxe": 2, "iron_pickaxe": 3})
#: The cheapest pickaxe of each tier.
PICKAXE_FOR_TIER: Mapping[int, str] = MappingProxyType({t: p for p, t in PICKAXE_TIER.items()})
#: Fuels a furnace burns, in the order the world uses them (one per smelt).
FUELS: tuple[str, ...] = ("coal", "planks")
#: The fuel the recipe tree (milestones, scripted expert) counts on.
CANONICAL_FUEL = "coal"


@dataclass(frozen=True)
class Gather:
    """A raw item obtained in the world: instruction, world feature it depends on, pickaxe tier needed."""

    item: str
    instruction: str
    feature: str
    tier: int


@dataclass(frozen=True)
class Recipe:
    """``inputs`` -> ``count`` x ``output``; ``station`` must be held; smelting also burns one fuel."""

    output: str
    count: int
    inputs: Mapping[str, int]
    station: str | None
    verb: str  #: ``craft`` or ``smelt``
    instruction: str

    @property
    def needs_fuel(self) -> bool:
        return self.verb == "smelt"


GATHERS: Mapping[str, Gather] = MappingProxyType(
    {
        g.item: g
        for g in (
            Gather("log", "chop tree", "trees", 0),
            Gather("cobblestone", "mine stone", "stone", 1),
            Gather("coal", "mine coal", "coal", 1),
            Gather("iron_ore", "mine iron", "iron", 2),
        )
    }
)


def _r(
    output: str,
    count: int,
    inputs: dict[str, int],
    station: str | None,
    verb: str = "craft",
    instruction: str | None = None,
) -> Recipe:
    return Recipe(output, count, MappingProxyType(inputs), station, verb, instruction or f"craft {output}")


RECIPES: Mapping[str, Recipe] = MappingProxyType(
    {
        r.output: r
        for r in (
            _r("planks", 4, {"log": 1}, None),
            _r("stick", 4, {"planks": 2}, None),
            _r("crafting_table", 1, {"planks": 4}, None),
            _r("wooden_pickaxe", 1, {"planks": 3, "stick": 2}, "crafting_table"),
            _r("stone_pickaxe", 1, {"cobblestone": 3, "stick": 2}, "crafting_table"),
            _r("furnace", 1, {"cobblestone": 8}, "crafting_table"),
            _r("iron_ingot", 1, {"iron_ore": 1}, "furnace", "smelt", "smelt iron"),
            _r("iron_pickaxe", 1, {"iron_ingot": 3, "stick": 2}, "crafting_table"),
            _r("torch", 4, {"coal": 1, "stick": 1}, None),
            _r("stone", 1, {"cobblestone": 1}, "furnace", "smelt", "smelt stone"),
            _r("stone_bricks", 4, {"stone": 4}, "crafting_table"),
        )
    }
)

#: Default milestone rewards; the iron-pickaxe tree sums to exactly 140.
DEFAULT_REWARDS: Mapping[str, float] = MappingProxyType(
    {
        "log": 10,
        "planks": 10,
        "stick": 10,
        "crafting_table": 10,
        "wooden_pickaxe": 15,
        "cobblestone": 15,
        "stone_pickaxe": 15,
        "furnace": 10,
        "coal": 10,
        "iron_ore": 15,
        "iron_ingot": 10,
        "iron_pickaxe": 10,
        "stone": 10,
        "stone_bricks": 15,
        "torch": 15,
    }
)


def pickaxe_tier(inventory: Mapping[str, int]) -> int:
    """Best pickaxe tier held (0 = none)."""
    return max((t for p, t in PICKAXE_TIER.items() if inventory.get(p, 0) > 0), default=0)


def prerequisites(target: str) -> list[str]:
    """Every item on the way to ``target`` (tools, stations, ingredients, the
    canonical fuel), plus ``target`` itself, in :data:`ITEMS` order."""
    if target not in ITEMS:
        raise ValueError(f"unknown item {target!r}; valid: {', '.join(ITEMS)}")
    seen: set[str] = set()

    def visit(item: str) -> None:
        if item in seen:
            return
        seen.add(item)
        if item in GATHERS:
            tier = GATHERS[item].tier
            if tier:
                visit(PICKAXE_FOR_TIER[tier])
            return
        rec = RECIPES[item]
        if rec.station:
            visit(rec.station)
        for ing in rec.inputs:
            visit(ing)
        if rec.needs_fuel:
            visit(CANONICAL_FUEL)

    visit(target)
    return [i for i in ITEMS if i in seen]


def raw_needs(target: str, inventory: Mapping[str, int]) -> dict[str, int]:
    """Raw items (``log``, ``cobblestone``, ``coal``, ``iron_ore``) still to gather to
    make ``target`` from ``inventory``, expanding the whole recipe tree (tools and
    stations included, canonical fuel for smelting)."""
    inv = dict(inventory)
    need: dict[str, int] = {}

    def take(item: str, qty: int) -> None:
        have = min(inv.get(item, 0), qty)
        inv[item] = inv.get(item, 0) - have
        qty -= have
        if qty <= 0:
            return
        if item in GATHERS:
            tier = GATHERS[item].tier
            if pickaxe_tier(inv) < tier:
                take(PICKAXE_FOR_TIER[tier], 1)
                inv[PICKAXE_FOR_TIER[tier]] = 1  # made once, kept (tools are not consumed)
            need[item] = need.get(item, 0) + qty
            return
        rec = RECIPES[item]
        crafts = math.ceil(qty / rec.count)
        if rec.station and inv.get(rec.station, 0) <= 0:
            take(rec.station, 1)
            inv[rec.station] = 1
        for ing, k in rec.inputs.items():
            take(ing, k * crafts)
        if rec.needs_fuel:
            take(CANONICAL_FUEL, crafts)
        inv[item] = inv.get(item, 0) + crafts * rec.count - qty

    take(target, 1)
    return need
