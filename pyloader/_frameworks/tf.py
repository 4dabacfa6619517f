"""``DataLoader.to_tf_dataset``: the loader as a ``tf.data.Dataset``."""
from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Protocol, Sequence, Tuple

import numpy as np

if TYPE_CHECKING:
    import tensorflow

INFER_FROM = 8  # batches the signature is inferred from


class _Shape(Protocol):
    @property
    def rank(self) -> Optional[int]: ...

    def as_list(self) -> List[Optional[int]]: ...

    def is_compatible_with(self, other: Sequence[int]) -> bool: ...


class _DType(Protocol):
    @property
    def name(self) -> str: ...


class _Spec(Protocol):
    """What is read of a ``tf.TensorSpec``."""

    @property
    def dtype(self) -> _DType: ...

    @property
    def shape(self) -> _Shape: ...


Signature = Dict[str, _Spec]


class _Run(Iterator[object], Protocol):
    def close(self) -> None: ...


class _Order(Protocol):
    @property
    def file_order(self) -> object: ...


class _Loader(Protocol):
    """What is read of the ``DataLoader``."""

    @property
    def order(self) -> _Order: ...

    @property
    def stream(self) -> object: ...

    @property
    def shuffle(self) -> object: ...

    @property
    def on_error(self) -> object: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> _Run: ...

    def _peek(self, limit: int) -> List[object]: ...


def _spec(tf: ModuleType, key: str, value: object, open_dims: int) -> _Spec:
    """``value``'s spec: its batch dimension ``None``, and its next ``open_dims`` dimensions too."""
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], (str, bytes)):
        return tf.TensorSpec(shape=(None,), dtype=tf.string, name=key)
    tensor = tf.convert_to_tensor(value)
    shape = [None] + [None if i < open_dims else d for i, d in enumerate(tensor.shape[1:])]
    return tf.TensorSpec(shape=shape, dtype=tensor.dtype, name=key)


def _padded(batch: Dict[str, object]) -> Dict[str, int]:
    """The fields this batch shows padded to its longest item, each with its dimensions after the batch's
    that vary with the batch: a field whose ``<key>_mask`` companion (a bool array over its leading
    dimensions) has a False (those dimensions, and the mask's own), or whose ``<key>_lengths`` companion
    (one length per item) has a length short of its first axis (all of its dimensions)."""
    out: Dict[str, int] = {}
    for key, value in batch.items():
        shape = tuple(getattr(value, "shape", ()))
        mask, lengths = batch.get(key + "_mask"), batch.get(key + "_lengths")
        if mask is not None and (dims := _masked_dims(shape, mask)) is not None:
            out[key] = out[key + "_mask"] = dims
        if lengths is not None and _some_short(shape, lengths):
            out[key] = len(shape) - 1
    return out


def _masked_dims(shape: Tuple[int, ...], mask: object) -> Optional[int]:
    """The dimensions after the batch's that a field of ``shape`` shows padded by its ``<key>_mask``
    companion: those of a bool mask over its leading dimensions that has a False; else ``None``."""
    flags = np.asarray(mask)
    if flags.dtype == bool and 2 <= flags.ndim <= len(shape) and shape[:flags.ndim] == flags.shape \
            and not flags.all():
        return flags.ndim - 1
    return None


def _some_short(shape: Tuple[int, ...], lengths: object) -> bool:
    """Whether the ``<key>_lengths`` companion of a field of ``shape`` (one integer length per item) has
    a length short of the field's first axis after the batch's."""
    if len(shape) < 2:
        return False
    counts = np.asarray(lengths)
    return bool(counts.shape == shape[:1] and counts.dtype.kind in "iu" and counts.size and counts.min() < shape[1])


def infer_signature(tf: ModuleType, batch: object) -> Signature:
    """Specs from one batch, from its data alone: the batch dimension is ``None``, and so is every
    dimension this batch shows padded (``_padded``); the others are as in the batch (``_merged``
    leaves open those that differ between batches)."""
    if not isinstance(batch, dict):
        raise TypeError(f"to_tf_dataset infers its signature from batches that are dicts, got "
                        f"{type(batch).__name__}: pass output_signature= to say what it is")
    open_dims = _padded(batch)
    return {k: _spec(tf, k, v, open_dims.get(k, 0)) for k, v in batch.items()}


