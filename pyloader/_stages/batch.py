"""Stage 3: cutting the sample stream into batches, handed on in groups.

Files are joined end to end, so only the last batch of an epoch can be short;
an optional shuffle buffer mixes samples across files first, and optional
length bucketing (``_stages.bucket``) then makes batches of samples of similar length. Consecutive
batches travel the rest of the pipeline as a ``Group`` (one thread hop, one
worker request, one hand-over for all of them), so fixed per-hop costs are
paid once per group rather than once per batch.

Rows that go through the buffers carry their file, their padding flag and
(bucketing) their length beside the user's columns, as a ``_columns.Traced``;
a batch made of them holds the user's columns alone, its files and ``__padding__``
flags taken from that provenance.
"""
from __future__ import annotations

import collections
import contextlib
from collections import abc
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple, Union, cast

import numpy as np

from .._columns import Columns, Provenance, Rows, Traced, concat, slice_rows
from .._errors import PipelineError
from .bucket import BucketWindows, Lengths
from .read import Piece, ReadFiles, ReadItem
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
    ``data[key]`` and ``meta[key][k]`` its ``meta[key]`` (arrays with a leading step axis).

    Later stages work on the arrays once for the whole group (one conversion per
    field rather than one per field and batch) and keep the result as
    ``outputs``, each value with the leading step axis; a batch's own ``data`` is
    then made only as it is handed out (``each``), so groups waiting in queues
    hold a few stacked arrays, not a dict and tensors per batch. When a batch
    must go alone its ``data`` and ``meta`` are made at once (``rows``, ``pick``).
    """

    def __init__(self, batches: List[Batch], columns: Dict[str, np.ndarray], meta: Dict[str, np.ndarray]) -> None:
        super().__init__(batches)
        self.columns: Optional[Dict[str, np.ndarray]] = columns  # dropped once encoded (``OrderedMap``)
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

    def rows(self) -> "StackedRows":
        """Each batch's raw columns, made on demand."""
        assert self.columns is not None, "a stacked group's rows are taken once"
        return StackedRows(self.columns, len(self))

    def pick(self, positions: Sequence[int]) -> Group:
        """The batches at ``positions`` as a plain ``Group``, each given its own ``meta``
        (and its raw columns, while the group still has them)."""
        picked = []
        for k in positions:
            batch = self[k]
            if self.columns is not None:
                batch.data = {key: column[k] for key, column in self.columns.items()}
            batch.meta = {key: column[k] for key, column in (self.meta or {}).items()}
            picked.append(batch)
        return picked


class StackedOutputs(dict):
    """What the steps made of a whole ``Stacked`` group at once: each output with a leading step axis."""


class StackedRows(abc.Sequence):
    """Item ``k`` is ``{key: columns[key][k]}``, made when asked for; ``columns`` is there for
    stages that can work on the whole group at once (``run_stacked``)."""

    def __init__(self, columns: Dict[str, np.ndarray], count: int) -> None:
        self.columns = columns
        self._count = count

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self._count))]
        if not -self._count <= k < self._count:
            raise IndexError(k)
        return {key: column[k] for key, column in self.columns.items()}


class GroupSize:
    """How many batches the next group may hold: 1 at first, doubling up to ``limit``.

    The first batch leaves as soon as it is cut (time to first batch), later
    groups grow so that per-group costs shrink per batch. ``limit`` bounds the
    batches a group holds (memory).
    """

    LIMIT = 32

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._next = 1

    def take(self) -> int:
        n, self._next = self._next, min(self.limit, self._next * 2)
        return n


def assemble(parts: Sequence[Tuple[Rows, int, int]], paths: Sequence[str]) -> Rows:
    """Rows ``start:end`` of each part, joined; a key mismatch names the files."""
    try:
        return concat([slice_rows(columns, start, end) for columns, start, end in parts], "batch")
    except ValueError as exc:
        raise ValueError(f"files {', '.join(map(repr, paths))} cannot share a batch: {exc}") from None


@dataclass(frozen=True)
class Segments:
    """A batch not assembled yet: rows ``start:end`` of each piece, in order.

    The pieces may be kept in worker processes; the runner decides where the
    rows are joined, so they move between processes only when they must.
    """

    parts: Tuple[Tuple[Piece, int, int], ...]

    @property
    def paths(self) -> Tuple[str, ...]:
        return tuple(dict.fromkeys(piece.task.path for piece, _, _ in self.parts))

    def local(self) -> Columns:
        return assemble([(cast(Columns, p.columns), start, end) for p, start, end in self.parts], self.paths)


