"""Length bucketing (``bucket_by``, ``bucket_buffer``): batches of samples of similar length, to save padding.

Samples pass through a buffer of ``bucket_buffer`` samples (after the shuffle
buffer, when there is one). Each time it fills, its samples are sorted by
length (ties broken at random), cut into batches of ``batch_size`` consecutive
samples, and the full batches leave in a random order; the fewer than
``batch_size`` samples left over (the longest) wait for the next round. At the
end of an epoch the rest leaves the same way, its short batch last, so an epoch
has as many batches as without bucketing (``len`` is unchanged) and only its
last batch may be short. The randomness comes from ``(random_seed, epoch)``
alone: the batches are a function of the data, the seed and the epoch, every
sample leaves exactly once, and a resumed run rebuilds the same batches.

A sample's length is, for ``bucket_by="key"``, ``len(sample[key])`` (or the
value itself when the field holds numbers, a length column), or for a
callable ``bucket_by(sample)`` (a real number). Lengths are worked out in the
loader's process as samples arrive (the rows come here, as for the shuffle
buffer). A length that cannot be worked out is an error of the sample's file
(stage ``bucket_by (sample i)``, the original exception's type kept), which
``on_error`` handles like a read error.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable, Iterator, Mapping, Optional, Union

import numpy as np

from ._columns import Columns, concat, n_rows, slice_rows, take
from ._errors import PipelineError
from ._rng import BUCKETS, derive_rng

LEN = "\x00len"  # private column: each row's length, worked out when it arrived
BUFFER_BATCHES = 32  # the default bucket_buffer, in batches
BucketBy = Union[str, Callable[[dict], float]]


class Lengths:
    """Works out the lengths of a piece's samples from ``bucket_by``."""

    def __init__(self, bucket_by: BucketBy) -> None:
        self.bucket_by = bucket_by

    def __call__(self, columns: Columns, path: str, first: int) -> np.ndarray:
        """The lengths of the rows of ``columns``, the first of which is sample ``first`` of file ``path``."""
        if callable(self.bucket_by):
            fields = list(columns.items())
            values = []
            for i in range(n_rows(columns)):
                try:
                    values.append(self.bucket_by({key: column[i] for key, column in fields}))
                except Exception as exc:
                    raise PipelineError(f"bucket_by (sample {first + i})", [path], exc) from exc
            return _checked(values, path, first, "bucket_by returned")
        key = self.bucket_by
        if key not in columns:
            raise PipelineError("bucket_by", [path], KeyError(
                f"bucket_by={key!r} is not a field of the file (its fields: {sorted(columns)})"))
        column = columns[key]
        if isinstance(column, np.ndarray) and column.ndim > 1:
            return np.full(len(column), column.shape[1], dtype=np.float64)  # every sample as long
        if isinstance(column, np.ndarray) and column.dtype.kind in "iuf":
            return column.astype(np.float64)  # a column of lengths
        values = []
        for i, value in enumerate(column):
            try:
                values.append(value if _is_number(value) else len(value))
            except TypeError as exc:
                raise PipelineError(f"bucket_by (sample {first + i})", [path], TypeError(
                    f"field {key!r} holds {type(value).__name__}, which has no length")) from exc
        return _checked(values, path, first, f"field {key!r} holds")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _checked(values: list, path: str, first: int, what: str) -> np.ndarray:
    for i, value in enumerate(values):
        if not _is_number(value):
            raise PipelineError(f"bucket_by (sample {first + i})", [path], TypeError(
                f"{what} {type(value).__name__} ({value!r:.60}), expected a length (a real number)"))
    return np.asarray(values, dtype=np.float64)


class BucketBuffer:
    """Holds up to ``size`` samples (with their ``LEN`` column) and lets them out as batches of
    samples of similar length, in a random order (see the module docstring). Draws come from
    ``(seed, epoch)``."""

    def __init__(self, size: int, batch_size: int, seed: int, epoch: int) -> None:
        self.size = size
        self.batch_size = batch_size
        self.rng = derive_rng(seed, BUCKETS, epoch)
        self.pool: Optional[Columns] = None

    def feed(self, columns: Columns) -> Iterator[Columns]:
        """Rows of full batches, batch after batch, each time the buffer fills."""
        n = n_rows(columns)
        for start in range(0, n, self.size):
            part = slice_rows(columns, start, min(n, start + self.size))
            self.pool = part if self.pool is None else concat([self.pool, part], "bucket buffer")
            if n_rows(self.pool) >= self.size:
                yield from self._flush(final=False)

    def drain(self) -> Iterator[Columns]:
        """The rest, at the end of an epoch: full batches, then the short one."""
        if self.pool is not None and n_rows(self.pool):
            yield from self._flush(final=True)
        self.pool = None

    def _flush(self, final: bool) -> Iterator[Columns]:
        pool = self.pool
        assert pool is not None
        n, size = n_rows(pool), self.batch_size
        by_length = np.lexsort((self.rng.random(n), pool[LEN]))
        k = n // size
        cut = by_length[:k * size].reshape(k, size)[self.rng.permutation(k)].ravel()
        rest = by_length[k * size:]
        if final:
            cut, self.pool = np.concatenate([cut, rest]), None
        else:
            self.pool = take(pool, np.sort(rest)) if len(rest) else None
        if len(cut):
            yield take(pool, cut)


def buffer_size(a: Mapping[str, Any]) -> Optional[int]:
    """The samples the bucket buffer holds for ``DataLoader(**a)`` (``None``: no bucketing)."""
    if a["bucket_by"] is None:
        return None
    size = a["bucket_buffer"]
    return BUFFER_BATCHES * a["datareader"].batch_size if size is None else size


def check_bucketing(a: Mapping[str, Any]) -> None:
    bucket_by, size, batch_size = a["bucket_by"], a["bucket_buffer"], a["datareader"].batch_size
    if bucket_by is None:
        if size is not None:
            raise ValueError("bucket_buffer sizes the buffer of length bucketing: it needs bucket_by")
        return
    if not (isinstance(bucket_by, str) or callable(bucket_by)):
        raise TypeError(f"bucket_by must be a field name or a callable giving a sample's length, got {bucket_by!r}")
    if a["stream"]:
        raise ValueError("bucket_by batches samples by length: stream mode keeps each row in file order")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < batch_size):
        raise ValueError(f"bucket_buffer must be an integer >= batch_size ({batch_size}), got {size!r}")
