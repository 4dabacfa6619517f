"""Encoded batches as NumPy arrays and back, exactly, without pickle (``cache_encoded``, ``rotation_dir``).

Contracts:

- ``pack(batch)`` turns what ``batch_encode`` returned (a dict of columns) into named
  arrays for ``np.savez``; ``unpack(arrays)`` gives back a dict equal to it in values
  *and* Python types: a list of lists of ``int`` comes back as a list of lists of
  ``int`` (not ``np.int64``), a tuple as a tuple, an array with its dtype and shape.
  The layout (column names, kinds, containers) travels as JSON bytes in the array
  ``LAYOUT``, so nothing ever needs ``allow_pickle=True``.
- A column is a ``list`` or ``tuple`` of items, or a NumPy array of any dtype but
  ``object`` (an ``object`` array of one dimension is taken as its items). Items are
  all of one type: ``int`` (64 bits), ``float``, ``complex``, ``bool``, ``str``,
  ``bytes``, a NumPy scalar type (one dtype), NumPy arrays (one dtype and number of
  dimensions, any shapes), or lists/tuples of such items, nested to any depth
  (ragged: values flat, plus offsets). Strings are stored as UTF-8 (lone
  surrogates kept), so every ``str`` round-trips, NUL characters included.
- Anything else (``None``, dicts, mixed types such as ``[1, 2.5]``, ints beyond 64
  bits, tensors, ``str`` subclasses) raises ``NotCacheable`` naming the column and
  what it holds: the data is never changed to fit.
- ``take(arrays, rows)`` gives rows of a stored batch (in any order), as ``unpack`` would
  give them after taking those rows, reading only what they need (the arrays may be
  memory-mapped ``.npy`` files: ``rotation_dir``); nothing it returns refers to the arrays.
"""
from __future__ import annotations

import itertools
import json
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .._columns import Column, Columns
from .._errors import NeverSkipped

LAYOUT = "__layout__"
FORMAT = 1
Arrays = Dict[str, np.ndarray]
Spec = Dict[str, Any]  # how one column (or its items) is stored: the layout's JSON
_SCALARS: Dict[type, Tuple[str, type]] = {  # exact Python type -> (kind, dtype)
    bool: ("bool", np.bool_), int: ("int", np.int64), float: ("float", np.float64), complex: ("complex", np.complex128),
}


class NotCacheable(TypeError, NeverSkipped):
    """An encoded column that cannot be stored exactly without pickle; the message names it (whatever
    ``on_error`` says, this is raised: skipping would drop every batch)."""


class _Unsupported(Exception):
    """Why a part of a column cannot be stored (the column is named by the caller)."""


def pack(batch: Mapping[str, Column], purpose: str = "cache_encoded") -> Arrays:
    """The arrays that hold ``batch`` exactly, its layout in ``LAYOUT`` (see the module's contracts);
    ``purpose`` (the option storing it) is named in errors."""
    arrays: Arrays = {}
    columns = []
    for i, (key, column) in enumerate(batch.items()):
        if not isinstance(key, str):
            raise NotCacheable(f"{purpose}: batch_encode returned the key {key!r}: keys must be strings")
        try:
            columns.append([key, _pack_column(column, f"c{i}", arrays)])
        except _Unsupported as why:
            raise NotCacheable(f"{purpose} cannot store column {key!r} of the encoded batch without pickle: "
                               f"{why} (supported: see the README, Cached epochs)") from None
    arrays[LAYOUT] = np.frombuffer(json.dumps({"format": FORMAT, "columns": columns}).encode(), dtype=np.uint8)
    return arrays


def unpack(arrays: Mapping[str, np.ndarray]) -> Columns:
    """The batch that ``pack`` stored in ``arrays``."""
    return take(arrays, None)


def take(arrays: Mapping[str, np.ndarray], rows: Optional[np.ndarray]) -> Columns:
    """Rows ``rows`` (positions, in that order; ``None``: all of them) of the batch that ``pack``
    stored in ``arrays`` (see the module's contracts)."""
    layout = json.loads(np.asarray(arrays[LAYOUT]).tobytes())
    if layout.get("format") != FORMAT:
        raise ValueError(f"unknown cached batch layout format {layout.get('format')!r}")
    return {key: _unpack_column(spec, arrays, rows) for key, spec in layout["columns"]}


