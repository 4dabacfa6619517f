"""Stage 1: which file is read when — the per-epoch plan of files."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple, Union

from ._order import FileOrder, OrderFn
from ._rng import FILE_ORDER, derive_rng
from ._shard import Sharding, planned_steps, rank_ranges, stream_positions, stream_target


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


@dataclass(frozen=True)
class EpochEnd:
    epoch: int


SourceItem = Union[FileTask, EpochEnd]
Bounds = Optional[Tuple[int, int]]  # a stream that is a slice of its file: rows start:end (``_entries``)


class FileSource:
    """Yields every epoch's files in order, then an ``EpochEnd`` marker.

    The order of epoch ``e`` is the sorted list, or with ``shuffle`` a permutation
    drawn from ``(seed, e)``, or what ``file_order`` says (``_order``): the same on
    every run, rank and worker.

    Under ranks ``counts`` gives the samples per file (``DataReader.count``); a file
    whose count is ``None`` (its ``count`` failed and was skipped) is left out:
    counted as empty and never read.

    In stream mode a file may be a slice of one (``bounds``): its tasks read rows
    ``start:end`` and its count is ``end - start``.
    """

    def __init__(self, files: Sequence[str], num_epoch: int, shuffle: bool, seed: int,
                 sharding: Sharding = Sharding(), counts: Optional[Sequence[Optional[int]]] = None,
                 whole_files: bool = False, file_order: Optional[OrderFn] = None,
                 bounds: Optional[Sequence[Bounds]] = None) -> None:
        self.files = list(files)
        self.file_order = None if file_order is None else FileOrder(file_order, self.files, seed)
        self.num_epoch = num_epoch
        self.shuffle = shuffle
        self.seed = seed
        self.sharding = sharding
        # samples per file; needed to split epochs across ranks
        self.counts = None if counts is None else [n or 0 for n in counts]
        self.left_out = frozenset(i for i, n in enumerate(counts or ()) if n is None)
        self.whole_files = whole_files  # stream mode: ranks split files, not sample ranges
        self.bounds = bounds

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
        if not self.sharding.active:
            for pos, index in enumerate(order):
                yield self._whole(epoch, pos, index)
            return
        if self.whole_files:
            for pos in stream_positions(order, self.sharding):
                index = order[pos]
                if index not in self.left_out:
                    yield self._whole(epoch, pos, index, count=self.counts[index])
            return
        assert self.counts is not None, "sharding needs the sample counts"
        share, padding = rank_ranges(order, self.counts, self.sharding)
        for pad, part in ((False, share), (True, padding)):
            for pos, start, end in part:
                index = order[pos]
                yield FileTask(epoch, pos, index, self.files[index], start, end, pad, self.counts[index])

    def _whole(self, epoch: int, pos: int, index: int, count: Optional[int] = None) -> FileTask:
        """The task reading file ``index`` whole, or its slice (checked by its bounds, not a count)."""
        bounds = self.bounds[index] if self.bounds is not None else None
        if bounds is None:
            return FileTask(epoch, pos, index, self.files[index], count=count)
        return FileTask(epoch, pos, index, self.files[index], *bounds)

    def steps(self, epoch: int, batch_size: int, seq_len: Optional[int], drop_last: bool) -> int:
        """The number of steps every rank gives in ``epoch``, planned from the counts alone
        (under ranks), so that no rank needs to ask the others."""
        order = self.order(epoch)
        if self.whole_files:
            return stream_target(order, self.counts, batch_size, seq_len or 1, self.sharding)
        return planned_steps(order, self.counts, self.sharding, batch_size, drop_last)

    def iterate(self, start_epoch: int = 0) -> Iterator[SourceItem]:
        for epoch in range(start_epoch, self.num_epoch):
            yield from self.tasks(epoch)
            yield EpochEnd(epoch)
