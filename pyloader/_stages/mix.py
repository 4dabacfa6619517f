"""Weighted mixing of sources: each epoch's plan, the files it reads, and the buffer that interleaves them.

Contracts:

* **The plan.** Epoch ``e`` draws the source of each sample position from a
  generator seeded by ``(random_seed, MIX, e)`` with the sources' normalized
  weights, so any window of samples matches the weights within sampling error.
  Each source gives its samples in its own order: its files in listed order
  (with ``shuffle=True`` a permutation drawn from ``(random_seed, MIX_FILES, e,
  k)``), each read with its own reader (in-file shuffle as usual).
* **Stop.** ``"first_exhausted"`` (the default) ends the epoch right after the
  draw that takes the last sample of some source; ``"all_exhausted"`` goes on
  until every source has given all its samples at least once, a source that runs
  out starting again from its first sample (same order). Either way the plan is
  made from ``DataReader.count`` alone, so the epoch's length is known up front
  (``len()``), and a source with no samples is a ``ValueError`` naming it.
* **Reading.** The plan says which rows of which file each position takes; the
  files are read as ranges (``FileTask`` start:end), ordered by the position that
  first needs them, so the buffer holds about one file per source. A file that
  holds other than its count is an error naming it (``_stages.read``).
* **Ranks.** Every rank makes the same plan; rank ``r`` takes the contiguous
  positions ``[N r / W, N (r + 1) / W)`` of it, reading only the file ranges they
  need; ``even_batches="pad"`` tops the shorter shares up with padding batches
  (``_stages.batch``), ``"drop"`` trims every share to the shortest; a share left empty (an
  epoch of fewer samples than ranks) reads the position after it as padding, as a plain
  loader's does. Every planned sample is delivered once across ranks, and every rank takes the same steps.
* **Resume** replays the epoch up to the position (the plan and the sources'
  orders are pure functions of the seed and the epoch); a state saved under
  another world size is refused.
"""
from __future__ import annotations

import collections
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .._columns import Traced, concat, interleave, n_rows, slice_rows
from .._rng import MIX, MIX_FILES, derive_rng
from .._state import files_digest
from .shard import Sharding, batches_of, shares
from .source import EpochEnd, FileTask, SourceItem, known_counts
from .sources import Mix

STOPS = ("first_exhausted", "all_exhausted")
_CHUNK = 65536  # draws made at a time: fixed, so the plan does not depend on anything but the seed


def check_stop(stop: object) -> None:
    if stop not in STOPS:
        raise ValueError(f"stop must be one of {STOPS}, got {stop!r}")


def draw_plan(weights: Sequence[float], totals: Sequence[int], stop: str, seed: int, epoch: int) -> np.ndarray:
    """The source of every sample position of ``epoch``, drawn until ``stop`` says the epoch ends."""
    rng = derive_rng(seed, MIX, epoch)
    # the epoch ends at the first source's end, or at the last one's
    needed, pick = (1, min) if stop == "first_exhausted" else (len(totals), max)
    taken = np.zeros(len(totals), dtype=np.int64)
    chunks: List[np.ndarray] = []
    while np.count_nonzero(taken >= totals) < needed:
        chunks.append(rng.choice(len(totals), size=_CHUNK, p=np.asarray(weights, dtype=np.float64)).astype(np.int16))
        taken += np.bincount(chunks[-1], minlength=len(totals))
    plan = np.concatenate(chunks)
    # each source exhausted: the position of its last sample's first pass
    ends = [int(np.flatnonzero(plan == k)[total - 1]) for k, total in enumerate(totals) if taken[k] >= total]
    return plan[:pick(ends) + 1]


Need = Tuple[int, int, int, int]  # (first position needing it, file index, start row, end row)


