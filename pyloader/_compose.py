"""The loader's keywords for composing data: their checks at construction, and their part of the resume fingerprint.

Each feature lives in its own module (``_filter``: ``filter_fn``; ``_order``:
``file_order``; ``_bucket``: ``bucket_by``; ``_stream`` and ``_entries``: the
stream-mode additions; ``_rotation``: ``rotation``, ``rotation_dir``, ``rotation_size``); this one only
gathers what ``DataLoader`` needs from all of them, so the loader names each once.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from ._bucket import buffer_size, check_bucketing
from ._filter import check_filter
from ._order import check_file_order
from ._rotation import check_rotation, rotation_fingerprint


def check_compose(a: Mapping[str, Any]) -> None:
    """Check the composing keywords of ``DataLoader(**a)``; raises naming the keyword."""
    check_filter(a["filter_fn"], a["stream"])
    check_file_order(a["file_order"], a["shuffle"])
    if a["time_major"] and not (a["stream"] and a["seq_len"]):
        raise ValueError("time_major=True lays stream windows out as [T, B, ...]: it needs stream=True and seq_len")
    check_bucketing(a)
    check_rotation(a)


def callable_name(fn: Any) -> Optional[str]:
    """``module.qualname`` of a user callable, for the fingerprint (a state saved with another
    filter or order is refused); ``None`` when there is none."""
    if fn is None:
        return None
    named = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(named, '__module__', '?')}.{named.__qualname__}"


def compose_fingerprint(a: Mapping[str, Any]) -> Dict[str, Any]:
    """The composing settings that change the batch sequence, as the state records them."""
    bucket_by = a["bucket_by"]
    return {"filter_fn": callable_name(a["filter_fn"]), "file_order": callable_name(a["file_order"]),
            "time_major": a["time_major"] or None,
            "bucket_by": bucket_by if isinstance(bucket_by, str) else callable_name(bucket_by),
            "bucket_buffer": buffer_size(a), "rotation": rotation_fingerprint(a)}
