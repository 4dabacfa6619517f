"""Stage 1 and the batcher's buffer for the global order (``_stages.tiles``): what a rank reads, and
the rows it hands on.

Rank ``r`` of ``W`` takes places ``[r G / W, (r + 1) G / W)`` of every row of every tile: whole columns,
so it reads only its columns (ranges of files, ``FileTask.ranged``: by random access where the reader
has it) and holds only its share of one tile. Global batch ``k`` holds the same samples for every world
size dividing ``G``; a state resumes under any of them at its global batch, exactly.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .._columns import Traced, concat, slice_rows, take
from .._execution.reading import FileTask
from .._sample_index import table_of
from .schedule import ScheduleLike
from .shard import Sharding
from .source import EpochEnd, SourceItem
from .tiles import Pool, TileOrder

Range = Tuple[int, int]  # rows ``start:end`` of a file


class TiledSource:
    """This rank's column ranges of every tile (``FileTask``s), and per epoch a ``TileBuffer`` that puts
    their rows in the order of the tiles' rows.

    ``resume``: ``(epoch, batches)`` the run starts at; that epoch's tasks start at the tile holding that
    global batch, whose rows before it the buffer leaves out. ``runs``: the sample index of files that
    have one (``_sample_index``), which places each range in its file's bytes."""

    def __init__(self, files: Sequence[str], counts: Sequence[int], pools: Sequence[Pool], *, batch_size: int,
                 block: int, batching: str, seed: int, num_epoch: int, drop_last: bool, sharding: Sharding,
                 resume: Tuple[int, int] = (-1, 0), runs: Optional[Dict[int, Dict[str, object]]] = None,
                 schedule: Optional[ScheduleLike] = None, epoch_size: Optional[int] = None) -> None:
        self.files = list(files)
        self.counts = list(counts)
        self.batch_size = batch_size
        self.sharding = sharding
        self.order = TileOrder(pools, batch_size * sharding.world_size, block, seed, drop_last, batching,
                               schedule=schedule, epoch_size=epoch_size)
        self.seed = seed
        self.num_epoch = num_epoch
        self.resume = resume
        self.tables = {i: t for i, r in (runs or {}).items() if (t := table_of(r, self.counts[i])) is not None}

    @property
    def places(self) -> slice:
        """This rank's places in every row of a tile."""
        r = self.sharding.rank
        return slice(r * self.batch_size, (r + 1) * self.batch_size)

    def _first_tile(self, epoch: int) -> int:
        return self.resume[1] // self.order.span if epoch == self.resume[0] else 0

    def tasks(self, epoch: int) -> Iterator[FileTask]:
        pos = 0
        for t in range(self._first_tile(epoch), self.order.layout(epoch).count):
            for index, ranges in self.reads(epoch, t)[0]:
                yield self._task(epoch, pos, index, ranges)
                pos += 1

    def reads(self, epoch: int, t: int) -> Tuple[List[Tuple[int, List[Range]]], np.ndarray]:
        """What this rank reads of tile ``t``: each file's ranges (the files in the order this rank's places
        first need them, each file's ranges in file order, those that touch joined), and where each sample
        of this rank's columns (in the order of its places) arrives among what is read."""
        layout = self.order.layout(epoch)
        tile = layout.tile(t)
        places, _ = self.order.permutations(epoch, t, tile)
        by_file: Dict[int, List[Tuple[int, int, int]]] = {}  # file -> (start, end, first sample in column order)
        at = 0
        for c in places[self.places]:
            lo = int(tile.lo[c])
            for index, start, end in layout.streams[tile.stream[c]].ranges(lo, lo + int(tile.lengths[c])):
                by_file.setdefault(index, []).append((start, end, at))
                at += end - start
        arrival = np.empty(at, dtype=np.int64)
        reads, held = [], 0
        for index, parts in by_file.items():
            parts.sort()
            for start, end, first in parts:
                arrival[first:first + end - start] = np.arange(held, held + end - start)
                held += end - start
            reads.append((index, _joined([(start, end) for start, end, _ in parts])))
        return reads, arrival

    def _task(self, epoch: int, pos: int, index: int, ranges: List[Range]) -> FileTask:
        table = self.tables.get(index)
        extents = () if table is None else tuple(table.extent(start, end) for start, end in ranges)
        return FileTask(epoch, pos, index, self.files[index], start=ranges[0][0], end=ranges[-1][1],
                        count=self.counts[index], seed=self.seed, ranged=True, ranges=tuple(ranges), extents=extents)

    def iterate(self, start_epoch: int = 0, skip_rows: int = 0, until: Optional[int] = None) -> Iterator[SourceItem]:
        """Every epoch's tasks from ``start_epoch`` on; the resumed epoch's begin at the tile of its
        position (``resume``; ``skip_rows``, the rank's rows before it, is what the tile says)."""
        for epoch in range(start_epoch, self.num_epoch if until is None else until):
            yield from self.tasks(epoch)
            yield EpochEnd(epoch)

    def samples(self, epoch: int) -> int:
        """The samples of the epoch's batches on this rank, padding of an empty last share included."""
        return self.order.layout(epoch).batches() * self.batch_size

    def steps(self, epoch: int, batch_size: int, seq_len: Optional[int], drop_last: bool) -> int:
        """Every rank gives one batch per global batch."""
        return self.order.layout(epoch).batches()

    def batches(self, epoch: int, batch_size: int, drop_last: bool, rotation: int = 1) -> int:
        """The batches this rank gives in ``epoch`` (``len()``)."""
        return self.order.layout(epoch).batches()

    def buffer(self, epoch: int) -> "TileBuffer":
        first = self._first_tile(epoch)
        skip = self.resume[1] - first * self.order.span if epoch == self.resume[0] else 0
        return TileBuffer(self, epoch, first, skip)

    def read_again(self, epoch: int, rows: int, read_from: int) -> List[str]:
        return []