class MixSource:
    """The file ranges this rank reads in each epoch of a mixed loader, and its steps (``FileSource``'s part)."""

    def __init__(self, mix: Mix, counts: Sequence[Optional[int]], stop: str, shuffle: bool, seed: int,
                 num_epoch: int, sharding: Optional[Sharding] = None,
                 counted: Optional[List[Dict[str, object]]] = None) -> None:
        self.mix = mix
        self.counted = counted  # per source, its "samples" batched are counted here (``loader.stats``)
        self.counts, self.left_out = known_counts(counts)
        self.stop = stop
        self.shuffle = shuffle
        self.seed = seed
        self.num_epoch = num_epoch
        self.sharding = sharding or Sharding()
        self.source_of = mix.source_of()
        self.totals = [sum(self.counts[a:b]) for a, b in mix.spans]
        for k, total in enumerate(self.totals):
            if not total:
                raise ValueError(f"source {k} ({mix.sources[k]!r}) has no samples: it cannot be mixed")
        self._plans: Dict[int, np.ndarray] = {}

    def plan(self, epoch: int) -> np.ndarray:
        """The source of every sample position of ``epoch`` (all ranks); the latest two epochs are kept."""
        if epoch not in self._plans:
            if len(self._plans) >= 2:
                self._plans.pop(min(self._plans))
            self._plans[epoch] = draw_plan(self.mix.weights(), self.totals, self.stop, self.seed, epoch)
        return self._plans[epoch]

    def order(self, epoch: int, k: int) -> List[int]:
        """Source ``k``'s files in ``epoch``, as indices in the loader's files."""
        a, b = self.mix.spans[k]
        if not self.shuffle:
            return list(range(a, b))
        return [a + int(i) for i in derive_rng(self.seed, MIX_FILES, epoch, k).permutation(b - a)]

    def _share(self, n: int) -> Tuple[int, int, int]:
        """This rank's positions ``[lo, hi)`` of an epoch of ``n``, and the samples every rank delivers."""
        cuts, target = shares([(0, n)], self.sharding.world_size, self.sharding.even_batches)
        lo = cuts[self.sharding.rank]
        return lo, min(cuts[self.sharding.rank + 1], lo + target), target

    def _window(self, n: int) -> Tuple[int, int, bool]:
        """The positions ``[lo, hi)`` of an epoch of ``n`` this rank reads, and whether they are padding: an
        empty share under ``"pad"`` (an epoch of fewer samples than ranks) reads the position after it, as
        a plain loader's rank pads with the samples after its share (``_stages.shard.rank_ranges``)."""
        lo, hi, target = self._share(n)
        if hi > lo or not target:
            return lo, hi, False
        lo %= n  # the share sizes differ by at most one: an empty one pads a single sample
        return lo, lo + 1, True

    def share(self, epoch: int) -> np.ndarray:
        """The source of each position of this rank's share of ``epoch``."""
        plan = self.plan(epoch)
        lo, hi, _ = self._window(len(plan))
        return plan[lo:hi]

    def samples(self, epoch: int) -> int:
        """The samples this rank delivers in ``epoch`` (under ranks its share and padding)."""
        return self._share(len(self.plan(epoch)))[2]

    def steps(self, epoch: int, batch_size: int, seq_len: Optional[int], drop_last: bool) -> int:
        """The batches every rank gives in ``epoch``."""
        return batches_of(self.samples(epoch), batch_size, drop_last)

    def batches(self, epoch: int, batch_size: int, drop_last: bool, rotation: int = 1) -> int:
        """The batches this rank gives in ``epoch`` (``len()``), each sample served ``rotation`` times."""
        return batches_of(self.samples(epoch), batch_size, drop_last, rotation)

    def _needs(self, epoch: int, k: int, first: int, n: int, positions: np.ndarray) -> Iterator[Need]:
        """Source ``k``'s samples ``first .. first + n`` (cycling through its files) as file ranges, each
        with the share position that needs its first row (``positions``: those of ``k``'s samples)."""
        order = self.order(epoch, k)
        total = self.totals[k]
        done = 0
        while done < n:
            at = (first + done) % total  # the place in the source's pass
            offset = 0
            for index in order:
                size = self.counts[index]
                lo, hi = max(at - offset, 0), min(at + n - done - offset, size)
                if lo < hi:
                    yield int(positions[done]), index, lo, hi
                    done += hi - lo
                    at += hi - lo
                offset += size

    def tasks(self, epoch: int) -> Iterator[FileTask]:
        plan = self.plan(epoch)
        lo, hi, pad = self._window(len(plan))
        needs: List[Need] = []
        for k in range(len(self.totals)):
            positions = np.flatnonzero(plan[lo:hi] == k)
            first = int(np.count_nonzero(plan[:lo] == k))
            needs.extend(self._needs(epoch, k, first, len(positions), positions))
        needs.sort(key=lambda need: need[0])
        for pos, (_, index, start, end) in enumerate(needs):
            yield FileTask(epoch, pos, index, self.mix.files[index], start=start, end=end, pad=pad,
                           count=self.counts[index], seed=self.seed)
        yield from self._empty(epoch, len(needs))

    def _empty(self, epoch: int, pos: int) -> Iterator[FileTask]:
        """The files counted empty that this rank reads to check they are (every ``world_size``-th one): the
        plan takes no row of them, so a count of 0 that is wrong would otherwise lose the file unseen."""
        for index in range(self.sharding.rank, len(self.counts), self.sharding.world_size):
            if not self.counts[index] and index not in self.left_out:
                yield FileTask(epoch, pos, index, self.mix.files[index], start=0, end=0, count=0, seed=self.seed)
                pos += 1

    def iterate(self, start_epoch: int = 0, skip_rows: int = 0, until: Optional[int] = None) -> Iterator[SourceItem]:
        for epoch in range(start_epoch, self.num_epoch if until is None else until):
            yield from self.tasks(epoch)
            yield EpochEnd(epoch)

    def buffer(self, epoch: int) -> "MixBuffer":
        return MixBuffer(self.share(epoch), self.source_of, self.mix, self.counted)


