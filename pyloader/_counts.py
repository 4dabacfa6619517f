"""The samples of each file (``DataReader.count``): from an index where it still matches, the rest counted concurrently.

Contracts:

- Indexes (``_storage.count_index``): the one next to the data (written by ``python -m pyloader
  index``) and, with ``cache_dir``, the loader's own there. Each is read in one request; an entry
  is used only while its file has the size and version it was counted at. Files that no longer
  match are counted again and named in a warning. The loader writes only the index in
  ``cache_dir`` (after it had to count), never next to the data.
- The files left are counted ``COUNT_THREADS`` at a time (one at a time, under its lock, for a
  reader that is not thread-safe), with a progress bar on request. ``stop`` (an event) makes the
  counts not yet begun never begin: a count that began runs to its end (user code cannot be
  interrupted), so a stop waits for at most one count per thread.
- A count that fails is a ``PipelineError`` naming the file, returned with the file's place;
  with ``first_failure_stops`` the counts not yet begun are then not begun.
- Mixed sources and stream entries (slices, in-memory streams) use no index.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple, TypeVar

from ._abc import DataReader
from ._errors import PipelineError
from ._execution.runners import Exclusive
from ._length import checked_count
from ._stats import Counting
from ._storage import count_index as ix

if TYPE_CHECKING:
    from tqdm import tqdm

logger = logging.getLogger("pyloader")
_T = TypeVar("_T")

COUNT_THREADS = 64  # remote counts wait on the network: many at once (a local one mostly on the disk cache)
_STALE_NAMED = 5


@dataclass
class Counted:
    """The counts of a loader's files (``None`` where a count failed), and how they were had."""

    counts: List[Optional[int]]
    failures: List[Tuple[int, PipelineError]] = field(default_factory=list)  # in the files' order
    seconds: float = 0.0
    counted: int = 0  # files whose count was asked of the reader
    indexed: int = 0  # files whose count came from an index
    stale: List[str] = field(default_factory=list)  # files an index held, changed since
    runs: Dict[int, Dict[str, object]] = field(default_factory=dict)  # where samples start, from an index

    def take_failures(self) -> List[Tuple[int, PipelineError]]:
        """The failures, handed over once. Kept here, an error would be held in a cycle: its cause's
        traceback reaches the user's ``count`` frame, whose parents (the counting thread's) hold this."""
        failures, self.failures = self.failures, []
        return failures


@dataclass
class IndexPlaces:
    """Where the indexes of a loader's data are: next to the data, and in ``cache_dir``."""

    key: ix.IndexKey
    folder: str  # the data's folder: names in the index next to the data are relative to it
    data_index: str
    cache_index: Optional[str]

    @classmethod
    def of(cls, reader: DataReader, data_dir: object, files: Sequence[str],
           cache_folder: Optional[str]) -> "IndexPlaces":
        key = ix.count_key(reader)
        folder = ix.index_folder(data_dir, files)
        cache = None if cache_folder is None else ix.cache_index_path(cache_folder, key, folder)
        return cls(key, folder, ix._join(folder, ix.INDEX_NAME), cache)

    def read(self) -> Tuple[List[ix.Entries], List[ix.Entries]]:
        """The entries of the index next to the data, and of the one in ``cache_dir`` (each list empty or one)."""
        return _read(self.data_index, self.key), _read(self.cache_index, self.key)


    def lookup(self, paths: List[str], now: Sequence[Optional[ix.Stamp]], data: List[ix.Entries],
               kept: List[ix.Entries]) -> ix.Lookup:
        """The counts the index next to the data gives, else the one in ``cache_dir`` (whose names are
        the paths as listed): it may hold a file the index next to the data no longer matches."""
        names = ix.names_in(self.folder, paths)
        result = ix.lookup(paths, names, now, data)
        again = ix.lookup(paths, paths, now, kept)  # stale is reported of the index next to the data only
        result.counts = [a if a is not None else b for a, b in zip(result.counts, again.counts)]
        result.runs = [a if a is not None else b for a, b in zip(result.runs, again.runs)]
        return result


