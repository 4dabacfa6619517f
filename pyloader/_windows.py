"""Buffers that work in windows of the sample stream: the shuffle buffer, and the base of the bucket buffer.

Contracts:

* **Windows.** A buffer of ``size`` samples cuts an epoch's sample stream (this
  rank's, in plan order) into windows at fixed positions: ``[0, offset)``, then
  ``size`` samples each from ``offset`` on (the last one shorter). ``offset`` is
  drawn per epoch from ``(random_seed, tag, epoch)`` (a multiple of ``unit``), so
  window edges fall elsewhere every epoch. Each window is taken whole and let out
  in an order that depends on that window alone (its rows, and a generator seeded
  by ``(random_seed, tag, epoch, the window's first position)``): the shuffle
  buffer lets out a uniform permutation of it. Nothing carries from one window to
  the next, so a buffer never holds more than ``size`` samples and every sample
  leaves exactly once.
* **Resume.** What leaves a buffer from stream position ``p`` on is made from the
  samples of the window holding ``p`` and those after it only. A resumed epoch
  (``fed_from``) reads the stream from that window's first position, drops what
  the window lets out before ``p``, and goes on: it reads the files that window
  spans, never those wholly before it, wherever ``p`` is in the epoch. Buffers in
  a row (shuffle, then bucket) each step back to their own window's start.
* **Positions** are counted in samples fed since the epoch began, which the
  counts give only where every sample read is fed (no ``filter_fn``, no file
  skipped after an error): elsewhere the epoch is replayed from its start.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ._columns import Columns, concat, n_rows, slice_rows, take
from ._rng import SHUFFLE_BUFFER, derive_rng


@dataclass(frozen=True)
class Windows:
    """Where the windows of one epoch fall: ``[0, offset)``, then every ``size`` samples from ``offset``."""

    size: int
    offset: int
    seed: int
    tag: int
    epoch: int

    @classmethod
    def drawn(cls, size: int, seed: int, tag: int, epoch: int, unit: int = 1) -> "Windows":
        """``size`` rounded down to a multiple of ``unit`` samples each, the first edge a multiple of
        ``unit`` drawn from ``(seed, tag, epoch)``."""
        offset = unit * int(derive_rng(seed, tag, epoch).integers(size // unit))
        return cls(size // unit * unit, offset, seed, tag, epoch)

    def start(self, position: int) -> int:
        """The first position of the window that holds ``position``."""
        if position < self.offset:
            return 0
        return self.offset + (position - self.offset) // self.size * self.size

    def end(self, start: int) -> int:
        """The position after the window that begins at ``start``."""
        return self.offset if start < self.offset else start + self.size

    def rng(self, start: int) -> np.random.Generator:
        """The draws of the window that begins at ``start``."""
        return derive_rng(self.seed, self.tag, self.epoch, start)


def fed_from(stages: Sequence[Windows], position: int) -> List[int]:
    """Where each buffer in a row must be fed from for the last one to let out the stream from
    ``position`` on: each steps back to the start of its window holding where the next one starts."""
    starts = []
    for windows in reversed(stages):
        position = windows.start(position)
        starts.append(position)
    return starts[::-1]


class WindowBuffer:
    """Takes in a window, lets it out reordered (``order``), from stream position ``first`` on;
    drops the first ``skip`` samples it lets out (delivered before a resume)."""

    name = "window"  # in the error of rows that cannot be joined

    def __init__(self, windows: Windows, first: int = 0, skip: int = 0) -> None:
        self.windows = windows
        self.skip = skip
        self._start = first
        self._end = windows.end(first)
        self._parts: List[Columns] = []
        self._held = 0

    def order(self, window: Columns, rng: np.random.Generator) -> np.ndarray:
        """The order in which a window's rows leave."""
        raise NotImplementedError

    def feed(self, columns: Columns) -> Iterator[Columns]:
        n, at = n_rows(columns), 0
        while at < n:
            part = min(n - at, self._end - self._start - self._held)
            self._parts.append(slice_rows(columns, at, at + part))
            self._held += part
            at += part
            if self._start + self._held == self._end:
                yield from self._flush()

    def drain(self) -> Iterator[Columns]:
        """The last window of the epoch, however short."""
        if self._held:
            yield from self._flush()

    def _flush(self) -> Iterator[Columns]:
        window = self._parts[0] if len(self._parts) == 1 else concat(self._parts, self.name)
        order = self.order(window, self.windows.rng(self._start))
        self._start, self._end = self._end, self.windows.end(self._end)
        self._parts, self._held = [], 0
        dropped, self.skip = min(self.skip, len(order)), max(0, self.skip - len(order))
        if dropped < len(order):
            yield take(window, order[dropped:])


def shuffle_windows(size: int, batch_size: int, seed: int, epoch: int) -> Windows:
    """The windows of a shuffle buffer of ``size`` samples: whole batches each, when it holds one, so
    that a batch is cut from one window (a resumed run's first batch needs that window only)."""
    return Windows.drawn(size, seed, SHUFFLE_BUFFER, epoch, unit=batch_size if size >= batch_size else 1)


class ShuffleBuffer(WindowBuffer):
    """``shuffle_buffer``: each window of the stream let out as a uniform permutation of it."""

    name = "shuffle buffer"

    def order(self, window: Columns, rng: np.random.Generator) -> np.ndarray:
        return rng.permutation(n_rows(window))


def window_buffers(stages: Sequence[Windows], resumed: Optional[int]) -> List[Tuple[int, int]]:
    """``(first, skip)`` for each buffer in a row: from the epoch's start, or (``resumed``, a
    position) fed from ``fed_from`` and letting out from ``resumed`` on."""
    if resumed is None:
        return [(0, 0) for _ in stages]
    starts = fed_from(stages, resumed)
    outs = [*starts[1:], resumed]
    return [(first, out - first) for first, out in zip(starts, outs)]
