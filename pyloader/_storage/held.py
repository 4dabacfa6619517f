"""Where rotation holds the samples it serves again (``_stages.rotation``): in memory, or on disk (``rotation_dir``).

Samples arrive a chunk at a time (those of one encoded batch, or of a part of one) and are held by
window: a ``Window`` is chunks put end to end, and ``take(rows)`` gives its rows, in any order, as
a ``_columns.Traced``: the samples' fields, and beside them their provenance (their batch's files,
their padding flag), which rotation keeps out of the fields. A window fills, is sealed once full
(``seal``) and is dropped after its last round (``drop``).

* ``InMemory``: a chunk is what ``batch_encode`` gave (with its provenance); sealing changes nothing.
* ``OnDisk(rotation_dir)``: a window fills in memory; sealing turns it into NumPy arrays
  (``_storage.codec``, as ``cache_encoded`` stores batches: a field that cannot be stored without pickle
  is a ``NotCacheable`` naming it), writes them to a folder of its own,
  ``<rotation_dir>/pyloader-rotation-<writer's tag>-<random>/<epoch>-<window>/``, one ``.npy`` file per array
  (the layout among them; the provenance's arrays too, as ``provenance-<field>.npy``), and reads
  them back memory-mapped (never unpickled), the rows served
  read as they are needed (``_storage.codec.take``); dropping the window removes its folder. The run's
  folder is made by the first seal and removed by ``close()`` (at the run's end, however it
  ends: a break, ``close()``, an error), at the latest when the process exits; a write still
  running in a thread when the run ends removes what it wrote. Nothing is left behind; the folder
  of a run whose process was killed is removed by the next run that makes its folder in
  ``rotation_dir`` (the tag tells a dead writer, ``_storage.writers``).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from typing import Dict, List, Optional, Protocol

import numpy as np

from .._columns import Provenance, Traced, concat, interleave, n_rows, slice_rows, take
from .._npy import HEADER_PARSE
from . import codec as _codec
from . import writers

_PREFIX = "pyloader-rotation-"
PROVENANCE = "provenance-"  # the files of the samples' provenance, beside the codec's (whose names are plain words)


class HeldRows(Protocol):
    """A window's rows: one filling (``Window``), or one sealed (what ``Held.seal`` returns)."""

    @property
    def n(self) -> int: ...

    def take(self, rows: np.ndarray) -> Traced: ...


class Held(Protocol):
    """How chunks are held; ``seal`` runs off the event loop (it may write files)."""

    def chunk(self, rows: Traced) -> Traced: ...

    def rows(self, chunk: Traced) -> int: ...

    def cut(self, chunk: Traced, start: int, end: int) -> Traced: ...

    def take(self, chunk: Traced, positions: np.ndarray) -> Traced: ...

    def seal(self, name: str, window: "Window") -> HeldRows: ...

    def drop(self, window: HeldRows) -> None: ...

    def close(self) -> None: ...


class Window:
    """Rows of chunks put end to end."""

    def __init__(self, held: Held) -> None:
        self.held = held
        self.chunks: List[Traced] = []
        self.ends: List[int] = []  # the rows up to the end of each chunk

    @property
    def n(self) -> int:
        return self.ends[-1] if self.ends else 0

    def add(self, chunk: Traced) -> None:
        self.chunks.append(chunk)
        self.ends.append(self.n + self.held.rows(chunk))

    def take(self, rows: np.ndarray) -> Traced:
        if len(self.chunks) == 1:
            return self.held.take(self.chunks[0], rows)
        starts = [0, *self.ends[:-1]]
        return interleave(np.searchsorted(self.ends, rows, side="right"),
                          lambda i, at: self.held.take(self.chunks[i], rows[at] - starts[i]), "rotation")


class InMemory:
    """Chunks kept as ``batch_encode`` gave them."""

    def chunk(self, rows: Traced) -> Traced:
        return rows

    def rows(self, chunk: Traced) -> int:
        return n_rows(chunk)

    def cut(self, chunk: Traced, start: int, end: int) -> Traced:
        return slice_rows(chunk, start, end)

    def take(self, chunk: Traced, positions: np.ndarray) -> Traced:
        return take(chunk, positions)

    def seal(self, name: str, window: Window) -> HeldRows:
        return window

    def drop(self, window: HeldRows) -> None:
        pass

    def close(self) -> None:
        pass


