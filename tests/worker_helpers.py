"""Importable, picklable pieces for ``test_workers.py``.

Worker processes started with ``spawn`` or ``forkserver`` unpickle the reader,
dataset, collator and ``worker_init_fn``: that only works for classes defined at
module level in a module the worker can import, which is what this module is for
(the tests folder is on ``sys.path`` under pytest and in the subprocess scripts).

Every fault the worker tests inject lives here, keyed by a file's base name or a
sample id, so the same reader works in the parent and in any worker.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import pyloader as pl


class UnpicklableError(Exception):
    """An exception that cannot cross a process boundary: it holds a lock."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def refuse_to_read(name: str) -> None:
    """A named function for the worker's traceback to mention."""
    raise OSError(f"disk says no to {name}")


def explode_in_encode(sample_id: int) -> None:
    raise ValueError(f"cannot encode sample {sample_id}")


def explode_in_collate(sample_id: int) -> None:
    raise KeyError(f"cannot collate sample {sample_id}")


def crash_with_segfault() -> None:
    ctypes.string_at(0)  # reads address 0: SIGSEGV


class NumReader(pl.DataReader):
    """One integer id per line, column ``id``.

    ``piece``: ``iter_file`` yields pieces of that many lines (default: the whole file).
    Faults, by file base name: ``delay`` (seconds slept per file), ``fail_on`` (OSError
    from ``refuse_to_read``), ``exit_on`` (``os._exit(3)``), ``unpicklable_on``
    (``UnpicklableError``), ``hang_on`` (writes ``busy-<pid>`` into ``marker_dir`` and
    sleeps a minute).
    """

    def __init__(self, batch_size: int = 4, shuffle: bool = False, random_seed: int = 42,
                 piece: Optional[int] = None, delay: float = 0.0, fail_on: Iterable[str] = (),
                 exit_on: Iterable[str] = (), unpicklable_on: Iterable[str] = (), hang_on: Iterable[str] = (),
                 marker_dir: Optional[str] = None) -> None:
        super().__init__(batch_size, shuffle=shuffle, random_seed=random_seed)
        self.piece = piece
        self.delay = delay
        self.fail_on = frozenset(fail_on)
        self.exit_on = frozenset(exit_on)
        self.unpicklable_on = frozenset(unpicklable_on)
        self.hang_on = frozenset(hang_on)
        self.marker_dir = marker_dir

    def _load(self, path: str) -> List[int]:
        name = os.path.basename(path)
        if self.delay:
            time.sleep(self.delay)
        if name in self.hang_on:
            Path(self.marker_dir, f"busy-{os.getpid()}").write_text(path)
            time.sleep(60)
        if name in self.exit_on:
            os._exit(3)
        if name in self.fail_on:
            refuse_to_read(name)
        if name in self.unpicklable_on:
            raise UnpicklableError(f"cannot pickle me, from {name}")
        with open(path) as f:
            return [int(line) for line in f if line.strip()]

    def read_file(self, path: str) -> Tuple[Dict[str, list], int]:
        ids = self._load(path)
        return {"id": ids}, len(ids)

    def iter_file(self, path: str) -> Iterator[Dict[str, list]]:
        ids = self._load(path)
        if self.piece is None:
            yield {"id": ids}
            return
        for start in range(0, len(ids), self.piece):
            yield {"id": ids[start:start + self.piece]}


class PidReader(NumReader):
    """Each sample also carries the pid of the process that read its file."""

    def iter_file(self, path: str) -> Iterator[Dict[str, list]]:
        for piece in super().iter_file(path):
            yield {**piece, "pid": [os.getpid()] * len(piece["id"])}


class PassThrough(pl.Dataset):
    """``batch_encode`` keeping every column as it is (lists stay lists)."""

    def batch_encode(self, batch_data):
        return dict(batch_data)


class EncodeDataset(pl.Dataset):
    """Adds ``sq`` (id squared); ``fail_on_id`` raises ValueError, ``segv_on_id`` segfaults."""

    def __init__(self, fail_on_id: Optional[int] = None, segv_on_id: Optional[int] = None,
                 exit_on_id: Optional[int] = None) -> None:
        self.fail_on_id = fail_on_id
        self.segv_on_id = segv_on_id
        self.exit_on_id = exit_on_id

    def batch_encode(self, batch_data):
        ids = [int(i) for i in batch_data["id"]]
        if self.segv_on_id in ids:
            crash_with_segfault()
        if self.exit_on_id in ids:
            os._exit(5)
        if self.fail_on_id in ids:
            explode_in_encode(self.fail_on_id)
        return {"id": ids, "sq": [i * i for i in ids]}


