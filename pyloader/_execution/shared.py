"""Numbers shared with worker processes: a value (``.value``) or a row (indexable) of C numbers.

Under ``fork`` they live on an anonymous shared mapping, which the workers inherit and
which is gone with its last reference: no descriptor stays open in the loader's process.
Other start methods pickle them into the worker, which needs a descriptor to pass:
there they come from multiprocessing's shared heap (whose arena file stays open, reused).
"""
from __future__ import annotations

import ctypes
import mmap
from multiprocessing.context import BaseContext
from typing import TYPE_CHECKING, Dict, Protocol, Type

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

_TYPES: Dict[str, Type[ctypes._SimpleCData]] = {"q": ctypes.c_longlong, "d": ctypes.c_double}


class SharedNumber(Protocol):
    """What ``shared_value`` returns."""

    value: float


class SharedRow(Protocol):
    """What ``shared_row`` returns."""

    def __getitem__(self, i: int) -> float: ...

    def __setitem__(self, i: int, value: float) -> None: ...

    def __len__(self) -> int: ...


def shared_value(ctx: BaseContext, typecode: str, value: float) -> SharedNumber:
    """One number with a ``.value``, shared with workers started by ``ctx`` (a multiprocessing context)."""
    if ctx.get_start_method() != "fork":
        return ctx.RawValue(typecode, value)
    shared = _TYPES[typecode].from_buffer(mmap.mmap(-1, ctypes.sizeof(_TYPES[typecode])))
    shared.value = value
    return shared


def shared_row(ctx: BaseContext, typecode: str, n: int) -> SharedRow:
    """``n`` numbers, zero at first, shared with workers started by ``ctx``."""
    if ctx.get_start_method() != "fork":
        return ctx.RawArray(typecode, n)
    row = _TYPES[typecode] * n
    return row.from_buffer(mmap.mmap(-1, ctypes.sizeof(row)))


def shared_bytes(ctx: BaseContext, n: int) -> "WriteableBuffer":
    """``n`` bytes, zero at first, shared with workers started by ``ctx`` (a writable buffer)."""
    if ctx.get_start_method() != "fork":
        return ctx.RawArray("b", n)
    return mmap.mmap(-1, n)
