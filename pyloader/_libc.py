"""The C library of this process, through ``ctypes``, for the few calls Python does not offer
(``mmap`` at a given address, ``madvise`` flags newer than Python's, ``prctl``).

``libc()`` is loaded once; ``None`` where there is no C library to load (each caller then does
without). A caller sets ``argtypes``/``restype`` on the functions it uses, which no other uses.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Optional


@functools.lru_cache(maxsize=None)
def libc() -> Optional[ctypes.CDLL]:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
