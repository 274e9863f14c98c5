"""The embedded Minecraft world: seeded layouts, stochastic instruction outcomes.

Each instruction behaves like a learned 40-frame low-level controller: it
succeeds with a probability that depends on the tools held and on the area's
features (tree density, exposed stone, coal, iron), which depend on the biome
and the depth. A layout-aware policy explores away from a treeless desert and
digs down for iron; the scripted expert (see :mod:`swarm_domains.minecraft.expert`)
does neither.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from types import MappingProxyType

from swarm_domains.minecraft import expert
from swarm_domains.minecraft.instructions import OWNER, parse
from swarm_domains.minecraft.recipes import FUELS, GATHERS, ITEMS, RECIPES, pickaxe_tier
from swarm_domains.minecraft.task import TaskSpec
from swarm_runtime.core.env import DomainEnv, ExpertStep, StepResult

LEVELS: tuple[str, ...] = ("none", "few", "some", "many")
FEATURES: tuple[str, ...] = ("trees", "stone", "coal", "iron")
#: Success probability of a gather instruction per feature level (with the minimum tool).
GATHER_P: tuple[float, ...] = (0.0, 0.2, 0.5, 0.85)
#: Extra success per pickaxe tier above the minimum, and the cap.
TOOL_BONUS, P_CAP = 0.1, 0.95
CRAFT_P = 0.95  #: crafting / smelting with everything at hand
EXPLORE_P = 0.85  #: finding a new area
DIG_P = 0.75  #: digging one level down (needs a wooden pickaxe; yields a cobblestone)
CLIMB_P = 0.85  #: climbing one level up
MAX_DEPTH = 2

_W = MappingProxyType
#: Surface feature distributions per biome: feature -> weights over LEVELS.
BIOMES: Mapping[str, Mapping[str, tuple[float, ...]]] = _W(
    {
        "forest": _W(
            {
                "trees": (0, 0, 0.4, 0.6),
                "stone": (0.05, 0.6, 0.35, 0),
                "coal": (0.03, 0.6, 0.37, 0),
                "iron": (0.03, 0.85, 0.12, 0),
            }
        ),
        "plains": _W(
            {
                "trees": (0.05, 0.6, 0.35, 0),
                "stone": (0.05, 0.6, 0.35, 0),
                "coal": (0.03, 0.6, 0.37, 0),
                "iron": (0.03, 0.85, 0.12, 0),
            }
        ),
        "desert": _W(
            {
                "trees": (0.2, 0.8, 0, 0),
                "stone": (0, 0.4, 0.6, 0),
                "coal": (0.05, 0.7, 0.25, 0),
                "iron": (0.05, 0.8, 0.15, 0),
            }
        ),
        "mountains": _W(
            {
                "trees": (0.05, 0.65, 0.3, 0),
                "stone": (0, 0, 0.3, 0.7),
                "coal": (0, 0.3, 0.5, 0.2),
                "iron": (0, 0.6, 0.35, 0.05),
            }
        ),
        "swamp": _W(
            {
                "trees": (0, 0.2, 0.6, 0.2),
                "stone": (0.1, 0.9, 0, 0),
                "coal": (0.05, 0.75, 0.2, 0),
                "iron": (0.05, 0.85, 0.1, 0),
            }
        ),
        "taiga": _W(
            {
                "trees": (0, 0.1, 0.4, 0.5),
                "stone": (0, 0.5, 0.5, 0),
                "coal": (0.05, 0.55, 0.4, 0),
                "iron": (0.05, 0.85, 0.1, 0),
            }
        ),
    }
)
BIOME_NAMES: tuple[str, ...] = tuple(BIOMES)
#: Underground feature distributions per depth (no trees below the surface).
UNDERGROUND: Mapping[int, Mapping[str, tuple[float, ...]]] = _W(
    {
        1: _W(
            {"trees": (1, 0, 0, 0), "stone": (0, 0, 0.2, 0.8), "coal": (0, 0.1, 0.5, 0.4), "iron": (0, 0.3, 0.5, 0.2)}
        ),
        2: _W({"trees": (1, 0, 0, 0), "stone": (0, 0, 0, 1), "coal": (0, 0.3, 0.5, 0.2), "iron": (0, 0, 0.4, 0.6)}),
    }
)
#: Chance that exploring on the surface leads into another biome.
NEW_BIOME_P = 0.5


def sample_area(rng: random.Random, biome: str, depth: int) -> dict[str, int]:
    """Feature levels (indices into LEVELS) of a fresh area of ``biome`` at ``depth``."""
    table = BIOMES[biome] if depth == 0 else UNDERGROUND[depth]
    return {f: rng.choices(range(len(LEVELS)), weights=table[f])[0] for f in FEATURES}


def gather_probability(item: str, area: Mapping[str, int], inventory: Mapping[str, int]) -> float:
    """Chance that the gather instruction for ``item`` yields one now (0 without the tool)."""
    g = GATHERS[item]
    tier = pickaxe_tier(inventory)
    if tier < g.tier:
        return 0.0
    p = GATHER_P[area[g.feature]]
    if p == 0.0:
        return 0.0
    bonus = TOOL_BONUS * (tier - g.tier) if g.tier else 0.0
    return min(P_CAP, p + bonus)


def missing_for(recipe_item: str, inventory: Mapping[str, int]) -> list[str]:
    """What ``inventory`` lacks to make ``recipe_item`` once ([] when it can)."""
    rec = RECIPES[recipe_item]
    lack = [i for i, k in rec.inputs.items() if inventory.get(i, 0) < k]
    if rec.station and inventory.get(rec.station, 0) <= 0:
        lack.append(rec.station)
    if rec.needs_fuel and not _fuel(inventory, rec.inputs):
        lack.append("fuel")
    return lack


def _fuel(inventory: Mapping[str, int], inputs: Mapping[str, int]) -> str | None:
    """First fuel available beyond what the recipe itself consumes."""
    for f in FUELS:
        if inventory.get(f, 0) - inputs.get(f, 0) > 0:
            return f
    return None


class CraftWorld(DomainEnv):
    """One seeded text Minecraft world. All state is plain data (snapshot = deep copy)."""

    #: counters an invalid instruction still advances (the conformance kit allows them to change)
    bookkeeping = ("steps",)

    def __init__(self, spec: TaskSpec):
        self.spec = spec
        self.rng = random.Random(0)
        self.biome, self.depth = BIOME_NAMES[0], 0
        self.area: dict[str, int] = {}
        self.inventory: dict[str, int] = {}
        self.obtained: list[str] = []  #: milestones paid, in order
        self.last = "none"
        self.steps = 0
        self.done = False
        self._obs = ""

    # ---- episode ----------------------------------------------------------------
    def reset(self, seed: int) -> str:
        self.rng = random.Random(int(seed))
        self.biome = self.rng.choice(BIOME_NAMES)
        self.depth = 0
        self.area = sample_area(self.rng, self.biome, 0)
        self.inventory, self.obtained = {}, []
        self.last, self.steps, self.done = "none", 0, False
        self._obs = self._render()
        return self._obs

    def step(self, action: str, role: str | None = None) -> StepResult:
        self.steps += 1
        instr = parse(action)
        if instr is None or self.done:
            return StepResult(
                self._obs,
                0.0,
                self.done,
                valid=False,
                info={"reason": "episode over" if self.done else "not an instruction"},
            )
        gained = self._apply(instr)
        self.last = f"{instr} {'ok' if gained is not None else 'failed'}"
        reward = 0.0
        for item in gained or ():
            if item in self.spec.milestones and item not in self.obtained:
                self.obtained.append(item)
                reward += self.spec.milestones[item]
        self.done = self.spec.target in self.obtained
        self._obs = self._render()
        return StepResult(self._obs, reward, self.done, True, {"instruction": instr, "success": gained is not None})

    def observation(self) -> str:
        return self._obs

    # ---- world rules -------------------------------------------------------------
    def _apply(self, instr: str) -> list[str] | None:
        """Run one instruction; the items gained ([] for a successful move) or ``None`` on failure."""
        roll = self.rng.random()  # one draw per instruction keeps outcomes easy to reason about
        if instr == "explore":
            if roll >= EXPLORE_P:
                return None
            if self.depth == 0 and self.rng.random() < NEW_BIOME_P:
                self.biome = self.rng.choice(BIOME_NAMES)
            self.area = sample_area(self.rng, self.biome, self.depth)
            return []
        if instr == "dig down":
            if self.depth >= MAX_DEPTH or pickaxe_tier(self.inventory) < 1 or roll >= DIG_P:
                return None
            self.depth += 1
            self.area = sample_area(self.rng, self.biome, self.depth)
            return self._add("cobblestone", 1)
        if instr == "climb up":
            if self.depth == 0 or roll >= CLIMB_P:
                return None
            self.depth -= 1
            self.area = sample_area(self.rng, self.biome, self.depth)
            return []
        for item, g in GATHERS.items():
            if g.instruction == instr:
                return self._add(item, 1) if roll < gather_probability(item, self.area, self.inventory) else None
        item = next(o for o, r in RECIPES.items() if r.instruction == instr)
        if missing_for(item, self.inventory) or roll >= CRAFT_P:
            return None
        rec = RECIPES[item]
        fuel = _fuel(self.inventory, rec.inputs) if rec.needs_fuel else None
        for ing, k in rec.inputs.items():
            self.inventory[ing] -= k
        if fuel:
            self.inventory[fuel] -= 1
        self.inventory = {k: v for k, v in self.inventory.items() if v > 0}
        return self._add(item, rec.count)

    def _add(self, item: str, n: int) -> list[str]:
        self.inventory[item] = self.inventory.get(item, 0) + n
        return [item]

    def _render(self) -> str:
        area = " ".join(f"{f} {LEVELS[self.area[f]]}" for f in FEATURES)
        inv = " ".join(f"{i} {self.inventory[i]}" for i in ITEMS if self.inventory.get(i, 0) > 0) or "empty"
        return (
            f"goal {self.spec.target} . biome {self.biome} depth {self.depth} {area} . "
            f"inventory {inv} . last {self.last}"
        )

    # ---- expert and metrics ------------------------------------------------------
    def expert_action(self) -> ExpertStep | None:
        if self.done:
            return None
        instr = expert.scripted_instruction(self.spec.target, self.inventory, self.depth)
        return None if instr is None else ExpertStep(OWNER[instr], instr)

    def metrics(self) -> dict[str, float]:
        out = {"success": float(self.spec.target in self.obtained), "steps": float(self.steps)}
        out.update({f"has_{m}": float(m in self.obtained) for m in self.spec.milestones})
        return out
