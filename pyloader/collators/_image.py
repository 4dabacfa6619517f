"""``Images``: image columns made model-ready inside a built-in collator (crop, flip, scale, normalize, CHW).

Contracts: each item of an image column is an array ``[H, W, C]`` or ``[H, W]`` (what
``pyloader.readers.decode_image`` gives). Items are cropped to ``size`` (at a random place drawn from
``pyloader.rng()``, or centred), flipped left-right with probability one half (drawn from
``pyloader.rng()``) with ``flip``, stacked, scaled to ``[0, 1]`` (integers by their dtype's maximum,
floats kept), normalized per channel with ``mean``/``std`` and, with ``channels_first``, made
``[B, C, H, W]`` (``[B, 1, H, W]`` for one channel). Items of different sizes with no ``size``, an
image smaller than ``size`` and a ``mean``/``std`` of the wrong length raise ``ValueError`` naming
the key. Random crops and flips need a loader run (``pyloader.rng()``); a centred crop does not.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .._checks import one_of
from .._columns import Column
from .._rng import rng
from ._stack import check_not_string

__all__ = ["Images"]

CROPS = ("random", "center")


class Images:
    """What a built-in collator does to the image columns ``keys`` before stacking the batch
    (``TorchCollator(images=Images(["jpg"], size=(224, 224), flip=True, mean=..., std=...))``).

    Example:
        ```python
        collator = TorchCollator(images=Images(["jpg"], size=(32, 32), flip=True,
                                               mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]))
        for batch in DataLoader(TarReader(batch_size=16, keep=["jpg"]), IdentityDataset(), collator, "shards/"):
            assert batch["jpg"].shape == (16, 3, 32, 32)    # float32, randomly cropped and flipped
        ```
    """

    def __init__(self, keys: Iterable[str], size: Optional[Tuple[int, int]] = None, crop: str = "random",
                 flip: bool = False, mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None,
                 channels_first: bool = True) -> None:
        check_not_string("keys", keys)
        self.keys = list(keys)
        _check_geometry(size, crop)
        self.size, self.crop, self.flip = size, crop, bool(flip)
        self.mean = None if mean is None else np.asarray(mean, dtype=np.float64)
        self.std = None if std is None else np.asarray(std, dtype=np.float64)
        if self.std is not None and np.any(self.std == 0):
            raise ValueError(f"std must not hold 0, got {std!r}")
        self.channels_first = bool(channels_first)

    def apply(self, features: Mapping[str, Column], float_dtype: np.dtype) -> Dict[str, Column]:
        """``features`` with each image column a float array ``[B, C, H, W]`` (or ``[B, H, W, C]``)."""
        out = dict(features)
        for key in self.keys:
            if key not in features:
                raise ValueError(f"image key {key!r} is not in the batch (keys: {sorted(features)})")
            out[key] = self._column(key, features[key], float_dtype)
        return out

    def _column(self, key: str, column: Column, float_dtype: np.dtype) -> np.ndarray:
        items = [self._item(key, np.asarray(item)) for item in column]
        dtype = _stacked_dtype(key, items)
        array = self._placed(items, float_dtype)
        if dtype.kind in "iu":
            array /= float_dtype.type(np.iinfo(dtype).max)
        self._normalize(key, array)
        return array

    def _placed(self, items: List[np.ndarray], float_dtype: np.dtype) -> np.ndarray:
        """The items as one new ``float_dtype`` array in the output layout, each cast as it is copied in
        (one pass over the batch: no stacked copy, no transposed copy)."""
        height, width, channels = np.atleast_3d(items[0]).shape
        if self.channels_first:
            out = np.empty((len(items), channels, height, width), dtype=float_dtype)
            channels_last = out.transpose(0, 2, 3, 1)
        else:
            out = channels_last = np.empty((len(items), height, width, channels), dtype=float_dtype)
        for k, item in enumerate(items):
            channels_last[k] = np.atleast_3d(item)
        return out

    def _item(self, key: str, image: np.ndarray) -> np.ndarray:
        if image.ndim not in (2, 3):
            raise ValueError(f"image key {key!r}: an image must be [H, W] or [H, W, C], got shape {image.shape}")
        image = self._cropped(key, image)
        if self.flip and rng().random() < 0.5:
            image = image[:, ::-1]
        return image

    def _cropped(self, key: str, image: np.ndarray) -> np.ndarray:
        """``image`` cut to ``size`` (at a random place, or centred); as it is without a ``size``."""
        if self.size is None:
            return image
        (h, w), (height, width) = self.size, image.shape[:2]
        if height < h or width < w:
            raise ValueError(f"image key {key!r}: an image of {height}x{width} is smaller than size {h}x{w}")
        if self.crop == "random":
            top, left = rng().integers(0, [height - h + 1, width - w + 1]).tolist()
        else:
            top, left = (height - h) // 2, (width - w) // 2
        return image[top:top + h, left:left + w]

    def _normalize(self, key: str, out: np.ndarray) -> None:
        """Normalize ``out`` (the batch in its output layout, C-contiguous) in place per channel with ``mean``
        and ``std``."""
        channels = out.shape[1 if self.channels_first else 3]
        # as [B, C, H*W] with a value per channel, or [B*H, W*C] with the values repeated along the last axis:
        # NumPy's inner loop then runs along a long axis (over [..., C] it runs C long: ten times slower)
        grid = out.reshape(len(out), channels, -1) if self.channels_first else out.reshape(-1, out.shape[2] * channels)
        for name, values, operation in (("mean", self.mean, np.subtract), ("std", self.std, np.divide)):
            if values is None:
                continue
            if values.size not in (1, channels):
                raise ValueError(f"image key {key!r}: {name} has {values.size} values for {channels} channels")
            along = np.resize(values.astype(out.dtype), channels)
            operation(grid, along[:, None] if self.channels_first else np.tile(along, out.shape[2]), out=grid)


def _stacked_dtype(key: str, items: List[np.ndarray]) -> np.dtype:
    """The dtype stacking ``items`` would give (its maximum scales integers); ``ValueError`` unless they are
    images of numbers, all of one size."""
    shapes = {item.shape for item in items}
    if len(shapes) > 1:
        raise ValueError(f"image key {key!r}: the images differ in size ({sorted(shapes)[:3]}...): give Images "
                         f"a size= to crop them to")
    if not items:
        raise ValueError(f"image key {key!r}: the batch holds no image")
    dtype = np.result_type(*items)
    if dtype.kind not in "biuf":
        raise ValueError(f"image key {key!r}: images must hold numbers, got {dtype}")
    return dtype


def _check_geometry(size: Optional[Tuple[int, int]], crop: str) -> None:
    if size is not None and (len(size) != 2 or not all(isinstance(v, int) and v >= 1 for v in size)):
        raise ValueError(f"size must be (height, width), two integers >= 1, got {size!r}")
    one_of(CROPS)("crop", crop)
