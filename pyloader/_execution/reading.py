"""Cutting one file into pieces, where user code runs (a thread of this process or a worker process).

``pieces_with_end(reader, task)`` is what both runners (``_execution.runners``, ``_execution.worker``)
call for a ``FileTask``: the file's validated pieces, in the order the batcher consumes them,
each with whether the file is known to end there and how many samples ``filter_fn`` dropped.
Contracts: a file goes through the reading method its reader's class defines last (``whole_file``);
with in-file shuffling its samples take one permutation seeded by ``(random_seed, epoch, file index)``;
a task's ``start:end`` are cut out here, and a file holding more or fewer samples than its ``count``
said is a ``ValueError`` naming it. Under weighted sources (``Readers``) each file is read by its
source's reader.

``FileTask`` and ``Readers`` live here rather than with the stages that plan them
(``_stages.source``, ``_stages.sources``): the runners and worker processes take them,
and execution imports nothing from the stages.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Generator, Iterator, Mapping, Optional, Sequence, Tuple, Union, cast

from .._abc import DataReader, read_result
from .._columns import Columns, concat, n_rows, slice_rows, take
from .._rng import IN_FILE, USER_READ, derive_rng, drawing, stepped
from .._sample_index import Extent
from .._stats import BusySink, clocked, timed
from .._storage.files import Served, prefetched
from .filter import unbundle


@dataclass(frozen=True)
class FileTask:
    """File ``path`` is the ``pos``-th file of ``epoch``; ``index`` is its place in the sorted list.

    Only rows ``start:end`` are read (``end=None``: to the end); ``pad`` marks
    rows read again only to even out the ranks' step counts; ``count`` is what
    ``DataReader.count`` said the file holds (under ranks; the file is checked against it).
    """

    epoch: int
    pos: int
    index: int
    path: str
    start: int = 0
    end: Optional[int] = None
    pad: bool = False
    count: Optional[int] = None
    seed: int = 0  # the loader's ``random_seed``: what ``pyloader.rng()`` draws from in the reader
    ranged: bool = False  # rows ``start:end`` read alone where the reader can (the global order, ``_stages.tiles``)
    ranges: Tuple[Tuple[int, int], ...] = ()  # with ``ranged``: the rows read, in file order (``start:end`` spans them)
    extents: Tuple[Extent, ...] = ()  # where each range lies in a line file's bytes, from the sample index


class Readers(DataReader):
    """Reads each file with its source's reader. The loader reads through ``pick(path)`` (``pieces_with_end``),
    so each source's own ``shuffle`` and ``random_seed`` apply; the other methods dispatch too."""

    def __init__(self, batch_size: int, readers: Sequence[DataReader], owner: Mapping[str, int]) -> None:
        super().__init__(batch_size)
        self.readers = list(readers)
        self.owner = dict(owner)

    def pick(self, path: str) -> DataReader:
        return self.readers[self.owner[path]]

    def read_file(self, path: str) -> Tuple[Mapping[str, object], int]:
        return self.pick(path).read_file(path)

    def iter_file(self, path: str) -> Iterator[Mapping[str, object]]:
        return self.pick(path).iter_file(path)

    def count(self, path: str) -> int:
        return self.pick(path).count(path)

    def _reads_ranges(self, path: str) -> bool:  # the read-ahead's questions (``_storage.bytes``)
        return bool(getattr(self.pick(path), "_reads_ranges", lambda _: False)(path))

    def _maps_itself(self, path: str) -> bool:
        return bool(getattr(self.pick(path), "_maps_itself", lambda _: False)(path))


class SafeReaders(Readers):
    """``Readers`` whose readers are all thread-safe."""

    thread_safe = True


def picked(reader: DataReader, path: str) -> DataReader:
    """The reader that reads ``path``: a source's own one under ``Readers``, else ``reader``."""
    return reader.pick(path) if isinstance(reader, Readers) else reader


