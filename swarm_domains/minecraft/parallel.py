"""The parallel form of the embedded Minecraft world (``algo=rlcr``, docs/guides/rlcr.md).

A team shares one area and one storage (the inventory): any agent may chop, mine
or craft at any moment, and what it gains lands in the shared storage when its
instruction finishes. Instructions take simulated time (:data:`SECONDS`), so two
agents chopping trees at once get the logs twice as fast, while two agents
crafting the same crafting table waste the planks and the time of one of them.
The anytime return (:meth:`SharedCraftWorld.progress`) is the milestone reward
paid so far. The turn-based :class:`~swarm_domains.minecraft.world.CraftWorld` is not
changed; this class only adds the concurrent hooks on top of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from swarm_domains.minecraft.expert import scripted_instruction
from swarm_domains.minecraft.instructions import parse
from swarm_domains.minecraft.recipes import GATHERS, RECIPES, pickaxe_tier, raw_needs
from swarm_domains.minecraft.world import CraftWorld, missing_for

#: Simulated seconds each kind of instruction takes (a gather is a 40-frame controller run, a craft
#: a few clicks); an unparsable instruction costs :data:`FUMBLE_SECONDS`.
SECONDS: Mapping[str, float] = MappingProxyType(
    {"gather": 20.0, "craft": 10.0, "explore": 30.0, "dig down": 30.0, "climb up": 20.0}
)
FUMBLE_SECONDS = 5.0


def instruction_kind(instr: str) -> str:
    if instr in ("explore", "dig down", "climb up"):
        return instr
    if any(g.instruction == instr for g in GATHERS.values()):
        return "gather"
    return "craft"


def _in_flight_outputs(inventory: Mapping[str, int], busy: Mapping[str, str]) -> dict[str, int]:
    """``inventory`` as it will be once every instruction in ``busy`` has succeeded."""
    inv = dict(inventory)
    for text in busy.values():
        instr = parse(text)
        if instr is None:
            continue
        gather = next((g for g in GATHERS.values() if g.instruction == instr), None)
        if gather is not None:
            inv[gather.item] = inv.get(gather.item, 0) + 1
            continue
        item = next((o for o, r in RECIPES.items() if r.instruction == instr), None)
        if item is None:
            continue
        rec = RECIPES[item]
        for ing, k in rec.inputs.items():
            inv[ing] = max(0, inv.get(ing, 0) - k)
        inv[item] = inv.get(item, 0) + rec.count
    return {k: v for k, v in inv.items() if v > 0}


class SharedCraftWorld(CraftWorld):
    """One seeded world worked by a team at once: shared area, shared storage, timed instructions."""

    def progress(self) -> float:
        """Milestone reward paid so far (the anytime return; at most ``reward_max``)."""
        return float(sum(self.spec.milestones[m] for m in self.obtained))

    def action_seconds(self, action: str, role: str | None = None) -> float:
        instr = parse(action)
        return FUMBLE_SECONDS if instr is None else SECONDS[instruction_kind(instr)]

    def concurrent_expert(self, agent: str, busy: dict[str, str]) -> str | None:
        """The layout-blind expert, split over the team: plan as if the instructions the others
        carry out had already succeeded (so nobody duplicates them); when the next craft waits
        for an ingredient still in flight, gather a raw item the plan still needs instead."""
        if self.done:
            return None
        planned = _in_flight_outputs(self.inventory, busy)
        instr = scripted_instruction(self.spec.target, planned, self.depth)
        if instr is None:
            return None
        item = next((o for o, r in RECIPES.items() if r.instruction == instr), None)
        if item is None or not missing_for(item, self.inventory):
            return instr
        tier = pickaxe_tier(self.inventory)
        for raw in raw_needs(self.spec.target, planned):
            g = GATHERS[raw]
            if g.tier <= tier:
                return "climb up" if raw == "log" and self.depth > 0 else g.instruction
        return instr
