"""NaVILA-style action text: parsing, per-role permissions, expansion into primitive steps.

One parser serves both simulators (embedded and habitat). NaVILA writes actions as
``"The next action is turn left 30 degree."``, ``"The next action is move forward 75 cm."``
and ``"The next action is stop."``. A multiple of the primitive step (15 degrees,
25 cm) is expanded into that many primitive VLN-CE actions, which carry habitat's
action names (``stop``, ``move_forward``, ``turn_left``, ``turn_right``).

Parsing is robust to case, punctuation, a missing ``"The next action is"`` prefix,
``degree``/``degrees``/``deg``, ``cm``/``centimeters``/``m``/``meters`` and a missing
amount (one primitive step); anything else is rejected (``None``).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

#: Primitive VLN-CE action space (habitat's action names).
STOP, MOVE_FORWARD, TURN_LEFT, TURN_RIGHT = "stop", "move_forward", "turn_left", "turn_right"
PRIMITIVES = (STOP, MOVE_FORWARD, TURN_LEFT, TURN_RIGHT)

TURN_STEP_DEG = 15  #: one primitive turn (VLN-CE ``TURN_ANGLE``)
FORWARD_STEP_CM = 25  #: one primitive forward step (VLN-CE ``FORWARD_STEP_SIZE`` 0.25 m)
MAX_TURN_DEG = 180  #: largest accepted turn in one action (12 primitive turns)
MAX_FORWARD_CM = 100  #: largest accepted forward move in one action (4 primitive steps)

#: Which primitive kinds each role may issue. ``None`` (a single monolithic model) may issue all.
ROLE_KINDS: dict[str, tuple[str, ...]] = {
    "Turner": (TURN_LEFT, TURN_RIGHT),
    "Mover": (MOVE_FORWARD,),
    "Stopper": (STOP,),
}

#: Words of the action texts (for the domain vocabulary).
ACTION_WORDS = (
    "The",
    "the",
    "next",
    "action",
    "is",
    "turn",
    "left",
    "right",
    "degree",
    "move",
    "forward",
    "cm",
    "stop",
    ".",
)

_PREFIX = re.compile(r"^(?:the\s+)?(?:next\s+)?(?:action\s+)?(?:is\s+)?")
_TURN = re.compile(r"^turn\s+(left|right)(?:\s+(\d+)(?:\s*(?:degrees?|deg))?)?$")
_MOVE = re.compile(r"^(?:move|go|walk)\s+forward(?:\s+(\d+(?:p\d+)?)\s*(cm|centimeters?|m|meters?)?)?$")
_STOP = re.compile(r"^stop(?:\s+here)?$")


@dataclass(frozen=True)
class ParsedAction:
    """One parsed action: ``kind`` is a primitive name, ``amount`` degrees (turns),
    centimetres (moves) or 0 (stop)."""

    kind: str
    amount: int = 0

    @property
    def n_steps(self) -> int:
        """How many primitive steps the action expands into."""
        if self.kind == STOP:
            return 1
        unit = FORWARD_STEP_CM if self.kind == MOVE_FORWARD else TURN_STEP_DEG
        return self.amount // unit

    def primitives(self) -> tuple[str, ...]:
        """The primitive VLN-CE actions this action expands into, in order."""
        return (self.kind,) * self.n_steps

    def short(self) -> str:
        """Compact rendering for the public log (``turn left 30 degree``)."""
        if self.kind == STOP:
            return "stop"
        if self.kind == MOVE_FORWARD:
            return f"move forward {self.amount} cm"
        return f"turn {'left' if self.kind == TURN_LEFT else 'right'} {self.amount} degree"

    def navila_text(self) -> str:
        """NaVILA's phrasing (``The next action is turn left 30 degree.``)."""
        return f"The next action is {self.short()}."


def parse_action(text: str) -> ParsedAction | None:
    """Parse NaVILA action text; ``None`` when it is not a well-formed action.

    Amounts must be positive multiples of the primitive step, at most
    :data:`MAX_TURN_DEG` degrees or :data:`MAX_FORWARD_CM` cm.
    """
    if not isinstance(text, str):
        return None
    return _parse_text(text)


