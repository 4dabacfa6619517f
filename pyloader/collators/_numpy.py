"""``NumpyCollator``: the stacked NumPy arrays themselves."""
from __future__ import annotations

import numpy as np

from ._base import ArrayCollator, row_wise

__all__ = ["NumpyCollator"]


class NumpyCollator(ArrayCollator):
    """Collates into ``np.ndarray`` values; string columns stay Python lists (or string arrays).

    Takes the keyword options of ``ArrayCollator``.

    Example:
        ```python
        batch = NumpyCollator().collate_batch({"ids": [[1, 2, 3], [4]], "y": [0, 1]})
        assert batch["ids"].tolist() == [[1, 2, 3], [4, 0, 0]]             # padded with 0
        assert batch["ids_mask"].tolist() == [[True, True, True], [True, False, False]]
        assert batch["y"].tolist() == [0, 1] and list(batch) == ["ids", "ids_mask", "y"]
        ```
    """

    thread_safe = True  # holds no per-call state on self
    releases_gil = True  # NumPy/pyarrow work: num_workers="auto" keeps it in this process

    @row_wise
    def convert_array(self, key: str, array: np.ndarray) -> np.ndarray:
        return array
