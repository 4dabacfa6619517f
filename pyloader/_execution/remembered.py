"""Where measured placement kept a run's files, remembered for the next run of the same code on the
same data (``num_workers="auto"``, ``_execution.measured``).

A program run again (the next job of a training schedule, a restart after a failure, a sweep, the
next round of a benchmark) would pay the trial again: windows in the slower place, and the changes
of place between them. So the place a run keeps (by its trial, a confirming window or a probe) is
written to a small JSON file named by the run's identity: the classes of the user's objects and the
bytecode of every method they define (a change of code is a new identity), the data (how many
files, the first and the last), the workers and their start method, and the code of ``Measured``. A run
with the same identity starts in that place; its first window confirms it as a trial's decision is
confirmed (another place's figure beating it by more than ``Measured.CLEAR`` would be kept
instead: there is none yet, so the probes do that, every few windows, as in any run).

Where: the folder ``PYLOADER_CACHE_DIR`` names (``off``: nothing is remembered), else
``$XDG_CACHE_HOME/pyloader``, else ``~/.cache/pyloader``; in it ``placement/<identity>.json``, at most
``KEEP`` files (the oldest go). A folder that cannot be read or written leaves runs as they were
(logged at DEBUG). What is read is a place's name, checked against the places there are
(``Measured``); nothing else is taken from it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import types
from typing import Any, Iterable, Optional, Sequence

from .measured import Measured

ENV = "PYLOADER_CACHE_DIR"
KEEP = 256  # identities remembered at most
_LAYOUT = "1"  # of the records: part of the identity, so that another layout is another record
_PLAIN = (str, int, float, bytes, bool, type(None))  # constants whose repr is the same in every process

_log = logging.getLogger("pyloader")


def folder() -> Optional[str]:
    """Where placements are remembered, or ``None`` when ``PYLOADER_CACHE_DIR=off``."""
    given = os.environ.get(ENV, "").strip()
    if given.lower() == "off":
        return None
    if given:
        return os.path.join(given, "placement")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pyloader", "placement")


def identity(objects: Iterable[Any], files: Sequence[str], num_workers: int, start_method: Optional[str]) -> str:
    """The identity of a run (see the module): a hex digest."""
    digest = hashlib.sha256()
    ends = (files[0], files[-1]) if files else ("", "")
    for part in (_LAYOUT, str(num_workers), str(start_method), str(len(files)), *ends):
        digest.update(part.encode("utf-8", "surrogateescape") + b"\0")
    _add_class(digest, Measured)  # another way of measuring: its decisions are not this one's
    for obj in objects:
        _add_code_of(digest, obj)
    return digest.hexdigest()[:32]


def recall(key: str) -> Optional[str]:
    """The place remembered for ``key``, if any: a name ``Measured`` checks against its places."""
    where = folder()
    if where is None:
        return None
    try:
        with open(os.path.join(where, f"{key}.json"), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record.get("place") if isinstance(record, dict) else None


def remember(key: str, place: str) -> None:
    """Write ``place`` for ``key`` (whole: a reader sees the old file or the new one), keeping ``KEEP`` at most."""
    where = folder()
    if where is None:
        return
    try:
        os.makedirs(where, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"place": place}, f)
        os.replace(tmp, os.path.join(where, f"{key}.json"))
        _trim(where)
    except OSError as exc:
        _log.debug("pyloader: the placement could not be remembered in %s: %s", where, exc)


def _trim(where: str) -> None:
    """Remove the oldest records beyond ``KEEP``."""
    records = sorted((e for e in os.scandir(where) if e.name.endswith(".json")), key=lambda e: e.stat().st_mtime)
    for record in records[:max(0, len(records) - KEEP)]:
        with contextlib.suppress(OSError):
            os.unlink(record.path)


def _add_code_of(digest: Any, obj: Any) -> None:
    """``obj``'s own code, for a function; else the name of each of its classes and the code of every
    function they define."""
    code = getattr(obj, "__code__", None)
    if isinstance(code, types.CodeType):
        digest.update(getattr(obj, "__qualname__", "").encode())
        _add_code(digest, code)
        return
    for cls in type(obj).__mro__:
        if cls.__module__ != "builtins":
            _add_class(digest, cls)


def _add_class(digest: Any, cls: type) -> None:
    digest.update(f"{cls.__module__}.{cls.__qualname__}".encode())
    for name in sorted(vars(cls)):
        function = _function_of(vars(cls)[name])
        if function is not None:
            digest.update(name.encode())
            _add_code(digest, function.__code__)


def _function_of(value: Any) -> Optional[types.FunctionType]:
    """The function a class attribute runs: itself, a static or class method's, a property's getter."""
    for candidate in (value, getattr(value, "__func__", None), getattr(value, "fget", None)):
        if isinstance(candidate, types.FunctionType):
            return candidate
    return None


def _add_code(digest: Any, code: types.CodeType) -> None:
    digest.update(code.co_code)
    digest.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _add_code(digest, const)
        elif isinstance(const, _PLAIN):
            digest.update(repr(const).encode())
