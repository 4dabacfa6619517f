"""What the loader does with framework tensors: pinning, moving to a device, adding metadata."""
from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Callable, Dict, KeysView, Mapping, Optional, Sequence, TypeVar, cast

import numpy as np

from .._stages.batch import Batch, Group, Stacked

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("pyloader")

G = TypeVar("G", bound=Group)
OnBatch = Callable[[object], object]  # what collate_batch returned -> the same with its tensors changed
OnTensor = Callable[["torch.Tensor"], "torch.Tensor"]


def map_tensors(obj: object, fn: OnTensor) -> object:
    """Apply ``fn`` to every torch tensor inside dicts, lists and tuples."""
    if _framework_of(obj) == "torch":
        return fn(cast("torch.Tensor", obj))
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    return obj


class TensorMap:
    """``fn`` on every torch tensor of a batch; the same on a stacked group (``run_stacked``):
    a tensor ``[K, ...]`` handled once, then split, gives what each batch would."""

    def __init__(self, fn: OnTensor) -> None:
        self.fn = fn

    def __call__(self, batch: object) -> object:
        return map_tensors(batch, self.fn)

    on_stacked = __call__


def pinner() -> Optional[OnBatch]:
    """A function pinning a batch's tensors in page-locked memory, or ``None`` without an accelerator."""
    import torch

    if not torch.cuda.is_available():
        logger.warning("Device(pin_memory=True) but no CUDA device is available: batches are not pinned")
        return None
    return TensorMap(lambda t: t.pin_memory())


def mover(device: "str | int | torch.device", non_blocking: bool) -> OnBatch:
    import torch

    device = torch.device(device)
    backend = getattr(torch, device.type, None)
    if device.type != "cpu" and not getattr(backend, "is_available", lambda: True)():
        raise ValueError(f"device={str(device)!r}, but torch.{device.type}.is_available() is False on this machine")
    return lambda batch: map_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking))


def unstack(value: object) -> Sequence[object]:
    """``value`` (a NumPy array, torch or TF tensor ``[K, ...]``) as K values ``[...]`` of its
    type, sharing its memory where the framework allows; ``TypeError`` for anything else."""
    if isinstance(value, np.ndarray):
        return list(value)
    framework = _framework_of(value)
    if framework == "torch":  # indexing holds the GIL; ``unbind`` lets it go, and waits for a thread busy with it
        return [value[k] for k in range(len(value))]  # type: ignore[arg-type,index]
    if framework == "tensorflow":
        return sys.modules["tensorflow"].unstack(value)
    raise TypeError(f"cannot split a {type(value).__name__} along its first axis")


def _converter(batch: Mapping[str, object]) -> Callable[[np.ndarray], object]:
    """Turns a NumPy array into a tensor of the type the collator chose for ``batch``."""
    for value in batch.values():
        framework = _framework_of(value)
        if framework is not None:
            return getattr(sys.modules[framework], _FROM_NUMPY[framework])
    return _same


_FROM_NUMPY = {"torch": "from_numpy", "tensorflow": "convert_to_tensor"}  # each framework's array -> tensor


def _framework_of(value: object) -> Optional[str]:
    """``"torch"`` or ``"tensorflow"`` for a tensor of that framework, else ``None`` (neither is imported here)."""
    for name in _FROM_NUMPY:
        module = sys.modules.get(name)
        if module is not None and isinstance(value, module.Tensor):
            return name
    return None


def _same(array: np.ndarray) -> np.ndarray:
    return array


def attach_meta(group: G) -> G:
    """Each batch of ``group`` (changed in place) with its metadata (``Batch.meta``: stream flags, padding
    flags) added to its collated dict, as tensors of the collator's framework.

    The metadata of the whole group is converted at once: one conversion per
    field rather than one per field and batch (a ``Stacked`` group's arrays as
    they are, others stacked first).
    """
    stacked = group.meta if isinstance(group, Stacked) else None
    meta = stacked or group[0].meta
    assert meta is not None, "attach_meta takes groups that carry meta"
    names = meta.keys()
    if isinstance(group, Stacked) and group.outputs is not None:  # made at once: its batches have no data yet
        _attach_to_outputs(group, group.outputs, names, stacked)
        return group
    for batch in group:
        _check_names(names, batch.data)
    if stacked is None:
        stacked = {key: np.stack([_meta(batch)[key] for batch in group]) for key in names}
    _attach_to_batches(group, names, stacked)
    return group


def _attach_to_batches(group: Group, names: KeysView[str], stacked: Dict[str, np.ndarray]) -> None:
    """Each batch's data with its row of the group's metadata, converted once per field."""
    convert = _converter(group[0].data)
    fields = [(key, unstack(convert(stacked[key]))) for key in names]
    for k, batch in enumerate(group):
        data = batch.data.copy()
        for key, values in fields:
            data[key] = values[k]
        batch.data, batch.meta = data, None


def _attach_to_outputs(group: Stacked, outputs: Dict[str, object], names: KeysView[str],
                       stacked: Optional[Dict[str, np.ndarray]]) -> None:
    """A group whose steps ran at once: its metadata joins its outputs (one conversion per field)."""
    assert stacked is not None
    _check_names(names, outputs)
    convert = _converter(outputs)
    outputs.update((key, convert(stacked[key])) for key in names)
    group.meta = None


def _meta(batch: Batch) -> Dict[str, np.ndarray]:
    assert batch.meta is not None, "a group's batches all carry meta or none"
    return batch.meta


def _check_names(names: KeysView[str], data: object) -> None:
    if not isinstance(data, dict):
        raise TypeError(f"collate_batch must return a dict to carry the batch's metadata, got {type(data).__name__}")
    if not names.isdisjoint(data):
        raise ValueError(f"batch fields {sorted(names & data.keys())} collide with stream metadata names; rename them")
