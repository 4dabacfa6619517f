"""How an option is declared, and the checks of one value.

An option (of ``DataLoader``, ``_options.Options``, or of one of its groups, ``_groups``) is a
dataclass field ``name: Annotated[type, Option("one line of doc", check=...)] = default``;
``declared(cls)`` reads them back. A check is ``check(name, value)``: it raises ``ValueError``
(a bad value) or ``TypeError`` (a value of the wrong kind) naming the option and the value it got.
"""
from __future__ import annotations

import math
import os
import typing
from dataclasses import dataclass, fields
from typing import Callable, Dict, Optional, Sequence, TypeGuard, Union

Check = Callable[[str, object], object]  # raises naming the option when the value is bad


class Recorded(Dict[str, object]):
    """What a group's ``resume`` gives: several entries of the fingerprint, under the keys states record."""


@dataclass(frozen=True)
class Option:
    """What a declaration says of one option besides its name, type and default."""

    doc: str
    check: Optional[Check] = None
    resume: Union[bool, Callable[[object], object]] = False  # in the fingerprint: as is (True), or mapped
    convert: Optional[Callable[[object], object]] = None  # how it is stored (bool options: ``bool``)


def declared(cls: type) -> Dict[str, Option]:
    """The ``Option`` of each field of the dataclass ``cls``, in declaration order (``KW_ONLY`` left out);
    a bool option without ``convert`` is stored as ``bool``."""
    if cls not in _DECLARED:
        _DECLARED[cls] = _read(cls)
    return _DECLARED[cls]


_DECLARED: Dict[type, Dict[str, Option]] = {}


def _read(cls: type) -> Dict[str, Option]:
    hints = typing.get_type_hints(cls, include_extras=True)
    out = {}
    for f in fields(cls):
        meta = [m for m in getattr(hints[f.name], "__metadata__", ()) if isinstance(m, Option)]
        if len(meta) != 1:
            raise TypeError(f"{cls.__name__}.{f.name} must be declared as Annotated[type, Option(...)]")
        option = meta[0]
        if option.convert is None and typing.get_args(hints[f.name])[0] is bool:
            option = Option(option.doc, option.check, option.resume, bool)
        out[f.name] = option
    return out


def is_integer(value: object, least: int = 0, below: float = math.inf) -> TypeGuard[int]:
    """Whether ``value`` is an ``int`` (a ``bool`` is not) with ``least <= value < below``."""
    return isinstance(value, int) and not isinstance(value, bool) and least <= value < below


def positive(name: str, value: object) -> int:
    if not is_integer(value, least=1):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def at_least_zero(name: str, value: object) -> None:
    if not is_integer(value):
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def optional(check: Check) -> Check:
    """``check``, with ``None`` allowed."""
    def checked(name: str, value: object) -> None:
        if value is not None:
            check(name, value)
    return checked


def one_of(choices: Union[Sequence[str], Callable[[], Sequence[str]]]) -> Check:
    """One of ``choices`` (or of what ``choices()`` gives when checked)."""
    def checked(name: str, value: object) -> None:
        allowed = choices() if callable(choices) else choices
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return checked


def instance_of(cls: type) -> Check:
    def checked(name: str, value: object) -> None:
        if not isinstance(value, cls):
            raise TypeError(f"{name} must be a pyloader.{cls.__name__}, got {type(value).__name__}")
    return checked


def a_folder(name: str, value: object) -> None:
    if not isinstance(value, str) and not hasattr(value, "__fspath__"):
        raise TypeError(f"{name} must be a folder's path, got {value!r}")


def as_path(value: object) -> Optional[str]:
    """A path option as stored: a ``str`` (``None`` kept)."""
    return None if value is None else os.fspath(value)  # type: ignore[call-overload]
