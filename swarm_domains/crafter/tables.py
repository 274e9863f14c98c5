"""Crafter's own tables (ids of the semantic map, actions, recipes, achievements), read from the installed Crafter."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

#: Creatures an agent may attack (object names of Crafter's semantic map).
CREATURES = ("cow", "zombie", "skeleton")


@dataclass(frozen=True)
class Tables:
    """What Crafter defines, as plain Python (shared by every env of a process; never copied).

    :param names: semantic-map id -> name (``materials`` then object classes, lower case; id 0 is ``unknown``).
    :param actions: the 17 primitive action names, in Crafter's order (an action's index is its id).
    """

    names: tuple[str, ...]
    actions: tuple[str, ...]
    achievements: tuple[str, ...]
    items: tuple[str, ...]
    vitals: tuple[str, ...]
    walkable: frozenset[str]
    collect: Mapping[str, dict]
    place: Mapping[str, dict]
    make: Mapping[str, dict]
    item_max: Mapping[str, int]

    def __deepcopy__(self, memo: dict) -> Tables:  # immutable: snapshots share it
        return self

    @property
    def ids(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}

    @property
    def stations(self) -> tuple[str, ...]:
        """Materials a ``make`` needs nearby (table, furnace), in first-use order."""
        return tuple(dict.fromkeys(s for rule in self.make.values() for s in rule.get("nearby", ())))


@functools.lru_cache(maxsize=1)
def load_tables() -> Tables:
    """Read the tables from Crafter itself (its ``data.yaml`` constants and a fresh env's semantic view)."""
    from swarm_domains.crafter.compat import load_crafter

    load_crafter()
    from crafter import constants

    from swarm_domains.crafter.sim import TextCrafter

    env = TextCrafter(seed=0)
    ids = {name: i for name, i in env._sem_view._mat_ids.items() if name is not None}
    ids.update({cls.__name__.lower(): i for cls, i in env._sem_view._obj_ids.items()})
    names = ["unknown"] * (max(ids.values()) + 1)
    for name, i in ids.items():
        names[i] = name
    items = tuple(constants.items)
    return Tables(
        names=tuple(names),
        actions=tuple(constants.actions),
        achievements=tuple(constants.achievements),
        items=items,
        vitals=tuple(k for k in items if constants.items[k]["initial"] > 0),
        walkable=frozenset(constants.walkable),
        collect=MappingProxyType(dict(constants.collect)),
        place=MappingProxyType(dict(constants.place)),
        make=MappingProxyType(dict(constants.make)),
        item_max=MappingProxyType({k: int(v["max"]) for k, v in constants.items.items()}),
    )
