"""The global order's layout: which samples an epoch holds, and where each one goes.

The model (``docs/guides/global-order.md`` draws it):

* **Pools and amounts.** The data is one pool, or one pool per weighted ``Source``. Each pool gives
  an epoch a number of samples (its amount: all of it, ``Shuffle.epoch_size``, a source's
  ``weight``, ``repeat`` or ``choose``). A pool's files are cut into spans of ``S`` consecutive
  samples (a file's last one shorter) and the spans put in an order drawn from the seed alone; an
  epoch takes whole passes over it, then the next part of it (``"balanced"``: epoch ``e`` goes on
  where epoch ``e - 1`` stopped, so epochs together cover the pool; ``"fixed"``: always the first part).
* **Streams.** The spans an epoch takes are permuted, from ``(random_seed, epoch)``, and laid end to
  end into a stream: all pools' spans into one (``batching="random"``), or one stream per pool.
* **Tiles.** Each tile holds ``G * S`` samples of the streams (``G``: the global batch), as ``G``
  columns of ``S`` consecutive samples of a stream: with one stream, the next ``G * S`` samples; with
  ``"stratified"``, each pool's share of the ``G`` columns (apportioned by what each pool has left);
  with ``"per_source"``, ``G`` columns of one pool, the pools' tiles in an order drawn from the
  epoch. What does not fill a whole tile of its kind is laid out last, as one stream. A last tile
  holds fewer samples: ``R`` rows, its columns ``R`` or ``R - 1`` samples long.
* **Batches.** Global batch ``k`` of a tile is its ``k``-th row: one sample of every column. Which
  column sits at which place of a row (a permutation of the ``G`` columns) and which sample of a
  column lands in which row (a permutation per column) are drawn from ``(random_seed, epoch, tile)``.

Everything is a pure function of ``(random_seed, epoch, counts, amounts, G, S)``: not of the world
size, the workers, or where a run resumed. With ``drop_last`` an epoch holds a multiple of ``G`` samples.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .._rng import TILE_COLUMNS, TILE_SPANS, derive_rng
from .schedule import Composition, ScheduleLike, Weights, column_lengths, scheduled_samples

if TYPE_CHECKING:
    from .sources import Mix as MixLike

DEFAULT_BLOCK = 1 << 16  # samples of one tile, all ranks together
BATCHINGS = ("random", "stratified", "per_source")
SAMPLINGS = ("balanced", "fixed")
_PASS, _EPOCH, _TILES = 0, 1, 2  # what a draw of TILE_SPANS is for


def rows_per_tile(block: int, global_batch: int) -> int:
    """``S``: the rows of a full tile (the samples of one column), at least one."""
    return max(1, block // global_batch)


@dataclass(frozen=True)
class Pool:
    """Samples of some files (``files``: their indices; ``counts``: their samples) that an epoch takes
    ``amount`` of."""

    files: np.ndarray
    counts: np.ndarray
    amount: int
    sampling: str = "balanced"

    @property
    def total(self) -> int:
        return int(self.counts.sum())


@dataclass(frozen=True)
class Spans:
    """Runs of consecutive samples of files, in order: file ``file[i]``, rows ``start[i] : start[i] + size[i]``;
    runs of one ``group`` (a span that crosses from a file into the next) are kept together when permuted."""

    file: np.ndarray
    start: np.ndarray
    size: np.ndarray
    group: np.ndarray

    @classmethod
    def cut(cls, files: np.ndarray, counts: np.ndarray, span: int) -> "Spans":
        """The samples of ``files`` end to end, cut every ``span`` samples (a span may cross into the next file)."""
        ends = np.cumsum(counts)
        if not len(ends) or not ends[-1]:
            return Spans.join([])
        begins = ends - counts
        cuts = np.unique(np.concatenate([begins[counts > 0], np.arange(0, int(ends[-1]), span)]))
        owner = np.searchsorted(ends, cuts, side="right")  # the file each run starts in
        stops = np.minimum(np.append(cuts[1:], ends[-1]), ends[owner])
        return cls(files[owner], cuts - begins[owner], stops - cuts, cuts // span)

    def __len__(self) -> int:
        return len(self.file)

    def at(self, index: np.ndarray) -> "Spans":
        return Spans(self.file[index], self.start[index], self.size[index], self.group[index])

    def permuted(self, rng: np.random.Generator) -> "Spans":
        """The groups in an order drawn from ``rng``, the runs of each in their order."""
        groups, first = np.unique(self.group, return_inverse=True)
        place = np.empty(len(groups), dtype=np.int64)
        place[rng.permutation(len(groups))] = np.arange(len(groups))
        return self.at(np.argsort(place[first], kind="stable"))

    def window(self, lo: int, n: int) -> "Spans":
        """Samples ``lo : lo + n`` of these spans end to end (``n`` at most their samples)."""
        ends = np.cumsum(self.size)
        first = int(np.searchsorted(ends, lo, side="right"))
        last = int(np.searchsorted(ends, lo + n, side="left"))
        out = self.at(np.arange(first, last + 1))
        head = lo - int(ends[first] - self.size[first])
        start, size = out.start.copy(), out.size.copy()
        start[0] += head
        size[0] -= head
        size[-1] -= int(ends[last]) - (lo + n)
        return Spans(out.file, start, size, out.group)

    @staticmethod
    def join(parts: Sequence["Spans"]) -> "Spans":
        """``parts`` end to end, each one's groups apart from the others'."""
        if not parts:
            empty = np.zeros(0, np.int64)
            return Spans(empty, empty, empty, empty)
        offsets = np.cumsum([0] + [int(p.group.max(initial=-1)) + 1 for p in parts[:-1]])
        group = np.concatenate([p.group + o for p, o in zip(parts, offsets)])
        return Spans(np.concatenate([p.file for p in parts]), np.concatenate([p.start for p in parts]),
                     np.concatenate([p.size for p in parts]), group)


class Stream:
    """Spans end to end: samples ``[lo, hi)`` as ranges of files."""

    def __init__(self, spans: Spans) -> None:
        self.spans = spans
        self.ends = np.cumsum(spans.size)
        self.samples = int(self.ends[-1]) if len(self.ends) else 0

    def ranges(self, lo: int, hi: int) -> Iterator[Tuple[int, int, int]]:
        """Samples ``[lo, hi)`` as ``(file, start, end)`` ranges, in order."""
        k = int(np.searchsorted(self.ends, lo, side="right"))
        while lo < hi:
            offset = lo - (int(self.ends[k]) - int(self.spans.size[k]))
            n = min(hi - lo, int(self.spans.size[k]) - offset)
            first = int(self.spans.start[k]) + offset
            yield int(self.spans.file[k]), first, first + n
            lo += n
            k += 1


@dataclass(frozen=True)
class Tile:
    """One tile: each column's stream, first sample in it, and samples."""

    stream: np.ndarray
    lo: np.ndarray
    lengths: np.ndarray

    @property
    def rows(self) -> int:
        return int(self.lengths.max(initial=0))