def file_pieces(reader: DataReader, task: FileTask, data: Union[None, bytes, Served] = None,
                busy: Optional[BusySink] = None) -> Iterator[Columns]:
    """The validated pieces of one file, in the order the batcher consumes them.

    The file goes through ``read_file`` or streams through ``iter_file`` (``whole_file``); with
    in-file shuffling its whole content takes one seeded permutation. ``data``: the file's bytes,
    read ahead (``open_file`` serves them).
    The reader's own time goes to ``busy`` as ``read_file``.
    """
    with prefetched(task.path, data):
        if task.ranged:
            yield from _ranged(reader, task, busy)
            return
        if task.start == 0 and task.end is None:
            yield from _pieces(reader, task, busy)
            return
        assert task.end is not None, "a share of a file names where it ends"
        yield from _share(_pieces(reader, task, busy), task, task.end)


def _share(pieces: Iterator[Columns], task: FileTask, end: int) -> Iterator[Columns]:
    """Rows ``task.start:end`` of the file's ``pieces`` (a rank's share of the file, or a slice of it)."""
    offset = 0
    for piece in pieces:
        n = n_rows(piece)
        lo, hi = max(task.start - offset, 0), min(end - offset, n)
        if lo < hi:
            yield piece if (lo, hi) == (0, n) else slice_rows(piece, lo, hi)
        offset += n
        if offset >= end:
            _check_no_more(pieces, task, offset, end)
            return
    if offset >= end:  # no rows asked for: a file counted empty, read to check that it is
        return
    raise _too_short(task, offset)


def _check_no_more(rest: Iterator[Columns], task: FileTask, offset: int, end: int) -> None:
    """The share that ends where the count says the file ends (at ``end``, its pieces read to ``offset``)
    checks there is no more: ``rest`` holds no row."""
    if end == task.count and (offset > end or any(n_rows(p) for p in rest)):
        raise ValueError(f"file {task.path!r} has more samples than the {task.count} "
                         f"DataReader.count said: the rest would be lost")


def _too_short(task: FileTask, offset: int) -> ValueError:
    if task.count is None:  # no count: a stream-mode slice (path, start, end)
        return ValueError(f"file {task.path!r} has {offset} samples, fewer than the slice {task.start}:{task.end} "
                          f"of it asks for")
    return ValueError(f"file {task.path!r} has {offset} samples but DataReader.count said at least {task.end}: "
                      f"ranks would take different numbers of steps")


def pieces_with_end(reader: object, task: FileTask, data: Union[None, bytes, Served] = None,
                    busy: Optional[BusySink] = None) -> Generator[Tuple[Columns, bool, int], None, None]:
    """``file_pieces`` as ``(piece, last, dropped)``: ``last`` is true when the file is known to end there,
    ``dropped`` counts the samples ``filter_fn`` dropped from it (``reader``: a ``DataReader``, or one
    bundled with the filter, ``_execution.filter.Filtered``).

    A reader that gives a file in one piece (``read_file``) is looked ahead,
    which costs nothing, so the end of the file travels with its piece instead
    of taking another request; a failure found by the look-ahead comes after
    the piece. Streaming readers are not looked ahead (that would parse a piece early).
    The time spent making each piece goes to ``busy`` as ``read``.
    """
    reader, keep = unbundle(reader)
    reader = picked(reader, task.path)  # a mixed loader's source reader
    raw = clocked(file_pieces(reader, task, data, busy), busy, "read", task.path)
    gen = _none_dropped(raw) if keep is None else keep.pieces(raw, task.path, task.start)
    if not (reader.shuffle or whole_file(reader) or task.ranged):  # a range comes in one piece: looked ahead
        for piece, dropped in gen:
            yield piece, False, dropped
        return
    yield from _looked_ahead(gen)


def _looked_ahead(gen: Iterator[Tuple[Columns, int]]) -> Generator[Tuple[Columns, bool, int], None, None]:
    """``gen``'s pieces with whether each is the last, one piece looked ahead; a failure found by the
    look-ahead comes after the piece."""
    with contextlib.closing(cast(Generator[object, None, None], gen)):
        ahead = next(gen, None)
        while ahead is not None:
            (piece, dropped) = ahead
            try:
                ahead = next(gen, None)
            except Exception:
                yield piece, False, dropped
                raise
            yield piece, ahead is None, dropped


