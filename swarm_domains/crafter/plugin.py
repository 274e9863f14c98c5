"""Plugin entry point of the crafter domain: registers :class:`CrafterDomain` (Crafter itself is imported only when
an env, the vocabulary or an evaluation needs it, so listing domains works without the ``crafter`` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from swarm_domains.crafter.instructions import instructions
from swarm_domains.crafter.task import TaskSpec
from swarm_runtime import Domain, DomainEnv, Role, hookimpl


class CrafterDomain(Domain):
    """Crafter (Hafner 2021) in text: Gatherer, Miner and Smith instruct a scripted executor."""

    name = "crafter"
    description = (
        "Crafter's procedurally generated worlds (22 achievements, wood to iron pickaxe and diamond) in text; "
        "agents issue instructions a scripted executor runs for up to `frames` env steps. Needs the crafter extra."
    )
    roles = (
        Role("Gatherer", "collects wood, water and saplings, eats, sleeps and explores"),
        Role("Miner", "mines stone, coal, iron and diamond, places stone, fights zombies and skeletons"),
        Role("Smith", "places the table and furnace and makes pickaxes and swords"),
    )
    tasks_dir = Path(__file__).parent / "tasks"

    def make_env(self, task: DictConfig) -> DomainEnv:
        from swarm_domains.crafter.tables import load_tables
        from swarm_domains.crafter.world import CrafterEnv

        spec = TaskSpec.from_config(task)
        tables = load_tables()  # ImportError, one line, without the extra or at another Crafter version
        spec.check_names(tables.achievements)
        return CrafterEnv(spec, tables)

    def action_choices(self, task: DictConfig, role: str | None) -> list[str]:
        """Every instruction (any role may issue any); Crafter's primitive actions too with ``primitive_actions``."""
        from swarm_domains.crafter.tables import load_tables

        t = load_tables()
        extra = list(t.actions) if TaskSpec.from_config(task).primitive_actions else []
        return list(instructions(t)) + extra

    def vocabulary(self, task: DictConfig) -> list[str]:
        from swarm_domains.crafter.observation import words
        from swarm_domains.crafter.tables import load_tables

        t = load_tables()
        phrases = [*instructions(t), *t.actions, *words(t)]
        return list(dict.fromkeys(w for p in phrases for w in p.split()))

    # ---- Crafter's score in every held-out evaluation ------------------------------
    def eval_figures(self, episodes: Sequence[Any]) -> dict[str, tuple[float, float]]:
        """The Crafter score (percent, jackknife SE over seeds) and Crafter's own return (Crafter's reward summed,
        whatever the task's reward)."""
        from swarm_domains.crafter.score import episodes_by_seed, score_with_se
        from swarm_domains.crafter.tables import load_tables
        from swarm_runtime.evaluation.heldout import mean_se

        by_seed = episodes_by_seed(episodes)
        if not any(by_seed.values()) or not any(u for eps in by_seed.values() for u in eps):
            return {}
        score = score_with_se(by_seed, load_tables().achievements)
        seeds: dict[int, list[float]] = {}
        for ep in episodes:
            seeds.setdefault(ep.seed, []).append(float(ep.metrics.get("crafter_return", 0.0)))
        ret = mean_se([sum(v) / len(v) for v in seeds.values()])
        return {"crafter_score": score, "crafter_return": ret}

    def eval_report(self, summary: dict[str, Any]) -> str:
        """Per-achievement success rates (percent of held-out episodes), in Crafter's order."""
        from swarm_domains.crafter.tables import load_tables

        names = [a for a in load_tables().achievements if f"ach_{a}_mean" in summary]
        if not names:
            return ""
        rows = [f"| {a} | {100 * summary[f'ach_{a}_mean']:.1f} |" for a in names]
        return "\n".join(["| achievement | success rate (%) |", "|---|---|", *rows])


@hookimpl
def swarm_register_domains(register) -> None:
    """Register the crafter domain."""
    register(CrafterDomain())
