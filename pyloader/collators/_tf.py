"""``TFCollator``: ``tf.Tensor`` values, strings included."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import tensorflow

from ._base import ArrayCollator, row_wise
from ._stack import ItemColumn

__all__ = ["TFCollator"]


class TFCollator(ArrayCollator):
    """Collates into ``tf.Tensor`` values made by ``tf.convert_to_tensor``.

    Takes the keyword options of ``ArrayCollator``. String columns become
    ``tf.string`` tensors; ragged string lists raise ``ValueError`` naming the
    key (list it in ``passthrough`` to keep it as a Python list). tensorflow is
    imported on the first batch, not when this module loads. With worker
    processes the stacking runs in the workers and the tensors are made in the
    loader's process.

    Example:
        ```python
        loader = DataLoader(JsonLinesReader(batch_size=64), IdentityDataset(), TFCollator(), "data/")
        for batch in loader:
            logits = model(batch["x"])          # batch["x"]: tf.Tensor, float32 [64, 4] (the last batch: fewer rows)
        ```
    """

    thread_safe = True  # holds no per-call state on self
    releases_gil = True  # NumPy/pyarrow work: num_workers="auto" keeps it in this process

    converts_in_main = True

    @row_wise
    def convert_array(self, key: str, array: np.ndarray) -> "tensorflow.Tensor":
        import tensorflow as tf

        return tf.convert_to_tensor(array)

    def convert_strings(self, key: str, values: ItemColumn) -> "tensorflow.Tensor":
        import tensorflow as tf

        try:
            return tf.convert_to_tensor(values, dtype=tf.string)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"key {key!r}: cannot make a tf.string tensor (ragged strings? list the key in passthrough): {exc}"
            ) from exc
