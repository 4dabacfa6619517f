"""Stream mode's streams other than whole files: slices of files, and in-memory sequences.

In stream mode ``data_dir`` may be a list whose items are paths (a file, read
whole) and ``(path, start, end)`` slices (rows ``start:end`` of the file,
``0 <= start <= end``), or an iterable of in-memory streams, each a dict of
equal-length columns (what ``read_file`` returns) or a sequence (a list or an
array, as the one field ``"data"``). Every item is one stream: a row reads it
from its first sample to its last, so one long file cut into slices feeds
several rows at once. Files and in-memory streams are not mixed.

* A slice is read through the reader like its file (``iter_file``), from row
  ``start`` on, and stops at ``end``; a file that ends before ``end`` is an
  error naming it, when its row gets there. ``__position__`` counts rows of the
  file, so a slice's first step says ``start``.
* In-memory streams are served from this process (no reader method is called;
  the reader's ``batch_size`` still sets the rows); ``<memory i>`` names stream
  ``i`` in messages. They are checked when the loader is built.
* Counts (ranks, ``len``) are known without ``DataReader.count``: a slice holds
  ``end - start`` samples, an in-memory stream its length.
* A resume state fingerprints the slices' files and bounds, or the in-memory
  streams' fields and lengths (not their contents).
"""
from __future__ import annotations

import asyncio
import hashlib
import os
from dataclasses import dataclass
from typing import Any, AsyncGenerator, List, Optional, Tuple, TypeGuard, Union

from .._columns import Columns, check_columns, n_rows, slice_rows
from .._state import files_digest
from .._storage.files import list_files
from .source import Bounds, FileTask

FIELD = "data"  # the field of an in-memory stream given as a bare sequence


@dataclass
class Entries:
    """What a stream-mode ``data_dir`` listed: a name per stream (the file's path, or ``<memory i>``),
    a slice's bounds (``None``: the whole file) and, for in-memory streams, their columns."""

    files: List[str]
    bounds: List[Bounds]
    memory: Optional[List[Columns]]
    listed: List[object]  # data_dir as given, made a list (an iterator is read once)

    def known_counts(self) -> List[Optional[int]]:
        """Samples per stream where known without the reader (``None``: ask ``DataReader.count``)."""
        if self.memory is not None:
            return [n_rows(columns) for columns in self.memory]
        return [None if b is None else b[1] - b[0] for b in self.bounds]

    def digest(self) -> str:
        """The fingerprint of the data: the files and the slices' bounds, or the in-memory streams' layout."""
        if self.memory is not None:
            layout = [f"{sorted(columns)}:{n_rows(columns)}" for columns in self.memory]
            return hashlib.sha1("\n".join(layout).encode()).hexdigest()
        bounds = "\n".join("" if b is None else f"{b[0]}:{b[1]}" for b in self.bounds)
        return hashlib.sha1(f"{files_digest(self.files)}\n{bounds}".encode()).hexdigest()


Path = Union[str, os.PathLike]  # a file of data_dir


def _is_path(item: object) -> TypeGuard[Path]:
    return isinstance(item, (str, os.PathLike))


def _is_slice(item: object) -> TypeGuard[Tuple[Path, object, object]]:
    return isinstance(item, tuple) and len(item) == 3 and _is_path(item[0])


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _bounds(item: Tuple[Path, object, object], k: int) -> Tuple[int, int]:
    _, start, end = item
    if not (_is_int(start) and _is_int(end)):
        raise ValueError(f"data_dir item {k} {item!r}: a slice is (path, start, end) with integer bounds")
    if not 0 <= start <= end:
        raise ValueError(f"data_dir item {k} {item!r}: a slice needs 0 <= start <= end")
    return start, end


