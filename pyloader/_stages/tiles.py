"""The global order: one permutation of every sample of an epoch, the same for any number of ranks.

The model (``docs/guides/global-order.md`` draws it):

* **Spans.** Each file is cut into spans of ``S`` consecutive samples (its last one shorter). The
  spans of the whole data are permuted, from ``(random_seed, epoch)``, and laid end to end: the
  *span stream*.
* **Tiles.** The span stream is cut into tiles of ``G * S`` samples, ``G`` being the global batch
  (``batch_size * world_size``) and ``G * S`` the block budget (``Shuffle.block``); the last tile is
  shorter. A tile is ``G`` *columns* of ``S`` consecutive samples of the stream (in the last tile,
  of ``R`` or ``R - 1`` samples, ``R`` rows), so a column is one span, or the end of one and the
  start of the next.
* **Batches.** Global batch ``k`` of a tile is its ``k``-th row: one sample of every column. Which
  column sits at which place of the row (a permutation of the ``G`` columns) and which sample of a
  column lands in which row (a permutation per column) are drawn from ``(random_seed, epoch, tile)``.
* **Ranks.** Rank ``r`` of ``W`` takes places ``[r G / W, (r + 1) G / W)`` of every row: whole
  columns, so it reads only its columns (ranges of ``S`` samples, by random access where the reader
  has it) and holds only its share of one tile (``G * S / W`` samples). Global batch ``k`` holds the
  same samples for every world size dividing ``G``; a state resumes under any of them at its global
  batch, exactly.

Everything is a pure function of ``(random_seed, epoch, counts, G, S)``: not of the world size, the
workers, the placement, or where a run was resumed. With ``drop_last`` an epoch holds
``N - N % G`` samples of the stream (the partial last batch is left out, a different part each epoch).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .._columns import Traced, concat, slice_rows, take
from .._execution.reading import FileTask
from .._rng import TILE_COLUMNS, TILE_SPANS, derive_rng
from .._sample_index import table_of
from .shard import Sharding
from .source import EpochEnd, SourceItem, known_counts

DEFAULT_BLOCK = 1 << 16  # samples of one tile, all ranks together


def rows_per_tile(block: int, global_batch: int) -> int:
    """``S``: the rows of a full tile (the samples of one column), at least one."""
    return max(1, block // global_batch)


@dataclass(frozen=True)
class Tile:
    """One tile of an epoch: where it starts in the span stream, its columns' lengths and starts."""

    start: int  # in the span stream
    lengths: np.ndarray  # samples of each column (all ``S`` but in the last tile)
    starts: np.ndarray  # each column's first sample, in the span stream

    @property
    def rows(self) -> int:
        return int(self.lengths.max(initial=0))