def _pack_column(column: Column, name: str, arrays: Arrays) -> Spec:
    if type(column) is np.ndarray:
        if column.dtype.hasobject:
            if column.ndim != 1 or column.dtype != object:
                raise _Unsupported(f"an object array of {column.ndim} dimensions")
            return {"container": "objects", "name": name, "items": _pack_items(list(column), name, arrays)}
        arrays[name] = column
        return {"container": "array", "name": name}
    if type(column) in (list, tuple):
        return {"container": type(column).__name__, "name": name, "items": _pack_items(column, name, arrays)}
    raise _Unsupported(f"it is a {type(column).__name__}: a column must be a list, a tuple or a NumPy array")


def _at(array: np.ndarray, rows: Optional[np.ndarray]) -> np.ndarray:
    """``array``'s rows ``rows``, copied out; all of it as it is when ``rows`` is ``None``."""
    return array if rows is None else np.array(array[rows])


def _unpack_column(spec: Spec, arrays: Mapping[str, np.ndarray], rows: Optional[np.ndarray]) -> Column:
    container = spec["container"]
    if container == "array":
        return _at(arrays[spec["name"]], rows)
    items = _unpack_items(spec["items"], arrays, spec["name"], rows)
    if container == "tuple":
        return tuple(items)
    if container == "objects":
        out = np.empty(len(items), dtype=object)
        for k, item in enumerate(items):
            out[k] = item
        return out
    return items


def _kind_of(items: Sequence[object]) -> type:
    types = set(map(type, items))
    if len(types) > 1:
        raise _Unsupported(f"items of several types ({', '.join(sorted(t.__name__ for t in types))})")
    return types.pop()


def _pack_items(items: Column, name: str, arrays: Arrays) -> Spec:
    """The spec of a flat sequence of items of one type; their arrays go in ``arrays`` under ``name``."""
    if not len(items):
        return {"kind": "empty"}
    kind = _kind_of(items)
    if kind in _PACKERS:
        return _PACKERS[kind](items, kind, name, arrays)
    if issubclass(kind, np.generic) and kind.__module__ == "numpy":
        return _pack_numpy_scalars(items, kind, name, arrays)
    raise _Unsupported(f"items of type {kind.__name__}")


def _pack_nested(items: Column, kind: type, name: str, arrays: Arrays) -> Spec:
    arrays[name + "o"] = _offsets(list(map(len, items)))
    flat = list(itertools.chain.from_iterable(items))
    return {"kind": "nested", "container": kind.__name__, "items": _pack_items(flat, name + "i", arrays)}


def _pack_strings(items: Column, kind: type, name: str, arrays: Arrays) -> Spec:
    encoded = [s.encode("utf-8", "surrogatepass") for s in items] if kind is str else list(items)
    arrays[name + "o"] = _offsets(list(map(len, encoded)))
    arrays[name] = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    return {"kind": kind.__name__}


def _pack_scalars(items: Column, kind: type, name: str, arrays: Arrays) -> Spec:
    label, dtype = _SCALARS[kind]
    try:
        arrays[name] = np.array(items, dtype=dtype)
    except OverflowError:
        raise _Unsupported("an int beyond 64 bits") from None
    return {"kind": label}


def _pack_numpy_scalars(items: Column, kind: type, name: str, arrays: Arrays) -> Spec:
    dtypes = {item.dtype for item in items}
    dtype = dtypes.pop()
    if dtypes or dtype.kind in "OUSV":
        raise _Unsupported(f"NumPy scalars of type {kind.__name__} (of several dtypes, or strings or objects)")
    arrays[name] = np.array(items, dtype=dtype)
    return {"kind": "scalar"}


def _pack_arrays(items: Sequence[np.ndarray], kind: type, name: str, arrays: Arrays) -> Spec:
    layouts = {(a.dtype, a.ndim) for a in items}
    dtype, ndim = next(iter(layouts))
    if len(layouts) > 1 or dtype.hasobject:
        raise _Unsupported("NumPy arrays of several dtypes or numbers of dimensions, or of objects")
    arrays[name + "s"] = np.array([a.shape for a in items], dtype=np.int64).reshape(len(items), ndim)
    arrays[name] = np.concatenate([a.ravel() for a in items])
    return {"kind": "arrays"}


