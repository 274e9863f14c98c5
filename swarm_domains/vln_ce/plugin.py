"""Plugin entry point of the vln_ce domain: registers :class:`VLNDomain`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from swarm_domains.vln_ce.actions import ACTION_WORDS, parse_action, role_choices
from swarm_domains.vln_ce.config import EmbeddedConfig, HabitatConfig, sim_name
from swarm_domains.vln_ce.instructions import INSTRUCTION_WORDS
from swarm_domains.vln_ce.layout import OBJECT_NAMES, ROOM_TYPES
from swarm_domains.vln_ce.observation import OBSERVATION_WORDS
from swarm_runtime import Domain, DomainEnv, Event, Role, hookimpl


class VLNDomain(Domain):
    """VLN-CE: follow an R2R-style route instruction through a house and stop at the goal."""

    name = "vln_ce"
    description = (
        "Vision-and-language navigation in continuous environments (R2R): Turner turns, "
        "Mover moves forward, Stopper stops; success = stop within 3 m of the goal."
    )
    roles = (
        Role("Turner", "turns left or right in 15 degree steps (turn left 30 degree)"),
        Role("Mover", "moves forward in 25 cm steps (move forward 75 cm)"),
        Role("Stopper", "stops when the instruction's goal is reached"),
    )
    tasks_dir = Path(__file__).parent / "tasks"

    def make_env(self, task: DictConfig) -> DomainEnv:
        """The embedded simulator, or the habitat-lab adapter for ``sim: habitat``."""
        sim = sim_name(task)
        emb = EmbeddedConfig.from_task(task)
        if sim == "embedded":
            from swarm_domains.vln_ce.sim import EmbeddedVLNEnv

            return EmbeddedVLNEnv(emb)
        from swarm_domains.vln_ce.habitat_adapter import HabitatVLNEnv

        return HabitatVLNEnv(HabitatConfig.from_task(task), emb)

    def vocabulary(self, task: DictConfig) -> list[str]:
        words = [
            *ACTION_WORDS,
            *INSTRUCTION_WORDS,
            *OBSERVATION_WORDS,
            *ROOM_TYPES,
            *OBJECT_NAMES,
            "invalid",
            "skip",
            "none",
        ]
        return list(dict.fromkeys(words))

    def action_choices(self, task: DictConfig, role: str | None) -> list[str] | None:
        """NaVILA's action texts for ``role``: the Turner's six turns (left/right 15, 30, 45
        degree), the Mover's three moves (25, 50, 75 cm), the Stopper's stop."""
        return role_choices(role)

    def render_log(self, log: Sequence[Event]) -> str:
        """Compact log: ``Turner turn left 30 degree ; Mover move forward 75 cm`` (no NaVILA prefix;
        unparsable text shows as ``invalid`` so raw model output never reaches the prompt)."""
        tail = list(log[-self.log_window :]) if self.log_window else []
        if not tail:
            return "none"
        parts = []
        for e in tail:
            if e.role is None:
                parts.append("skip")
                continue
            act = parse_action(e.action)
            if act is None:
                parts.append(f"{e.role} invalid")
            else:
                parts.append(f"{e.role} {act.short()}" + ("" if e.valid else " invalid"))
        return " ; ".join(parts)


@hookimpl
def swarm_register_domains(register):
    register(VLNDomain())