@functools.lru_cache(maxsize=8192)
def _parse_text(text: str) -> ParsedAction | None:
    """:func:`parse_action` of a string, cached: every prompt's public log re-parses the last
    ``log_window`` actions (ParsedAction is frozen, so sharing one is safe)."""
    t = text.lower().replace("_", " ")
    t = re.sub(r"(\d)\s*\.\s*(\d)", r"\1p\2", t)  # keep decimals ("0.5 m") apart from full stops
    t = re.sub(r"[^a-z0-9]+", " ", t)
    t = re.sub(r"(\d)(?=[a-oq-z]|p(?!\d))", r"\1 ", t).strip()  # "75cm" -> "75 cm"
    body = _PREFIX.sub("", t, count=1).strip()
    if _STOP.match(body):
        return ParsedAction(STOP, 0)
    m = _TURN.match(body)
    if m:
        deg = int(m.group(2)) if m.group(2) else TURN_STEP_DEG
        if deg <= 0 or deg % TURN_STEP_DEG or deg > MAX_TURN_DEG:
            return None
        return ParsedAction(TURN_LEFT if m.group(1) == "left" else TURN_RIGHT, deg)
    m = _MOVE.match(body)
    if m:
        amount = float(m.group(1).replace("p", ".")) if m.group(1) else float(FORWARD_STEP_CM)
        if m.group(2) and m.group(2).startswith("m"):
            amount *= 100.0
        elif "p" in (m.group(1) or ""):
            return None  # fractional centimetres
        cm = int(round(amount))
        if abs(amount - cm) > 1e-6 or cm <= 0 or cm % FORWARD_STEP_CM or cm > MAX_FORWARD_CM:
            return None
        return ParsedAction(MOVE_FORWARD, cm)
    return None


def role_allows(role: str | None, kind: str) -> bool:
    """Whether ``role`` may issue an action of ``kind`` (``None`` = monolithic model: all)."""
    if role is None:
        return True
    return kind in ROLE_KINDS.get(role, ())


def check_action(text: str, role: str | None) -> tuple[ParsedAction | None, str | None]:
    """Parse ``text`` for ``role``: ``(action, None)`` when allowed, else ``(None, reason)``."""
    act = parse_action(text)
    if act is None:
        return None, f"unparsable action {text!r}; expected e.g. 'The next action is turn left 30 degree.'"
    if role is not None and role not in ROLE_KINDS:
        return None, f"unknown role {role!r}; valid: {', '.join(ROLE_KINDS)}"
    if not role_allows(role, act.kind):
        return None, f"{role} may not {act.short()}; {role} may only {'/'.join(ROLE_KINDS[role])}"
    return act, None


#: NaVILA's action amounts (its training data's multiples): the experts use these, and so does
#: constrained decoding (``model.constrained_actions``).
NAVILA_TURN_DEG = (15, 30, 45)
NAVILA_FORWARD_CM = (25, 50, 75)


def role_choices(role: str | None) -> list[str]:
    """Every NaVILA action text ``role`` may emit (``None``: all three roles' texts)."""
    if role is not None and role not in ROLE_KINDS:
        raise ValueError(f"unknown role {role!r}; valid: {', '.join(ROLE_KINDS)}")
    out = []
    for kind in ROLE_KINDS[role] if role is not None else (TURN_LEFT, TURN_RIGHT, MOVE_FORWARD, STOP):
        amounts = {TURN_LEFT: NAVILA_TURN_DEG, TURN_RIGHT: NAVILA_TURN_DEG, MOVE_FORWARD: NAVILA_FORWARD_CM}
        out += [ParsedAction(kind, a).navila_text() for a in amounts.get(kind, (0,))]
    return out


def expert_text(kind: str, amount: int = 0) -> str:
    """NaVILA text for an expert action (``kind`` a primitive name)."""
    return ParsedAction(kind, amount).navila_text()
