"""Organisation of a collective (``rlcr.org``): ``flat`` (N peers) or ``ceo`` (the episode starts with
a CEO who hires specialists with a one-line brief, up to ``rlcr.max_hires`` at once, and fires them).
Every member runs the same shared policy; its name and brief are in its prompt."""

from __future__ import annotations

from dataclasses import dataclass, field

ORGS = ("flat", "ceo")
CEO = "ceo"
#: Agent names: words without digits, so the word-level tokenizer keeps each one a single token.
NAMES = (
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
)
#: Most agents a flat team may have (one name each).
MAX_FLAT = 9
#: Most specialists a CEO may have at once (``rlcr.max_hires`` is capped here).
MAX_HIRES = 8


@dataclass
class Organisation:
    kind: str
    agents: int = 3  #: flat: team size
    max_hires: int = 8  #: ceo: most specialists at once
    members: list[str] = field(default_factory=list)
    briefs: dict[str, str] = field(default_factory=dict)
    fired: list[str] = field(default_factory=list)
    hired: int = 0

    def __post_init__(self):
        if self.kind not in ORGS:
            raise ValueError(f"rlcr.org {self.kind!r} is unknown; valid: {', '.join(ORGS)}")
        if not self.members:
            self.members = list(NAMES[: self.agents]) if self.kind == "flat" else [CEO]
        self.peak = len(self.members)

    def active(self, agent: str) -> bool:
        return agent in self.members

    def hire(self, by: str, brief: str) -> tuple[str | None, str]:
        """``(name, "")`` of the new specialist, or ``(None, why)`` when the hire is refused."""
        if self.kind != "ceo" or by != CEO:
            return None, "only the ceo hires"
        if len(self.members) - 1 >= self.max_hires:
            return None, f"cap of {self.max_hires} specialists"
        if self.hired >= len(NAMES):
            return None, "no names left"
        name = NAMES[self.hired]
        self.hired += 1
        self.members.append(name)
        self.briefs[name] = brief.strip() or "none"
        self.peak = max(self.peak, len(self.members))
        return name, ""

    def fire(self, by: str, target: str) -> tuple[bool, str]:
        if self.kind != "ceo" or by != CEO:
            return False, "only the ceo fires"
        if target == CEO or target not in self.members:
            return False, f"no specialist {target!r}"
        self.members.remove(target)
        self.fired.append(target)
        return True, ""
