"""``TorchCollator``: CPU ``torch.Tensor`` values sharing memory with the stacked arrays."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

from ._base import ArrayCollator, row_wise

__all__ = ["TorchCollator"]


class TorchCollator(ArrayCollator):
    """Collates into ``torch.Tensor`` values made by ``torch.from_numpy`` (no copy).

    Takes the keyword options of ``ArrayCollator``. String columns stay Python
    lists. torch is imported on the first batch, not when this module loads.
    An array torch cannot view as it is (negative strides, non-native byte
    order) is copied first. A read-only input array gives a tensor that must not
    be written to (torch warns about it once).
    Pinning is the loader's job: ``DataLoader(device=Device(pin_memory=True))``.

    Example:
        ```python
        batch = TorchCollator(pad_info="lengths").collate_batch({"ids": [[1, 2, 3], [4]], "y": [0, 1]})
        assert batch["ids"].tolist() == [[1, 2, 3], [4, 0, 0]]             # torch.int64 tensors
        assert batch["ids_lengths"].tolist() == [3, 1] and batch["y"].tolist() == [0, 1]
        ```
    """

    thread_safe = True  # holds no per-call state on self
    worker_imports = ("torch",)  # imported before worker processes start, not once in each
    releases_gil = True  # NumPy/pyarrow work: num_workers="auto" keeps it in this process

    @row_wise
    def convert_array(self, key: str, array: np.ndarray) -> "torch.Tensor":
        import torch

        array = _viewable(array)
        try:
            tensor = torch.from_numpy(array)
        except TypeError as exc:
            raise ValueError(f"key {key!r}: torch cannot hold {array.dtype} values: {exc}") from exc
        return tensor


def _viewable(array: np.ndarray) -> np.ndarray:
    """``array`` as torch can view it: copied only where its byte order is not native or a stride is negative."""
    if not array.dtype.isnative or min(array.strides, default=0) < 0:
        return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
    return array
