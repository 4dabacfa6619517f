"""Stage 1: which file is read when — the per-epoch plan of files."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import FrozenSet, Iterator, List, Optional, Protocol, Sequence, Tuple, Union

from .._execution.reading import FileTask
from .._rng import FILE_ORDER, derive_rng
from .order import FileOrder, OrderFn
from .shard import SINGLE, Sharding, Split, planned_steps, rank_ranges, stream_shares, stream_target
from .stream_plan import leftover


@dataclass(frozen=True)
class Elastic:
    """Epoch ``epoch`` was begun under other world sizes: every rank of split ``(world_size, n)``
    took ``n`` batches of ``batch_size`` (in stream mode ``n`` steps of ``batch_size`` rows of
    ``width`` samples); this run shares out what they left."""

    epoch: int
    splits: Tuple[Split, ...]
    batch_size: int
    width: int = 1


def seek(task: FileTask, offset: int, length: int) -> FileTask:
    """``task`` (``length`` samples) from its ``offset``-th sample on. A whole file gets its end
    made explicit: ``_execution.reading.file_pieces`` checks the file against its count there."""
    if not offset:
        return task
    if task.end is None:
        return dataclasses.replace(task, start=task.start + offset, end=task.start + length, count=length)
    return dataclasses.replace(task, start=task.start + offset)


@dataclass(frozen=True)
class EpochEnd:
    epoch: int


SourceItem = Union[FileTask, EpochEnd]


class Source(Protocol):
    """Stage 1, the plan of files of every epoch: ``FileSource``, or ``MixSource`` for weighted sources."""

    def tasks(self, epoch: int) -> Iterator[FileTask]:
        """The files this rank reads in ``epoch``, in order."""

    def iterate(self, start_epoch: int = 0, skip_rows: int = 0, until: Optional[int] = None) -> Iterator[SourceItem]:
        """Every epoch's tasks from ``start_epoch`` on, each epoch closed by an ``EpochEnd``."""

    def samples(self, epoch: int) -> int:
        """The samples this rank delivers in ``epoch`` (from the counts)."""

    def steps(self, epoch: int, batch_size: int, seq_len: Optional[int], drop_last: bool) -> int:
        """The batches (steps) of ``epoch`` on this rank, planned from the counts."""
Bounds = Optional[Tuple[int, int]]  # a stream that is a slice of its file: rows start:end (``_stages.entries``)


def known_counts(counts: Sequence[Optional[int]]) -> Tuple[List[int], FrozenSet[int]]:
    """The samples per file, a count that failed (``None``, skipped) as 0, and those files: left out."""
    return [n or 0 for n in counts], frozenset(i for i, n in enumerate(counts) if n is None)