def _none_dropped(pieces: Iterator[Columns]) -> Iterator[Tuple[Columns, int]]:
    with contextlib.closing(pieces):  # type: ignore[type-var]  # closing it closes the reader's generator
        for piece in pieces:
            yield piece, 0


def _ranged(reader: DataReader, task: FileTask, busy: Optional[BusySink]) -> Iterator[Columns]:
    """Ranges of a file (``task.ranges``, else ``start:end``), in file order (the global order makes the order:
    ``_stages.tiles``): straight from the reader's ``read_range`` where it has one (a line reader's from its
    bytes where the sample index places them), else read up to them in file order."""
    assert task.end is not None, "a range names where it ends"
    ranges = task.ranges or ((task.start, task.end),)
    if type(reader).read_range is DataReader.read_range:
        yield from _share_ranges(_in_order(reader, task, busy), ranges, task.path)
        return
    read_extents = getattr(reader, "read_extents", None)
    with timed(busy, "read_file", task.path), drawing(task.seed, USER_READ, task.epoch, task.index, task.start):
        if task.extents and read_extents is not None:
            got = read_extents(task.path, task.extents, [end - start for start, end in ranges])
        else:
            got = [read_result(task.path, reader.read_range(task.path, start, end)) for start, end in ranges]
    for (start, end), (columns, n) in zip(ranges, got):
        if n != end - start:
            raise ValueError(f"file {task.path!r}: read_range({start}, {end}) gave {n} samples, not {end - start}")
        yield reader.checked(task.path, columns, n)


def _share_ranges(pieces: Iterator[Columns], ranges: Sequence[Tuple[int, int]], path: str) -> Iterator[Columns]:
    """Rows ``ranges`` (in file order) of a file's ``pieces``, read once from its start."""
    offset = 0
    for piece in pieces:
        n = n_rows(piece)
        for start, end in ranges:
            lo, hi = max(start - offset, 0), min(end - offset, n)
            if lo < hi:
                yield piece if (lo, hi) == (0, n) else slice_rows(piece, lo, hi)
        offset += n
        if offset >= ranges[-1][1]:
            return
    raise ValueError(f"file {path!r} has {offset} samples, fewer than the range {ranges[-1]} of it asks for")


def whole_file(reader: DataReader) -> bool:
    """Whether ``reader`` reads a file through ``read_file`` (in one piece) rather than ``iter_file``.

    The method its class defines last wins: a subclass that overrides one of the two (a ``read_file``
    on top of ``JsonLinesReader``, an ``iter_file`` on top of ``NumpyReader``) is called whatever the
    settings. Where one class defines both, ``shuffle`` decides: the permutation needs the whole file."""
    mro = type(reader).__mro__
    read, it = (next(i for i, cls in enumerate(mro) if name in cls.__dict__) for name in ("read_file", "iter_file"))
    return read < it or (read == it and reader.shuffle)


def _pieces(reader: DataReader, task: FileTask, busy: Optional[BusySink]) -> Iterator[Columns]:
    pieces = _in_order(reader, task, busy)
    if not reader.shuffle:
        yield from pieces
        return
    whole = list(pieces)  # an ``iter_file`` that gives none: an empty file, nothing to permute
    if whole:
        columns = concat(whole, f"file {task.path!r}")
        perm = derive_rng(reader.random_seed, IN_FILE, task.epoch, task.index).permutation(n_rows(columns))
        yield take(columns, perm)


def _in_order(reader: DataReader, task: FileTask, busy: Optional[BusySink]) -> Iterator[Columns]:
    """The file's pieces in file order, through the reading method its class defines last (``whole_file``)."""
    if whole_file(reader):
        with timed(busy, "read_file", task.path), drawing(task.seed, USER_READ, task.epoch, task.index, 0):
            columns, n = read_result(task.path, reader.read_file(task.path))
        yield reader.checked(task.path, columns, n)
        return
    user = stepped(lambda: reader.iter_file(task.path), task.seed, USER_READ, task.epoch, task.index)
    for piece in clocked(user, busy, "read_file", task.path):
        yield reader.checked(task.path, piece)
