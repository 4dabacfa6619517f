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
        NumpyCollator().collate_batch({"ids": [[1, 2, 3], [4]], "y": [0, 1]})
        # {'ids': array([[1, 2, 3], [4, 0, 0]]), 'ids_mask': array([[True, True, True], [True, False, False]]),
        #  'y': array([0, 1])}
        ```
    """

    thread_safe = True  # holds no per-call state on self
    releases_gil = True  # NumPy/pyarrow work: num_workers="auto" keeps it in this process

    @row_wise
    def convert_array(self, key: str, array: np.ndarray) -> np.ndarray:
        return array