class FileSource:
    """Yields every epoch's files in order, then an ``EpochEnd`` marker.

    The order of epoch ``e`` is the sorted list, or with ``shuffle`` a permutation
    drawn from ``(seed, e)``, or what ``file_order`` says (``_stages.order``): the same on
    every run, rank and worker.

    Under ranks ``counts`` gives the samples per file (``DataReader.count``); a file
    whose count is ``None`` (its ``count`` failed and was skipped) is left out:
    counted as empty and never read.

    In stream mode a file may be a slice of one (``bounds``): its tasks read rows
    ``start:end`` and its count is ``end - start``.
    """

    def __init__(self, files: Sequence[str], num_epoch: int, shuffle: bool, seed: int,
                 sharding: Sharding = SINGLE, counts: Optional[Sequence[Optional[int]]] = None,
                 whole_files: bool = False, file_order: Optional[OrderFn] = None,
                 bounds: Optional[Sequence[Bounds]] = None, elastic: Optional[Elastic] = None) -> None:
        self.files = list(files)
        self.file_order = None if file_order is None else FileOrder(file_order, self.files, seed)
        self.num_epoch = num_epoch
        self.shuffle = shuffle
        self.seed = seed
        self.sharding = sharding
        # samples per file; needed to split epochs across ranks
        self.counts: Optional[List[int]]
        self.counts, self.left_out = (None, frozenset()) if counts is None else known_counts(counts)
        self.whole_files = whole_files  # stream mode: ranks split files, not sample ranges
        self.bounds = bounds  # None: every file whole (no list of a million Nones for a million files)
        self.elastic = elastic

    def order(self, epoch: int) -> List[int]:
        """The files ``epoch`` reads, as positions in ``files``, in order."""
        if self.file_order is not None:
            return self.file_order(epoch)
        if not self.shuffle:
            return list(range(len(self.files)))
        return derive_rng(self.seed, FILE_ORDER, epoch).permutation(len(self.files)).tolist()

    def tasks(self, epoch: int) -> Iterator[FileTask]:
        """The files this rank reads in ``epoch``: all of them, or its share plus padding."""
        order = self.order(epoch)
        if not self.sharding.active and not self._taken(epoch).splits:
            for pos, index in enumerate(order):
                yield self._whole(epoch, pos, index)
            return
        assert self.counts is not None, "sharding needs the sample counts"
        if self.whole_files:
            yield from self._stream_share(epoch, self.counts)
            return
        yield from self._rank_share(epoch, order, self.counts)

    def _stream_share(self, epoch: int, counts: Sequence[int]) -> Iterator[FileTask]:
        """Stream mode: this rank's files of the epoch, those left out aside."""
        share = self._stream_shares(epoch, counts)[self.sharding.rank]
        return (task for task in share if task.index not in self.left_out)

    def _rank_share(self, epoch: int, order: List[int], counts: Sequence[int]) -> Iterator[FileTask]:
        """This rank's rows of the epoch's files, then the files counted empty it checks, then its padding."""
        taken = self._taken(epoch)
        share, padding = rank_ranges(order, counts, self.sharding, taken.splits, taken.batch_size)
        for pos, start, end in share:
            index = order[pos]
            yield FileTask(epoch, pos, index, self.files[index], start=start, end=end, count=counts[index],
                           seed=self.seed)
        yield from self._empty(epoch, order, counts)
        for pos, start, end in padding:
            index = order[pos]
            yield FileTask(epoch, pos, index, self.files[index], start=start, end=end, pad=True,
                           count=counts[index], seed=self.seed)

    def _empty(self, epoch: int, order: Sequence[int], counts: Sequence[int]) -> Iterator[FileTask]:
        """The files counted empty that this rank reads to check they are (every ``world_size``-th one): no
        share holds a row of them, so a count of 0 that is wrong would otherwise lose the file unseen."""
        for pos, index in enumerate(order):
            if pos % self.sharding.world_size == self.sharding.rank and not counts[index]:
                if index not in self.left_out:
                    yield FileTask(epoch, pos, index, self.files[index], start=0, end=0, count=0, seed=self.seed)

    def _whole(self, epoch: int, pos: int, index: int, count: Optional[int] = None) -> FileTask:
        """The task reading file ``index`` whole, or its slice (checked by its bounds, not a count)."""
        bounds = None if self.bounds is None else self.bounds[index]
        if bounds is None:
            return FileTask(epoch, pos, index, self.files[index], count=count, seed=self.seed)
        return FileTask(epoch, pos, index, self.files[index], *bounds, seed=self.seed)

    def _stream_shares(self, epoch: int, counts: Sequence[int]) -> List[List[FileTask]]:
        """Stream mode: every rank's files (a rank takes every ``world_size``-th one). After an
        elastic resume, what the ranks of the splits before left undelivered, in plan order and
        shared the same way: the files they had not started, and those in progress from where
        their rows were (``_stages.stream_plan.leftover``)."""
        tasks = [self._whole(epoch, pos, index, count=counts[index])
                 for pos, index in enumerate(self.order(epoch))]
        taken = self._taken(epoch)
        for world_size, steps in taken.splits:
            # ranks past the files had none (they streamed padding): as many ranks as files share alike
            left = [seek(task, offset, length) for share in stream_shares(tasks, min(world_size, max(len(tasks), 1)))
                    for task, offset, length in leftover([(t, self.length(t)) for t in share], taken.batch_size,
                                                         taken.width, steps)]
            tasks = sorted(left, key=lambda task: task.pos)
        return stream_shares(tasks, self.sharding.world_size)

    def length(self, task: FileTask) -> int:
        """The samples ``task`` reads (from the counts)."""
        assert self.counts is not None, "a task's length comes from the sample counts"
        return (self.counts[task.index] if task.end is None else task.end) - task.start

    def steps(self, epoch: int, batch_size: int, seq_len: Optional[int], drop_last: bool) -> int:
        """The number of steps every rank gives in ``epoch``, planned from the counts alone
        (under ranks), so that no rank needs to ask the others."""
        order = self.order(epoch)
        assert self.counts is not None, "planning steps needs the sample counts"
        splits = self._taken(epoch).splits
        before = sum(b for _, b in splits)
        if self.whole_files:
            lengths = [[self.length(task) for task in share] for share in self._stream_shares(epoch, self.counts)]
            return before + stream_target(lengths, batch_size, seq_len or 1, self.sharding.even_batches)
        return before + planned_steps(order, self.counts, self.sharding, batch_size, drop_last, splits)

    def samples(self, epoch: int) -> int:
        """The samples this rank delivers in ``epoch`` outside stream mode, from the counts alone (as
        ``MixSource.samples``): under ranks its share and its padding, which its tasks read (``rows``)."""
        return self.rows(epoch)

    def _taken(self, epoch: int) -> Elastic:
        """The parts of ``epoch`` taken under other world sizes before this run (elastic resume): none
        outside the epoch resumed."""
        if self.elastic is None or self.elastic.epoch != epoch:
            return Elastic(epoch, (), 1)
        return self.elastic

    def tasks_after(self, epoch: int, rows: int) -> Iterator[FileTask]:
        """``tasks(epoch)`` less their first ``rows`` rows (a resumed epoch): the files wholly
        before that point are not read at all, and the one it falls in is read from there on.
        Needs the counts."""
        assert self.counts is not None, "resuming past whole files needs the sample counts"
        for task in self.tasks(epoch):
            n = self.length(task)
            if rows and rows >= n:
                rows -= n
                continue
            if rows:
                task = dataclasses.replace(task, start=task.start + rows, end=task.start + n,
                                           count=self.counts[task.index])
                rows = 0
            yield task

    def rows(self, epoch: int) -> int:
        """The samples ``tasks(epoch)`` read. Needs the counts."""
        return sum(self.length(task) for task in self.tasks(epoch))

    def read_again(self, epoch: int, rows: int, read_from: int) -> List[str]:
        """The files a resumed epoch read from row ``read_from`` on (``tasks_after``) holding rows
        before ``rows``, the rows handed out already: with ``read_from == rows``, the file they end
        inside of, if they do."""
        out, at = [], 0
        for task in self.tasks(epoch):
            if at >= rows:
                break
            n = self.length(task)
            if n and at + n > read_from:
                out.append(task.path)
            at += n
        return out

    def iterate(self, start_epoch: int = 0, skip_rows: int = 0, until: Optional[int] = None) -> Iterator[SourceItem]:
        """Every epoch's tasks from ``start_epoch`` on (to ``until``, exclusive; default: ``num_epoch``), each
        epoch closed by an ``EpochEnd``; the first epoch less its first ``skip_rows`` rows (see ``tasks_after``)."""
        for epoch in range(start_epoch, self.num_epoch if until is None else until):
            yield from self.tasks_after(epoch, skip_rows) if skip_rows and epoch == start_epoch else self.tasks(epoch)
            yield EpochEnd(epoch)
