"""Column operations on a dict of equal-length columns (lists or NumPy arrays).

Every stage moves samples as columns, never as per-sample dicts: slicing a
list or an array is one C call, building a dict per sample is not.

Rows that pass through the loader's buffers (shuffle, mix, bucketing) or are held
by rotation carry per-row facts of the loader's own (``Provenance``: each row's
file, its padding flag, its length) *beside* the user's columns, never among them:
a ``Traced`` is both, and ``n_rows``, ``slice_rows``, ``take``, ``concat`` and
``interleave`` move the two together. The user's columns go through untouched,
whatever their names.
"""
from __future__ import annotations

import math
from collections import abc  # isinstance against these, not typing's aliases: several times faster
from dataclasses import dataclass, fields
from operator import itemgetter
from typing import Any, Callable, Dict, Optional, Sequence, TypeVar, final

import numpy as np

Column = Any  # a list or a NumPy array (or another sequence), one item per sample
Columns = Dict[str, Column]


@dataclass(frozen=True)
class Provenance:
    """Per-row facts the loader keeps about rows, one array item per row (``None``: not kept in this run)."""

    file: Optional[np.ndarray] = None  # the row's file, as an index in the loader's files (the batcher's buffers)
    padding: Optional[np.ndarray] = None  # the row only evens out the ranks' step counts (``__padding__``)
    length: Optional[np.ndarray] = None  # the row's length (``bucket_by``)
    batch_files: Optional[np.ndarray] = None  # rotation: the files of the row's batch, as an index in a table

    def arrays(self) -> Dict[str, np.ndarray]:
        """The facts kept, by field name."""
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}


@final
@dataclass(frozen=True)
class Traced:
    """The user's ``columns`` (only theirs) and the rows' ``provenance``, of one length."""

    columns: Columns
    provenance: Provenance

    @property
    def n(self) -> int:
        return n_rows(self.columns) if self.columns else n_rows(self.provenance.arrays())

    def map(self, op: Callable[[Columns], Columns]) -> "Traced":
        """``op`` applied to the columns and to the provenance's arrays alike."""
        return Traced(op(self.columns), Provenance(**op(self.provenance.arrays())))


Rows = TypeVar("Rows", Columns, Traced)  # what the row helpers below take: plain columns, or traced ones


def check_columns(columns: object, n_sample: Optional[int], where: str) -> Columns:
    """Check that ``columns`` is a dict of sequences of one length; return it as a dict.

    ``n_sample`` is the length the caller announced (``None``: take the first
    column's). ``ValueError`` names ``where`` and the key at fault.
    """
    if not isinstance(columns, abc.Mapping):
        raise ValueError(f"{where}: expected a dict of lists, got {type(columns).__name__}")
    out: Columns = {}
    for key, col in columns.items():
        _check_column(key, col, where)
        if n_sample is None:
            n_sample = len(col)
        elif len(col) != n_sample:
            raise ValueError(f"{where}: key {key!r} has {len(col)} items but n_sample is {n_sample}")
        out[key] = col if isinstance(col, (list, np.ndarray)) else list(col)
    _check_n_sample(n_sample, where)
    return out


def _check_n_sample(n_sample: Optional[int], where: str) -> None:
    """``ValueError`` unless ``n_sample`` (``None``: no columns, and none announced) is a non-negative integer."""
    if n_sample is not None and (not isinstance(n_sample, (int, np.integer)) or n_sample < 0):
        raise ValueError(f"{where}: n_sample must be a non-negative integer, got {n_sample!r}")


def _check_column(key: object, col: object, where: str) -> None:
    """``ValueError`` unless ``key`` is a string and ``col`` a sequence (of one item per sample)."""
    if not isinstance(key, str):
        raise ValueError(f"{where}: keys must be strings, got {key!r}")
    if isinstance(col, (str, bytes)) or not hasattr(col, "__len__") or not hasattr(col, "__getitem__"):
        raise ValueError(f"{where}: key {key!r} holds {type(col).__name__}, expected a list or array")
    if isinstance(col, np.ndarray) and col.ndim == 0:
        raise ValueError(f"{where}: key {key!r} holds a 0-d array, expected one item per sample")


