"""The shuffle buffer (``shuffle_buffer``): slots renewed at random, whose state a resume rebuilds from the counts.

Contracts:

* **The buffer** has ``size`` slots. The first ``size`` samples of an epoch's
  stream (this rank's, in plan order) fill slots ``0 .. size-1``; each later
  sample (stream position ``t``) takes the place of the one in slot ``r_t``,
  which leaves (the ``t - size``-th out). At the end of the epoch the samples
  still held leave in a random order. It holds ``size`` samples, every sample
  leaves exactly once, and a sample leaves after a random stay, as from a
  reservoir.
* **The draws** ``r_t`` come in rounds of ``ROUND * size`` steps: every slot
  once and ``(ROUND - 1) * size`` slots drawn uniformly, in a random order (the
  rounds of about ``BLOCK`` steps drawn together from ``(random_seed, epoch,
  block)``); the final order comes from ``(random_seed, epoch)``. Nothing
  depends on the data or on how it arrives in pieces. Every slot is renewed at
  least once a round, so a sample stays fewer than ``2 * ROUND * size`` steps:
  a reservoir's tail, cut there, which leaves the mixing about as good as the
  uncut reservoir's (figures: benchmarks/README.md, ``bench_shuffle.py``).
* **Resume.** The stream positions the slots hold before step ``t`` are a
  function of the draws of the last two rounds alone (the last step that
  renewed each slot), not of the data. A resumed epoch whose first ``p``
  samples were handed out is fed from the earliest position held before step
  ``p + size`` (``reads_from``: at most ``(2 * ROUND - 1) * size`` before
  ``p``), keeps only the held samples, and goes on: before its first batch it
  reads the files of at most ``2 * ROUND * size + batch_size`` samples of the
  stream, wherever ``p`` is.
* **Positions** are counted in samples fed since the epoch began, which the
  counts give only where every sample read is fed (no ``filter_fn``, no file
  skipped after an error): elsewhere the epoch is replayed from its start.
"""
from __future__ import annotations

from typing import Dict, Generic, Iterator, List, Optional, Tuple

import numpy as np

from .._columns import Rows, concat, n_rows, slice_rows, take
from .._rng import SHUFFLE_BUFFER, derive_rng

ROUND = 2  # a round of draws is this many times the buffer's size
BLOCK = 1 << 16  # rounds are drawn a block of about this many steps at a time (one generator each)
STEPS = 4096  # samples taken in at once (or the buffer's size): the output is the same, the copies smaller
Resume = Optional[Tuple[int, int]]  # (samples of the epoch handed out already, samples the epoch feeds)