class Counter:
    """Counts a loader's files, using and keeping its indexes (``None``: no index, as for mixed sources)."""

    def __init__(self, reader: DataReader, files: Sequence[str], exclusive: Exclusive,
                 places: Optional[IndexPlaces], counting: Optional[Counting] = None) -> None:
        self.reader = reader
        self.counting = counting or Counting()  # the loader's stats of counting
        self._lock = threading.Lock()  # len() and a run's start may count at once: the second waits, then reuses
        self._done: Optional[Counted] = None  # every count, once all succeeded
        self.files = list(files)
        self.exclusive = exclusive
        self.places = places

    def count(self, known: Optional[Sequence[Optional[int]]] = None, *, first_failure_stops: bool = True,
              stop: Optional[threading.Event] = None, progress: bool = False) -> Counted:
        """The count of every file (``known[i]``, where not ``None``, is file ``i``'s without asking)."""
        with self._lock:
            if self._done is not None:
                return Counted(list(self._done.counts), runs=self._done.runs)
            out = self._count_all(known, first_failure_stops, stop, progress)
            if None not in out.counts:  # not when a count failed, nor when stopped before every count began
                self._done = Counted(list(out.counts), runs=out.runs)
            return out

    def _count_all(self, known: Optional[Sequence[Optional[int]]], first_failure_stops: bool,
                   stop: Optional[threading.Event], progress: bool) -> Counted:
        began = time.perf_counter()
        counts = _starting_counts(known, len(self.files))
        need = _unknown(counts)
        out = Counted(counts)
        places = self.places
        stamps = self._from_indexes(places, need, out) if places is not None and need else {}
        left = _unknown(counts)  # of ``need``: the others were known already
        self._count(left, out, first_failure_stops, stop or threading.Event(), progress)
        out.counted = len(left)
        if left and places is not None and places.cache_index is not None:  # what is counted is kept there
            self._keep(places.cache_index, places.key, need, counts, stamps)
        out.seconds = time.perf_counter() - began
        self.counting.add(out.counted, out.indexed, len(out.stale), out.seconds)
        return out

    def _from_indexes(self, places: IndexPlaces, need: List[int], out: Counted) -> Dict[int, ix.Stamp]:
        """Fill ``out.counts`` from the indexes; the stamps of the files (those found now)."""
        data, kept = places.read()
        if not data and places.cache_index is None:  # without cache_dir, ``kept`` is empty too
            return {}  # no index to check against nor to keep: no file need be looked at
        paths = [self.files[i] for i in need]
        now = ix.stamps(paths, places.folder)
        found = _held(need, now)
        result = places.lookup(paths, now, data, kept)
        for i, n in zip(need, result.counts):
            out.counts[i] = n
        out.runs.update(_held(need, result.runs))
        out.indexed = sum(n is not None for n in result.counts)
        out.stale = result.stale
        if result.stale:
            _warn_stale(places.data_index, result.stale)
        return found

    def _count(self, left: List[int], out: Counted, first_failure_stops: bool, stop: threading.Event,
               progress: bool) -> None:
        keys = self.exclusive.keys([self.reader])
        failed = threading.Event()
        bar = _bar(len(left)) if progress and left else None
        lock = threading.Lock()

        def one(i: int) -> None:
            if stop.is_set() or (first_failure_stops and failed.is_set()):
                return
            try:
                out.counts[i] = self.exclusive.call(keys, checked_count, self.reader, self.files[i])
            except PipelineError as exc:
                failed.set()
                with lock:
                    out.failures.append((i, exc))
            if bar is not None:
                with lock:
                    bar.update(1)

        try:
            if keys or len(left) < 2:
                for i in left:
                    one(i)
            else:
                with ThreadPoolExecutor(min(COUNT_THREADS, len(left)), thread_name_prefix="pyloader-count") as pool:
                    list(pool.map(one, left))
        finally:
            if bar is not None:
                bar.close()
        out.failures.sort(key=lambda f: f[0])

    def _keep(self, cache_index: str, key: ix.IndexKey, need: List[int], counts: List[Optional[int]],
              stamps: Dict[int, ix.Stamp]) -> None:
        """Write what was counted, and what the indexes gave, to the index in ``cache_dir`` (``cache_index``);
        a failure to write is logged, the counts are good."""
        entries = {self.files[i]: ix.entry(stamps[i], n) for i in need
                   if i in stamps and (n := counts[i]) is not None}
        try:
            ix.write_index(cache_index, key, entries)
        except OSError as exc:
            logger.warning("pyloader: the count index in cache_dir %r cannot be written: %s", cache_index, exc)


def _held(need: List[int], found: Sequence[Optional[_T]]) -> Dict[int, _T]:
    """``found[k]`` for file ``need[k]``, by file, where it is not ``None`` (the sample index an index holds,
    the stamp of a file found)."""
    return {i: r for i, r in zip(need, found) if r is not None}


def _starting_counts(known: Optional[Sequence[Optional[int]]], files: int) -> List[Optional[int]]:
    """The counts a count starts from: a copy of ``known``, or ``None`` for each of the ``files``."""
    return list(known) if known is not None else [None] * files


def _unknown(counts: Sequence[Optional[int]]) -> List[int]:
    """The positions of ``counts`` not known (``None``), in order."""
    return [i for i, n in enumerate(counts) if n is None]


def _read(index: Optional[str], key: ix.IndexKey) -> List[ix.Entries]:
    """The entries of the index at ``index``: a list of one, or empty (no index there, or no ``index``)."""
    found = None if index is None else ix.read_index(index, key)
    return [] if found is None else [found]


def _warn_stale(index: str, stale: List[str]) -> None:
    named = ", ".join(repr(p) for p in stale[:_STALE_NAMED])
    more = f" and {len(stale) - _STALE_NAMED} more" if len(stale) > _STALE_NAMED else ""
    logger.warning("pyloader: the count index %r no longer matches %d files (changed since it was written: "
                   "%s%s): counted again; `python -m pyloader index` brings it up to date",
                   index, len(stale), named, more)


def _bar(total: int) -> tqdm:
    from ._frameworks.progress import counting_bar

    return counting_bar(total)
