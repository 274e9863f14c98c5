"""Scripted policies over the recipe tree (pure functions of the world's state).

:func:`scripted_instruction` is the SFT expert: a fixed, reasonable but
suboptimal plan that ignores the layout. It walks the recipe tree depth first,
makes each tool and station when first needed, gathers exactly what the next
craft needs, retries a failing instruction forever and never explores or digs
down. :func:`layout_aware_instruction` is a reference for what RL can learn:
it gathers every log first, explores away from poor areas and digs down for
stone, coal and iron. The docs report both on the eval seeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from swarm_domains.minecraft.recipes import (
    CANONICAL_FUEL,
    GATHERS,
    PICKAXE_FOR_TIER,
    RECIPES,
    pickaxe_tier,
    raw_needs,
)


def next_instruction(target: str, inventory: Mapping[str, int]) -> str | None:
    """First instruction of a depth-first plan to make ``target`` from ``inventory``
    (``None`` when ``target`` is held). Items reserved for earlier branches of the
    tree are never consumed by later ones, so replanning every step is stable."""
    inv = dict(inventory)

    def plan(item: str, qty: int) -> str | None:
        have = min(inv.get(item, 0), qty)
        inv[item] = inv.get(item, 0) - have
        qty -= have
        if qty <= 0:
            return None
        if item in GATHERS:
            tier = GATHERS[item].tier
            if pickaxe_tier(inv) < tier:
                return plan(PICKAXE_FOR_TIER[tier], 1)
            return GATHERS[item].instruction
        rec = RECIPES[item]
        crafts = math.ceil(qty / rec.count)
        if rec.station and inv.get(rec.station, 0) <= 0:
            return plan(rec.station, 1)
        for ing, k in rec.inputs.items():
            step = plan(ing, k * crafts)
            if step:
                return step
        if rec.needs_fuel:
            step = plan(CANONICAL_FUEL, crafts)
            if step:
                return step
        return rec.instruction

    return plan(target, 1)


def scripted_instruction(target: str, inventory: Mapping[str, int], depth: int) -> str | None:
    """The layout-blind expert: follow :func:`next_instruction`; the only concession
    to the world is climbing back to the surface when it needs logs underground."""
    instr = next_instruction(target, inventory)
    if instr == "chop tree" and depth > 0:
        return "climb up"
    return instr


def layout_aware_instruction(
    target: str, inventory: Mapping[str, int], depth: int, area: Mapping[str, int]
) -> str | None:
    """A reference layout-aware policy (not used for SFT): every log first, from a
    wooded area; then mine deep underground, exploring away from poor areas."""
    if inventory.get(target, 0) > 0:
        return None
    needs = raw_needs(target, inventory)
    if needs.get("log", 0) > 0:
        if depth > 0:
            return "climb up"
        return "chop tree" if area["trees"] >= 2 else "explore"
    instr = next_instruction(target, inventory)
    gather = next((g for g in GATHERS.values() if g.instruction == instr), None)
    if gather is None:
        return instr
    if depth < 2 and pickaxe_tier(inventory) >= 1:
        return "dig down"
    return instr if area[gather.feature] >= 2 else "explore"