def n_rows(columns: Any) -> int:
    """The rows of ``columns`` (a dict of columns or a ``Traced``)."""
    if isinstance(columns, Traced):
        return columns.n
    for col in columns.values():
        return len(col)
    return 0


def take(columns: Rows, indices: Any) -> Rows:
    """Rows ``indices`` of every column, in that order."""
    if isinstance(columns, Traced):
        return columns.map(lambda part: take(part, indices))
    if len(indices) == 0:
        return slice_rows(columns, 0, 0)
    idx = np.asarray(indices, dtype=np.int64)
    pick = itemgetter(*idx.tolist())
    out: Columns = {}
    for key, col in columns.items():
        if isinstance(col, np.ndarray):
            out[key] = col[idx]
        else:
            got = pick(col)
            out[key] = list(got) if len(idx) > 1 else [got]
    return out


def array_row_bytes(columns: Columns) -> Optional[int]:
    """The bytes of one row of ``columns`` when each is a NumPy array of rows (a memory map's view
    included): consecutive batches of them can then be one ``[batches, rows, ...]`` view
    (``stacked_views``); ``None`` otherwise."""
    if not columns or not all(type(c) in (np.ndarray, np.memmap) and c.ndim for c in columns.values()):
        return None
    return sum(c.dtype.itemsize * math.prod(c.shape[1:]) for c in columns.values())


def stacked_views(columns: Columns, start: int, count: int, size: int) -> Dict[str, np.ndarray]:
    """Rows ``start : start + count * size`` of array ``columns``, each seen as ``[count, size, ...]``
    (a view: splitting the first axis never copies)."""
    end = start + count * size
    return {key: col[start:end].reshape(count, size, *col.shape[1:]) for key, col in columns.items()}


def slice_rows(columns: Rows, start: int, stop: int) -> Rows:
    if isinstance(columns, Traced):
        return columns.map(lambda part: slice_rows(part, start, stop))
    return {key: col[start:stop] for key, col in columns.items()}


def concat(pieces: Sequence[Rows], where: str = "batch") -> Rows:
    """Join pieces row-wise. Arrays stay arrays when every piece holds one."""
    if len(pieces) == 1:
        return pieces[0]
    if isinstance(pieces[0], Traced):
        return _concat_traced(pieces, where)
    keys = list(pieces[0])
    for piece in pieces[1:]:
        if set(piece) != set(keys):
            raise ValueError(f"{where}: pieces have different keys: {sorted(keys)} vs {sorted(piece)}")
    return {key: _joined([p[key] for p in pieces]) for key in keys}


def _concat_traced(pieces: Sequence[Traced], where: str) -> Traced:
    """``concat`` of traced pieces: their columns, and their provenance's arrays, joined alike."""
    return Traced(concat([p.columns for p in pieces], where),
                  Provenance(**concat([p.provenance.arrays() for p in pieces], where)))


def _joined(cols: Sequence[Column]) -> Column:
    """Columns end to end: one array when all are arrays, else a list."""
    if all(isinstance(c, np.ndarray) for c in cols):
        return np.concatenate(cols)
    joined: list = []
    for c in cols:
        joined.extend(c.tolist() if isinstance(c, np.ndarray) else c)
    return joined


def interleave(labels: np.ndarray, part: Callable[[int, np.ndarray], Rows], where: str) -> Rows:
    """Rows from several places, in the order of ``labels`` (one per row): ``part(label, positions)``
    gives the rows of one label (those at ``positions``, in order); they are joined once and put back
    in order."""
    parts: list = []
    order = np.empty(len(labels), dtype=np.int64)
    offset = 0
    for label in np.unique(labels).tolist():
        positions = np.flatnonzero(labels == label)
        parts.append(part(label, positions))
        order[positions] = offset + np.arange(len(positions))
        offset += len(positions)
    return take(concat(parts, where), order)
