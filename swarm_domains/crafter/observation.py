"""The text observation: vitals, inventory, the nearest thing of each kind in the player's local view, achievements."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from swarm_domains.crafter.tables import Tables

#: Half-size of the local view (cells left/right, up/down): Crafter's 9x7 image view around the player.
VIEW = (4, 3)
#: Names left out of the view (everywhere, or the player itself).
HIDDEN = ("grass", "player", "unknown")
WORDS = ("have", "nothing", "see", "facing", "done", "none", "last", "ok", "failed", "invalid", "left", "right", "up")
WORDS += ("down", ",", ".", "sleeping")


def offset_text(dx: int, dy: int) -> str:
    """``2 left 1 up`` (cells; the empty string at the player's own cell)."""
    parts = []
    if dx:
        parts.append(f"{abs(dx)} {'right' if dx > 0 else 'left'}")
    if dy:
        parts.append(f"{abs(dy)} {'down' if dy > 0 else 'up'}")
    return " ".join(parts)


def nearest_in_view(t: Tables, sem: np.ndarray, pos: tuple[int, int]) -> list[tuple[str, int, int]]:
    """The nearest cell of each kind in the local view, as ``(name, dx, dy)``, nearest kinds first (ties: by id)."""
    best: dict[int, tuple[int, int, int]] = {}
    for dx in range(-VIEW[0], VIEW[0] + 1):
        for dy in range(-VIEW[1], VIEW[1] + 1):
            x, y = pos[0] + dx, pos[1] + dy
            if (dx, dy) == (0, 0) or not (0 <= x < sem.shape[0] and 0 <= y < sem.shape[1]):
                continue
            i = int(sem[x, y])
            d = abs(dx) + abs(dy)
            if t.names[i] not in HIDDEN and (i not in best or d < best[i][0]):
                best[i] = (d, dx, dy)
    order = sorted(best, key=lambda i: (best[i][0], i))
    return [(t.names[i], best[i][1], best[i][2]) for i in order]


def render(
    t: Tables,
    sem: np.ndarray,
    pos: tuple[int, int],
    facing: tuple[int, int],
    inventory: Mapping[str, int],
    unlocked: Iterable[str],
    last: str,
    sleeping: bool = False,
) -> str:
    """``health 9 food 9 drink 9 energy 9 . have wood 2 . see tree 1 left , water 2 right 1 up . facing grass .
    last ok . done collect_wood``."""
    vitals = " ".join(f"{k} {inventory.get(k, 0)}" for k in t.vitals)
    held = " ".join(f"{k} {inventory[k]}" for k in t.items if k not in t.vitals and inventory.get(k, 0) > 0)
    seen = " , ".join(f"{n} {offset_text(dx, dy)}" for n, dx, dy in nearest_in_view(t, sem, pos))
    fx, fy = pos[0] + facing[0], pos[1] + facing[1]
    inside = 0 <= fx < sem.shape[0] and 0 <= fy < sem.shape[1]
    faced = t.names[int(sem[fx, fy])] if inside else "none"
    done = " ".join(a for a in t.achievements if a in set(unlocked)) or "none"
    state = " . sleeping" if sleeping else ""
    return (
        f"{vitals}{state} . have {held or 'nothing'} . see {seen or 'nothing'} . facing {faced} . last {last} . "
        f"done {done}"
    )


def words(t: Tables) -> list[str]:
    """Every word :func:`render` may write (digits aside)."""
    return [*WORDS, *t.names, *t.items, *t.achievements]
