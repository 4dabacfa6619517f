"""``DataLoader.to_tf_dataset``: the loader as a ``tf.data.Dataset``."""
from __future__ import annotations

from typing import Any, Dict

import numpy as np


_PADDING_SUFFIXES = ("_mask", "_lengths")


def _spec(tf: Any, key: str, value: Any, ragged: bool) -> Any:
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], (str, bytes)):
        return tf.TensorSpec(shape=(None,), dtype=tf.string, name=key)
    tensor = tf.convert_to_tensor(value)
    shape = [None] + [None if ragged else d for d in tensor.shape[1:]]
    return tf.TensorSpec(shape=shape, dtype=tensor.dtype, name=key)


def infer_signature(tf: Any, batch: Dict[str, Any]) -> Dict[str, Any]:
    """Specs from one batch: the batch dimension is ``None``, and so is every
    dimension of a field that has a padding companion (``<key>_mask`` or
    ``<key>_lengths``) and of the companion itself, since padding varies per batch."""
    if not isinstance(batch, dict):
        raise TypeError(f"to_tf_dataset needs batches that are dicts, got {type(batch).__name__}")
    padded = {k[: -len(s)] for k in batch for s in _PADDING_SUFFIXES if k.endswith(s)}
    ragged = padded | {k + s for k in padded for s in _PADDING_SUFFIXES}
    return {k: _spec(tf, k, v, k in ragged) for k, v in batch.items()}


def _as_numpy(value: Any) -> Any:
    return value.numpy() if hasattr(value, "numpy") and not isinstance(value, np.ndarray) else value


def to_tf_dataset(loader: Any, output_signature: Any = None) -> Any:
    """A ``tf.data.Dataset`` built with ``from_generator``; each iteration of it is
    a fresh pass of the loader. Without ``output_signature`` it is inferred from
    the first batch (one extra short pass that is stopped at once)."""
    import tensorflow as tf

    if output_signature is None:
        it = iter(loader)
        try:
            first = next(it)
        except StopIteration:
            raise ValueError("cannot infer output_signature: the loader yields no batch") from None
        finally:
            it.close()
        output_signature = infer_signature(tf, first)

    def generate():
        it = iter(loader)
        try:
            for batch in it:
                yield {k: _as_numpy(v) for k, v in batch.items()} if isinstance(batch, dict) else batch
        finally:
            it.close()

    return tf.data.Dataset.from_generator(generate, output_signature=output_signature)