def _memory(item: object, k: int) -> Columns:
    where = f"in-memory stream {k} of data_dir"
    if isinstance(item, dict):
        return check_columns(item, None, where)
    if isinstance(item, (bytes, bytearray)) or not hasattr(item, "__len__") or not hasattr(item, "__getitem__"):
        raise ValueError(f"{where}: expected a path, a (path, start, end) slice, a dict of columns or a "
                         f"sequence, got {type(item).__name__}")
    return check_columns({FIELD: item}, None, where)


def parse_entries(data_dir: object, stream: bool) -> Optional[Entries]:
    """The streams ``data_dir`` lists when it lists slices or in-memory streams; ``None`` when it is
    an ordinary ``data_dir`` (a folder, a glob, a URL, a list of paths), for ``list_files``."""
    if _is_path(data_dir) or not hasattr(data_dir, "__iter__"):
        return None
    listed = list(data_dir)
    if all(_is_path(item) for item in listed):
        return None
    if not stream:
        raise _not_paths(listed)
    return _streams(listed)


def _streams(listed: List[object]) -> Entries:
    """Stream mode's streams: files and slices of files, or in-memory streams."""
    if any(_is_path(item) or _is_slice(item) for item in listed):
        return _file_entries(listed)
    return _memory_entries(listed)


def _not_paths(listed: List[object]) -> ValueError:
    """The error for a ``data_dir`` that lists streams outside stream mode, naming its first non-path."""
    k, item = next((k, item) for k, item in enumerate(listed) if not _is_path(item))
    return ValueError(f"data_dir item {k} is a {type(item).__name__}: outside stream mode data_dir lists paths "
                      f"((path, start, end) slices and in-memory streams are streams of stream=True)")


def _memory_entries(listed: List[object]) -> Entries:
    """In-memory streams: dicts of columns, or sequences (one field, ``FIELD``)."""
    memory = [_memory(item, k) for k, item in enumerate(listed)]
    return Entries([f"<memory {k}>" for k in range(len(memory))], [None] * len(memory), memory, listed)


def _file_entries(listed: List[object]) -> Entries:
    """Files read whole and ``(path, start, end)`` slices of files."""
    paths: List[Path] = []
    bounds: List[Bounds] = []
    for k, item in enumerate(listed):
        if _is_path(item):
            paths.append(item)
            bounds.append(None)
        elif _is_slice(item):
            paths.append(item[0])
            bounds.append(_bounds(item, k))
        else:
            raise ValueError(f"data_dir item {k} is a {type(item).__name__} among files: list files and "
                             f"(path, start, end) slices, or in-memory streams only")
    return Entries(list_files(paths), bounds, None, listed)


class MemoryRunner:
    """A runner for in-memory streams: their pieces come from this process; ``run`` (encoding and
    collating) is the wrapped runner's."""

    def __init__(self, runner: Any, memory: List[Columns]) -> None:
        self.memory = memory
        self.run = runner.run
        self.encoding_only = runner.encoding_only

    async def pieces(self, task: FileTask, fetch: bool,
                     demand: Optional[asyncio.Event] = None) -> AsyncGenerator[Tuple[int, Columns, None, int], None]:
        columns = self.memory[task.index]
        end = n_rows(columns) if task.end is None else task.end
        if end > task.start:
            yield end - task.start, slice_rows(columns, task.start, end), None, 0


def with_memory(runner: Any, entries: Optional[Entries]) -> Any:
    return runner if entries is None or entries.memory is None else MemoryRunner(runner, entries.memory)


def stream_data(data_dir: Any, stream: bool, retries: int = 3) -> Tuple[List[str], Optional[Entries]]:
    """The loader's files (a name per stream) and, when ``data_dir`` lists slices or in-memory
    streams, what it lists."""
    entries = parse_entries(data_dir, stream)
    return (list_files(data_dir, retries), None) if entries is None else (entries.files, entries)


def bounds_of(entries: Optional[Entries]) -> Optional[List[Bounds]]:
    return None if entries is None else entries.bounds


def known_counts(entries: Optional[Entries]) -> Optional[List[Optional[int]]]:
    return None if entries is None else entries.known_counts()
