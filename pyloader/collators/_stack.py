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
    TypeGuard,
    Union,
)

import numpy as np
import numpy.typing as npt

from .._checks import positive

__all__ = ["PAD_INFO", "StackOptions", "check_not_string", "stack_batch", "stack_column"]

PAD_INFO = ("mask", "lengths", None)
_SEQUENCE = (list, tuple, np.ndarray)
_STRING = (str, bytes)
_NUMERIC_KINDS = "biufc"
_PY_BASES = (bool, int, float, complex)  # narrowest first (bool: it is also an int)
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
        float_dt = _checked_dtype("float_dtype", float_dtype, "f", "a floating")
        int_dt = _checked_dtype("int_dtype", int_dtype, "iu", "an integer")
        if pad_info not in PAD_INFO:
            raise ValueError(f"pad_info must be one of {PAD_INFO}, got {pad_info!r}")
        for name, value in (("keys", keys), ("passthrough", passthrough), ("ragged_keys", ragged_keys)):
            check_not_string(name, value)
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


def _checked_dtype(name: str, value: npt.DTypeLike, kinds: str, what: str) -> np.dtype:
    """``value`` as a dtype; ``ValueError`` unless its kind is one of ``kinds`` (``what``: their name)."""
    dtype = np.dtype(value)
    if dtype.kind not in kinds:
        raise ValueError(f"{name} must be {what} dtype, got {dtype}")
    return dtype


def _ragged_axes(ragged_keys: Union[Mapping[str, int], Iterable[str]]) -> Dict[str, int]:
    """``ragged_keys`` as ``{key: ragged axes}`` (a key alone: one axis); ``ValueError`` names a bad count."""
    ragged = dict(ragged_keys) if isinstance(ragged_keys, abc.Mapping) else dict.fromkeys(ragged_keys, 1)
    for key, n_axes in ragged.items():
        positive(f"ragged_keys[{key!r}]", n_axes)
    return ragged


def check_not_string(name: str, keys: object) -> None:
    """``ValueError`` where ``keys``, a collection of keys, is a string (its characters would pass for keys)."""
    if isinstance(keys, (str, bytes)):
        raise ValueError(f"{name} must be a collection of keys, not the string {keys!r}")


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
        array = column if _as_it_is(column, key, options) else None
        stacked = None if array is not None else stack_column(key, column, options)  # rejects what has no length
        if first_key is None:
            first_key = key
        elif len(column) != len(features[first_key]):
            raise ValueError(
                f"key {key!r} has {len(column)} items but key {first_key!r} has {len(features[first_key])}"
            )
        if array is not None:
            out[key] = convert_array(key, array)
        elif stacked is None:
            out[key] = convert_strings(key, column)
        else:
            out.update(_converted(key, stacked, features, convert_array))
    return out


def _as_it_is(column: ItemColumn, key: str, options: StackOptions) -> TypeGuard[np.ndarray]:
    """Whether ``stack_column`` would return ``column`` itself and no companion, known without its
    walk: the common column, an array of a dtype that is neither objects nor strings, with no
    ragged axes declared."""
    return isinstance(column, np.ndarray) and column.ndim > 0 and column.dtype.kind not in "OUS" \
        and key not in options.ragged_keys


def _converted(key: str, stacked: Dict[str, np.ndarray], features: Mapping[str, ItemColumn],
               convert_array: ArrayConverter) -> Dict[str, object]:
    """``stacked`` (the array of ``key``, then its companion) through ``convert_array``; ``ValueError`` where
    the companion's name is already a key of the batch."""
    out: Dict[str, object] = {}
    for name, array in stacked.items():
        if name != key and name in features:
            raise ValueError(f"key {key!r}: its companion {name!r} clashes with a key already in the batch")
        out[name] = convert_array(name, array)
    return out


def _check_keys(features: Mapping[str, ItemColumn], options: StackOptions) -> None:
    """``ValueError`` unless ``features`` is a dict of columns holding every key ``options`` asks for."""
    if type(features) is not dict and not isinstance(features, abc.Mapping):  # the ABC's check costs more
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
    if isinstance(column, np.ndarray) and column.ndim == 0:
        raise ValueError(f"key {key!r} holds a 0-d array, expected one item per sample")
    column = _items(column)
    if isinstance(column, np.ndarray):
        return _stacked_array(key, column, options)
    _check_items(key, column)
    if _holds_strings(column):
        return None
    layout = _Layout(key)
    layout.walk(column, 0)
    return _stack_walked(key, column, layout, options)


def _check_items(key: str, column: ItemColumn) -> None:
    """``ValueError`` unless ``column`` is a list (or another sequence) of items, none of them ``None``."""
    if isinstance(column, _STRING) or not isinstance(column, abc.Sequence):
        raise ValueError(f"key {key!r} holds {type(column).__name__}, expected a list or an array")
    if type(None) in set(map(type, column)):
        raise ValueError(f"key {key!r} holds None; every sample needs a value")


def _items(node: ItemColumn) -> ItemColumn:
    """``node``, or the list of its items when it is an object array (its items are Python objects)."""
    return node.tolist() if isinstance(node, np.ndarray) and node.dtype.kind == "O" else node


