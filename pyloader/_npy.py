"""What the ``.npy`` code paths share: one lock for header parsing, and the registry of mapped files.

``HEADER_PARSE``: NumPy parses a ``.npy`` header with ``ast.literal_eval``, and CPython 3.11
builds AST objects in state all threads share: a parse in one thread can make one running in
another fail with "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905).
Whatever of pyloader parses headers from threads (the ``NumpyReader``, cached epochs, rotation
on disk) holds this lock meanwhile.

The registry: ``register_mapped`` records a memory-mapped file (a ``.npy`` of the
``NumpyReader``, an Arrow IPC file of the ``ParquetReader``: its path, the file's identity,
where its data lies in this process's memory and in the file) for as long as the map lives.
``file_span(array)`` tells whether an array's bytes are, unchanged, bytes of a registered
file: then they can travel to another process as ``(file, offset, shape, dtype)`` and be
mapped there (``_execution.ipc``). Bytes written since the mapping (a copy-on-write map turns
a written page private) are not the file's: a span is given only where no page of the array
was written, as ``/proc/self/pagemap`` tells; where it cannot tell, none is given.

``populate(array)``: the pages of a mapped array are put in this process's page tables at once
(Linux's ``MADV_POPULATE_READ``), by the thread that reads it ahead, GIL released: a consumer
that touches every page of a batch otherwise takes a fault every few pages, in its own thread,
holding the GIL. Not done where batches are not used (a worker process sends spans, mapped
again in the loader's process: ``populating(False)``), for arrays over ``POPULATE_MAX`` bytes
(the read-ahead must not pull a whole large file into memory), or where the kernel lacks it.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import threading
import weakref
from typing import Any, Dict, NamedTuple, Optional, Tuple

import numpy as np

from ._libc import libc

HEADER_PARSE = threading.Lock()

Identity = Tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


class FileSpan(NamedTuple):
    """Where an array's bytes lie in a file: ``offset`` bytes from its start."""

    path: str
    identity: Identity
    offset: int


class _Region(NamedTuple):
    end: int  # the address after the mapped data
    path: str
    identity: Identity
    offset: int  # the file offset of the data's first byte


_REGIONS: Dict[int, _Region] = {}  # start address -> region
_LOCK = threading.Lock()
_PAGE = mmap.PAGESIZE


POPULATE_MAX = 64 * 1024 * 1024
_MADV_POPULATE_READ = 22  # Linux 5.14


class _Populate:
    """libc's ``madvise`` (``None``: not here, or not usable), and whether to call it."""

    def __init__(self) -> None:
        self.on = True
        self.madvise: Optional[Any] = getattr(libc(), "madvise", None)
        if self.madvise is not None:
            self.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


_POPULATE = _Populate()


def populating(on: bool) -> None:
    """Whether ``populate`` does anything in this process (a worker process says ``False``)."""
    _POPULATE.on = on


def populate(array: np.ndarray) -> None:
    """Map the pages under ``array`` (a view of a mapped file) into this process now (see the module)."""
    madvise = _POPULATE.madvise
    if madvise is None or not _POPULATE.on or not 0 < array.nbytes <= POPULATE_MAX:
        return
    address = array.__array_interface__["data"][0]
    start = address - address % _PAGE
    if madvise(start, address + array.nbytes - start, _MADV_POPULATE_READ) != 0:
        _POPULATE.madvise = None  # EINVAL: a kernel without it; anything else: not worth a retry either


def identity_of(st: os.stat_result) -> Identity:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def register_mapped(owner: Any, start: int, size: int, path: str, offset: int) -> None:
    """Record that the ``size`` bytes at address ``start`` are those of the local file ``path`` from
    ``offset`` on, mapped (copy-on-write or read-only) for as long as ``owner`` lives (an
    ``np.memmap``, a pyarrow ``Buffer`` over a memory map). The file's identity is taken now."""
    if size <= 0:
        return
    region = _Region(start + size, path, identity_of(os.stat(path)), offset)
    with _LOCK:
        _REGIONS[start] = region
    weakref.finalize(owner, _forget, start)


def _forget(start: int) -> None:
    with _LOCK:
        _REGIONS.pop(start, None)


def file_span(array: np.ndarray) -> Optional[FileSpan]:
    """Where the bytes of ``array`` (C-contiguous) lie in a registered, mapped file, unwritten
    since it was mapped; ``None`` when they do not, or when that cannot be told."""
    if not _REGIONS or not array.nbytes or not array.flags.c_contiguous:
        return None
    address = array.__array_interface__["data"][0]
    found = _region_holding(address, array.nbytes)
    if found is None or _written(address, array.nbytes):
        return None
    start, region = found
    return FileSpan(region.path, region.identity, region.offset + address - start)


def _region_holding(address: int, size: int) -> Optional[Tuple[int, _Region]]:
    """``(start, region)``: a registered region that holds the ``size`` bytes at ``address``, or ``None``."""
    with _LOCK:
        return next(((start, r) for start, r in _REGIONS.items() if start <= address and address + size <= r.end),
                    None)


def _written(address: int, size: int) -> bool:
    """Whether a page of ``[address, address + size)`` may hold bytes written in this process
    (present and private, or swapped out), or pagemap cannot tell."""
    first, last = address // _PAGE, (address + size - 1) // _PAGE
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        raw = os.pread(fd, (last - first + 1) * 8, first * 8)
    except OSError:
        return True
    finally:
        os.close(fd)
    # bits 61-63 of each little-endian entry are bits 5-7 of its last byte: file page, swapped, present
    return len(raw) != (last - first + 1) * 8 or _WRITTEN in raw[7::8].translate(_WRITTEN_FLAGS)


_WRITTEN = b"\1"
# the last byte of an entry -> 1 where the page is swapped out, or present and not a page of the file; else 0
_WRITTEN_FLAGS = bytes(int(bool(top & 0x40 or top & 0xA0 == 0x80)) for top in range(256))
