"""A bid as text, both ways (no torch): the bid-level token a model emits (:func:`bid_token`, one added token
per level, such as ``<bid_0.4>``) and the strict reading of a generated bid (:func:`parse_bid`). The
transformers backend, the OpenAI sampler, the serve worker and the gateway all read bids with these."""

from __future__ import annotations

import re
from collections.abc import Sequence

_BID_RE = re.compile(r"<bid_([0-9.]+)>|(\d*\.\d+|\d+)")


def bid_token(level: float) -> str:
    """The token of bid level ``level`` (``<bid_0.4>``)."""
    return f"<bid_{float(level):g}>"


def parse_bid(text: str, levels: Sequence[float]) -> tuple[float, bool]:
    """The bid ``text`` ends with: a ``<bid_x>`` token or a number spelled as a level is (``0.4``,
    ``.4``, ``0.40``; any number whose value is exactly a level, written with digits and one
    point), ``(level, True)``; anything else (``-0.5``, ``5.0.3``, ``0,5``, ``nan``, ``5.0``, a
    value between levels) is ``(0.0, False)``, counted as an unparsed bid."""
    found = _BID_RE.findall(text)
    if not found:
        return 0.0, False
    match = list(_BID_RE.finditer(text))[-1]
    tok, num = found[-1]
    raw = tok or num
    start, end = match.span()
    before, after = text[:start], text[end:]
    if num and (
        (before[-1:] in ("-", "+", ".", ",") or before[-1:].isalnum())
        or (after[:1] in (".", ",") and after[1:2].isdigit())
        or after[:1].isalnum()
    ):
        return 0.0, False  # part of a longer token: -0.5, 5.0.3, 0,5, 1e-3, v0.4
    if not re.fullmatch(r"\d*\.?\d+|\d+\.", raw):
        return 0.0, False
    v = float(raw)
    for lvl in levels:
        if v == float(lvl):
            return lvl, True
    return 0.0, False
