"""Column operations on a dict of equal-length columns (lists or NumPy arrays).

Every stage moves samples as columns, never as per-sample dicts: slicing a
list or an array is one C call, building a dict per sample is not.
"""
from __future__ import annotations

from collections import abc  # isinstance against these, not typing's aliases: several times faster
from operator import itemgetter
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import numpy as np

Column = Any  # a list or a NumPy array (or another sequence), one item per sample
Columns = Dict[str, Column]


def check_columns(columns: Mapping[str, Sequence], n_sample: Optional[int], where: str) -> Columns:
    """Check that ``columns`` is a dict of sequences of one length; return it as a dict.

    ``n_sample`` is the length the caller announced (``None``: take the first
    column's). ``ValueError`` names ``where`` and the key at fault.
    """
    if not isinstance(columns, abc.Mapping):
        raise ValueError(f"{where}: expected a dict of lists, got {type(columns).__name__}")
    out: Columns = {}
    for key, col in columns.items():
        if not isinstance(key, str):
            raise ValueError(f"{where}: keys must be strings, got {key!r}")
        if isinstance(col, (str, bytes)) or not hasattr(col, "__len__") or not hasattr(col, "__getitem__"):
            raise ValueError(f"{where}: key {key!r} holds {type(col).__name__}, expected a list or array")
        if isinstance(col, np.ndarray) and col.ndim == 0:
            raise ValueError(f"{where}: key {key!r} holds a 0-d array, expected one item per sample")
        if n_sample is None:
            n_sample = len(col)
        elif len(col) != n_sample:
            raise ValueError(f"{where}: key {key!r} has {len(col)} items but n_sample is {n_sample}")
        out[key] = col if isinstance(col, (list, np.ndarray)) else list(col)
    if n_sample is not None and (not isinstance(n_sample, (int, np.integer)) or n_sample < 0):
        raise ValueError(f"{where}: n_sample must be a non-negative integer, got {n_sample!r}")
    return out


def n_rows(columns: Columns) -> int:
    for col in columns.values():
        return len(col)
    return 0


def take(columns: Columns, indices: Any) -> Columns:
    """Rows ``indices`` of every column, in that order."""
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


def slice_rows(columns: Columns, start: int, stop: int) -> Columns:
    return {key: col[start:stop] for key, col in columns.items()}


def concat(pieces: Sequence[Columns], where: str = "batch") -> Columns:
    """Join pieces row-wise. Arrays stay arrays when every piece holds one."""
    if len(pieces) == 1:
        return pieces[0]
    keys = list(pieces[0])
    out: Columns = {}
    for piece in pieces[1:]:
        if set(piece) != set(keys):
            raise ValueError(f"{where}: pieces have different keys: {sorted(keys)} vs {sorted(piece)}")
    for key in keys:
        cols = [p[key] for p in pieces]
        if all(isinstance(c, np.ndarray) for c in cols):
            out[key] = np.concatenate(cols)
        else:
            joined: list = []
            for c in cols:
                joined.extend(c.tolist() if isinstance(c, np.ndarray) else c)
            out[key] = joined
    return out


def interleave(labels: np.ndarray, part: Callable[[int, np.ndarray], Columns], where: str) -> Columns:
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