class Layout:
    """One epoch of the global order: its streams and tiles (see the module docstring)."""

    def __init__(self, order: "TileOrder", epoch: int) -> None:
        self.order, self.epoch = order, epoch
        g = order.global_batch
        taken = [order.taken(k, epoch) for k in range(len(order.pools))]
        total = sum(int(t.size.sum()) for t in taken)
        keep = total - total % g if order.drop_last else total
        taken = _trimmed(taken, total - keep)
        self.streams, self.tiles_of = _streams(order, taken, epoch)
        self.before = np.cumsum([[0] * len(taken)] + self.tiles_of[:-1], axis=0) if self.tiles_of else None
        self.full = len(self.tiles_of)
        self.samples = keep
        self.tail = self.streams[-1].samples
        self.count = self.full + -(-self.tail // (g * order.span))

    def tile(self, t: int) -> Tile:
        g, s = self.order.global_batch, self.order.span
        if t < self.full:
            return self._whole(t, g, s)
        last = len(self.streams) - 1
        lo = (t - self.full) * g * s
        lengths = column_lengths(min(g * s, self.tail - lo), g)
        return Tile(np.full(g, last), lo + np.cumsum(lengths) - lengths, lengths)

    def _whole(self, t: int, g: int, s: int) -> Tile:
        """A full tile of the pools' own streams: ``tiles_of[t]`` columns of each, at each one's cursor."""
        columns = np.asarray(self.tiles_of[t])
        assert self.before is not None, "full tiles of the pools' own streams"
        before = self.before[t]
        stream = np.repeat(np.arange(len(columns)), columns)
        first = np.repeat(before * s, columns)
        within = np.arange(g) - np.repeat(np.cumsum(columns) - columns, columns)
        return Tile(stream, first + within * s, np.full(g, s, dtype=np.int64))

    def batches(self) -> int:
        return -(-self.samples // self.order.global_batch)


class ScheduledLayout:
    """One epoch of the global order under a schedule (``_stages.schedule``): each pool's own stream, and
    tiles whose columns the schedule gives the pools."""

    def __init__(self, order: "TileOrder", epoch: int) -> None:
        assert order.composition is not None, "a scheduled order"
        self.order, self.epoch = order, epoch
        self.composition = c = order.composition
        self.columns = c.columns(epoch)
        self.streams = [Stream(_permuted(order.taken(k, epoch), order.seed, epoch, k)) for k in range(len(order.pools))]
        self.cursor = np.cumsum(np.vstack([np.zeros((1, self.columns.shape[1]), dtype=np.int64), self.columns[:-1]]),
                                axis=0) * order.span  # each pool's first sample in tile t: all tiles before are full
        self.count = c.tiles
        self.samples = c.samples

    def tile(self, t: int) -> Tile:
        columns = self.columns[t]
        lengths = self.composition.lengths(t)
        stream = np.repeat(np.arange(len(columns)), columns)
        starts = np.cumsum(lengths) - lengths
        pool_first = starts[np.repeat(np.cumsum(columns) - columns, columns)]  # where each pool's columns start
        return Tile(stream, self.cursor[t][stream] + starts - pool_first, lengths)

    def batches(self) -> int:
        return -(-self.samples // self.order.global_batch)


def _streams(order: "TileOrder", taken: List[Spans], epoch: int) -> Tuple[List[Stream], List[Tuple[int, ...]]]:
    """An epoch's streams (all pools' spans in one; or each pool's, then what their whole tiles leave), and
    the whole tiles of the pools' own streams."""
    if order.batching == "random" or len(taken) == 1:
        return [Stream(_permuted(Spans.join(taken), order.seed, epoch, 0))], []
    pools = [Stream(_permuted(t, order.seed, epoch, k)) for k, t in enumerate(taken)]
    tiles, heads = _whole_tiles(order.batching, [x.samples for x in pools], order.global_batch, order.span,
                                order.seed, epoch)
    return pools + [Stream(Spans.join([_stream_window(x, h) for x, h in zip(pools, heads)]))], tiles


def _stream_window(stream: Stream, head: int) -> Spans:
    """The spans of ``stream`` from sample ``head`` on."""
    left = stream.samples - head
    return stream.spans.window(head, left) if left > 0 else Spans.join([])


def _trimmed(taken: List[Spans], drop: int) -> List[Spans]:
    """``taken`` less ``drop`` samples at the end of the last pools (``drop_last``)."""
    out = list(taken)
    for k in reversed(range(len(out))):
        if not drop:
            break
        n = int(out[k].size.sum())
        cut = min(drop, n)
        out[k] = out[k].window(0, n - cut) if n - cut else Spans.join([])
        drop -= cut
    return out


def _permuted(spans: Spans, seed: int, epoch: int, k: int) -> Spans:
    return spans.permuted(derive_rng(seed, TILE_SPANS, _EPOCH, epoch, k))


def _whole_tiles(batching: str, samples: List[int], g: int, s: int, seed: int,
                 epoch: int) -> Tuple[List[Tuple[int, ...]], List[int]]:
    """The full tiles of the pools' own streams (``samples`` each): each tile's columns per pool, and where
    each stream's rest starts."""
    if batching == "per_source":
        return _per_source_tiles(samples, g, s, seed, epoch)
    return _stratified_tiles(samples, g, s)


def _per_source_tiles(samples: List[int], g: int, s: int, seed: int,
                      epoch: int) -> Tuple[List[Tuple[int, ...]], List[int]]:
    """Every whole tile of one pool's stream, the pools' tiles in an order drawn from the epoch."""
    whole = [n // (g * s) for n in samples]
    tiles = [_one_pool(k, len(samples), g) for k, n in enumerate(whole) for _ in range(n)]
    order = derive_rng(seed, TILE_SPANS, _TILES, epoch).permutation(len(tiles))
    return [tiles[i] for i in order], [n * g * s for n in whole]


def _one_pool(k: int, pools: int, g: int) -> Tuple[int, ...]:
    """A tile's columns, all ``g`` of pool ``k``."""
    return tuple(g if j == k else 0 for j in range(pools))


def _stratified_tiles(samples: List[int], g: int, s: int) -> Tuple[List[Tuple[int, ...]], List[int]]:
    """Tiles whose columns each pool fills in its share of what the pools have left, while they can."""
    left, tiles = list(samples), []
    while sum(left) >= g * s:
        columns = _capped(apportioned(g, left), left, s)
        if sum(columns) < g:
            break
        tiles.append(tuple(columns))
        left = [n - c * s for n, c in zip(left, columns)]
    return tiles, [n - rest for n, rest in zip(samples, left)]


def _capped(columns: List[int], left: List[int], s: int) -> List[int]:
    """``columns`` moved, one at a time, from pools that cannot fill theirs to pools that can."""
    out = list(columns)
    for k in range(len(out)):
        while out[k] * s > left[k]:
            out[k] -= 1
            room = [j for j in range(len(out)) if (out[j] + 1) * s <= left[j]]
            if room:
                out[max(room, key=lambda j: left[j] - out[j] * s)] += 1
    return out


class TileOrder:
    """The global order of every epoch: pools, their amounts, layouts and each tile's permutations."""

    def __init__(self, pools: Sequence[Pool], global_batch: int, block: int, seed: int, drop_last: bool,
                 batching: str = "random", schedule: Optional[ScheduleLike] = None,
                 epoch_size: Optional[int] = None) -> None:
        self.pools = list(pools)
        self.global_batch = global_batch
        self.span = rows_per_tile(block, global_batch)
        self.seed = seed
        self.drop_last = drop_last
        self.batching = batching
        self.spans = [_permuted_pass(Spans.cut(p.files, p.counts, self.span), seed, k) for k, p in enumerate(pools)]
        self._layouts: Dict[int, Union[Layout, ScheduledLayout]] = {}
        self.composition = None if schedule is None else self._composed(schedule, epoch_size)

    def _composed(self, schedule: ScheduleLike, epoch_size: Optional[int]) -> Composition:
        """The tiles' columns per pool that ``schedule`` gives (``_stages.schedule``)."""
        totals = [p.total for p in self.pools]
        if not all(totals):
            raise ValueError(f"source {totals.index(0)} has no samples: a Shuffle.schedule cannot give it a share")
        samples = scheduled_samples(epoch_size, totals, self.global_batch, self.drop_last)
        return Composition(Weights(schedule, len(self.pools)), samples, self.global_batch, self.span, self.batching,
                           self.seed)

    def _amount(self, k: int, epoch: int) -> Tuple[int, int]:
        """The samples pool ``k`` gives ``epoch``, and those it gave the epochs before."""
        if self.composition is None:
            amount = self.pools[k].amount
            return amount, epoch * amount
        return int(self.composition.given(epoch)[k]), int(self.composition.before(epoch)[k])

    def taken(self, k: int, epoch: int) -> Spans:
        """The spans pool ``k`` gives ``epoch``: whole passes, then the part after the previous epoch's."""
        pool, spans = self.pools[k], self.spans[k]
        total = pool.total
        amount, before = self._amount(k, epoch)
        if not total or not amount:
            return Spans.join([])
        passes, part = divmod(amount, total)
        at = before % total if pool.sampling == "balanced" else 0
        wrap = [spans.window(at, min(part, total - at))] if part else []
        if part > total - at:
            wrap.append(spans.window(0, part - (total - at)))
        return Spans.join([spans] * passes + wrap)

    def layout(self, epoch: int) -> Union[Layout, ScheduledLayout]:
        if epoch not in self._layouts:
            if len(self._layouts) >= 2:
                self._layouts.pop(min(self._layouts))
            self._layouts[epoch] = Layout(self, epoch) if self.composition is None else ScheduledLayout(self, epoch)
        return self._layouts[epoch]

    def permutations(self, epoch: int, t: int, tile: Tile) -> Tuple[np.ndarray, np.ndarray]:
        """Tile ``t``'s column at each place of a row, and each column's rows: ``rows[c, j]`` is the
        sample of column ``c`` (counted in it) in row ``j``, where ``j < lengths[c]``."""
        rng = derive_rng(self.seed, TILE_COLUMNS, epoch, t)
        places = rng.permutation(self.global_batch)
        rows = np.argsort(rng.random((self.global_batch, tile.rows)), axis=1, kind="stable")
        short = tile.lengths < tile.rows
        if short.any():  # a last tile: a column one short takes its rows among its own samples
            rows[short] = [np.concatenate([r[r < tile.rows - 1], r[r == tile.rows - 1]]) for r in rows[short]]
        return places, rows


def _permuted_pass(spans: Spans, seed: int, k: int) -> Spans:
    """A pool's spans in the order its passes take them (from the seed alone: epochs go on along it)."""
    return spans.permuted(derive_rng(seed, TILE_SPANS, _PASS, k))


def apportioned(n: int, shares: Sequence[float]) -> List[int]:
    """``n`` split in proportion to ``shares`` (largest remainders), summing to ``n``."""
    total = float(sum(shares))
    if total <= 0:
        return [0] * len(shares)
    exact = [n * s / total for s in shares]
    out = [int(x) for x in exact]
    for k in sorted(range(len(shares)), key=lambda k: out[k] - exact[k])[:n - sum(out)]:
        out[k] += 1
    return out


def pool_amounts(totals: Sequence[int], weights: Sequence[float], repeats: Sequence[Optional[float]],
                 chooses: Sequence[Optional[int]], epoch_size: Optional[int], stop: str) -> List[int]:
    """Each pool's samples per epoch: ``choose`` as given, ``repeat`` times its samples, and the rest of the
    epoch shared by ``weight`` (within ``epoch_size``, else until the first pool, or every pool, has given
    all its samples: ``stop``); with ``epoch_size`` and no pool left to share, every amount scaled to it."""
    fixed = list(map(_fixed, totals, repeats, chooses))
    free = _unfixed(fixed)
    out = [f or 0 for f in fixed]
    if not free:
        return out if epoch_size is None else apportioned(epoch_size, out)
    rest = max(0, epoch_size - sum(out)) if epoch_size is not None else _until_stop(totals, weights, free, stop)
    return _shared(out, free, rest, weights)


def _unfixed(fixed: List[Optional[int]]) -> List[int]:
    """The pools whose amount their weight gives."""
    return [k for k, f in enumerate(fixed) if f is None]


def _shared(out: List[int], free: List[int], rest: int, weights: Sequence[float]) -> List[int]:
    """``out`` with ``rest`` shared among the ``free`` pools by their weights."""
    for k, n in zip(free, apportioned(rest, [weights[k] for k in free])):
        out[k] = n
    return out


def _until_stop(totals: Sequence[int], weights: Sequence[float], free: List[int], stop: str) -> int:
    """The samples the ``free`` pools give together, each its share, until the first (or last) has given all."""
    each = [totals[k] / weights[k] for k in free]
    return round((min(each) if stop == "first_exhausted" else max(each)) * sum(weights[k] for k in free))


def _fixed(total: int, repeat: Optional[float], choose: Optional[int]) -> Optional[int]:
    """A pool's samples per epoch where ``choose`` or ``repeat`` gives them."""
    if choose is not None:
        return choose
    return None if repeat is None else round(repeat * total)


def pools_of(epoch_size: Optional[int], counts: Sequence[int], mix: Optional["MixLike"], stop: str) -> List[Pool]:
    """The pools of a loader's data and their amounts: one of all the files, or one per weighted source."""
    c = np.asarray(counts, dtype=np.int64)
    if mix is None:
        return [Pool(np.arange(len(c)), c, int(c.sum()) if epoch_size is None else epoch_size)]
    sources = mix.sources
    totals = [int(c[a:b].sum()) for a, b in mix.spans]
    amounts = pool_amounts(totals, mix.weights(), [s.repeat for s in sources], [s.choose for s in sources],
                           epoch_size, stop)
    return [Pool(np.arange(a, b), c[a:b], n, s.sampling) for (a, b), n, s in zip(mix.spans, amounts, sources)]