class Slots:
    """The draws of one epoch's shuffle buffer of ``size`` slots."""

    def __init__(self, size: int, seed: int, epoch: int) -> None:
        self.size = size
        self.seed = seed
        self.epoch = epoch
        self._blocks: Dict[int, np.ndarray] = {}  # rounds drawn together, by block

    def round(self, m: int) -> np.ndarray:
        """The slots renewed by the steps of round ``m`` (``size + m * ROUND * size`` on)."""
        per_block = max(1, BLOCK // (ROUND * self.size))
        block, k = divmod(m, per_block)
        if block not in self._blocks:
            if len(self._blocks) >= 2:  # the latest two blocks are kept
                self._blocks.pop(min(self._blocks))
            rng = derive_rng(self.seed, SHUFFLE_BUFFER, self.epoch, block)
            every = np.broadcast_to(np.arange(self.size), (per_block, self.size))
            drawn = rng.integers(self.size, size=(per_block, (ROUND - 1) * self.size))
            rounds = rng.permuted(np.concatenate([every, drawn], axis=1), axis=1)
            self._blocks[block] = rounds.astype(np.uint16) if self.size <= 1 << 16 else rounds  # sorts faster
        return self._blocks[block][k]

    def renewed(self, start: int, stop: int) -> np.ndarray:
        """The slot each step ``start .. stop-1`` renews (steps from ``size`` on)."""
        span, parts = ROUND * self.size, []
        while start < stop:
            m, at = divmod(start - self.size, span)
            part = self.round(m)[at:at + stop - start]
            parts.append(part)
            start += len(part)
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def held(self, step: int) -> np.ndarray:
        """The stream position each slot holds before step ``step``: the last step that renewed it
        (in the last two rounds, as every round renews every slot), or the fill."""
        held = np.arange(min(self.size, step))
        if step > self.size:
            span = ROUND * self.size
            last = (step - 1 - self.size) // span
            for m in range(max(0, last - 1), last + 1):
                steps = self.size + m * span + np.arange(span)
                within = steps < step
                np.maximum.at(held, self.round(m)[within], steps[within])
        return held

    def reads_from(self, out: int, rows: int) -> int:
        """Where the stream must be fed from for the buffer to let out its ``out``-th sample on
        (of an epoch of ``rows``)."""
        held = self.held(min(out + self.size, rows))
        return int(held.min()) if len(held) else out

    def final_order(self, n: int) -> np.ndarray:
        return derive_rng(self.seed, SHUFFLE_BUFFER, self.epoch).permutation(n)

    def buffer(self, resume: Resume = None) -> "ShuffleBuffer":
        """The epoch's buffer (of the batcher's traced rows, or of any columns)."""
        return ShuffleBuffer(self, resume)


class ShuffleBuffer(Generic[Rows]):
    """Lets samples out as the module docstring says, fed from the epoch's start or, resumed
    (``resume``), from ``Slots.reads_from``: then only the samples held at the position are kept."""

    def __init__(self, slots: Slots, resume: Resume = None) -> None:
        self.slots = slots
        size = slots.size
        self._pool: Optional[Rows] = None  # row s: slot s's sample, once the slots are filled
        self._filling: List[Tuple[Rows, np.ndarray]] = []  # samples kept before the first step, with their slots
        self._skip = 0  # samples of the final order handed out already
        if resume is None:
            self._keep: Optional[Tuple[np.ndarray, np.ndarray]] = None  # the fill: position s goes to slot s
            self.position, self._steps_from = 0, size
            return
        out, rows = resume
        self._steps_from = min(out + size, rows)
        held = slots.held(self._steps_from)
        by_position = np.argsort(held)
        self._keep = (held[by_position], by_position)  # the positions held, sorted, and their slots
        self.position = int(held.min()) if len(held) else self._steps_from
        if out + size > rows:
            self._skip = out - (rows - len(held))

    def feed(self, columns: Rows) -> Iterator[Rows]:
        n, at = n_rows(columns), 0
        while at < n:
            if self.position < self._steps_from:
                k = min(n - at, self._steps_from - self.position)
                self._fill(slice_rows(columns, at, at + k))
            else:
                k = min(n - at, max(self.slots.size, STEPS))
                yield self._step(slice_rows(columns, at, at + k))
            at += k
            self.position += k

    def drain(self) -> Iterator[Rows]:
        """The samples still held, in the epoch's final order."""
        pool = self._filled()
        self._pool = None
        if pool is not None:
            order = self.slots.final_order(n_rows(pool))[self._skip:]
            if len(order):
                yield take(pool, order)

    def _fill(self, part: Rows) -> None:
        positions = np.arange(self.position, self.position + n_rows(part))
        if self._keep is None:
            self._filling.append((part, positions))
            return
        kept, slots = self._keep
        at = np.minimum(np.searchsorted(kept, positions), len(kept) - 1)
        hit = kept[at] == positions
        if hit.any():
            self._filling.append((take(part, np.flatnonzero(hit)), slots[at[hit]]))

    def _filled(self) -> Optional[Rows]:
        """The slots' samples, slot by slot, once the fill is over."""
        if self._filling:
            parts, slots = zip(*self._filling)
            self._filling = []
            rows = parts[0] if len(parts) == 1 else concat(parts, "shuffle buffer")
            self._pool = take(rows, np.argsort(np.concatenate(slots)))
        return self._pool

    def _step(self, part: Rows) -> Rows:
        """Each sample of ``part`` takes a slot's place; the samples it displaces, in order."""
        pool = self._filled()
        assert pool is not None, "the steps come after the fill"
        size, k = self.slots.size, n_rows(part)
        renewed = self.slots.renewed(self.position, self.position + k)
        by_slot = np.argsort(renewed, kind="stable")  # the steps of each slot together, in order
        grouped = renewed[by_slot]
        again = grouped[1:] == grouped[:-1]  # the step renews a slot an earlier step of ``part`` renewed
        leaves = renewed.astype(np.int64)  # row of ``both`` that each step lets out: the slot's sample ...
        leaves[by_slot[1:][again]] = size + by_slot[:-1][again]  # ... or the sample an earlier step put there
        stays = np.arange(size)
        last = np.append(~again, True)
        stays[grouped[last]] = size + by_slot[last]
        both = concat([pool, part], "shuffle buffer")
        self._pool = take(both, stays)
        return take(both, leaves)