def _merged(tf: ModuleType, specs: List[Signature]) -> Signature:
    """One signature for several batches: a dimension that differs between them is ``None``."""
    out = dict(specs[0])
    for spec in specs[1:]:
        for key, one in spec.items():
            first = out.get(key)
            if first is None or (first.dtype, first.shape.rank) != (one.dtype, one.shape.rank):
                raise ValueError(f"to_tf_dataset: field {key!r} changes between batches ({first} then {one}): "
                                 f"pass output_signature= to say what it is")
            dims = [a if a == b else None for a, b in zip(first.shape.as_list(), one.shape.as_list())]
            out[key] = tf.TensorSpec(shape=dims, dtype=first.dtype, name=key)
    return out


def _as_numpy(value: object) -> object:
    return value.numpy() if hasattr(value, "numpy") and not isinstance(value, np.ndarray) else value


def _check(batch: Dict[str, object], signature: Signature) -> None:
    for key, value in batch.items():
        spec = signature.get(key)
        shape = getattr(value, "shape", None)
        if spec is None or shape is None or spec.shape.is_compatible_with(shape):
            continue
        loose = _loosened(signature, key)
        raise ValueError(f"to_tf_dataset: field {key!r} has shape {list(shape)} but the signature inferred from the "
                         f"first batches says {spec.shape.as_list()}: pass output_signature={{"
                         + ", ".join(f"{k!r}: {v}" for k, v in loose.items()) + "}")


def _loosened(signature: Dict[str, "tensorflow.TensorSpec"], key: str) -> Dict[str, str]:
    """``signature`` as ``tf.TensorSpec`` source text, field ``key``'s dimensions all left open."""
    return {k: f"tf.TensorSpec({[None] * len(v.shape) if k == key else v.shape.as_list()}, tf.{v.dtype.name})"
            for k, v in signature.items()}


def cardinality(loader: _Loader) -> Optional[int]:
    """The batches of every pass, when every pass has as many: not with stream mode's shuffled or
    custom file order (the step count depends on it), nor a ``file_order`` that drops or repeats
    files, nor when skipped errors can shorten a pass."""
    from .._stages.order import declares_drops_or_repeats

    custom = loader.order.file_order is not None
    if loader.stream and (loader.shuffle or custom) or declares_drops_or_repeats(loader.order.file_order) \
            or getattr(loader.on_error, "policy", loader.on_error) != "raise":  # an OnError
        return None
    try:
        return len(loader)
    except TypeError:
        return None


def to_tf_dataset(loader: _Loader, output_signature: object = None) -> "tensorflow.data.Dataset":
    """A ``tf.data.Dataset`` built with ``from_generator``; each pass over it is the loader's
    next iteration (the next epoch). Without ``output_signature`` it is inferred from the
    first batches (up to ``INFER_FROM``, read in a short extra pass that leaves the loader's
    position alone): a dimension that differs between them is ``None``; a later batch
    that does not fit raises ``ValueError`` saying what to pass. The dataset declares its
    cardinality (``len(loader)``) where every pass has as many batches."""
    import tensorflow as tf

    inferred: Optional[Signature] = None  # checked against each batch
    if output_signature is None:
        first = loader._peek(INFER_FROM)
        if not first:
            raise ValueError("cannot infer output_signature: the loader yields no batch")
        output_signature = inferred = _merged(tf, [infer_signature(tf, batch) for batch in first])

    def generate() -> Iterator[object]:
        it = iter(loader)
        try:
            for batch in it:
                if isinstance(batch, dict):
                    batch = {k: _as_numpy(v) for k, v in batch.items()}
                    if inferred is not None:
                        _check(batch, inferred)
                yield batch
        finally:
            it.close()

    ds = tf.data.Dataset.from_generator(generate, output_signature=output_signature)
    n = cardinality(loader)
    return ds if n is None else ds.apply(tf.data.experimental.assert_cardinality(n))
