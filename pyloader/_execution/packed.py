"""A batch of small arrays sent from a worker as one flat buffer instead of a pickle.

Contract: ``pack(batch, limit)`` returns a ``Packed`` when ``batch`` is a ``dict`` with ``str``
keys whose values are distinct objects, each an exact ``np.ndarray`` or an exact CPU
``torch.Tensor`` (strided, not requiring grad, with a NumPy dtype) of fixed-width values
(numbers, booleans, dates, fixed-width strings), of at most ``limit`` bytes, and not a span of
a mapped file (``_npy.file_span``: those travel as where they lie); else ``None``, and the
batch is pickled as before. ``Packed.open()`` gives a dict with the same keys in the same
order, each value of the same type, dtype, shape, memory order (C or Fortran) and, for
arrays, writeable flag, as pickling would: every value owns its memory (one buffer per
batch), none shares it with the sender.

Why: a batch of a few small arrays is the common case, and pickling one goes through the
pickler's Python hooks (``ipc._Pickler.reducer_override``) for every array and tensor,
several times what copying its bytes costs, on both sides of every batch.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List, Literal, Optional, Tuple

import numpy as np

from .._npy import file_span

_KINDS = frozenset("biufcmMSU")  # fixed-width dtypes that np.dtype(dtype.str) rebuilds exactly (records: "V")
_ALIGN = 16
Order = Literal["C", "F"]
Entry = Tuple[str, bool, str, Tuple[int, ...], int, Order, bool]  # key, tensor, dtype, shape, offset, order, writeable


class Packed:
    """A batch as ``(entries, data)``: where each value lies in ``data``, and the bytes."""

    __slots__ = ("entries", "data")

    def __init__(self, entries: Tuple[Entry, ...], data: bytes) -> None:
        self.entries = entries
        self.data = data

    def __reduce__(self) -> Tuple[type, Tuple[Tuple[Entry, ...], bytes]]:
        return Packed, (self.entries, self.data)

    def open(self) -> Dict[str, object]:
        memory = bytearray(self.data)  # writable, and owned by the batch's values alone
        out: Dict[str, object] = {}
        for key, tensor, dtype, shape, offset, order, writeable in self.entries:
            array = np.ndarray(shape, np.dtype(dtype), buffer=memory, offset=offset, order=order)
            if tensor:
                import torch

                out[key] = torch.from_numpy(array)
            else:
                array.flags.writeable = writeable
                out[key] = array
        return out


def _as_array(value: Any) -> Optional[Tuple[np.ndarray, bool]]:
    """``(the value's array, whether it is a tensor)`` when it can be packed, else ``None``."""
    if type(value) is np.ndarray:
        return value, False
    torch = sys.modules.get("torch")
    if torch is None or type(value) is not torch.Tensor:
        return None
    try:
        return value.numpy(), True  # refused for a tensor on a device, requiring grad, sparse, conjugate, ...
    except (TypeError, RuntimeError):  # ... or of a dtype NumPy lacks (bfloat16)
        return None


def _packable(array: np.ndarray, limit: int) -> bool:
    return array.dtype.kind in _KINDS and array.nbytes <= limit and file_span(array) is None


def _order(array: np.ndarray) -> Order:
    """The array's memory order, as pickling keeps it: Fortran only when it is not also C-contiguous."""
    return "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"


def pack(batch: object, limit: int) -> Optional[Packed]:
    """``batch`` as a ``Packed``, or ``None`` when it is not a dict of small arrays (see the module)."""
    if type(batch) is not dict or len({id(v) for v in batch.values()}) != len(batch):
        return None
    entries: List[Entry] = []
    parts: List[bytes] = []
    offset = 0
    for key, value in batch.items():
        found = _as_array(value) if type(key) is str else None
        if found is None or not _packable(found[0], limit):
            return None
        array, tensor = found
        order = _order(array)
        raw = array.tobytes(order=order)
        pad = -offset % _ALIGN
        parts.extend((b"\0" * pad, raw))
        offset += pad
        entries.append((key, tensor, array.dtype.str, array.shape, offset, order, bool(array.flags.writeable)))
        offset += len(raw)
    return Packed(tuple(entries), b"".join(parts))