class Batcher:
    """Turns file pieces into ``Batch``es of ``batch_size`` rows.

    Without buffers a batch is a ``Segments`` of the pieces it spans; with a
    shuffle buffer or bucketing (``bucket``: the lengths and the buffer size),
    the buffers' output is joined here (they hold the rows anyway).

    ``resumed``: an epoch whose files start past its first batches (the index of
    its first batch); ``resumed_rows``: the samples of it handed out already and
    the samples it feeds: with buffers its stream is read from ``reads_from()``,
    where their state at the position can be rebuilt (``_stages.shuffle``, ``_stages.bucket``).

    Under ranks ``steps(e)`` is the number of batches every rank gives in epoch
    ``e``. A share that lost samples to a skipped error gives fewer; it is topped
    up with copies of its epoch's last batch, flagged as padding (the rows of
    that batch stay referenced until the epoch ends).
    """

    def __init__(self, files: Sequence[str], batch_size: int, drop_last: bool,
                 shuffle_buffer: int, seed: int, flag_padding: bool = False,
                 steps: Optional[Callable[[int], int]] = None,
                 bucket: Optional[Tuple[Lengths, int]] = None, resumed: Tuple[int, int] = (-1, 0),
                 mix: Optional[Callable[[int], Any]] = None, resumed_rows: Tuple[int, int] = (0, 0)) -> None:
        self.files = files
        self.mix = mix  # epoch -> the buffer interleaving weighted sources (``_stages.mix``), first of the buffers
        self.bucket = bucket
        self.resumed = resumed  # (epoch, first batch)
        self.resumed_rows = resumed_rows
        self.flag_padding = flag_padding
        self.steps = steps
        self._last: Optional[Tuple[Any, int, Tuple[str, ...]]] = None  # (data, rows, paths) of the last batch cut
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        # [rows, start]: pieces of files, or (with buffers) what the buffers let out, traced
        self._pending: Deque[List] = collections.deque()
        self._count = 0

    def _push(self, piece: Union[Piece, Traced]) -> None:
        if piece.n:
            self._pending.append([piece, 0])
            self._count += piece.n

    def _take(self, size: int) -> List[Tuple[Any, int, int]]:
        parts = []
        while size:
            entry = self._pending[0]
            piece, start = entry
            end = min(piece.n, start + size)
            parts.append((piece, start, end))
            size -= end - start
            self._count -= end - start
            if end == piece.n:
                self._pending.popleft()
            else:
                entry[1] = end
        return parts

    def _batch(self, epoch: int, index: int, size: int) -> Batch:
        parts = self._take(size)
        if isinstance(parts[0][0], Piece):
            segments = Segments(tuple(parts))
            meta = self._meta(lambda: np.concatenate([np.full(end - start, p.task.pad) for p, start, end in parts]))
            batch = Batch(epoch, index, segments, segments.paths, meta)
        else:
            files = np.concatenate([p.provenance.file[start:end] for p, start, end in parts])
            paths = tuple(self.files[i] for i in np.unique(files))
            rows = assemble(parts, paths)
            batch = Batch(epoch, index, rows.columns, paths, self._meta(lambda: rows.provenance.padding))
        if self.steps is not None:
            self._last = (_copy(batch.data), size, batch.paths)
        return batch

    def _padding(self, epoch: int, index: int) -> Iterator[Group]:
        """Copies of the epoch's last batch, flagged as padding, from batch ``index`` up to the
        batches planned for ``epoch`` (under ranks); in groups of at most ``GroupSize.LIMIT``."""
        if self.steps is None or self._last is None:
            return  # no batch this epoch: the padding is made later, from collated batches (``EvenSteps``)
        data, size, paths = self._last
        end = self.steps(epoch)
        for start in range(index, end, GroupSize.LIMIT):
            yield [Batch(epoch, k, _copy(data), paths, self._meta(lambda: np.ones(size, dtype=bool)))
                   for k in range(start, min(end, start + GroupSize.LIMIT))]

    def _meta(self, pad: Callable[[], np.ndarray]) -> Optional[Dict[str, np.ndarray]]:
        """The ``__padding__`` flags, worked out only when ranks are padded."""
        return {PADDING: np.asarray(pad(), dtype=bool)} if self.flag_padding else None

    def _full(self, epoch: int, index: int, sizes: GroupSize) -> Iterator[Group]:
        """The full batches at hand, from batch ``index`` on, in groups."""
        while self._count >= self.batch_size:
            group: Group = []
            for _ in range(min(sizes.take(), self._count // self.batch_size)):
                group.append(self._batch(epoch, index + len(group), self.batch_size))
            index += len(group)
            yield group

    def _stages(self, epoch: int) -> List[Any]:
        """The plans of this epoch's shuffle and bucket buffers (``Slots``, ``BucketWindows``), in turn."""
        out: List[Any] = []
        if self.shuffle_buffer:
            out.append(Slots(self.shuffle_buffer, self.seed, epoch))
        if self.bucket is not None:
            out.append(BucketWindows.drawn(self.bucket[1], self.batch_size, self.seed, epoch))
        return out

    def _resumed(self, stages: List[Any]) -> Tuple[int, List[int]]:
        """Where the resumed epoch's stream is read from, and the sample each buffer lets out first:
        each buffer is fed from where the one before it must let out."""
        handed, rows = self.resumed_rows
        outs = []
        for stage in reversed(stages):
            outs.append(handed)
            handed = stage.reads_from(handed, rows)
        return handed, outs[::-1]

    def reads_from(self) -> int:
        """Where the resumed epoch's stream is read from (its samples handed out, or before: the
        buffers rebuild their state from there)."""
        return self._resumed(self._stages(self.resumed[0]))[0]

    def _buffers(self, epoch: int) -> List[Any]:
        """The buffers samples go through this epoch, in turn: the mix, the shuffle buffer, the bucket buffer."""
        out: List[Any] = [] if self.mix is None else [self.mix(epoch)]
        stages = self._stages(epoch)
        if epoch == self.resumed[0] and self.resumed_rows[0]:
            _, outs = self._resumed(stages)
            return out + [stage.buffer((at, self.resumed_rows[1])) for stage, at in zip(stages, outs)]
        return out + [stage.buffer() for stage in stages]

    def _take_piece(self, piece: Piece, task: FileTask, buffers: List[Any], read: ReadFiles) -> bool:
        """Move a piece's rows towards the batches (through the buffers, traced with their file, padding
        flag and length); False when the rest of its file is to be left: its lengths failed, and the
        error policy skipped the file."""
        if not buffers:
            self._push(piece)
            return True
        held = piece.columns
        assert held is not None, "a piece that goes through a buffer is held here"
        length = None
        if self.bucket is not None:
            try:
                length = self.bucket[0](held, task.path, piece.offset)
            except PipelineError as exc:
                read.errors("bucket_by", [task.path], exc)  # raises unless the policy skips
                read.stats.skipped_files += 1
                return False
        provenance = Provenance(file=np.full(piece.n, task.index, dtype=np.int64),
                                padding=np.full(piece.n, task.pad), length=length)
        for part in _through(buffers, Traced(held, provenance)):
            self._push(part)
        return True

    def _first_index(self, epoch: int) -> int:
        return self.resumed[1] if epoch == self.resumed[0] else 0

    async def iterate(self, items: AsyncIterator[ReadItem], read: ReadFiles) -> AsyncIterator[Group]:
        epoch, index = None, 0
        buffers: List[Any] = []
        sizes = GroupSize()
        async for item in items:
            if isinstance(item, EpochEnd):
                if epoch is None:
                    index = self._first_index(item.epoch)
                for rows in _drained(buffers):
                    self._push(rows)
                for group in self._full(item.epoch, index, sizes):
                    yield group
                    index += len(group)
                if self._count and not self.drop_last:
                    yield [self._batch(item.epoch, index, self._count)]
                    index += 1
                for group in self._padding(item.epoch, index):
                    yield group
                self._pending.clear()
                self._count = 0
                epoch, index, buffers, self._last = None, 0, [], None
                continue
            if epoch is None:
                epoch = item.task.epoch
                index = self._first_index(epoch)
                buffers = self._buffers(epoch)
            async with contextlib.aclosing(read.pieces(item)) as pieces:
                async for piece in pieces:
                    if not self._take_piece(piece, item.task, buffers, read):
                        break
                    for group in self._full(epoch, index, sizes):
                        yield group
                        index += len(group)


def _through(buffers: List[Any], rows: Traced) -> Iterator[Traced]:
    """``rows`` fed to the first buffer, what leaves it to the next, and so on."""
    if not buffers:
        yield rows
        return
    for part in buffers[0].feed(rows):
        yield from _through(buffers[1:], part)


def _drained(buffers: List[Any]) -> Iterator[Traced]:
    """What the buffers hold at the end of an epoch: each one's rest, through the buffers after it."""
    for k, buffer in enumerate(buffers):
        for part in buffer.drain():
            yield from _through(buffers[k + 1:], part)


def _copy(data: Any) -> Any:
    """A batch's raw data for another batch: a ``Segments`` is never changed, columns may be (by ``batch_encode``)."""
    return dict(data) if isinstance(data, dict) else data
