"""What ``write`` reads: the kinds of input, each cut into parts (tasks) in input order.

Contracts:

- ``samples``: an iterable of dicts (a list, a generator, a HF ``IterableDataset``). It is iterated
  once, in this process; each part carries its samples to the task.
- ``indexed``: an object with ``__len__`` and ``__getitem__`` giving dicts (a HF ``Dataset``, anything
  alike), not a list or tuple. A part is a range of indexes; the object itself goes with each task
  (a HF ``Dataset`` of files on disk pickles as their paths), which reads its rows. One that does not
  pickle, or pickles to more than ``TRAVEL_BYTES`` (a dataset in memory), is read here, in order, and
  its rows sent as an iterable's: the same parts, the same chunks.
- ``files``: a folder (or glob, or list) of files of any kind. Files whose names share a key (the
  path below the folder up to the first dot of the base name, as webdataset's, ``img/001.jpg`` and
  ``img/001.cls``) are one sample, ``{"__key__": "img/001", "jpg": b"...", "cls": b"..."}``, the bytes
  read by the task.
- ``table``: Parquet, CSV, TSV or JSON lines files (told by the names, compressed or not), or any files
  a ``DataReader`` given reads. One part per file, read by the task with the reader, a row a sample.

A path is ``table`` when a reader is given or every file's name says a table format, else ``files``.
The parts, and so the chunks, depend on the input and the sizes only, never on the workers.
"""
from __future__ import annotations

import itertools
import os
import pickle
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Sized, Tuple, cast

from .._abc import DataReader
from .._storage.compression import SUFFIXES
from .._storage.count_index import index_folder, names_in
from .._storage.files import list_files, read_whole
from ..readers._tar import split_name

Sample = Dict[str, object]
KINDS = ("auto", "samples", "indexed", "files", "table")
TRAVEL_BYTES = 16 * 2**20
TABLE_SUFFIXES = (".parquet", ".arrow", ".feather", ".csv", ".tsv", ".jsonl", ".ndjson", ".json")


@dataclass(frozen=True)
class Part:
    """One task's input: ``kind`` and what the task needs to read it (see the module)."""

    kind: str
    payload: object
    first: int  # the input position of its first unit (a sample, an index, a key or a file)
    units: int

    def describe(self) -> str:
        what = {"samples": "samples", "indexed": "indexes", "files": "keys", "table": "file"}[self.kind]
        if self.kind == "table":
            return f"the file {cast(Tuple[str, DataReader], self.payload)[0]!r}"
        return f"{what} {self.first}-{self.first + self.units - 1} of the input"


def _bare_name(path: str) -> str:
    """The name without a compression suffix, in lower case."""
    name = path.rsplit("/", 1)[-1].lower()
    for codec_suffix in SUFFIXES:
        if name.endswith(codec_suffix):
            return name[:-len(codec_suffix)]
    return name


def reader_for(path: str) -> DataReader:
    """The built-in reader of a table file, told by its name; ``ValueError`` naming it otherwise."""
    name = _bare_name(path)
    if name.endswith((".parquet", ".arrow", ".feather")):
        from ..readers import ParquetReader

        return ParquetReader()
    if name.endswith((".csv", ".tsv")):
        from ..readers import CSVReader

        return CSVReader(delimiter="\t" if name.endswith(".tsv") else ",")
    if name.endswith((".jsonl", ".ndjson", ".json")):
        from ..readers import JsonLinesReader

        return JsonLinesReader()
    raise ValueError(f"{path!r} is not a Parquet, CSV or JSON lines file by its name: pass reader= to read it")


def _is_paths(source: object) -> bool:
    if isinstance(source, (str, os.PathLike)):
        return True
    return isinstance(source, (list, tuple)) and bool(source) and \
        all(isinstance(s, (str, os.PathLike)) for s in source)


def _files_of(source: object) -> Tuple[List[str], str]:
    """Every file of a path, or of each path of a list (a folder walked, a glob matched), and the folder
    the keys of ``files`` are named from."""
    specs = [os.fspath(source)] if isinstance(source, (str, os.PathLike)) else \
        [os.fspath(s) for s in cast(Sequence[str], source)]
    files = [f for spec in specs for f in list_files(spec)]
    return files, index_folder(specs[0] if len(specs) == 1 else None, files)


class Source:
    """An input, told apart by ``kind_of``; ``parts(size)`` cuts it, ``size()`` units each (asked
    before each part, so that the first part's result can size the rest)."""

    def __init__(self, kind: str, parts: Callable[[Callable[[], int]], Iterator[Part]],
                 total: Optional[int]) -> None:
        self.kind, self._parts, self.total = kind, parts, total

    def parts(self, size: Callable[[], int]) -> Iterator[Part]:
        return self._parts(size)


