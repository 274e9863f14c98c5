"""The C allocator's mmap threshold, fixed for processes that load a pretrained base.

glibc's ``malloc`` serves a block of at least ``M_MMAP_THRESHOLD`` bytes with its own ``mmap`` and returns it to the
system when it is freed; smaller blocks come from the heap, which keeps freed memory for reuse. The threshold starts
at 128 KiB and, by default, rises to the size of each large block freed (up to 32 MiB): after a few training steps
of a pretrained model most activation and logits buffers land in the heap, and the process's resident memory
stays at its highest point however much is freed. :func:`fix_mmap_threshold` sets the threshold once (which also
stops it from rising), as ``MALLOC_MMAP_THRESHOLD_=131072`` in the environment does: the SmolLM2 SFT of 64 examples
peaked at 1.79 GiB resident so and passed 5.5 GiB without it (docs/benchmarks.md, "A real vocabulary").

It changes no number a run computes, only where freed memory goes. A threshold the user set in the environment is
kept; elsewhere than glibc (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

#: ``mallopt`` parameter number of the mmap threshold (glibc's malloc.h: ``M_MMAP_THRESHOLD``).
M_MMAP_THRESHOLD = -3
#: The threshold set: glibc's initial value, kept from rising.
THRESHOLD = 128 * 1024

_done: list[bool] = []


def fix_mmap_threshold(threshold: int = THRESHOLD) -> bool:
    """Set glibc's mmap threshold to ``threshold`` bytes, once per process. True when set now or earlier; False
    where the environment already sets one (``MALLOC_MMAP_THRESHOLD_``), or the C library is not glibc."""
    if _done:
        return _done[0]
    ok = False
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        libc = _glibc()
        ok = libc is not None and libc.mallopt(M_MMAP_THRESHOLD, int(threshold)) == 1
    _done.append(ok)
    return ok


def _glibc():
    """The process's C library where it is glibc (it has ``gnu_get_libc_version``), else None."""
    try:
        name = ctypes.util.find_library("c")
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if libc is None or not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc
