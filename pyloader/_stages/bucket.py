"""Length bucketing (``bucket_by``, ``bucket_buffer``): batches of samples of similar length, to save padding.

Samples pass through a buffer of ``bucket_buffer`` samples (after the shuffle
buffer, when there is one) that works in windows of the epoch's stream (this
rank's, in plan order), ``bucket_buffer`` rounded down to whole batches each.
A window's samples are sorted by length (ties broken at random) and cut into
batches of ``batch_size`` consecutive samples, which leave in a random order;
the ``batch_size - 1`` longest wait for the next window (with its own samples,
the window holds no more than ``bucket_buffer``), so the longest samples of
several windows meet. Windows come in chains of ``CHAIN``, sized so that a
chain holds whole batches: the last window of a chain lets out everything it
holds, and nothing crosses into the next chain. The first chain of an epoch
ends at a drawn multiple of ``batch_size``, so the edges fall elsewhere every
epoch; the epoch's last window lets out its rest, its short batch last. So an
epoch has as many batches as without bucketing (``len`` is unchanged) and only
its last batch may be short. The randomness comes from ``(random_seed,
epoch)``: the batches are a function of the data, the seed and the epoch, and
every sample leaves exactly once. A resumed epoch is fed from the first
position of the chain that holds its position (positions come from the
counts, as for the shuffle buffer, ``_stages.shuffle``), drops what the chain lets out
before it, and goes on: it reads the files of at most ``CHAIN`` windows before
the position, wherever it is.

A sample's length is, for ``bucket_by="key"``, ``len(sample[key])`` (or the
value itself when the field holds numbers, a length column), or for a
callable ``bucket_by(sample)`` (a real number). Lengths are worked out in the
loader's process as samples arrive (the rows come here, as for the shuffle
buffer). A length that cannot be worked out is an error of the sample's file
(stage ``bucket_by (sample i)``, the original exception's type kept), which
``on_error`` handles like a read error.
"""
from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Tuple, Union

import numpy as np

from .._columns import Column, Columns, Traced, concat, n_rows, slice_rows, take
from .._errors import PipelineError
from .._rng import BUCKETS, derive_rng

BUFFER_BATCHES = 32  # the default bucket_buffer, in batches
CHAIN = 4  # windows in a chain: the longest samples of one wait for the next within a chain
BucketBy = Union[str, Callable[[dict], float]]


class Lengths:
    """Works out the lengths of a piece's samples from ``bucket_by``."""

    def __init__(self, bucket_by: BucketBy) -> None:
        self.bucket_by = bucket_by

    def __call__(self, columns: Columns, path: str, first: int) -> np.ndarray:
        """The lengths of the rows of ``columns``, the first of which is sample ``first`` of file ``path``."""
        if callable(self.bucket_by):
            return self._called(self.bucket_by, columns, path, first)
        key = self.bucket_by
        if key not in columns:
            raise PipelineError("bucket_by", [path], KeyError(
                f"bucket_by={key!r} is not a field of the file (its fields: {sorted(columns)})"))
        return _field_lengths(key, columns[key], path, first)

    @staticmethod
    def _called(bucket_by: Callable[[dict], float], columns: Columns, path: str,
                first: int) -> np.ndarray:
        """``bucket_by(sample)`` for each row."""
        fields = list(columns.items())
        values = []
        for i in range(n_rows(columns)):
            try:
                values.append(bucket_by({key: column[i] for key, column in fields}))
            except Exception as exc:
                raise PipelineError(f"bucket_by (sample {first + i})", [path], exc) from exc
        return _checked(values, path, first, "bucket_by returned")


def _field_lengths(key: str, column: Column, path: str, first: int) -> np.ndarray:
    """The lengths of field ``key``'s samples: an array's second dimension (samples that are arrays),
    a numeric array's values (a column of lengths), else each item as a length: numbers as they
    are, anything else by its ``len``."""
    if isinstance(column, np.ndarray):
        if column.ndim > 1:
            return np.full(len(column), column.shape[1], dtype=np.float64)  # every sample as long
        if column.dtype.kind in "iuf":
            return column.astype(np.float64)
    values = []
    for i, value in enumerate(column):
        try:
            values.append(value if _is_number(value) else len(value))
        except TypeError as exc:
            raise PipelineError(f"bucket_by (sample {first + i})", [path], TypeError(
                f"field {key!r} holds {type(value).__name__}, which has no length")) from exc
    return _checked(values, path, first, f"field {key!r} holds")


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _checked(values: list, path: str, first: int, what: str) -> np.ndarray:
    for i, value in enumerate(values):
        if not _is_number(value):
            raise PipelineError(f"bucket_by (sample {first + i})", [path], TypeError(
                f"{what} {type(value).__name__} ({value!r:.60}), expected a length (a real number)"))
    return np.asarray(values, dtype=np.float64)


@dataclass(frozen=True)
class BucketWindows:
    """Where one epoch's chains of bucket windows fall: ``[0, offset)``, then every ``chain`` samples."""

    size: int  # the samples a window holds: ``bucket_buffer`` rounded down to whole batches
    batch_size: int
    offset: int
    seed: int
    epoch: int

    @classmethod
    def drawn(cls, size: int, batch_size: int, seed: int, epoch: int) -> "BucketWindows":
        """The first chain's end drawn from ``(seed, epoch)``, in whole batches."""
        whole = cls(size // batch_size * batch_size, batch_size, 0, seed, epoch)
        offset = batch_size * int(derive_rng(seed, BUCKETS, epoch).integers(whole.chain // batch_size))
        return dataclasses.replace(whole, offset=offset)

    @property
    def carry(self) -> int:
        """The longest samples that wait for the next window of a chain (none in windows of one batch)."""
        return self.batch_size - 1 if self.size >= 2 * self.batch_size else 0

    @property
    def windows(self) -> int:
        return CHAIN if self.carry else 1

    @property
    def chain(self) -> int:
        """The samples of a chain: whole batches."""
        return sum(self.own(j) for j in range(self.windows))

    def own(self, j: int) -> int:
        """The samples the ``j``-th window of a chain takes in, so that with the ``carry`` each holds at
        most ``size`` and each but the last lets out whole batches, the last all it holds: ``size``, less
        the ``carry`` it holds from the window before (but the first) and one (but the last)."""
        return self.size - (self.carry if j else 0) - (j < self.windows - 1)

    def start(self, position: int) -> int:
        """The first position of the chain that holds ``position``."""
        if position < self.offset:
            return 0
        return self.offset + (position - self.offset) // self.chain * self.chain

    def end(self, start: int) -> int:
        """The position after the chain that begins at ``start``."""
        return self.offset if start < self.offset else start + self.chain

    def reads_from(self, out: int, rows: int) -> int:
        """Where the stream must be fed from for the buffer to let out its ``out``-th sample on."""
        return self.start(out)

    def buffer(self, resume: Optional[Tuple[int, int]] = None) -> "BucketBuffer":
        """The epoch's buffer, from its start or (``resume``: samples handed out, samples of the
        epoch) fed from ``reads_from`` on."""
        if resume is None:
            return BucketBuffer(self)
        first = self.start(resume[0])
        return BucketBuffer(self, first, resume[0] - first)


class BucketBuffer:
    """Takes in windows, lets each out as batches of samples of similar length (their
    ``provenance.length``) in a random order (see the module docstring), from stream position ``first`` (a
    chain's start) on; drops the first ``skip`` samples it lets out (handed out before a resume)."""

    def __init__(self, windows: BucketWindows, first: int = 0, skip: int = 0) -> None:
        self.windows = windows
        self.skip = skip
        self._chain, self._window = first, 0  # the chain being taken in, and its window
        self._position = first
        self._end = self._window_end()
        self._parts: List[Traced] = []  # the window's samples: the carried ones, then its own

    def _window_end(self) -> int:
        w = self.windows
        own = sum(w.own(j) for j in range(self._window + 1))
        return min(self._chain + own, w.end(self._chain))

    def feed(self, columns: Traced) -> Iterator[Traced]:
        n, at = n_rows(columns), 0
        while at < n:
            part = min(n - at, self._end - self._position)
            self._parts.append(slice_rows(columns, at, at + part))
            self._position += part
            at += part
            if self._position == self._end:
                yield from self._flush(final=self._end == self.windows.end(self._chain))

    def drain(self) -> Iterator[Traced]:
        """The rest at the epoch's end: its last window and what it carries, however short."""
        if self._parts:
            yield from self._flush(final=True)

    def _flush(self, final: bool) -> Iterator[Traced]:
        w = self.windows
        window = concat(self._parts, "bucket buffer")
        n, size = n_rows(window), w.batch_size
        rng = derive_rng(w.seed, BUCKETS, w.epoch, self._chain, self._window)
        lengths = window.provenance.length
        assert lengths is not None, "rows bucketed carry their lengths"
        by_length = np.lexsort((rng.random(n), lengths))
        wait = 0 if final else n % size  # the longest wait for the next window of the chain
        k = (n - wait) // size
        cut = by_length[:k * size].reshape(k, size)[rng.permutation(k)].ravel()
        order = np.concatenate([cut, by_length[k * size:n - wait]])  # a short batch (the epoch's last) last
        self._parts = [take(window, by_length[n - wait:])] if wait else []
        if final:
            self._chain, self._window = self._end, 0
        else:
            self._window += 1
        self._end = self._window_end()
        dropped, self.skip = min(self.skip, len(order)), max(0, self.skip - len(order))
        if dropped < len(order):
            yield take(window, order[dropped:])


def buffer_size(given: Optional[int], batch_size: int) -> int:
    """The samples the bucket buffer holds: ``given``, else ``BUFFER_BATCHES`` batches."""
    return BUFFER_BATCHES * batch_size if given is None else given
