"""The instruction set agents emit (built from Crafter's tables), its parser and which role owns each."""

from __future__ import annotations

import re
from dataclasses import dataclass

from swarm_domains.crafter.tables import CREATURES, Tables

ROLE_NAMES = ("Gatherer", "Miner", "Smith")
#: Instructions without an argument.
BARE = ("sleep", "explore")


@dataclass(frozen=True)
class Instruction:
    """One parsed instruction: ``verb`` (collect, attack, place, make, sleep, explore, or ``primitive``) and its
    ``arg`` (a material, object, item or primitive action name; ``""`` for bare ones)."""

    verb: str
    arg: str = ""

    @property
    def text(self) -> str:
        return self.arg if self.verb == "primitive" else f"{self.verb} {self.arg}".strip()


def instructions(t: Tables) -> tuple[str, ...]:
    """Every instruction text (primitive actions aside), in a stable order."""
    return (
        tuple(f"collect {m}" for m in t.collect)
        + ("collect plant",)
        + tuple(f"attack {c}" for c in CREATURES)
        + tuple(f"place {p}" for p in t.place)
        + tuple(f"make {m}" for m in t.make)
        + BARE
    )


def owner(text: str, t: Tables) -> str:
    """The role whose scripted expert issues ``text`` (any role may issue any instruction)."""
    verb, _, arg = text.partition(" ")
    if verb == "make" or (verb == "place" and arg in t.stations):
        return "Smith"
    if verb == "collect" and t.collect.get(arg, {}).get("require") or arg == "stone" or arg in ("zombie", "skeleton"):
        return "Miner"
    return "Gatherer"


_PUNCT = re.compile(r"[^\w\s]+")


def parse(text: object, t: Tables) -> Instruction | None:
    """The instruction ``text`` names, or ``None``: lenient about case, punctuation and spacing; a primitive
    action name (``move_left``, ``do``, ...) is an instruction of one env step; extra words make it unparsable."""
    if not isinstance(text, str):
        return None
    words = _PUNCT.sub(" ", text.lower()).split()
    canon = " ".join(words)
    if len(words) == 1 and words[0] in t.actions:
        return Instruction("primitive", words[0])
    if canon in instructions(t):
        verb, _, arg = canon.partition(" ")
        return Instruction(verb, arg)
    return None