class _OnDiskWindow:
    """A sealed window: its arrays memory-mapped from its folder (the samples' ``arrays`` as
    ``_storage.codec`` packed them, and their provenance)."""

    def __init__(self, folder: str, n: int, arrays: Dict[str, np.ndarray], provenance: Provenance) -> None:
        self.folder = folder
        self.n = n
        self.arrays = arrays
        self.provenance = provenance

    def take(self, rows: np.ndarray) -> Traced:
        return Traced(_codec.take(self.arrays, rows), Provenance(**take(self.provenance.arrays(), rows)))


def _remove(root: str, pid: int) -> None:
    if os.getpid() == pid:  # never from a forked child: the folder is its parent's
        shutil.rmtree(root, ignore_errors=True)


def _remove_dead_runs(folder: str) -> None:
    """Remove the run folders in ``folder`` of processes that died (killed) without removing them."""
    for name in os.listdir(folder):
        if name.startswith(_PREFIX) and writers.dead(name):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)


def _save(arrays: Dict[str, np.ndarray], folder: str) -> Dict[str, str]:
    """Each array to ``folder/<name>.npy`` (names of ``_storage.codec``'s: plain words), whole or not at all."""
    paths = {}
    for name, array in arrays.items():
        path = os.path.join(folder, f"{name}.npy")
        with open(path + ".tmp", "wb") as f:
            np.save(f, np.ascontiguousarray(array), allow_pickle=False)
        os.replace(path + ".tmp", path)
        paths[name] = path
    return paths


def _loaded(folder: str, n: int, paths: Dict[str, str]) -> _OnDiskWindow:
    """A sealed window's arrays, read back memory-mapped from their ``paths`` (never unpickled)."""
    with HEADER_PARSE:
        loaded = {k: np.load(p, mmap_mode="r", allow_pickle=False) for k, p in paths.items()}
    provenance = {k[len(PROVENANCE):]: loaded.pop(k) for k in list(loaded) if k.startswith(PROVENANCE)}
    return _OnDiskWindow(folder, n, loaded, Provenance(**provenance))


class OnDisk(InMemory):
    """The window being filled in memory; sealed windows as ``.npy`` files under a folder of the run's."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.root: Optional[str] = None
        self._lock = threading.Lock()
        self._closed = False

    def _folder_for(self, name: str) -> Optional[str]:
        """A new folder for window ``name``, or ``None`` once closed."""
        with self._lock:
            if self._closed:
                return None
            if self.root is None:
                os.makedirs(self.folder, exist_ok=True)
                _remove_dead_runs(self.folder)
                self.root = tempfile.mkdtemp(prefix=f"{_PREFIX}{writers.tag()}-", dir=self.folder)
                weakref.finalize(self, _remove, self.root, os.getpid())
            folder = os.path.join(self.root, name)
            os.mkdir(folder)
            return folder

    def seal(self, name: str, window: Window) -> HeldRows:
        """The window written to its folder and read back memory-mapped; ``NotCacheable`` names a field
        that cannot be stored without pickle."""
        rows: Traced = concat(window.chunks, "rotation")
        arrays = _codec.pack(rows.columns, "rotation_dir")
        arrays.update({PROVENANCE + name: array for name, array in rows.provenance.arrays().items()})
        folder = self._folder_for(name)
        if folder is None:
            return window  # the run has ended: nobody will read it
        try:
            paths = _save(arrays, folder)
        finally:
            with self._lock:
                closed = self._closed
                if closed:  # the run ended while this was written: what close() found is gone already
                    shutil.rmtree(str(self.root), ignore_errors=True)
        if closed:
            return window
        return _loaded(folder, window.n, paths)

    def drop(self, window: HeldRows) -> None:
        if isinstance(window, _OnDiskWindow):
            window.arrays, window.provenance = {}, Provenance()
            shutil.rmtree(window.folder, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)