class MixBuffer:
    """Interleaves the sources' rows in the order of the plan's share (a buffer of ``Batcher``).

    Rows arrive traced with their file (``Traced.provenance``), source by source in the order the plan
    first needs them; what the plan can take at once leaves as soon as it has arrived.
    """

    def __init__(self, share: np.ndarray, source_of: Sequence[int], mix: Mix,
                 counted: Optional[List[Dict[str, Any]]] = None) -> None:
        self.share = share
        self.counted = counted
        self.source_of = source_of
        self.mix = mix
        n = len(mix.sources)
        self.positions = [np.flatnonzero(share == k) for k in range(n)]
        self.used = [0] * n  # rows of each source that left
        self.queues: List[Deque[Traced]] = [collections.deque() for _ in range(n)]
        self.held = [0] * n  # rows of each source at hand
        self.cursor = 0

    def feed(self, columns: Traced) -> Iterator[Traced]:
        files = columns.provenance.file
        assert files is not None, "rows mixed carry their files"
        if not len(files):  # a piece filter_fn emptied
            return
        k = self.source_of[int(files[0])]
        self.queues[k].append(columns)
        self.held[k] += n_rows(columns)
        end = len(self.share)
        for j, positions in enumerate(self.positions):
            if self.used[j] + self.held[j] < len(positions):
                end = min(end, int(positions[self.used[j] + self.held[j]]))
        if end > self.cursor:
            yield self._emit(self.share[self.cursor:end])
            self.cursor = end

    def drain(self) -> Iterator[Traced]:
        """The rest of the plan that rows are at hand for: all of it, unless an error was skipped."""
        part = self.share[self.cursor:]
        keep = np.zeros(len(part), dtype=bool)
        for k, held in enumerate(self.held):
            keep[np.flatnonzero(part == k)[:held]] = True
        self.cursor = len(self.share)
        if keep.any():
            yield self._emit(part[keep])

    def _emit(self, part: np.ndarray) -> Traced:
        """The next rows for positions of sources ``part``, in that order."""
        try:
            return interleave(part, lambda k, positions: self._pop(k, len(positions)), "mix")
        except ValueError as exc:
            raise ValueError(f"sources {', '.join(map(repr, self.mix.sources))} cannot be mixed: {exc}") from None

    def _pop(self, k: int, n: int) -> Traced:
        if self.counted:
            self.counted[k]["samples"] += n
        self.used[k] += n
        self.held[k] -= n
        parts: List[Traced] = []
        queue = self.queues[k]
        while n:
            head = queue[0]
            size = n_rows(head)
            if size <= n:
                parts.append(queue.popleft())
                n -= size
            else:
                parts.append(slice_rows(head, 0, n))
                queue[0] = slice_rows(head, n, size)
                n = 0
        return concat(parts, "mix")


def mix_fingerprint(mix: Optional[Mix], stop: str) -> Optional[Dict[str, object]]:
    """The sources' part of the resume state: their files, weights and readers, and ``stop``."""
    if mix is None:
        return None
    return {"stop": stop, "sources": [
        {"files": files_digest(mix.files[a:b]), "num_files": b - a, "weight": s.weight,
         "reader": type(mix.readers.readers[k]).__qualname__, **({"amount": s.amount} if s.amount else {})}
        for k, (s, (a, b)) in enumerate(zip(mix.sources, mix.spans))]}