def _stacked_array(key: str, column: np.ndarray, options: StackOptions) -> Optional[Dict[str, np.ndarray]]:
    """``stack_column`` for a column that is an array of one dtype: strings pass (``None``), others as they are."""
    if column.dtype.kind in "US":
        return None
    return _rectangular(key, column, _check_declared(key, column.ndim - 1, options), options)


def _stack_walked(key: str, column: ItemColumn, layout: "_Layout", options: StackOptions) -> Dict[str, np.ndarray]:
    """``stack_column`` for a column of numbers, once ``layout`` has walked it: padded where it is ragged."""
    dtype = layout.dtype(options)
    depth = layout.last_axis()
    ragged = layout.last_ragged(depth)
    declared = _check_declared(key, depth, options)
    try:
        if not ragged:
            return _rectangular(key, np.array(column, dtype=dtype), declared, options)
        array, mask = _padded(key, column, options, dtype, tuple(layout.lens[: depth + 1]), max(ragged, declared))
    except (OverflowError, TypeError, ValueError) as exc:
        raise ValueError(f"key {key!r}: cannot stack as {dtype}: {exc}") from exc
    return {key: array, **_companion(key, options, column, mask)}


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


def _rectangular(key: str, array: np.ndarray, declared: int, options: StackOptions) -> Dict[str, np.ndarray]:
    """``{key: array}`` for a batch that needed no padding; a key with ``declared`` ragged axes (in
    ``ragged_keys``) also gets its companion: a mask all true, every item's full length."""
    if not declared:
        return {key: array}
    mask = np.ones(array.shape[: declared + 1], dtype=bool) if options.pad_info == "mask" else None
    return {key: array, **_companion(key, options, array, mask)}


def _companion(key: str, options: StackOptions, items: ItemColumn,
               mask: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
    """The ``<key>_mask``/``<key>_lengths`` entry that ``pad_info`` asks for: ``mask`` itself, or the
    length of each of ``items`` along its first axis."""
    if options.pad_info == "lengths":
        return {f"{key}_lengths": np.fromiter((len(item) for item in items), dtype=np.int64, count=len(items))}
    return {} if mask is None else {f"{key}_mask": mask}


def _holds_strings(column: ItemColumn) -> bool:
    """Whether the first non-empty leaf of ``column`` is a string."""
    for item in column:
        leaf = _first_leaf(item)
        if isinstance(leaf, np.ndarray):
            return leaf.dtype.kind in "US"
        if not isinstance(leaf, (list, tuple)):  # an empty sequence: look at the next item
            return isinstance(leaf, _STRING)
    return False


def _first_leaf(item: object) -> object:
    """``item``'s first element, that element's first element, and so on down to one that is not a list or a tuple,
    or is an empty one."""
    while isinstance(item, (list, tuple)) and item:
        item = item[0]
    return item


def _fill(node: ItemColumn, out: np.ndarray, mask: Optional[np.ndarray], axis: int, last: int) -> None:
    """Copy one item (``node``, whose first axis is ``axis``) into the top corner of ``out``, marking it in ``mask``
    (if any)."""
    node = _items(node)
    if isinstance(node, np.ndarray):
        _fill_array(node, out, mask, axis, last)
    elif axis < last:
        for j, child in enumerate(node):
            _fill(child, out[j], None if mask is None else mask[j], axis + 1, last)
    elif node:
        out[: len(node)] = node  # below the last ragged axis the item is rectangular
        if mask is not None:
            mask[: len(node)] = True


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
        node = _items(node)
        if isinstance(node, np.ndarray):
            self._see_array(node, axis)
            return
        self._see_len(axis, len(node))
        types = set(map(type, node))
        if type(None) in types:
            raise ValueError(f"key {self.key!r} holds None at nesting level {axis + 1}")
        nested = [issubclass(t, _SEQUENCE) for t in types]
        if all(nested):  # an empty sequence too: it says nothing about the axes below it
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
        bases = {_python_base(t) for t in self.py_types}
        if self.np_dtypes:
            return np.result_type(*self.np_dtypes, *(_WEAK[b] for b in bases))
        return _python_dtype(bases, options)

    def last_axis(self) -> int:
        """The items' last axis: where their scalars are (items all empty: the deepest axis seen)."""
        return self.depth if self.depth is not None else len(self.lens) - 1

    def last_ragged(self, depth: int) -> int:
        """The last of the item axes ``1..depth`` along which the items differ in length (0: none)."""
        return max((axis for axis in range(1, depth + 1) if self.ragged[axis]), default=0)

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


def _python_base(scalar_type: type) -> type:
    """Which of ``bool``, ``int``, ``float`` and ``complex`` the Python scalar type is (``bool`` first: it is also
    an ``int``)."""
    return next(base for base in _PY_BASES if issubclass(scalar_type, base))


def _python_dtype(bases: AbstractSet[type], options: StackOptions) -> np.dtype:
    """The dtype of a column of Python scalars of these kinds (``bool``, ``int``, ``float``, ``complex``):
    the widest kind's (none, a column of empty sequences: ``float_dtype``)."""
    widest = max(bases, key=_PY_BASES.index, default=float)
    if widest is complex:
        return np.result_type(options.float_dtype, 0j)
    return {bool: np.dtype(bool), int: options.int_dtype, float: options.float_dtype}[widest]
