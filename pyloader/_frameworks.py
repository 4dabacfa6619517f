"""What the loader does with PyTorch tensors: pinning and moving them to a device."""
from __future__ import annotations

import logging
import sys
from typing import Any, Callable, Mapping

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


def _converter(batch: Mapping[str, Any]) -> Callable[[np.ndarray], Any]:
    """Turns NumPy arrays into the tensor type the collator chose for ``batch``."""
    torch, tf = sys.modules.get("torch"), sys.modules.get("tensorflow")
    for value in batch.values():
        if torch is not None and isinstance(value, torch.Tensor):
            return torch.from_numpy
        if tf is not None and isinstance(value, tf.Tensor):
            return tf.convert_to_tensor
    return lambda array: array


def attach_meta(batch: Any, meta: Mapping[str, np.ndarray]) -> Any:
    """Add stream metadata to a collated dict, as tensors of the collator's framework."""
    if not isinstance(batch, dict):
        raise TypeError(f"stream mode needs collate_batch to return a dict, got {type(batch).__name__}")
    clash = sorted(set(batch) & set(meta))
    if clash:
        raise ValueError(f"batch fields {clash} collide with stream metadata names; rename them")
    convert = _converter(batch)
    out = dict(batch)
    out.update((key, convert(value)) for key, value in meta.items())
    return out
