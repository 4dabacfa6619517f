"""The base class of the built-in collators: NumPy stacking plus one conversion hook."""
from __future__ import annotations

import abc
from typing import Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np
import numpy.typing as npt

from .._abc import DataCollator
from ._image import Images
from ._stack import ItemColumn, StackOptions, stack_batch

__all__ = ["ArrayCollator"]

Convert = TypeVar("Convert", bound=Callable[..., object])
Collated = Dict[str, object]  # a collated batch: arrays, tensors, or what convert_* return


def row_wise(convert_array: Convert) -> Convert:
    """Marks a ``convert_array`` that treats an array's first axis like the others: converting a
    stack of batches and splitting the result gives what converting each batch gives, so
    ``collate_stacked`` may convert a group of batches at once."""
    convert_array.row_wise = True  # type: ignore[attr-defined]
    return convert_array


class ArrayCollator(DataCollator):
    """Stacks an encoded batch into arrays of shape ``[batch, ...]``, then converts each one.

    ``collate_batch(features)`` takes a dict of columns, each a list with one
    item per sample or a NumPy array whose first axis is the sample axis:

    * Python bools become ``bool``, ints ``int_dtype``, floats ``float_dtype``;
      NumPy arrays and scalars keep their dtype. Scalars give shape ``[batch]``;
      a batch of one keeps its batch axis.
    * A column that already is a numeric NumPy array is not copied.
    * Items of different lengths (along any axis, e.g. ``[T]`` or ``[T][L]``)
      are padded to the longest in the batch with ``pad_values.get(key,
      pad_value)``, and a companion is added after the key: ``<key>_mask``
      (bool, True on real values, the padded shape up to its last ragged axis;
      ``[batch, max_len]`` for one ragged axis) when ``pad_info="mask"``,
      ``<key>_lengths`` (int64 ``[batch]``, each item's length along its first
      axis) when ``pad_info="lengths"``, nothing when ``pad_info=None``.
    * The companion appears only in batches that needed padding, unless the key
      is in ``ragged_keys`` (a list of keys, or ``{key: number of leading ragged
      axes}``): those always get it, so a batch of one or a batch of equal
      lengths has the same keys as any other.
    * String columns (``str``/``bytes`` items, lists of them, string arrays) are
      handed to ``convert_strings``, which by default returns them unchanged.
    * Only the keys in ``keys`` (default: all) are collated; the others, and
      every key in ``passthrough``, are returned untouched.
    * ``ValueError`` names the key at fault: a ``None`` item, mixed nesting,
      strings among numbers, columns of different lengths, a companion name
      that is already a key.

    * ``images`` (``Images``): image columns cropped, flipped, scaled to ``[0, 1]``,
      normalized and made channels-first floats before the batch is stacked.

    Subclasses say only how to turn a NumPy array into their tensor type.
    """

    def __init__(
        self,
        *,
        float_dtype: npt.DTypeLike = np.float32,
        int_dtype: npt.DTypeLike = np.int64,
        pad_value: object = 0,
        pad_values: Optional[Mapping[str, object]] = None,
        pad_info: Optional[str] = "mask",
        keys: Optional[Iterable[str]] = None,
        passthrough: Iterable[str] = (),
        ragged_keys: Union[Mapping[str, int], Iterable[str]] = (),
        images: Optional[Images] = None,
    ) -> None:
        if not isinstance(images, (Images, type(None))):
            raise ValueError(f"images must be a pyloader.collators.Images, got {type(images).__name__}")
        self.images = images
        self.options = StackOptions.create(
            float_dtype=float_dtype,
            int_dtype=int_dtype,
            pad_value=pad_value,
            pad_values=pad_values,
            pad_info=pad_info,
            keys=keys,
            passthrough=passthrough,
            ragged_keys=ragged_keys,
        )

    #: With worker processes, run ``convert`` in the loader's process rather than
    #: in a worker (set by collators whose tensors must not be made after a fork).
    converts_in_main = False

    def collate_batch(self, features: Dict[str, Sequence]) -> Collated:
        """Collate ``features`` as the class docstring says."""
        return stack_batch(self._prepared(features), self.options, self.convert_array, self.convert_strings)

    def _prepared(self, features: Mapping[str, Sequence]) -> Mapping[str, ItemColumn]:
        """``features`` with the image columns made float arrays (``images``)."""
        return features if self.images is None else self.images.apply(features, self.options.float_dtype)

    def collate_stacked(self, columns: Mapping[str, np.ndarray]) -> Optional[Collated]:
        """``collate_batch`` on K batches at once: ``columns`` holds each field of the K batches
        stacked along a new first axis, and so does the result. ``None`` where that could differ
        from collating each batch: a subclass changing ``collate_batch`` or a ``convert_array``
        not marked ``row_wise``, ``ragged_keys`` (companions take their shape from the leading
        axes), or a column that is not a numeric NumPy array."""
        if not self._collates_rows_alike() or not all(_stackable(column) for column in columns.values()):
            return None
        return stack_batch(columns, self.options, self.convert_array, self.convert_strings)

    def _collates_rows_alike(self) -> bool:
        """Whether collating K stacked batches gives what collating each does: ``collate_batch`` and a
        ``row_wise`` ``convert_array`` as they are, no ``ragged_keys`` nor ``images``."""
        cls = type(self)
        return (cls.collate_batch is ArrayCollator.collate_batch and getattr(cls.convert_array, "row_wise", False)
                and not self.options.ragged_keys and self.images is None)

    def stack(self, features: Dict[str, Sequence]) -> Tuple[Collated, Dict[str, str]]:
        """The NumPy half of ``collate_batch``: the stacked batch, and which of its
        entries still need ``convert_array`` or ``convert_strings``."""
        pending: Dict[str, str] = {}

        def keep(kind: str) -> Callable[[str, object], object]:
            def record(key: str, value: object) -> object:
                pending[key] = kind
                return value
            return record

        return stack_batch(self._prepared(features), self.options, keep("array"), keep("strings")), pending

    def convert(self, stacked: Tuple[Collated, Dict[str, str]]) -> Collated:
        """The framework half of ``collate_batch``: ``convert(stack(f)) == collate_batch(f)``."""
        batch, pending = stacked
        convert: Dict[str, Callable[..., object]] = {"array": self.convert_array, "strings": self.convert_strings}
        out = dict(batch)
        for key, kind in pending.items():
            out[key] = convert[kind](key, batch[key])
        return out

    @abc.abstractmethod
    def convert_array(self, key: str, array: np.ndarray) -> object:
        """Turn the stacked ``array`` of ``key`` (or of a companion) into the output type."""

    def convert_strings(self, key: str, values: ItemColumn) -> object:
        """Turn the string column ``key`` into the output type; the default returns it unchanged."""
        return values


def _stackable(column: object) -> bool:
    """A numeric NumPy array with a leading step axis."""
    return isinstance(column, np.ndarray) and column.ndim >= 2 and column.dtype.kind not in "OUS"
