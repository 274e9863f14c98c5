"""Crafter's env without the pixels, and deterministic: the text domain reads the world's state, so rendering an
image each step is skipped; and where Crafter despawns a random creature of a chunk, it draws from a set ordered by
memory address (so the same seed could play differently in two processes, or after a restore): here the chunk's
objects come in the world's creation order. Crafter's world, dynamics, random draws and reward are otherwise its own."""

from __future__ import annotations

import crafter


class TextCrafter(crafter.Env):
    """``crafter.Env`` whose observation is ``None`` instead of a rendered image."""

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
