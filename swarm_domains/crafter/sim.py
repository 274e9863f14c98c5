"""Crafter's env without the pixels, and deterministic: the text domain reads the world's state, so rendering an
image each step is skipped; and where Crafter despawns a random creature of a chunk, it draws from a set ordered by
memory address (so the same seed could play differently in two processes, or after a restore): here the chunk's
objects come in the world's creation order. Crafter's world, dynamics, random draws and reward are otherwise its own."""

from __future__ import annotations

import crafter
import numpy as np
from crafter import constants, engine, objects


class TextCrafter(crafter.Env):
    """``crafter.Env`` whose observation is ``None`` instead of a rendered image (so it loads no textures)."""

    def __init__(self, area=(64, 64), view=(9, 9), size=(64, 64), reward=True, length=10000, seed=None):
        # crafter.Env.__init__ of Crafter 1.8.3 without its textures and image views (they load every PNG)
        self._area, self._view, self._size = area, np.array(view), np.array(size)
        self._reward, self._length, self._seed, self._episode = reward, length, seed, 0
        self._world = engine.World(area, constants.materials, (12, 12))
        self._textures = self._local_view = self._item_view = None
        self._sem_view = engine.SemanticView(
            self._world,
            [objects.Player, objects.Cow, objects.Zombie, objects.Skeleton, objects.Arrow, objects.Plant],
        )
        self._step = self._player = self._last_health = self._unlocked = None
        self.reward_range = self.metadata = None

    def _obs(self):
        return None

    def _balance_chunk(self, chunk, objs):
        order = sorted(objs, key=lambda obj: int(self._world._obj_map[tuple(obj.pos)]))
        super()._balance_chunk(chunk, order)

    def __getstate__(self):
        """Pickled without the image renderers (textures: most of the bytes); a restored env renders nothing."""
        state = dict(self.__dict__)
        for key in ("_textures", "_local_view", "_item_view"):
            state[key] = None
        return state
