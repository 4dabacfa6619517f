"""Stage 3: cutting the sample stream into batches, handed on in groups.

Files are joined end to end, so only the last batch of an epoch can be short;
an optional shuffle buffer mixes samples across files first, and optional
length bucketing (``_stages.bucket``) then makes batches of samples of similar length. Consecutive
batches travel the rest of the pipeline as a ``Group`` (one thread hop, one
worker request, one hand-over for all of them), so fixed per-hop costs are
paid once per group rather than once per batch. Full batches of one piece whose
columns are all arrays may go as a ``Stacked`` group (``Cut.stack``): later stages
then work on the whole group at once.

Rows that go through the buffers carry their file, their padding flag and
(bucketing) their length beside the user's columns, as a ``_columns.Traced``;
a batch made of them holds the user's columns alone, its files and ``__padding__``
flags taken from that provenance.
"""
from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass
from typing import (
    Any,
    AsyncIterator,
    Callable,
    Deque,
    Dict,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Union,
)

import numpy as np

from .._columns import Provenance, Traced, array_row_bytes, stacked_views
from .._errors import ErrorHandler, PipelineError
from .._execution.steps import BatchData, Segments, StackedOutputs, StackedRows, StackedSegments, assemble
from .._stats import Stats
from .bucket import BucketWindows, Lengths
from .read import Piece, PiecesOf, ReadItem
from .shuffle import Slots
from .source import EpochEnd, FileTask

PADDING = "__padding__"  # the flag handed to the user when ranks are padded


@dataclass
class Batch:
    """Batch ``index`` of ``epoch``; ``paths`` are the files its rows came from.

    ``data`` is the raw columns, then what ``batch_encode`` and ``collate_batch`` made of them.
    """

    epoch: int
    index: int
    data: Any
    paths: Tuple[str, ...]
    meta: Optional[Dict[str, np.ndarray]] = None  # stream mode: per-row flags, kept out of user code
    rows: int = 0  # its samples as cut, set before encoding (``_stages.map``), counted by ``loader.stats``
    # cache_encoded (``_stages.cached_epochs``): the epoch that wrote the cache this batch was read from, or its own
    # epoch when that epoch writes the cache; None: from the files alone
    cached: Optional[int] = None


Group = List[Batch]  # consecutive batches of one epoch, in order


class Stacked(list):
    """A ``Group`` cut from one array per field: ``columns[key][k]`` is batch ``k``'s
    ``data[key]`` and ``meta[key][k]`` its ``meta[key]`` (arrays with a leading step axis);
    or, for rows a worker process keeps, ``remote``: the group's rows there.

    Later stages work on the arrays once for the whole group (one conversion per
    field rather than one per field and batch) and keep the result as
    ``outputs``, each value with the leading step axis; a batch's own ``data`` is
    then made only as it is handed out (``each``), so groups waiting in queues
    hold a few stacked arrays, not a dict and tensors per batch. When a batch
    must go alone its ``data`` and ``meta`` are made at once (``rows``, ``pick``).
    """

    def __init__(self, batches: List[Batch], columns: Optional[Dict[str, np.ndarray]],
                 meta: Optional[Dict[str, np.ndarray]], remote: Optional[StackedSegments] = None) -> None:
        super().__init__(batches)
        # the raw rows, dropped once encoded (``OrderedMap``)
        self.columns: Optional[Dict[str, np.ndarray]] = columns
        self.remote = remote
        self.meta: Optional[Dict[str, Any]] = meta
        self.outputs: Optional[StackedOutputs] = None

    def each(self, unstack: Callable[[Any], Sequence[Any]]) -> Iterator[Batch]:
        """The batches in order, each given its ``data`` from ``outputs`` as it is taken
        (``unstack`` splits a value along its first axis)."""
        if self.outputs is None:
            yield from self
            return
        split = [(key, unstack(value)) for key, value in self.outputs.items()]
        self.outputs = None
        for k, batch in enumerate(self):
            batch.data = {key: values[k] for key, values in split}
            yield batch

    def rows(self) -> Union[StackedRows, StackedSegments]:
        """Each batch's raw columns (or, kept in a worker, ``Segments``), made on demand."""
        if self.remote is not None:
            return self.remote
        assert self.columns is not None, "a stacked group's rows are taken once"
        return StackedRows(self.columns, len(self))

    def rows_each(self) -> int:
        """The samples of each of its batches, as cut (its columns are ``[batches, rows, ...]``)."""
        if self.remote is not None:
            return self.remote.size
        for column in (self.columns or {}).values():
            return int(column.shape[1]) if column.ndim > 1 else 1
        return 0

    def drop_rows(self) -> None:
        """Its raw rows are not needed any more (encoded)."""
        self.columns = self.remote = None

    def pick(self, positions: Sequence[int]) -> Group:
        """The batches at ``positions`` as a plain ``Group``, each given its own ``meta``
        (and its raw rows, while the group still has them)."""
        picked = []
        for k in positions:
            batch = self[k]
            if self.columns is not None:
                batch.data = {key: column[k] for key, column in self.columns.items()}
            elif self.remote is not None:
                batch.data = self.remote[k]
            if self.meta is not None:
                batch.meta = {key: column[k] for key, column in self.meta.items()}
            picked.append(batch)
        return picked