# how items of each exact type are stored (NumPy scalars aside: by subclass)
_PACKERS: Dict[type, Callable[[Column, type, str, Arrays], Spec]] = {
    list: _pack_nested, tuple: _pack_nested, str: _pack_strings, bytes: _pack_strings, np.ndarray: _pack_arrays,
    **dict.fromkeys(_SCALARS, _pack_scalars)}


def _offsets(lengths: List[int]) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _unpack_arrays(spec: Spec, arrays: Mapping[str, np.ndarray], name: str,
                   rows: Optional[np.ndarray]) -> List[np.ndarray]:
    """The NumPy arrays stored under ``name`` (those at ``rows``, copied, when given; else views)."""
    shapes, values = np.asarray(arrays[name + "s"]), arrays[name]
    sizes = np.prod(shapes, axis=1)
    ends = np.cumsum(sizes)
    starts = (ends - sizes).tolist()
    ends = ends.tolist()
    if rows is None:
        return [values[starts[k]:ends[k]].reshape(shapes[k]) for k in range(len(shapes))]
    return [np.array(values[starts[k]:ends[k]]).reshape(shapes[k]) for k in rows.tolist()]


def _spans(bounds: np.ndarray, rows: Optional[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """Where the items ``rows`` (``None``: all) start and end, from the offsets ``bounds``."""
    if rows is None:
        return np.asarray(bounds[:-1]), np.asarray(bounds[1:])
    return np.asarray(bounds[rows]), np.asarray(bounds[rows + 1])


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``starts[k]:ends[k]`` for every ``k``, put end to end, as positions."""
    lengths = ends - starts
    return np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(int(lengths.sum()))


def _unpack_items(spec: Spec, arrays: Mapping[str, np.ndarray], name: str,
                  rows: Optional[np.ndarray] = None) -> Sequence[object]:
    """The items ``_pack_items`` stored under ``name`` (those at ``rows`` when given, copied out of ``arrays``)."""
    kind = spec["kind"]
    if kind in _UNPACKERS:
        return _UNPACKERS[kind](spec, arrays, name, rows)
    values = _at(arrays[name], rows)
    if kind == "scalar":
        return list(values)
    return values.tolist()  # bool, int, float, complex: the Python types they were


def _unpack_empty(spec: Spec, arrays: Mapping[str, np.ndarray], name: str,
                  rows: Optional[np.ndarray]) -> Sequence[object]:
    return []


def _unpack_nested(spec: Spec, arrays: Mapping[str, np.ndarray], name: str,
                   rows: Optional[np.ndarray]) -> Sequence[object]:
    starts, ends = _spans(arrays[name + "o"], rows)
    flat = _unpack_items(spec["items"], arrays, name + "i", None if rows is None else _ranges(starts, ends))
    make: Callable[[Sequence[object]], object] = tuple if spec["container"] == "tuple" else list
    edges = np.cumsum(np.concatenate([[0], ends - starts])).tolist()
    return [make(flat[a:b]) for a, b in zip(edges[:-1], edges[1:])]


def _unpack_strings(spec: Spec, arrays: Mapping[str, np.ndarray], name: str,
                    rows: Optional[np.ndarray]) -> Sequence[object]:
    starts, ends = _spans(arrays[name + "o"], rows)
    data = arrays[name]
    parts = [bytes(data[a:b]) for a, b in zip(starts.tolist(), ends.tolist())]
    return [p.decode("utf-8", "surrogatepass") for p in parts] if spec["kind"] == "str" else parts


# how items stored as each kind are read back (the scalar kinds aside)
_UNPACKERS: Dict[str, Callable[[Spec, Mapping[str, np.ndarray], str, Optional[np.ndarray]], Sequence[object]]] = {
    "empty": _unpack_empty, "nested": _unpack_nested, "str": _unpack_strings, "bytes": _unpack_strings,
    "arrays": _unpack_arrays}