class ExitingDataset(pl.Dataset):
    """``batch_encode`` asks to exit on the batch holding id 9."""

    def __init__(self, exc_type: type) -> None:
        self.exc_type = exc_type

    def batch_encode(self, batch):
        if 9 in batch["id"]:
            raise self.exc_type(3) if self.exc_type is SystemExit else self.exc_type()
        return batch


class ListCollator(pl.DataCollator):
    """Columns as plain lists; ``fail_on_id`` raises KeyError from ``explode_in_collate``."""

    def __init__(self, fail_on_id: Optional[int] = None) -> None:
        self.fail_on_id = fail_on_id

    def collate_batch(self, features):
        out = {k: [v.item() if hasattr(v, "item") else v for v in col] for k, col in features.items()}
        if self.fail_on_id is not None and self.fail_on_id in out.get("id", ()):
            explode_in_collate(self.fail_on_id)
        return out


class InitRecorder:
    """A ``worker_init_fn`` that leaves ``<worker_id>-<pid>`` in ``folder`` (and, if asked, prints it)."""

    def __init__(self, folder: str, echo: bool = False) -> None:
        self.folder = folder
        self.echo = echo

    def __call__(self, worker_id: int) -> None:
        Path(self.folder, f"{worker_id}-{os.getpid()}").touch()
        if self.echo:
            print(f"worker {worker_id} pid {os.getpid()}", flush=True)
            sys.stdout.flush()


def recorded_workers(folder: str) -> List[Tuple[int, int]]:
    """``(worker_id, pid)`` for every worker an ``InitRecorder`` saw, sorted."""
    out = []
    for name in os.listdir(folder):
        wid, _, pid = name.partition("-")
        if wid.isdigit() and pid.isdigit():
            out.append((int(wid), int(pid)))
    return sorted(out)


def refuse_to_init(worker_id: int) -> None:
    """A ``worker_init_fn`` that fails, from a named function for the traceback to mention."""
    raise ValueError(f"no device for worker {worker_id}")


def cannot_be_rebuilt(text: str) -> None:
    raise ValueError(f"cannot be rebuilt here: {text}")


class RebuildFails:
    """Pickles fine in a worker, but unpickling it (in the loader) raises ValueError."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __reduce__(self):
        return cannot_be_rebuilt, (self.text,)


class OddResultCollator(ListCollator):
    """Like ``ListCollator``, but the batch holding ``on_id`` gets an odd extra column:
    ``"lock"``, which cannot be pickled, or ``"rebuild"``, which cannot be unpickled."""

    def __init__(self, on_id: int, odd: str) -> None:
        super().__init__()
        self.on_id = on_id
        self.odd = odd

    def collate_batch(self, features):
        out = super().collate_batch(features)
        if self.on_id in out["id"]:
            out["odd"] = threading.Lock() if self.odd == "lock" else RebuildFails(f"batch of {self.on_id}")
        return out


class BlobCollator(pl.DataCollator):
    """``id`` and ``blob``: per sample ``width`` float64 copies of its id, so that a batch's
    arrays travel out of band (through a memfd), not inside the pickle."""

    def __init__(self, width: int = 4096) -> None:
        self.width = width

    def collate_batch(self, features):
        import numpy as np

        ids = np.asarray(features["id"], dtype=np.int64)
        return {"id": ids, "blob": np.repeat(ids.astype(np.float64)[:, None], self.width, axis=1)}


class OpenFileReader(NumReader):
    """Reads ``piece`` lines at a time and keeps the file open in between (the default reader
    loads each file first): a file left mid-read stays open in the process reading it."""

    def iter_file(self, path: str) -> Iterator[Dict[str, list]]:
        with open(path) as f:
            ids: List[int] = []
            for line in f:
                ids.append(int(line))
                if len(ids) == self.piece:
                    yield {"id": ids}
                    ids = []
            if ids:
                yield {"id": ids}


class LockReader(NumReader):
    """Like ``NumReader``, but the files named in ``locked`` also give a column of locks,
    which cannot be pickled."""

    def __init__(self, batch_size: int = 4, locked: Iterable[str] = ()) -> None:
        super().__init__(batch_size)
        self.locked = frozenset(locked)

    def iter_file(self, path: str) -> Iterator[Dict[str, list]]:
        for piece in super().iter_file(path):
            if os.path.basename(path) in self.locked:
                piece = {**piece, "lock": [threading.Lock() for _ in piece["id"]]}
            yield piece
