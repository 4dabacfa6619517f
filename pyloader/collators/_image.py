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

from .._columns import Column
from .._rng import rng

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
        if isinstance(keys, (str, bytes)):
            raise ValueError(f"keys must be a collection of keys, not the string {keys!r}")
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
        shapes = {item.shape for item in items}
        if len(shapes) > 1:
            raise ValueError(f"image key {key!r}: the images differ in size ({sorted(shapes)[:3]}...): give Images "
                             f"a size= to crop them to")
        if not items:
            raise ValueError(f"image key {key!r}: the batch holds no image")
        dtype = np.result_type(*items)  # what stacking them would hold: its maximum scales integers
        if dtype.kind not in "biuf":
            raise ValueError(f"image key {key!r}: images must hold numbers, got {dtype}")
        array = self._placed(items, float_dtype)
        if dtype.kind in "iu":
            array /= float_dtype.type(np.iinfo(dtype).max)
        return self._normalized(key, array, 1 if self.channels_first else 3)

    def _placed(self, items: List[np.ndarray], float_dtype: np.dtype) -> np.ndarray:
        """The items as one new ``float_dtype`` array in the output layout, each cast as it is copied in
        (one pass over the batch: no stacked copy, no transposed copy)."""
        items = [item if item.ndim == 3 else item[..., None] for item in items]
        height, width, channels = items[0].shape
        shape = (len(items), channels, height, width) if self.channels_first else (len(items), height, width, channels)
        out = np.empty(shape, dtype=float_dtype)
        for k, item in enumerate(items):
            out[k] = item.transpose(2, 0, 1) if self.channels_first else item
        return out

    def _item(self, key: str, image: np.ndarray) -> np.ndarray:
        if image.ndim not in (2, 3):
            raise ValueError(f"image key {key!r}: an image must be [H, W] or [H, W, C], got shape {image.shape}")
        if self.size is not None:
            image = self._cropped(key, image)
        if self.flip and rng().random() < 0.5:
            image = image[:, ::-1]
        return image

    def _cropped(self, key: str, image: np.ndarray) -> np.ndarray:
        assert self.size is not None, "only called with a size"
        (h, w), (height, width) = self.size, image.shape[:2]
        if height < h or width < w:
            raise ValueError(f"image key {key!r}: an image of {height}x{width} is smaller than size {h}x{w}")
        if self.crop == "random":
            top, left = (int(v) for v in rng().integers(0, [height - h + 1, width - w + 1]))
        else:
            top, left = (height - h) // 2, (width - w) // 2
        return image[top:top + h, left:left + w]

    def _normalized(self, key: str, array: np.ndarray, channel: int) -> np.ndarray:
        """``array`` normalized in place per channel (its axis ``channel``)."""
        channels = array.shape[channel]
        for name, values in (("mean", self.mean), ("std", self.std)):
            if values is not None and values.size not in (1, channels):
                raise ValueError(f"image key {key!r}: {name} has {values.size} values for {channels} channels")
        along = (-1,) + (1,) * (array.ndim - 1 - channel)  # broadcast along the channel axis
        if self.mean is not None:
            array -= self.mean.astype(array.dtype).reshape(along)
        if self.std is not None:
            array /= self.std.astype(array.dtype).reshape(along)
        return array


def _check_geometry(size: Optional[Tuple[int, int]], crop: str) -> None:
    if size is not None and (len(size) != 2 or not all(isinstance(v, int) and v >= 1 for v in size)):
        raise ValueError(f"size must be (height, width), two integers >= 1, got {size!r}")
    if crop not in CROPS:
        raise ValueError(f"crop must be one of {CROPS}, got {crop!r}")
