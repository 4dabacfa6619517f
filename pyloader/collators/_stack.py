"""Stacking and padding in NumPy: the work every built-in collator shares.

``stack_batch`` turns an encoded batch (a dict of columns, each a list with one
item per sample or a NumPy array whose first axis is the sample axis) into
NumPy arrays of shape ``[batch, ...]`` and hands each array to a converter that
the framework-specific collator supplies. Nothing here imports torch or
tensorflow.
"""
from __future__ import annotations

from collections import abc  # isinstance against these, not typing's aliases: several times faster
from dataclasses import dataclass, field
from typing import (
    AbstractSet,
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

import numpy as np
import numpy.typing as npt

from .._checks import is_integer

__all__ = ["PAD_INFO", "StackOptions", "stack_batch", "stack_column"]

PAD_INFO = ("mask", "lengths", None)
_SEQUENCE = (list, tuple, np.ndarray)
_STRING = (str, bytes)
_NUMERIC_KINDS = "biufc"
_PY_BASES = (bool, int, float, complex)  # bool first: it is also an int
_WEAK = {bool: False, int: 0, float: 0.0, complex: 0j}  # Python scalars promote NumPy dtypes weakly

ItemColumn = Union[Sequence, np.ndarray]  # one item per sample: a list, or an array along its first axis
ArrayConverter = Callable[[str, np.ndarray], object]
StringConverter = Callable[[str, ItemColumn], object]


@dataclass(frozen=True)
class StackOptions:
    """Validated collator settings; build it with ``StackOptions.create``."""

    float_dtype: np.dtype = np.dtype(np.float32)
    int_dtype: np.dtype = np.dtype(np.int64)
    pad_value: object = 0
    pad_values: Dict[str, object] = field(default_factory=dict)
    pad_info: Optional[str] = "mask"
    keys: Optional[FrozenSet[str]] = None
    passthrough: FrozenSet[str] = frozenset()
    ragged_keys: Dict[str, int] = field(default_factory=dict)

    @classmethod
    def create(
        cls,
        float_dtype: npt.DTypeLike = np.float32,
        int_dtype: npt.DTypeLike = np.int64,
        pad_value: object = 0,
        pad_values: Optional[Mapping[str, object]] = None,
        pad_info: Optional[str] = "mask",
        keys: Optional[Iterable[str]] = None,
        passthrough: Iterable[str] = (),
        ragged_keys: Union[Mapping[str, int], Iterable[str]] = (),
    ) -> "StackOptions":
        """Check and normalise the settings; ``ValueError`` names the bad one."""
        float_dt, int_dt = np.dtype(float_dtype), np.dtype(int_dtype)
        if float_dt.kind != "f":
            raise ValueError(f"float_dtype must be a floating dtype, got {float_dt}")
        if int_dt.kind not in "iu":
            raise ValueError(f"int_dtype must be an integer dtype, got {int_dt}")
        if pad_info not in PAD_INFO:
            raise ValueError(f"pad_info must be one of {PAD_INFO}, got {pad_info!r}")
        for name, value in (("keys", keys), ("passthrough", passthrough), ("ragged_keys", ragged_keys)):
            if isinstance(value, (str, bytes)):
                raise ValueError(f"{name} must be a collection of keys, not the string {value!r}")
        ragged = _ragged_axes(ragged_keys)
        return cls(
            float_dtype=float_dt,
            int_dtype=int_dt,
            pad_value=pad_value,
            pad_values=dict(pad_values or {}),
            pad_info=pad_info,
            keys=None if keys is None else frozenset(keys),
            passthrough=frozenset(passthrough),
            ragged_keys=ragged,
        )

    def collates(self, key: str) -> bool:
        """Whether ``key`` is collated (rather than returned untouched)."""
        return key not in self.passthrough and (self.keys is None or key in self.keys)


def _ragged_axes(ragged_keys: Union[Mapping[str, int], Iterable[str]]) -> Dict[str, int]:
    """``ragged_keys`` as ``{key: ragged axes}`` (a key alone: one axis); ``ValueError`` names a bad count."""
    ragged = dict(ragged_keys) if isinstance(ragged_keys, abc.Mapping) else dict.fromkeys(ragged_keys, 1)
    for key, n_axes in ragged.items():
        if not is_integer(n_axes, least=1):
            raise ValueError(f"ragged_keys[{key!r}] must be an integer >= 1, got {n_axes!r}")
    return ragged


def stack_batch(
    features: Mapping[str, ItemColumn],
    options: StackOptions,
    convert_array: ArrayConverter,
    convert_strings: StringConverter,
) -> Dict[str, object]:
    """Collate every column of ``features``; see ``stack_column`` for one column.

    Keys that ``options`` does not collate are copied through untouched. Each
    collated array (companions included) goes through ``convert_array(name,
    array)``; each string column through ``convert_strings(key, column)``.
    Companions follow their key in the result. ``ValueError`` names the key at fault.
    """
    _check_keys(features, options)
    out: Dict[str, object] = {}
    first_key: Optional[str] = None
    for key, column in features.items():
        if not options.collates(key):
            out[key] = column
            continue
        stacked = stack_column(key, column, options)  # rejects what has no length
        if first_key is None:
            first_key = key
        elif len(column) != len(features[first_key]):
            raise ValueError(
                f"key {key!r} has {len(column)} items but key {first_key!r} has {len(features[first_key])}"
            )
        if stacked is None:
            out[key] = convert_strings(key, column)
            continue
        for name, array in stacked.items():
            if name != key and name in features:
                raise ValueError(f"key {key!r}: its companion {name!r} clashes with a key already in the batch")
            out[name] = convert_array(name, array)
    return out


def _check_keys(features: Mapping[str, ItemColumn], options: StackOptions) -> None:
    """``ValueError`` unless ``features`` is a dict of columns holding every key ``options`` asks for."""
    if not isinstance(features, abc.Mapping):
        raise ValueError(f"expected a dict of columns, got {type(features).__name__}")
    if options.keys is not None:
        missing = sorted(options.keys.difference(features))
        if missing:
            raise ValueError(f"keys {missing} were asked for but are not in the batch")


def stack_column(key: str, column: ItemColumn, options: StackOptions) -> Optional[Dict[str, np.ndarray]]:
    """Stack one column into ``{key: array}`` plus its companion, or ``None`` for strings.

    * A non-object NumPy array is returned as is, never copied.
    * String columns (``str``/``bytes`` items, lists of them, string arrays) give ``None``:
      the caller passes them on unchanged.
    * Otherwise items are stacked along a new first axis. Python bools give
      ``bool``, ints ``options.int_dtype``, floats ``options.float_dtype``;
      NumPy arrays and scalars keep their dtype (Python scalars mixed in promote
      it the way NumPy promotes them). A column of empty sequences gives ``float_dtype``.
    * Items of different lengths along any axis are padded to the batch's
      longest with ``pad_values.get(key, pad_value)``. The companion is then
      ``<key>_mask`` (bool, True on real values, the padded shape up to the last
      ragged axis) for ``pad_info="mask"``, ``<key>_lengths`` (int64 ``[batch]``,
      each item's length along its first axis) for ``"lengths"``, none for ``None``.
      Keys in ``ragged_keys`` always get the companion, even when this batch is
      not ragged, with at least the declared number of leading axes in the mask.
    """
    if isinstance(column, np.ndarray):
        if column.ndim == 0:
            raise ValueError(f"key {key!r} holds a 0-d array, expected one item per sample")
        if column.dtype.kind != "O":
            return _stacked_array(key, column, options)
        column = column.tolist()
    if isinstance(column, _STRING) or not isinstance(column, abc.Sequence):
        raise ValueError(f"key {key!r} holds {type(column).__name__}, expected a list or an array")
    if type(None) in set(map(type, column)):
        raise ValueError(f"key {key!r} holds None; every sample needs a value")
    if _holds_strings(column):
        return None
    layout = _Layout(key)
    layout.walk(column, 0)
    return _stack_walked(key, column, layout, options)


def _stacked_array(key: str, column: np.ndarray, options: StackOptions) -> Optional[Dict[str, np.ndarray]]:
    """``stack_column`` for a column that is an array of one dtype: strings pass (``None``), others as they are."""
    if column.dtype.kind in "US":
        return None
    _check_declared(key, column.ndim - 1, options)
    return {key: column, **_companion(key, column, options)}


def _stack_walked(key: str, column: ItemColumn, layout: "_Layout", options: StackOptions) -> Dict[str, np.ndarray]:
    """``stack_column`` for a column of numbers, once ``layout`` has walked it: padded where it is ragged."""
    dtype = layout.dtype(options)
    depth = layout.depth if layout.depth is not None else len(layout.lens) - 1
    shape = tuple(layout.lens[: depth + 1])
    ragged = [axis for axis in range(1, depth + 1) if layout.ragged[axis]]
    declared = _check_declared(key, depth, options)
    try:
        if not ragged:
            array = np.array(column, dtype=dtype)
            return {key: array, **_companion(key, array, options)}
        array, mask = _padded(key, column, options, dtype, shape, max(ragged[-1], declared))
    except (OverflowError, TypeError, ValueError) as exc:
        raise ValueError(f"key {key!r}: cannot stack as {dtype}: {exc}") from exc
    return {key: array, **_companion(key, array, options, column, mask)}


def _padded(key: str, column: ItemColumn, options: StackOptions, dtype: np.dtype, shape: Tuple[int, ...],
            last: int) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """The ragged ``column`` in an array of the batch's longest ``shape``, padded, and its mask (``pad_info="mask"``:
    true on real values, up to the ``last`` ragged axis)."""
    array = np.full(shape, options.pad_values.get(key, options.pad_value), dtype=dtype)
    mask = np.zeros(shape[: last + 1], dtype=bool) if options.pad_info == "mask" else None
    for i, item in enumerate(column):
        _fill(item, array[i], None if mask is None else mask[i], 1, last)
    return array, mask


def _check_declared(key: str, depth: int, options: StackOptions) -> int:
    """The number of ragged axes declared for ``key`` (0: none); items must have that many axes."""
    declared = options.ragged_keys.get(key, 0)
    if declared > depth:
        raise ValueError(f"key {key!r}: ragged_keys declares {declared} ragged axes but its items have {depth}")
    return declared


def _companion(
    key: str,
    array: np.ndarray,
    options: StackOptions,
    padded_column: Optional[ItemColumn] = None,
    mask: Optional[np.ndarray] = None,
) -> Dict[str, np.ndarray]:
    """The ``<key>_mask``/``<key>_lengths`` entry.

    ``padded_column`` is the column when this batch had to be padded (``mask``
    is then the mask built while padding); a rectangular batch gets a companion
    only when ``key`` is in ``ragged_keys``.
    """
    if options.pad_info is None or (padded_column is None and key not in options.ragged_keys):
        return {}
    if options.pad_info == "lengths":
        if padded_column is None:
            lengths = np.full(array.shape[0], array.shape[1], dtype=np.int64)
        else:
            lengths = np.fromiter((len(item) for item in padded_column), dtype=np.int64, count=len(padded_column))
        return {f"{key}_lengths": lengths}
    if mask is None:
        mask = np.ones(array.shape[: options.ragged_keys[key] + 1], dtype=bool)
    return {f"{key}_mask": mask}


def _holds_strings(column: ItemColumn) -> bool:
    """Whether the first non-empty leaf of ``column`` is a string."""
    for item in column:
        while isinstance(item, (list, tuple)) and item:
            item = item[0]
        if isinstance(item, (list, tuple)):
            continue
        if isinstance(item, np.ndarray):
            return item.dtype.kind in "US"
        return isinstance(item, _STRING)
    return False


def _fill(node: ItemColumn, out: np.ndarray, mask: Optional[np.ndarray], axis: int, last: int) -> None:
    """Copy one item (``node``, whose first axis is ``axis``) into the top corner of ``out``."""
    if isinstance(node, np.ndarray) and node.dtype.kind != "O":
        _fill_array(node, out, mask, axis, last)
        return
    if isinstance(node, np.ndarray):
        node = node.tolist()
    n = len(node)
    if axis == last or n == 0:
        if n:
            out[:n] = node  # below the last ragged axis the item is rectangular
        if mask is not None:
            mask[:n] = True
        return
    for j, child in enumerate(node):
        _fill(child, out[j], None if mask is None else mask[j], axis + 1, last)


def _fill_array(node: np.ndarray, out: np.ndarray, mask: Optional[np.ndarray], axis: int, last: int) -> None:
    """``_fill`` for an item that is a (non-object) array: one copy, its ragged axes masked at once."""
    region = tuple(slice(0, n) for n in node.shape)
    out[region] = node
    if mask is not None:
        mask[region[: last - axis + 1]] = True


class _Layout:
    """What one walk over a column found: per-axis longest length, raggedness, depth, leaf types."""

    __slots__ = ("key", "lens", "ragged", "depth", "py_types", "np_dtypes")

    def __init__(self, key: str) -> None:
        self.key = key
        self.lens: List[int] = []  # longest length seen on each axis; axis 0 is the batch
        self.ragged: List[bool] = []
        self.depth: Optional[int] = None  # index of the last axis
        self.py_types: Set[type] = set()
        self.np_dtypes: Set[np.dtype] = set()

    def walk(self, node: ItemColumn, axis: int) -> None:
        if isinstance(node, np.ndarray) and node.dtype.kind != "O":
            self._see_array(node, axis)
            return
        if isinstance(node, np.ndarray):
            node = node.tolist()
        self._see_len(axis, len(node))
        types = set(map(type, node))
        if not types:
            return  # an empty sequence says nothing about the axes below it
        if type(None) in types:
            raise ValueError(f"key {self.key!r} holds None at nesting level {axis + 1}")
        nested = [issubclass(t, _SEQUENCE) for t in types]
        if all(nested):
            for child in node:
                self.walk(child, axis + 1)
        elif not any(nested):
            self._see_depth(axis)
            self._see_scalars(types)
        else:
            raise ValueError(f"key {self.key!r} mixes sequences and scalars at nesting level {axis + 1}")

    def dtype(self, options: StackOptions) -> np.dtype:
        """The dtype the stacked column gets (see ``stack_column``)."""
        for dt in self.np_dtypes:
            if dt.kind not in _NUMERIC_KINDS:
                raise ValueError(f"key {self.key!r} holds {dt} values, which cannot be collated")
        bases = {next(b for b in _PY_BASES if issubclass(t, b)) for t in self.py_types}
        if self.np_dtypes:
            return np.result_type(*self.np_dtypes, *(_WEAK[b] for b in bases))
        return _python_dtype(bases, options)

    def _see_array(self, node: np.ndarray, axis: int) -> None:
        for offset, n in enumerate(node.shape):
            self._see_len(axis + offset, n)
        self._see_depth(axis + node.ndim - 1)
        self.np_dtypes.add(node.dtype)

    def _see_len(self, axis: int, n: int) -> None:
        if axis == len(self.lens):
            self.lens.append(n)
            self.ragged.append(False)
        elif n != self.lens[axis]:
            self.ragged[axis] = True
            self.lens[axis] = max(n, self.lens[axis])

    def _see_depth(self, depth: int) -> None:
        if self.depth is None:
            self.depth = depth
        elif depth != self.depth:
            raise ValueError(f"key {self.key!r}: items are nested to different depths ({self.depth} and {depth})")

    def _see_scalars(self, types: Set[type]) -> None:
        for t in types:
            if issubclass(t, _STRING):
                raise ValueError(f"key {self.key!r} mixes strings with numbers")
            if issubclass(t, np.generic):
                self.np_dtypes.add(np.dtype(t))
            elif issubclass(t, _PY_BASES):
                self.py_types.add(t)
            else:
                raise ValueError(f"key {self.key!r} holds {t.__name__} values, which cannot be collated")


def _python_dtype(bases: AbstractSet[type], options: StackOptions) -> np.dtype:
    """The dtype of a column of Python scalars of these kinds (``bool``, ``int``, ``float``, ``complex``)."""
    if complex in bases:
        return np.result_type(options.float_dtype, 0j)
    if float in bases or not bases:
        return options.float_dtype
    return options.int_dtype if int in bases else np.dtype(bool)
