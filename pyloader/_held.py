"""Where rotation holds the samples it serves again (``_rotation``): in memory, or on disk (``rotation_dir``).

Samples arrive a chunk at a time (those of one encoded batch, or of a part of one) and are held by
window: a ``Window`` is chunks put end to end, and ``take(rows)`` gives its rows, in any order, as
columns. A window fills, is sealed once full (``seal``) and is dropped after its last round (``drop``).

* ``InMemory``: a chunk is what ``batch_encode`` gave; sealing changes nothing.
* ``OnDisk(rotation_dir)``: a chunk is turned into NumPy arrays as it arrives (``_npcolumns``; a
  field that cannot be raises ``Unstorable`` naming it). A window fills in memory; sealing writes
  it to a folder of its own, ``<rotation_dir>/pyloader-rotation-<random>/<epoch>-<window>/``, one
  ``.npy`` file per array (``f<field>.<part>.npy``), and reads it back memory-mapped (never
  unpickled); dropping it removes the folder. The run's folder is made by the first seal and
  removed by ``close()`` (at the run's end, however it ends: a break, ``close()``, an error), at
  the latest when the process exits; a write still running in a thread when the run ends removes
  what it wrote. Nothing is left behind.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from typing import Any, Dict, List, Optional, Protocol

import numpy as np

from . import _npcolumns
from ._columns import Columns, interleave, n_rows, slice_rows, take


class Held(Protocol):
    """How chunks are held; ``seal`` runs off the event loop (it may write files)."""

    def chunk(self, columns: Columns) -> Any: ...

    def rows(self, chunk: Any) -> int: ...

    def cut(self, chunk: Any, start: int, end: int) -> Any: ...

    def take(self, chunk: Any, positions: np.ndarray) -> Columns: ...

    def seal(self, name: str, window: "Window") -> Any: ...

    def drop(self, window: Any) -> None: ...

    def close(self) -> None: ...


class Window:
    """Rows of chunks put end to end."""

    def __init__(self, held: Held) -> None:
        self.held = held
        self.chunks: List[Any] = []
        self.ends: List[int] = []  # the rows up to the end of each chunk

    @property
    def n(self) -> int:
        return self.ends[-1] if self.ends else 0

    def add(self, chunk: Any) -> None:
        self.chunks.append(chunk)
        self.ends.append(self.n + self.held.rows(chunk))

    def take(self, rows: np.ndarray) -> Columns:
        if len(self.chunks) == 1:
            return self.held.take(self.chunks[0], rows)
        starts = [0, *self.ends[:-1]]
        return interleave(np.searchsorted(self.ends, rows, side="right"),
                          lambda i, at: self.held.take(self.chunks[i], rows[at] - starts[i]), "rotation")


class InMemory:
    """Chunks kept as ``batch_encode`` gave them."""

    def chunk(self, columns: Columns) -> Columns:
        return columns

    def rows(self, chunk: Columns) -> int:
        return n_rows(chunk)

    def cut(self, chunk: Columns, start: int, end: int) -> Columns:
        return slice_rows(chunk, start, end)

    def take(self, chunk: Columns, positions: np.ndarray) -> Columns:
        return take(chunk, positions)

    def seal(self, name: str, window: Window) -> Window:
        return window

    def drop(self, window: Window) -> None:
        pass

    def close(self) -> None:
        pass


class _OnDiskWindow:
    """A sealed window: its arrays memory-mapped from its folder."""

    def __init__(self, folder: str, n: int, arrays: _npcolumns.Encoded) -> None:
        self.folder = folder
        self.n = n
        self.arrays = arrays

    def take(self, rows: np.ndarray) -> Columns:
        return _npcolumns.take(self.arrays, rows)


def _remove(root: str, pid: int) -> None:
    if os.getpid() == pid:  # never from a forked child: the folder is its parent's
        shutil.rmtree(root, ignore_errors=True)


class OnDisk:
    """Chunks as NumPy arrays; sealed windows in ``.npy`` files under a folder of the run's."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.root: Optional[str] = None
        self._lock = threading.Lock()
        self._closed = False
        self._stored: Optional[Dict[str, _npcolumns.Stored]] = None  # how the first chunk's fields are stored

    def chunk(self, columns: Columns) -> _npcolumns.Encoded:
        """The chunk as arrays; a field stored otherwise than in the first chunk is an ``Unstorable``."""
        encoded = _npcolumns.encode(columns)
        stored = {key: _npcolumns.stored(field) for key, field in encoded.items()}
        if self._stored is None:
            self._stored = stored
        for key, how in stored.items():
            first = self._stored.get(key)
            if first is not None and first[1] is None:  # empty so far: what has values tells
                self._stored[key] = first = how
            if first is not None and not _npcolumns.same_storage(how, first):
                raise _npcolumns.Unstorable(f"rotation_dir stores a field one way for all samples: field {key!r} "
                                            f"holds {_npcolumns.describe(how)} here and {_npcolumns.describe(first)} "
                                            f"before")
        return encoded

    def rows(self, chunk: _npcolumns.Encoded) -> int:
        return _npcolumns.rows(chunk)

    def cut(self, chunk: _npcolumns.Encoded, start: int, end: int) -> _npcolumns.Encoded:
        return _npcolumns.cut(chunk, start, end)

    def take(self, chunk: _npcolumns.Encoded, positions: np.ndarray) -> Columns:
        return _npcolumns.take(chunk, positions)

    def _folder_for(self, name: str) -> Optional[str]:
        """A new folder for window ``name``, or ``None`` once closed."""
        with self._lock:
            if self._closed:
                return None
            if self.root is None:
                os.makedirs(self.folder, exist_ok=True)
                self.root = tempfile.mkdtemp(prefix="pyloader-rotation-", dir=self.folder)
                weakref.finalize(self, _remove, self.root, os.getpid())
            folder = os.path.join(self.root, name)
            os.mkdir(folder)
            return folder

    def seal(self, name: str, window: Window) -> Any:
        joined = _npcolumns.join(window.chunks)
        folder = self._folder_for(name)
        if folder is None:
            return window  # the run has ended: nobody will read it
        try:
            manifest = _npcolumns.save(joined, folder)
        finally:
            with self._lock:
                closed = self._closed
                if closed:  # the run ended while this was written: what close() found is gone already
                    shutil.rmtree(str(self.root), ignore_errors=True)
        return window if closed else _OnDiskWindow(folder, window.n, _npcolumns.load(manifest))

    def drop(self, window: Any) -> None:
        if isinstance(window, _OnDiskWindow):
            window.arrays = {}
            shutil.rmtree(window.folder, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)