def source_of(source: object, *, kind: str = "auto", reader: Optional[DataReader] = None) -> Source:
    """``source`` as a ``Source`` of ``kind`` (``"auto"``: told as the module says)."""
    if kind not in KINDS:
        raise ValueError(f"unknown source kind {kind!r}: expected one of {list(KINDS)}")
    if _is_paths(source) and kind in ("auto", "files", "table"):
        return _path_source(source, kind, reader)
    if kind in ("files", "table"):
        raise TypeError(f"source kind {kind!r} takes a path or a list of paths, got {type(source).__name__}")
    if kind == "indexed" or (kind == "auto" and _is_indexed(source)):
        return _indexed_source(source)
    return _iterable_source(source)


def _indexed_source(source: object) -> Source:
    """A source read by index: by index in the workers where it travels to them, else row by row here."""
    n = len(cast(Sized, source))
    if _travels(source):
        return Source("indexed", lambda size: _index_parts(source, n, size), n)
    rows = (cast(Sequence[Sample], source)[i] for i in range(n))
    return Source("samples", lambda size: _sample_parts(rows, size), n)


def _iterable_source(source: object) -> Source:
    if not isinstance(source, Iterable) or isinstance(source, (str, bytes, dict)):
        raise TypeError(f"write takes an iterable of dict samples, an object with __len__ and __getitem__, "
                        f"a path or a list of paths, got {type(source).__name__}")
    total = len(source) if isinstance(source, Sized) else None
    return Source("samples", lambda size: _sample_parts(iter(source), size), total)


def _is_indexed(source: object) -> bool:
    """Whether ``source`` is read by index: ``__len__`` and ``__getitem__``, and no list, tuple, string or dict."""
    return hasattr(source, "__len__") and hasattr(source, "__getitem__") and \
        not isinstance(source, (list, tuple, str, bytes, dict))


def _travels(source: object) -> bool:
    """Whether an object read by index goes with each task: it pickles, in ``TRAVEL_BYTES`` at most (a HF
    ``Dataset`` of files does, as their paths); else its rows are read here and sent, as an iterable's."""
    try:
        return len(pickle.dumps(source)) <= TRAVEL_BYTES
    except Exception:  # pickle's errors, or the object's own
        return False


def _path_source(source: object, kind: str, reader: Optional[DataReader]) -> Source:
    files, folder = _files_of(source)
    tables = reader is not None or all(_bare_name(f).endswith(TABLE_SUFFIXES) for f in files)
    if kind == "table" or (kind == "auto" and tables):
        return Source("table", lambda size: _table_parts(files, reader), len(files))
    return _key_source(files, folder)


def _key_source(files: List[str], folder: str) -> Source:
    keys: Dict[str, List[Tuple[str, str]]] = {}  # key -> [(extension, path)], in the order listed
    for path, name in zip(files, names_in(folder, files)):
        key, ext = split_name(name) or (name, "")
        keys.setdefault(key, []).append((ext, path))
    grouped = list(keys.items())

    def parts(size: Callable[[], int]) -> Iterator[Part]:
        first = 0
        while first < len(grouped):
            n = size()
            yield Part("files", grouped[first:first + n], first, len(grouped[first:first + n]))
            first += n

    return Source("files", parts, len(grouped))


def _table_parts(files: Sequence[str], reader: Optional[DataReader]) -> Iterator[Part]:
    for k, path in enumerate(files):
        yield Part("table", (path, reader if reader is not None else reader_for(path)), k, 1)


def _index_parts(source: object, n: int, size: Callable[[], int]) -> Iterator[Part]:
    first = 0
    while first < n:
        stop = min(n, first + size())
        yield Part("indexed", (source, first, stop), first, stop - first)
        first = stop


def _sample_parts(samples: Iterator[Sample], size: Callable[[], int]) -> Iterator[Part]:
    first = 0
    while True:
        taken = list(itertools.islice(samples, size()))
        if not taken:
            return
        yield Part("samples", taken, first, len(taken))
        first += len(taken)


# -- in the task --------------------------------------------------------------------------
def _file_sample(key: str, members: List[Tuple[str, str]]) -> Sample:
    sample: Sample = {"__key__": key}
    for ext, path in members:
        sample[ext or "data"] = read_whole(path)
    return sample


def _rows(path: str, reader: DataReader) -> Iterator[Sample]:
    for columns in reader.iter_file(path):
        names = list(columns)
        values = [columns[name] for name in names]
        n = len(values[0]) if values else 0
        for i in range(n):
            yield {name: column[i] for name, column in zip(names, values)}


def _indexed(payload: object) -> Iterator[Sample]:
    source, start, stop = cast(Tuple[Sequence[Sample], int, int], payload)
    return (source[i] for i in range(start, stop))


def _keyed(payload: object) -> Iterator[Sample]:
    return (_file_sample(key, members) for key, members in cast(List[Tuple[str, List[Tuple[str, str]]]], payload))


def _table(payload: object) -> Iterator[Sample]:
    return _rows(*cast(Tuple[str, DataReader], payload))


_READ: Dict[str, Callable[[object], Iterator[Sample]]] = {
    "samples": lambda payload: iter(cast(List[Sample], payload)), "indexed": _indexed, "files": _keyed,
    "table": _table}


def samples_of(part: Part) -> Iterator[Sample]:
    """The samples of ``part``, read where the task runs."""
    return _READ[part.kind](part.payload)
