"""``TorchCollator``: CPU ``torch.Tensor`` values sharing memory with the stacked arrays."""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ._base import ArrayCollator

__all__ = ["TorchCollator"]


class TorchCollator(ArrayCollator):
    """Collates into ``torch.Tensor`` values made by ``torch.from_numpy`` (no copy).

    Takes the keyword options of ``ArrayCollator``. String columns stay Python
    lists. torch is imported on the first batch, not when this module loads.
    An array torch cannot view as it is (negative strides, non-native byte
    order) is copied first. A read-only input array gives a tensor that must not
    be written to (torch warns about it once).

    ``pin_memory=True`` pins every tensor (a copy into page-locked memory) so
    that ``.to("cuda", non_blocking=True)`` can overlap; without CUDA it warns
    once and leaves the tensors unpinned.
    """

    def __init__(self, *, pin_memory: bool = False, **options: Any) -> None:
        super().__init__(**options)
        self.pin_memory = bool(pin_memory)
        self._can_pin: bool | None = None

    def convert_array(self, key: str, array: np.ndarray) -> Any:
        import torch

        if not array.dtype.isnative or any(stride < 0 for stride in array.strides):
            array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
        try:
            tensor = torch.from_numpy(array)
        except TypeError as exc:
            raise ValueError(f"key {key!r}: torch cannot hold {array.dtype} values: {exc}") from exc
        if self.pin_memory and self._pinnable():
            tensor = tensor.pin_memory()
        return tensor

    def _pinnable(self) -> bool:
        if self._can_pin is None:
            import torch

            self._can_pin = torch.cuda.is_available()
            if not self._can_pin:
                warnings.warn("TorchCollator(pin_memory=True): no CUDA device, tensors are left unpinned", stacklevel=5)
        return self._can_pin