def picked(group: Group, positions: Sequence[int]) -> Group:
    """The batches of ``group`` at ``positions`` (in order): ``group`` itself when that is all of them,
    else a plain ``Group`` (``Stacked.pick``)."""
    if len(positions) == len(group):
        return group
    return group.pick(positions) if isinstance(group, Stacked) else [group[k] for k in positions]


def drop_replayed(group: Group, kept: List[int], stats: Stats) -> Group:
    """The batches of ``group`` at ``kept``, its last ones; those before them were read again only to find
    a resumed position (counted as replayed), and go no further."""
    stats.replayed(len(group) - len(kept), {p for b in group[:len(group) - len(kept)] for p in b.paths})
    return picked(group, kept)


class GroupSize:
    """How many batches the next group may hold: 1 at first, doubling up to ``limit``.

    The first batch leaves as soon as it is cut (time to first batch), later
    groups grow so that per-group costs shrink per batch. ``limit`` bounds the
    batches a group holds (memory).

    Groups of small batches cut from one array per field (stream batches, ``Stacked``
    groups) may hold more of them (``of_small``): per-group costs need more batches to
    be paid off, while the samples (and bytes) a group holds stay those of a group of
    ordinary batches.
    """

    LIMIT = 32
    SAMPLES = 32768
    BYTES = 16 << 20
    MOST = 1024

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._next = 1

    def take(self) -> int:
        n, self._next = self._next, min(self.limit, self._next * 2)
        return n

    @classmethod
    def of_small(cls, samples: int, nbytes: Optional[int] = None) -> int:
        """The batches a group of small batches (``samples`` each, of ``nbytes`` where known) may hold:
        up to ``SAMPLES`` samples and ``BYTES`` bytes, never fewer than ``LIMIT`` batches nor more than ``MOST``."""
        most = cls.SAMPLES // max(1, samples)
        if nbytes:
            most = min(most, cls.BYTES // nbytes)
        return min(cls.MOST, max(cls.LIMIT, most))


class Cut(NamedTuple):
    """How the sample stream is cut: ``batch_size`` rows a batch, the short last one kept unless ``drop_last``;
    with ``stack``, full batches of one piece of arrays travel as a ``Stacked`` group (``Batcher._stacked``)."""

    batch_size: int
    drop_last: bool = False
    stack: bool = False


class Bucketing(NamedTuple):
    """Length bucketing (``_stages.bucket``): each row's length, and the buffer's size in samples."""

    lengths: Lengths
    size: int


class RowBuffer(Protocol):
    """A buffer rows go through on their way to the batches (mix, shuffle, bucket), one per epoch."""

    def feed(self, columns: Traced) -> Iterator[Traced]: ...

    def drain(self) -> Iterator[Traced]: ...


class BufferPlan(Protocol):
    """An epoch's plan of a buffer (``Slots``, ``BucketWindows``): where it is fed from to let out its
    ``out``-th sample, and the buffer itself (``resume``: samples handed out, samples of the epoch)."""

    def reads_from(self, out: int, rows: int) -> int: ...

    def buffer(self, resume: Optional[Tuple[int, int]] = None) -> RowBuffer: ...


class Buffers(NamedTuple):
    """The buffers rows meet in before they are cut, in turn: the weighted sources' mix (``mix(epoch)``),
    the shuffle buffer (``shuffle`` samples, drawn from ``seed``), length bucketing."""

    shuffle: int = 0
    seed: int = 0
    bucket: Optional[Bucketing] = None
    mix: Optional[Callable[[int], RowBuffer]] = None

    def __bool__(self) -> bool:
        return bool(self.shuffle) or self.bucket is not None or self.mix is not None


class RankSteps(NamedTuple):
    """Under ranks: ``__padding__`` flags on each batch (``flag``), and ``steps(e)``, the batches every
    rank gives in epoch ``e`` (a share short of them is topped up here)."""

    flag: bool = False
    steps: Optional[Callable[[int], int]] = None


class ResumeRows(NamedTuple):
    """Where the batcher's first epoch (``epoch``) begins: the index of its first batch, and with
    buffers the samples of it handed out already (``handed``) and the samples it feeds (``rows``)."""

    epoch: int = -1
    first: int = 0
    handed: int = 0
    rows: int = 0


NO_BUFFERS, NO_RANKS, FROM_START = Buffers(), RankSteps(), ResumeRows()
Parts = List[Tuple[Any, int, int]]  # rows ``start:end`` of each: all pieces of files, or all traced rows


class Batcher:
    """Turns file pieces into ``Batch``es (``cut``).

    Without buffers a batch is a ``Segments`` of the pieces it spans; with
    ``buffers`` (a shuffle buffer, bucketing, a mix) the buffers' output is
    joined here (they hold the rows anyway).

    ``resume``: an epoch whose files start past its first batches; with buffers its stream is read
    from ``reads_from()``, where their state at the position can be rebuilt (``_stages.shuffle``,
    ``_stages.bucket``).

    ``pieces``: a file's pieces, as the read stage delivers them; ``errors`` and ``stats``: the run's
    (lengths that fail count as a skipped file).

    Under ranks (``ranks``) a share that lost samples to a skipped error gives fewer batches than
    planned; it is topped up with copies of its epoch's last batch, flagged as padding (the rows of
    that batch stay referenced until the epoch ends).
    """

    def __init__(self, files: Sequence[str], pieces: PiecesOf, errors: ErrorHandler, stats: Stats, *,
                 cut: Cut, buffers: Buffers = NO_BUFFERS, ranks: RankSteps = NO_RANKS,
                 resume: ResumeRows = FROM_START) -> None:
        self.files = files
        self.pieces, self.errors, self.stats = pieces, errors, stats
        self.cut, self.buffers, self.ranks, self.resume = cut, buffers, ranks, resume
        self._last: Optional[Tuple[BatchData, int, Tuple[str, ...]]] = None  # (data, rows, paths) of the last batch
        # [rows, start]: pieces of files, or (with buffers) what the buffers let out, traced
        self._pending: Deque[List] = collections.deque()
        self._count = 0

    def _push(self, piece: Union[Piece, Traced]) -> None:
        if piece.n:
            self._pending.append([piece, 0])
            self._count += piece.n

    def _take(self, size: int) -> Parts:
        parts = []
        while size:
            entry = self._pending[0]
            piece, start = entry
            end = min(piece.n, start + size)
            parts.append((piece, start, end))
            size -= end - start
            self._advance(entry, end)
        return parts

    def _batch(self, epoch: int, index: int, size: int) -> Batch:
        parts = self._take(size)
        cut = self._of_pieces if isinstance(parts[0][0], Piece) else self._of_rows
        batch = cut(epoch, index, parts)
        if self.ranks.steps is not None:
            self._last = (_copy(batch.data), size, batch.paths)
        return batch

    def _of_pieces(self, epoch: int, index: int, parts: Parts) -> Batch:
        """A batch of rows of file pieces: the ``Segments`` they span."""
        segments = Segments(tuple(parts))
        meta = self._meta(lambda: np.concatenate([np.full(end - start, p.task.pad) for p, start, end in parts]))
        return Batch(epoch, index, segments, segments.paths, meta)

    def _of_rows(self, epoch: int, index: int, parts: Parts) -> Batch:
        """A batch of rows the buffers let out, joined, its files and flags from their provenance."""
        files = np.concatenate([p.provenance.file[start:end] for p, start, end in parts])
        paths = tuple(self.files[i] for i in np.unique(files))
        rows = assemble(parts, paths)
        return Batch(epoch, index, rows.columns, paths, self._meta(lambda: rows.provenance.padding))

    def _padding(self, epoch: int, index: int) -> Iterator[Group]:
        """Copies of the epoch's last batch, flagged as padding, from batch ``index`` up to the
        batches planned for ``epoch`` (under ranks); in groups of at most ``GroupSize.LIMIT``."""
        if self.ranks.steps is None or self._last is None:
            return  # no batch this epoch: the padding is made later, from collated batches (``EvenSteps``)
        data, size, paths = self._last
        end = self.ranks.steps(epoch)
        for start in range(index, end, GroupSize.LIMIT):
            yield [Batch(epoch, k, _copy(data), paths, self._meta(lambda: np.ones(size, dtype=bool)))
                   for k in range(start, min(end, start + GroupSize.LIMIT))]

    def _meta(self, pad: Callable[[], np.ndarray]) -> Optional[Dict[str, np.ndarray]]:
        """The ``__padding__`` flags, worked out only when ranks are padded."""
        return {PADDING: np.asarray(pad(), dtype=bool)} if self.ranks.flag else None

    def _full(self, epoch: int, index: int, sizes: GroupSize) -> Iterator[Group]:
        """The full batches at hand, from batch ``index`` on, in groups."""
        while self._count >= self.cut.batch_size:
            taken = sizes.take()
            count = min(taken, self._count // self.cut.batch_size)
            group: Optional[Group] = self._stacked(epoch, index, count, grown=taken == sizes.limit) \
                if self.cut.stack else None
            if group is None:
                if self.cut.stack:  # up to the batch that ends past the first piece: the next piece may stack
                    count = min(count, self._to_first_piece_end())
                group = [self._batch(epoch, index + k, self.cut.batch_size) for k in range(count)]
            index += len(group)
            yield group

    def _stacked(self, epoch: int, index: int, count: int, grown: bool) -> Optional[Stacked]:
        """Up to ``count`` full batches of the first pending piece alone (once the groups have ``grown``,
        up to ``GroupSize.of_small``), as one ``Stacked`` group (each column seen as ``[batches, rows, ...]``,
        no copy), when they are two or more and every column is an array; else ``None``."""
        entry = self._pending[0]
        piece, start = entry
        if not isinstance(piece, Piece):
            return None
        row_bytes = array_row_bytes(piece.columns) if piece.columns is not None else getattr(piece.ref, "row_bytes",
                                                                                               None)
        if row_bytes is None:
            return None
        size = self.cut.batch_size
        if grown:
            count = GroupSize.of_small(size, size * row_bytes)
        count = min(count, (piece.n - start) // size)
        if count < 2:
            return None
        self._advance(entry, start + count * size)
        batches = [Batch(epoch, index + k, None, (piece.task.path,)) for k in range(count)]
        if piece.columns is not None:
            return Stacked(batches, stacked_views(piece.columns, start, count, size), None)
        return Stacked(batches, None, None, StackedSegments(piece, start, size, count))

    def _to_first_piece_end(self) -> int:
        """The batches that take the rest of the first pending piece (the last may go past its end)."""
        piece, start = self._pending[0]
        return -(-(piece.n - start) // self.cut.batch_size)

    def _advance(self, entry: List, end: int) -> None:
        """The first pending piece (``entry``) taken up to row ``end``."""
        piece, start = entry
        self._count -= end - start
        if end == piece.n:
            self._pending.popleft()
        else:
            entry[1] = end

    def _buffers(self, epoch: int) -> List[RowBuffer]:
        """The buffers samples go through this epoch, in turn: the mix, the shuffle buffer, the bucket buffer."""
        out: List[RowBuffer] = [] if self.buffers.mix is None else [self.buffers.mix(epoch)]
        stages = _plans(self.buffers, self.cut.batch_size, epoch)
        if epoch == self.resume.epoch and self.resume.handed:
            _, outs = _resumed(stages, self.resume)
            return out + [stage.buffer((at, self.resume.rows)) for stage, at in zip(stages, outs)]
        return out + [stage.buffer() for stage in stages]

    def _take_piece(self, piece: Piece, task: FileTask, buffers: List[RowBuffer]) -> bool:
        """Move a piece's rows towards the batches (through the buffers, traced with their file, padding
        flag and length); False when the rest of its file is to be left: its lengths failed, and the
        error policy skipped the file."""
        if not buffers:
            self._push(piece)
            return True
        held = piece.columns
        assert held is not None, "a piece that goes through a buffer is held here"
        length = None
        if self.buffers.bucket is not None:
            try:
                length = self.buffers.bucket.lengths(held, task.path, piece.offset)
            except PipelineError as exc:
                self.errors("bucket_by", [task.path], exc)  # raises unless the policy skips
                self.stats.skipped_files += 1
                return False
        provenance = Provenance(file=np.full(piece.n, task.index, dtype=np.int64),
                                padding=np.full(piece.n, task.pad), length=length)
        for part in _through(buffers, Traced(held, provenance)):
            self._push(part)
        return True

    def _epoch_end(self, epoch: int, index: int, buffers: List[RowBuffer], sizes: GroupSize) -> Iterator[Group]:
        """The rest of ``epoch`` from batch ``index`` on: what the buffers hold, the short last batch
        (unless ``drop_last``), and under ranks the padding up to the planned steps."""
        for rows in _drained(buffers):
            self._push(rows)
        for group in self._full(epoch, index, sizes):
            yield group
            index += len(group)
        if self._count and not self.cut.drop_last:
            yield [self._batch(epoch, index, self._count)]
            index += 1
        yield from self._padding(epoch, index)
        self._pending.clear()
        self._count = 0
        self._last = None

    def _first_index(self, epoch: int) -> int:
        return self.resume.first if epoch == self.resume.epoch else 0

    async def iterate(self, items: AsyncIterator[ReadItem]) -> AsyncIterator[Group]:
        epoch, index = None, 0
        buffers: List[RowBuffer] = []
        sizes = GroupSize()
        async for item in items:
            if isinstance(item, EpochEnd):
                for group in self._epoch_end(item.epoch, self._first_index(item.epoch) if epoch is None else index,
                                             buffers, sizes):
                    yield group
                epoch, index, buffers = None, 0, []
                continue
            if epoch is None:
                epoch = item.task.epoch
                index = self._first_index(epoch)
                buffers = self._buffers(epoch)
            async with contextlib.aclosing(self.pieces(item)) as pieces:
                async for piece in pieces:
                    if not self._take_piece(piece, item.task, buffers):
                        break
                    for group in self._full(epoch, index, sizes):
                        yield group
                        index += len(group)


def _plans(buffers: Buffers, batch_size: int, epoch: int) -> List[BufferPlan]:
    """The plans of ``epoch``'s shuffle and bucket buffers (``Slots``, ``BucketWindows``), in turn."""
    out: List[BufferPlan] = []
    if buffers.shuffle:
        out.append(Slots(buffers.shuffle, buffers.seed, epoch))
    if buffers.bucket is not None:
        out.append(BucketWindows.drawn(buffers.bucket.size, batch_size, buffers.seed, epoch))
    return out


def _resumed(stages: List[BufferPlan], resume: ResumeRows) -> Tuple[int, List[int]]:
    """Where the resumed epoch's stream is read from, and the sample each buffer lets out first:
    each buffer is fed from where the one before it must let out."""
    handed, outs = resume.handed, []
    for stage in reversed(stages):
        outs.append(handed)
        handed = stage.reads_from(handed, resume.rows)
    return handed, outs[::-1]


def reads_from(buffers: Buffers, batch_size: int, resume: ResumeRows) -> int:
    """Where the resumed epoch's stream is read from (its samples handed out, or before: the
    buffers rebuild their state from there)."""
    return _resumed(_plans(buffers, batch_size, resume.epoch), resume)[0]


class RowBatcher(Protocol):
    """Stage 3: the read stage's items cut into groups of batches (``Batcher``, ``StreamBatcher``)."""

    def iterate(self, items: AsyncIterator[ReadItem]) -> AsyncIterator[Group]: ...


def _through(buffers: List[RowBuffer], rows: Traced) -> Iterator[Traced]:
    """``rows`` fed to the first buffer, what leaves it to the next, and so on."""
    if not buffers:
        yield rows
        return
    for part in buffers[0].feed(rows):
        yield from _through(buffers[1:], part)


def _drained(buffers: List[RowBuffer]) -> Iterator[Traced]:
    """What the buffers hold at the end of an epoch: each one's rest, through the buffers after it."""
    for k, buffer in enumerate(buffers):
        for part in buffer.drain():
            yield from _through(buffers[k + 1:], part)


def _copy(data: BatchData) -> BatchData:
    """A batch's raw data for another batch: a ``Segments`` is never changed, columns may be (by ``batch_encode``)."""
    return dict(data) if isinstance(data, dict) else data