def _joined(ranges: List[Range]) -> List[Range]:
    """Ranges in order, those that touch made one."""
    out = [ranges[0]]
    for start, end in ranges[1:]:
        if start == out[-1][1]:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _rows_of(at: np.ndarray, present: np.ndarray) -> Tuple[List[np.ndarray], List[bool]]:
    """Each row's samples (``at[row][present[row]]``) and whether it is padding: a row this rank has no
    sample of (its columns are shorter, in an epoch's last tile) takes the rank's samples of the row before
    it again, flagged as padding, so that every rank gives every step, and a run resumed there the same."""
    picks: List[np.ndarray] = []
    padded: List[bool] = []
    for j in range(len(at)):
        row = at[j][present[j]]
        pad = not len(row) and bool(picks)
        picks.append(picks[-1] if pad else row)
        padded.append(pad)
    return picks, padded


def _flagged(rows: Traced, padded: Optional[np.ndarray]) -> Traced:
    """``rows`` with ``padded`` ones flagged as padding (``Provenance.padding``)."""
    if padded is None:
        return rows
    before = rows.provenance.padding
    flags = padded if before is None else np.asarray(before, dtype=bool) | padded
    return Traced(rows.columns, dataclasses.replace(rows.provenance, padding=flags))


class TileBuffer:
    """Holds this rank's columns of one tile as they arrive (in the order of its places), then lets
    out the tile's rows, each this rank's places of one global batch; ``skip``: rows of the first
    tile handed out already (a resumed epoch)."""

    def __init__(self, source: TiledSource, epoch: int, first: int, skip: int) -> None:
        self.source, self.epoch = source, epoch
        self.layout = source.order.layout(epoch)
        self.tile = first
        self.skip = skip
        self.held: List[Traced] = []
        self.count = 0
        self._plan()

    def _plan(self) -> None:
        """The next tile's order: how many rows of this rank it holds, and where each goes."""
        if self.tile >= self.layout.count:
            self.need, self.emit, self.padded = -1, np.zeros(0, dtype=np.int64), None
            return
        tile = self.layout.tile(self.tile)
        places, rows = self.source.order.permutations(self.epoch, self.tile, tile)
        mine = places[self.source.places]
        lengths = tile.lengths[mine]
        firsts = np.cumsum(lengths) - lengths  # each column's first row in what this rank holds
        at = (rows[mine] + firsts[:, None]).T  # [row, place]: the sample (in column order) each place takes
        present = np.arange(tile.rows)[:, None] < lengths[None, :]
        self.need = int(lengths.sum())
        picks, padded = _rows_of(at, present)
        arrival = self.source.reads(self.epoch, self.tile)[1]
        none = [np.zeros(0, dtype=np.int64)]
        self.emit = arrival[np.concatenate(picks[self.skip:] or none)]
        flags = np.concatenate([np.full(len(p), pad) for p, pad in zip(picks, padded)][self.skip:] or none)
        self.padded = flags.astype(bool) if flags.any() else None
        self.skip = 0

    def feed(self, columns: Traced) -> Iterator[Traced]:
        if not columns.n:
            return
        self.held.append(columns)
        self.count += columns.n
        while self.need >= 0 and self.count >= self.need:
            yield from self._let_out()

    def _let_out(self) -> Iterator[Traced]:
        if self.held:
            joined: Traced = concat(self.held, "global order")
            rest = joined.n - self.need
            self.held = [slice_rows(joined, self.need, joined.n)] if rest else []
            self.count = rest
            if len(self.emit):
                yield _flagged(take(slice_rows(joined, 0, self.need), self.emit), self.padded)
        self.tile += 1
        self._plan()

    def drain(self) -> Iterator[Traced]:
        """What is held at the epoch's end: only where rows went missing (an error skipped), in order."""
        if self.held:
            yield concat(self.held, "global order")
        self.held, self.count = [], 0