class TileOrder:
    """The global order of every epoch (see the module docstring): spans, tiles, and each tile's
    permutations."""

    def __init__(self, counts: Sequence[int], global_batch: int, block: int, seed: int, drop_last: bool) -> None:
        self.counts = np.asarray(counts, dtype=np.int64)
        self.global_batch = global_batch
        self.span = rows_per_tile(block, global_batch)
        self.seed = seed
        self.drop_last = drop_last
        total = int(self.counts.sum())
        self.samples = total - total % global_batch if drop_last else total
        per_file = -(-self.counts // self.span)
        self.span_file = np.repeat(np.arange(len(self.counts)), per_file)
        first = np.cumsum(per_file) - per_file
        self.span_start = (np.arange(len(self.span_file)) - np.repeat(first, per_file)) * self.span
        self.span_len = np.minimum(self.span, self.counts[self.span_file] - self.span_start)

    def tiles(self) -> int:
        return -(-self.samples // (self.global_batch * self.span))

    def batches(self) -> int:
        """Global batches of an epoch."""
        return -(-self.samples // self.global_batch)

    def stream(self, epoch: int) -> Tuple[np.ndarray, np.ndarray]:
        """The span stream of ``epoch``: the spans in their order, and where each starts in the stream."""
        order = derive_rng(self.seed, TILE_SPANS, epoch).permutation(len(self.span_file))
        ends = np.cumsum(self.span_len[order])
        return order, ends - self.span_len[order]

    def tile(self, t: int) -> Tile:
        full = self.global_batch * self.span
        start = t * full
        n = min(full, self.samples - start)
        base, extra = divmod(n, self.global_batch)
        lengths = np.full(self.global_batch, base, dtype=np.int64)
        lengths[:extra] += 1
        return Tile(start, lengths, start + np.cumsum(lengths) - lengths)

    def permutations(self, epoch: int, t: int, tile: Tile) -> Tuple[np.ndarray, np.ndarray]:
        """Tile ``t``'s column at each place of a row, and each column's rows: ``rows[c, j]`` is the
        sample of column ``c`` (counted in it) in row ``j``, where ``j < lengths[c]``."""
        rng = derive_rng(self.seed, TILE_COLUMNS, epoch, t)
        places = rng.permutation(self.global_batch)
        rows = np.argsort(rng.random((self.global_batch, tile.rows)), axis=1, kind="stable")
        short = tile.lengths < tile.rows
        if short.any():  # the last tile: a column one short takes its rows among its own samples
            rows[short] = [np.concatenate([r[r < tile.rows - 1], r[r == tile.rows - 1]]) for r in rows[short]]
        return places, rows

    def ranges(self, lo: int, hi: int, stream: Tuple[np.ndarray, np.ndarray]) -> Iterator[Tuple[int, int, int]]:
        """Samples ``[lo, hi)`` of the span stream as ``(file, start, end)`` ranges of files, in order."""
        order, starts = stream
        k = int(np.searchsorted(starts, lo, side="right")) - 1
        while lo < hi:
            span = int(order[k])
            offset = lo - int(starts[k])
            take_n = min(hi - lo, int(self.span_len[span]) - offset)
            first = int(self.span_start[span]) + offset
            yield int(self.span_file[span]), first, first + take_n
            lo += take_n
            k += 1


class TiledSource:
    """Stage 1 for the global order: this rank's column ranges of every tile (``FileTask``s read by
    random access), and per epoch a ``TileBuffer`` that puts their rows in the order of the tiles' rows.

    ``resume``: ``(epoch, batches)`` the run starts at; that epoch's tasks start at the tile holding
    that global batch, whose rows before it the buffer leaves out."""

    def __init__(self, files: Sequence[str], counts: Sequence[Optional[int]], *, batch_size: int, block: int,
                 seed: int, num_epoch: int, drop_last: bool, sharding: Sharding,
                 resume: Tuple[int, int] = (-1, 0), runs: Optional[Dict[int, Dict[str, object]]] = None) -> None:
        self.files = list(files)
        self.counts, self.left_out = known_counts(counts)
        self.batch_size = batch_size
        self.sharding = sharding
        self.order = TileOrder(self.counts, batch_size * sharding.world_size, block, seed, drop_last)
        self.seed = seed
        self.num_epoch = num_epoch
        self.resume = resume
        self.tables = {i: t for i, r in (runs or {}).items() if (t := table_of(r, self.counts[i])) is not None}

    @property
    def places(self) -> range:
        """This rank's places in every row of a tile."""
        r = self.sharding.rank
        return range(r * self.batch_size, (r + 1) * self.batch_size)

    def _first_tile(self, epoch: int) -> int:
        return self.resume[1] // self.order.span if epoch == self.resume[0] else 0

    def tasks(self, epoch: int) -> Iterator[FileTask]:
        stream = self.order.stream(epoch)
        pos = 0
        for t in range(self._first_tile(epoch), self.order.tiles()):
            tile = self.order.tile(t)
            places, _ = self.order.permutations(epoch, t, tile)
            for c in places[self.places.start:self.places.stop]:
                lo = int(tile.starts[c])
                for index, start, end in self.order.ranges(lo, lo + int(tile.lengths[c]), stream):
                    table = self.tables.get(index)
                    yield FileTask(epoch, pos, index, self.files[index], start=start, end=end,
                                   count=self.counts[index], seed=self.seed, ranged=True,
                                   extent=None if table is None else table.extent(start, end))
                    pos += 1

    def iterate(self, start_epoch: int = 0, skip_rows: int = 0, until: Optional[int] = None) -> Iterator[SourceItem]:
        """Every epoch's tasks from ``start_epoch`` on; the resumed epoch's begin at the tile of its
        position (``resume``), ``skip_rows`` is the rank's rows before it (unused: the tile says)."""
        for epoch in range(start_epoch, self.num_epoch if until is None else until):
            yield from self.tasks(epoch)
            yield EpochEnd(epoch)

    def samples(self, epoch: int) -> int:
        """The samples of the epoch's batches on this rank, padding of an empty last share included."""
        return self.steps(epoch, self.batch_size, None, self.order.drop_last) * self.batch_size

    def steps(self, epoch: int, batch_size: int, seq_len: Optional[int], drop_last: bool) -> int:
        """Every rank gives one batch per global batch."""
        return self.order.batches()

    def batches(self, epoch: int, batch_size: int, drop_last: bool, rotation: int = 1) -> int:
        """The batches this rank gives in ``epoch`` (``len()``)."""
        return self.order.batches()

    def buffer(self, epoch: int) -> "TileBuffer":
        first = self._first_tile(epoch)
        skip = self.resume[1] - first * self.order.span if epoch == self.resume[0] else 0
        return TileBuffer(self, epoch, first, skip)

    def read_again(self, epoch: int, rows: int, read_from: int) -> List[str]:
        return []


class TileBuffer:
    """Holds this rank's columns of one tile as they arrive (in the order of its places), then lets
    out the tile's rows, each this rank's places of one global batch; ``skip``: rows of the first
    tile handed out already (a resumed epoch)."""

    def __init__(self, source: TiledSource, epoch: int, first: int, skip: int) -> None:
        self.source, self.epoch = source, epoch
        self.tile = first
        self.skip = skip
        self.held: List[Traced] = []
        self.count = 0
        self._plan()

    def _plan(self) -> None:
        """The next tile's order: how many rows of this rank it holds, and where each goes."""
        order = self.source.order
        if self.tile >= order.tiles():
            self.need, self.emit = -1, np.zeros(0, dtype=np.int64)
            return
        tile = order.tile(self.tile)
        places, rows = order.permutations(self.epoch, self.tile, tile)
        mine = places[self.source.places.start:self.source.places.stop]
        lengths = tile.lengths[mine]
        firsts = np.cumsum(lengths) - lengths  # each column's first row in what this rank holds
        at = (rows[mine] + firsts[:, None]).T  # [row, place]: the held row each place of each row takes
        present = np.arange(tile.rows)[:, None] < lengths[None, :]
        self.need = int(lengths.sum())
        self.emit = at[present][self.skip * len(mine):]
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
                yield take(slice_rows(joined, 0, self.need), self.emit)
        self.tile += 1
        self._plan()

    def drain(self) -> Iterator[Traced]:
        """What is held at the epoch's end: only where rows went missing (an error skipped), in order."""
        if self.held:
            yield concat(self.held, "global order")
        self.held, self.count = [], 0
