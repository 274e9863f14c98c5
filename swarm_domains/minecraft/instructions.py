"""The instruction set (the action texts agents emit), its parser and role ownership."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from swarm_domains.minecraft.recipes import GATHERS, RECIPES

#: Instructions that move the agent rather than gather or craft.
MOVES: tuple[str, ...] = ("explore", "dig down", "climb up")

#: Every instruction, in a stable order.
INSTRUCTIONS: tuple[str, ...] = (
    ("chop tree", "explore")
    + tuple(g.instruction for g in GATHERS.values() if g.item != "log")
    + ("dig down", "climb up")
    + tuple(r.instruction for r in RECIPES.values())
)

ROLE_NAMES: tuple[str, ...] = ("Logger", "Miner", "Smith")


def owner(instruction: str) -> str:
    """The role whose scripted expert owns ``instruction`` (any role may issue any)."""
    if instruction in ("chop tree", "explore"):
        return "Logger"
    if instruction.startswith("mine ") or instruction in ("dig down", "climb up"):
        return "Miner"
    return "Smith"


OWNER: Mapping[str, str] = MappingProxyType({i: owner(i) for i in INSTRUCTIONS})

_PUNCT = re.compile(r"[^\w\s]+")


def parse(text: str) -> str | None:
    """Canonical instruction for ``text`` or ``None`` when it is not one.

    Lenient about case, surrounding punctuation and spacing, and accepts item
    names written with spaces (``craft wooden pickaxe``); extra words make the
    text invalid (a generated action must be exactly one instruction).
    """
    if not isinstance(text, str):
        return None
    words = _PUNCT.sub(" ", text.lower()).split()
    if not words:
        return None
    canon = " ".join(words)
    if canon in OWNER:
        return canon
    if len(words) > 2 and words[0] in ("craft", "smelt"):
        joined = f"{words[0]} {'_'.join(words[1:])}"
        if joined in OWNER:
            return joined
    return None
