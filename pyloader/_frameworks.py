"""What the loader does with framework tensors: pinning, moving to a device, adding metadata."""
from __future__ import annotations

import logging
import sys
from typing import Any, Callable, List, Mapping, Sequence

import numpy as np

logger = logging.getLogger("pyloader")


def map_tensors(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply ``fn`` to every torch tensor inside dicts, lists and tuples."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    return obj


def pinner() -> Callable[[Any], Any]:
    """A function pinning a batch's tensors in page-locked memory, or ``None`` without an accelerator."""
    import torch

    if not torch.cuda.is_available():
        logger.warning("pin_memory=True but no CUDA device is available: batches are not pinned")
        return None  # type: ignore[return-value]
    return lambda batch: map_tensors(batch, lambda t: t.pin_memory())


def mover(device: Any, non_blocking: bool) -> Callable[[Any], Any]:
    import torch

    device = torch.device(device)
    return lambda batch: map_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking))


def _unstacker(batch: Mapping[str, Any]) -> Callable[[np.ndarray], Sequence[Any]]:
    """Turns a NumPy array ``[K, ...]`` into K tensors ``[...]`` of the type the collator chose
    for ``batch``, with one conversion for all K."""
    torch, tf = sys.modules.get("torch"), sys.modules.get("tensorflow")
    for value in batch.values():
        if torch is not None and isinstance(value, torch.Tensor):
            return lambda array: torch.from_numpy(array).unbind(0)
        if tf is not None and isinstance(value, tf.Tensor):
            return lambda array: tf.unstack(tf.convert_to_tensor(array))
    return lambda array: list(array)


def attach_meta(group: List[Any]) -> List[Any]:
    """Each batch of ``group`` (changed in place) with its metadata (``Batch.meta``: stream flags, padding
    flags) added to its collated dict, as tensors of the collator's framework.

    The metadata of the whole group is converted at once: one conversion per
    field rather than one per field and batch.
    """
    names = group[0].meta.keys()
    for batch in group:
        if not isinstance(batch.data, dict):
            raise TypeError(f"collate_batch must return a dict to carry the batch's metadata, "
                            f"got {type(batch.data).__name__}")
        if not names.isdisjoint(batch.data):
            clash = sorted(names & batch.data.keys())
            raise ValueError(f"batch fields {clash} collide with stream metadata names; rename them")
    unstack = _unstacker(group[0].data)
    fields = {key: unstack(np.stack([batch.meta[key] for batch in group])) for key in names}
    for k, batch in enumerate(group):
        batch.data = {**batch.data, **{key: values[k] for key, values in fields.items()}}
        batch.meta = None
    return group
