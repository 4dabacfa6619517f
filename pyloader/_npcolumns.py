"""Encoded samples as plain NumPy arrays, for samples held on disk (``rotation_dir``): nothing is pickled.

Each field of a chunk of samples becomes a few arrays of numbers (its *kind* says how to read them
back), saved as ``.npy`` files and read back memory-mapped with ``np.load(allow_pickle=False)``:

==========================================================  =================  ==========================
the field holds                                             arrays             read back as
==========================================================  =================  ==========================
an array (``np.ndarray``, not of objects)                   the array          an array
a list of NumPy arrays of one dtype and ``ndim``            values, offsets,   a list of arrays
                                                            shapes
a list of ``bool``, of ``int`` or of ``float``              the values         a list of them
a list of NumPy scalars                                     the values         a list of NumPy scalars
a list of lists (or of tuples) of ``bool``/``int``/``float``  values, offsets  lists (tuples) of them
a list of ``str`` or of ``bytes``                           UTF-8 bytes,       ``str`` / ``bytes``
                                                            offsets
==========================================================  =================  ==========================

Ragged values are stored flat, with ``offsets`` (``n + 1`` of them) marking where each sample's
start. Anything else (``None``, dicts, mixed types, ints beyond 64 bits) is a ``TypeError``
naming the field. A field must be of one kind in every chunk of a window (``join``).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from ._columns import Columns

Field = Tuple[str, Dict[str, np.ndarray]]  # (kind, its arrays: "v" values, "o" offsets, "s" shapes)
Encoded = Dict[str, Field]
_NUMBERS = {bool: np.bool_, int: np.int64, float: np.float64}
_RAGGED = ("arrays", "lists", "tuples", "str", "bytes")


class Unstorable(TypeError):
    """A field that cannot be held as NumPy arrays."""


def _unstorable(key: str, what: str) -> Unstorable:
    return Unstorable(f"rotation_dir holds samples on disk as NumPy arrays, never pickled: field {key!r} "
                      f"holds {what}; fields may hold arrays, numbers, strings, bytes, lists of numbers "
                      f"of one type, or lists of arrays (or hold samples in memory: no rotation_dir)")


def _type_names(values: Any) -> str:
    return " and ".join(sorted({type(v).__name__ for v in values}))


def _ragged(flat: np.ndarray, sizes: Sequence[int]) -> Dict[str, np.ndarray]:
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return {"v": flat, "o": offsets}


def _numbers(key: str, values: Sequence[Any], what: str) -> np.ndarray:
    """``values`` (Python numbers of one type, or none) as an array."""
    kinds = {type(v) for v in values}
    if len(kinds) > 1 or not kinds <= set(_NUMBERS):
        raise _unstorable(key, f"{what}{_type_names(values)}")
    try:
        return np.asarray(values, dtype=_NUMBERS[kinds.pop()] if kinds else np.int64)
    except OverflowError:
        raise _unstorable(key, f"{what}int beyond 64 bits") from None


def _arrays(key: str, values: List[np.ndarray]) -> Field:
    dtypes, ndims = {v.dtype for v in values}, {v.ndim for v in values}
    if len(dtypes) > 1 or len(ndims) > 1 or dtypes.pop().hasobject:
        raise _unstorable(key, "arrays of several dtypes or dimensions, or of objects")
    arrays = _ragged(np.concatenate([v.ravel() for v in values]), [v.size for v in values])
    arrays["s"] = np.array([v.shape for v in values], dtype=np.int64).reshape(len(values), ndims.pop())
    return "arrays", arrays


def _field(key: str, values: Any) -> Field:
    """One field of a chunk as arrays."""
    if isinstance(values, np.ndarray) and not values.dtype.hasobject:
        return "array", {"v": values}
    values = list(values)
    kinds = {type(v) for v in values}
    if len(kinds) != 1:
        raise _unstorable(key, f"values of several types ({_type_names(values)})")
    return _values(key, values, kinds.pop())


def _values(key: str, values: List[Any], kind: type) -> Field:
    """A field of values of one type ``kind``, as arrays."""
    if kind in _NUMBERS:
        return "numbers", {"v": _numbers(key, values, "")}
    if issubclass(kind, np.generic) and not np.asarray(values).dtype.hasobject:
        return "scalars", {"v": np.asarray(values)}
    if kind is np.ndarray:
        return _arrays(key, values)
    if kind in (list, tuple):
        flat = [x for v in values for x in v]
        return kind.__name__ + "s", _ragged(_numbers(key, flat, f"{kind.__name__}s of "), [len(v) for v in values])
    if kind in (str, bytes):
        data = [v.encode("utf-8") for v in values] if kind is str else values
        return kind.__name__, _ragged(np.frombuffer(b"".join(data), dtype=np.uint8), [len(d) for d in data])
    raise _unstorable(key, f"{kind.__name__} values")


def encode(columns: Columns) -> Encoded:
    """A chunk's fields as arrays; ``Unstorable`` names a field that cannot be."""
    return {key: _field(key, values) for key, values in columns.items()}


Stored = Tuple[str, Any, Tuple[int, ...]]  # a field's kind, dtype (None: no values) and per-sample shape


