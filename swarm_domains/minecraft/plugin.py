"""Plugin entry point of the minecraft domain: registers :class:`MinecraftDomain`."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from swarm_domains.minecraft.instructions import INSTRUCTIONS
from swarm_domains.minecraft.recipes import ITEMS
from swarm_domains.minecraft.task import TaskSpec
from swarm_domains.minecraft.world import BIOME_NAMES, FEATURES, LEVELS, MAX_DEPTH
from swarm_runtime import Domain, DomainEnv, Role, hookimpl

#: Words of the observation template (besides items, biomes, features, levels, digits).
OBS_WORDS = ("goal", "biome", "depth", "inventory", "empty", "last", "ok", "failed", "none", ".")


class MinecraftDomain(Domain):
    """Text crafting world with the real recipe tree; Logger, Miner and Smith."""

    name = "minecraft"
    description = (
        "Craft up the Minecraft tech tree (log -> ... -> iron_pickaxe) in seeded worlds "
        "whose layout changes what works; embedded text world or MineStudio + STEVE-1."
    )
    roles = (
        Role("Logger", "chops trees and explores for better areas"),
        Role("Miner", "mines stone, coal and iron, digs down and climbs up"),
        Role("Smith", "crafts tools and stations and smelts in the furnace"),
    )
    tasks_dir = Path(__file__).parent / "tasks"

    def make_env(self, task: DictConfig) -> DomainEnv:
        spec = TaskSpec.from_config(task)
        if spec.sim == "minestudio":
            from swarm_domains.minecraft.minestudio import MineStudioEnv

            return MineStudioEnv(spec)
        from swarm_domains.minecraft.world import CraftWorld

        return CraftWorld(spec)

    def concurrent_env(self, task: DictConfig) -> DomainEnv:
        """``algo=rlcr``: the parallel form (shared area and storage, timed instructions,
        anytime return = milestone reward so far; :mod:`swarm_domains.minecraft.parallel`)."""
        spec = TaskSpec.from_config(task)
        if spec.sim != "embedded":
            raise ValueError(
                f"minecraft task: algo=rlcr runs the embedded world only (sim=embedded), got sim {spec.sim!r}"
            )
        from swarm_domains.minecraft.parallel import SharedCraftWorld

        return SharedCraftWorld(spec)

    def action_choices(self, task: DictConfig, role: str | None) -> list[str]:
        """The instruction set: any role may issue any instruction (a wrong one fails in the world)."""
        return list(INSTRUCTIONS)

    def vocabulary(self, task: DictConfig) -> list[str]:
        words: dict[str, None] = {}
        for phrase in (
            *INSTRUCTIONS,
            *ITEMS,
            *BIOME_NAMES,
            *FEATURES,
            *LEVELS,
            *OBS_WORDS,
            *(str(d) for d in range(MAX_DEPTH + 1)),
        ):
            for w in phrase.split():
                words.setdefault(w, None)
        return list(words)


@hookimpl
def swarm_register_domains(register) -> None:
    """Register the minecraft domain."""
    register(MinecraftDomain())
