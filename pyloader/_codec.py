"""Encoded batches as NumPy arrays and back, exactly, without pickle (``cache_encoded``).

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
"""
from __future__ import annotations

import itertools
import json
from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple

import numpy as np

from ._errors import NeverSkipped

LAYOUT = "__layout__"
FORMAT = 1
Arrays = Dict[str, np.ndarray]
_SCALARS: Dict[type, Tuple[str, Any]] = {  # exact Python type -> (kind, dtype)
    bool: ("bool", np.bool_), int: ("int", np.int64), float: ("float", np.float64), complex: ("complex", np.complex128),
}


class NotCacheable(TypeError, NeverSkipped):
    """An encoded column that cannot be stored exactly without pickle; the message names it (whatever
    ``on_error`` says, this is raised: skipping would drop every batch)."""


class _Unsupported(Exception):
    """Why a part of a column cannot be stored (the column is named by the caller)."""


def pack(batch: Mapping[str, Any]) -> Arrays:
    """The arrays that hold ``batch`` exactly, its layout in ``LAYOUT`` (see the module's contracts)."""
    arrays: Arrays = {}
    columns = []
    for i, (key, column) in enumerate(batch.items()):
        if not isinstance(key, str):
            raise NotCacheable(f"cache_encoded: batch_encode returned the key {key!r}: keys must be strings")
        try:
            columns.append([key, _pack_column(column, f"c{i}", arrays)])
        except _Unsupported as why:
            raise NotCacheable(f"cache_encoded cannot store column {key!r} of the encoded batch without pickle: "
                               f"{why} (supported: see the README, Cached epochs)") from None
    arrays[LAYOUT] = np.frombuffer(json.dumps({"format": FORMAT, "columns": columns}).encode(), dtype=np.uint8)
    return arrays


def unpack(arrays: Mapping[str, np.ndarray]) -> Dict[str, Any]:
    """The batch that ``pack`` stored in ``arrays``."""
    layout = json.loads(arrays[LAYOUT].tobytes())
    if layout.get("format") != FORMAT:
        raise ValueError(f"unknown cached batch layout format {layout.get('format')!r}")
    return {key: _unpack_column(spec, arrays) for key, spec in layout["columns"]}


def _pack_column(column: Any, name: str, arrays: Arrays) -> Dict[str, Any]:
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


def _unpack_column(spec: Dict[str, Any], arrays: Mapping[str, np.ndarray]) -> Any:
    container = spec["container"]
    if container == "array":
        return arrays[spec["name"]]
    items = _unpack_items(spec["items"], arrays, spec["name"])
    if container == "tuple":
        return tuple(items)
    if container == "objects":
        out = np.empty(len(items), dtype=object)
        for k, item in enumerate(items):
            out[k] = item
        return out
    return items


def _kind_of(items: Sequence[Any]) -> type:
    types = set(map(type, items))
    if len(types) > 1:
        raise _Unsupported(f"items of several types ({', '.join(sorted(t.__name__ for t in types))})")
    return types.pop()


def _pack_items(items: Sequence[Any], name: str, arrays: Arrays) -> Dict[str, Any]:
    """The spec of a flat sequence of items of one type; their arrays go in ``arrays`` under ``name``."""
    if not len(items):
        return {"kind": "empty"}
    kind = _kind_of(items)
    if kind in (list, tuple):
        arrays[name + "o"] = _offsets(list(map(len, items)))
        flat = list(itertools.chain.from_iterable(items))
        return {"kind": "nested", "container": kind.__name__, "items": _pack_items(flat, name + "i", arrays)}
    if kind in (str, bytes):
        encoded = [s.encode("utf-8", "surrogatepass") for s in items] if kind is str else list(items)
        arrays[name + "o"] = _offsets(list(map(len, encoded)))
        arrays[name] = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        return {"kind": kind.__name__}
    if kind in _SCALARS:
        label, dtype = _SCALARS[kind]
        try:
            arrays[name] = np.array(items, dtype=dtype)
        except OverflowError:
            raise _Unsupported("an int beyond 64 bits") from None
        return {"kind": label}
    if kind is np.ndarray:
        return _pack_arrays(items, name, arrays)
    if issubclass(kind, np.generic) and kind.__module__ == "numpy":
        dtypes = {item.dtype for item in items}
        dtype = dtypes.pop()
        if dtypes or dtype.kind in "OUSV":
            raise _Unsupported(f"NumPy scalars of type {kind.__name__} (of several dtypes, or strings or objects)")
        arrays[name] = np.array(items, dtype=dtype)
        return {"kind": "scalar"}
    raise _Unsupported(f"items of type {kind.__name__}")


def _pack_arrays(items: Sequence[np.ndarray], name: str, arrays: Arrays) -> Dict[str, Any]:
    dtypes, ndims = {a.dtype for a in items}, {a.ndim for a in items}
    if len(dtypes) > 1 or len(ndims) > 1 or next(iter(dtypes)).hasobject:
        raise _Unsupported("NumPy arrays of several dtypes or numbers of dimensions, or of objects")
    arrays[name + "s"] = np.array([a.shape for a in items], dtype=np.int64).reshape(len(items), ndims.pop())
    arrays[name] = np.concatenate([a.ravel() for a in items])
    return {"kind": "arrays"}


def _offsets(lengths: List[int]) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _unpack_items(spec: Dict[str, Any], arrays: Mapping[str, np.ndarray], name: str) -> List[Any]:
    """The items ``_pack_items`` stored under ``name``."""
    kind = spec["kind"]
    if kind == "empty":
        return []
    if kind == "nested":
        bounds = arrays[name + "o"].tolist()
        flat = _unpack_items(spec["items"], arrays, name + "i")
        make: Callable[[List[Any]], Any] = tuple if spec["container"] == "tuple" else list
        return [make(flat[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    if kind in ("str", "bytes"):
        data, bounds = arrays[name].tobytes(), arrays[name + "o"].tolist()
        parts = [data[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        return [p.decode("utf-8", "surrogatepass") for p in parts] if kind == "str" else parts
    if kind == "arrays":
        shapes, values = arrays[name + "s"], arrays[name]
        sizes = [int(np.prod(shape)) for shape in shapes.tolist()]
        ends = np.cumsum(sizes).tolist()
        return [values[end - size:end].reshape(shape) for end, size, shape in zip(ends, sizes, shapes.tolist())]
    if kind == "scalar":
        return list(arrays[name])
    return arrays[name].tolist()  # bool, int, float, complex: the Python types they were