def stored(field: Field) -> Stored:
    """How a field is stored, to compare with how it was before (``same_storage``)."""
    kind, arrays = field
    values = arrays["v"]
    shape = tuple(values.shape[1:]) if kind == "array" else ()
    return kind, values.dtype if values.size or kind == "array" else None, shape


def describe(how: Stored) -> str:
    kind, dtype, shape = how
    return f"{kind}" + ("" if dtype is None else f" of {dtype}") + (f", {shape} per sample" if shape else "")


def same_storage(a: Stored, b: Stored) -> bool:
    """Whether fields stored as ``a`` and ``b`` can be joined and read back alike."""
    return a[0] == b[0] and a[2] == b[2] and (a[1] is None or b[1] is None or a[1] == b[1])


def rows(encoded: Encoded) -> int:
    for kind, arrays in encoded.values():
        return len(arrays["o"]) - 1 if kind in _RAGGED else len(arrays["v"])
    return 0


def cut(encoded: Encoded, start: int, end: int) -> Encoded:
    """Samples ``start:end`` of a chunk."""
    out: Encoded = {}
    for key, (kind, arrays) in encoded.items():
        if kind not in _RAGGED:
            out[key] = kind, {"v": arrays["v"][start:end]}
            continue
        offsets = arrays["o"][start:end + 1]
        part = {"v": arrays["v"][offsets[0]:offsets[-1]], "o": offsets - offsets[0]}
        if "s" in arrays:
            part["s"] = arrays["s"][start:end]
        out[key] = kind, part
    return out


def join(chunks: Sequence[Encoded]) -> Encoded:
    """Chunks put end to end; a field of another kind in one of them is a ``TypeError`` naming it."""
    out: Encoded = {}
    for key, (kind, _) in chunks[0].items():
        fields = [chunk[key] for chunk in chunks]
        kinds = {k for k, _ in fields}
        if len(kinds) > 1:
            raise TypeError(f"field {key!r} holds {' in some batches and '.join(sorted(kinds))} in others: "
                            f"rotation_dir stores a field one way for all the samples of a window")
        parts = [arrays for _, arrays in fields]
        if kind not in _RAGGED:
            out[key] = kind, {"v": np.concatenate([p["v"] for p in parts])}
            continue
        values = [p["v"] for p in parts if len(p["v"])] or [parts[0]["v"]]  # an empty part says no dtype
        shift = np.cumsum([0] + [int(p["o"][-1]) for p in parts[:-1]])
        joined = {"v": np.concatenate(values),
                  "o": np.concatenate([parts[0]["o"][:1]] + [p["o"][1:] + s for p, s in zip(parts, shift)])}
        if "s" in parts[0]:
            joined["s"] = np.concatenate([p["s"] for p in parts])
        out[key] = kind, joined
    return out


def take(encoded: Encoded, positions: np.ndarray) -> Columns:
    """Samples ``positions`` (in that order) as columns, each field as it was given (see the table);
    nothing returned refers to the arrays (they may be memory-mapped files about to go)."""
    out: Columns = {}
    for key, (kind, arrays) in encoded.items():
        values = arrays["v"]
        if kind not in _RAGGED:
            picked = np.array(values[positions])
            out[key] = picked if kind == "array" else picked.tolist() if kind == "numbers" else list(picked)
            continue
        starts, ends = arrays["o"][positions].tolist(), arrays["o"][positions + 1].tolist()
        if kind == "arrays":
            shapes = arrays["s"][positions].tolist()
            out[key] = [np.array(values[a:b]).reshape(shape) for a, b, shape in zip(starts, ends, shapes)]
        elif kind in ("lists", "tuples"):
            made = list if kind == "lists" else tuple
            out[key] = [made(values[a:b].tolist()) for a, b in zip(starts, ends)]
        else:
            raw = [bytes(values[a:b]) for a, b in zip(starts, ends)]
            out[key] = [r.decode("utf-8") for r in raw] if kind == "str" else raw
    return out


Manifest = List[Tuple[str, str, Dict[str, str]]]  # (field, kind, {part: path})


def save(encoded: Encoded, folder: str) -> Manifest:
    """Write each array of ``encoded`` to ``folder`` (which exists), one ``.npy`` file each, named by
    the field's place (``f<i>.<part>.npy``): a file appears whole or not at all."""
    manifest: Manifest = []
    for i, (key, (kind, arrays)) in enumerate(encoded.items()):
        paths = {}
        for part, array in arrays.items():
            path = os.path.join(folder, f"f{i}.{part}.npy")
            with open(path + ".tmp", "wb") as f:
                np.save(f, np.ascontiguousarray(array), allow_pickle=False)
            os.replace(path + ".tmp", path)
            paths[part] = path
        manifest.append((key, kind, paths))
    return manifest


def load(manifest: Manifest) -> Encoded:
    """What ``save`` wrote, memory-mapped (read as needed, never unpickled)."""
    return {key: (kind, {part: np.load(path, mmap_mode="r", allow_pickle=False) for part, path in paths.items()})
            for key, kind, paths in manifest}
