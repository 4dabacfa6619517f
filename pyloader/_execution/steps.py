"""Running the user's steps on a batch, and the forms a batch takes to get there.

A step is ``(name, fn)``: ``batch_encode``, ``collate_batch`` or the loader's own
(pinning). Contracts:

- ``run_steps`` applies the steps in turn; a step that raises becomes ``StepFailed(name)``
  with the original exception as ``__cause__``, so the error policy can name the step.
- ``run_each`` runs a group batch by batch: one ``Outcome`` per batch, a failed
  batch does not stop the others.
- ``run_stacked`` runs a whole ``StackedRows`` group at once when every step can
  (``on_stacked``), else gives ``None`` and the caller runs it batch by batch.
  A group whose rows a worker keeps comes as ``StackedSegments``: the worker runs it so.

A batch reaches a runner as ``Columns``, as ``Segments`` (rows of pieces not joined yet:
the runner joins them where the pieces are, ``assemble``) or, for a ``Stacked`` group, as
``StackedRows``; a group run at once comes back as ``StackedOutputs``. These live here, at
the execution layer, because the runners and the worker processes exchange them; the
stages (``_stages.batch``, ``_stages.map``) make and take them.
"""
from __future__ import annotations

import time
import zlib
from collections import abc
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple, Union, cast, overload

import numpy as np

from .._columns import Columns, Rows, concat, slice_rows
from .._rng import enter, leave
from .._stats import BusySink, GroupClock, profiled, profiling, timed
from .._trace import SpanSink, batch_label

Step = Tuple[str, Callable[[Any], object]]  # a user method's name, and the method (it takes what the step before gave)


class StepFailed(Exception):
    """``step`` (a user method's name) raised ``__cause__``."""

    def __init__(self, step: str) -> None:
        super().__init__(step)
        self.step = step


Key = Tuple[int, ...]  # a batch's place, what ``pyloader.rng()`` draws from in its steps (``_stages.map``)


_STEP_KEYS: Dict[str, int] = {}


def step_key(name: str) -> int:
    """A step's part of the keys of its ``pyloader.rng()``: the same in every process and run."""
    code = _STEP_KEYS.get(name)
    if code is None:
        code = _STEP_KEYS[name] = zlib.crc32(name.encode())
    return code


def run_steps(steps: Sequence[Step], data: object, spent: Optional[List[float]] = None,
              key: Optional[Key] = None) -> object:
    """Apply the steps in turn; one call off the loop for all of them, so a batch
    crosses threads once rather than once per step. Step ``i``'s seconds are added to
    ``spent[i]`` (``GroupClock.steps``); each step shows as a profiler range. With the
    batch's ``key``, each step runs under ``enter((*key, step_key(name)))`` (``pyloader.rng()``)."""
    ranges = profiling()  # checked once per batch: a step costs no more than two clock readings
    for i, (name, fn) in enumerate(steps):
        began = time.perf_counter()
        token = None if key is None else enter((*key, step_key(name)))
        try:
            if ranges:
                with profiled(name):
                    data = fn(data)
            else:
                data = fn(data)
        except Exception as exc:
            raise StepFailed(name) from exc
        finally:
            if token is not None:
                leave(token)
            if spent is not None:
                spent[i] += time.perf_counter() - began
    return data


class _Span:
    """A step that shows as a span of its batch in a trace (``traced``)."""

    __slots__ = ("name", "fn", "label", "trace")

    def __init__(self, name: str, fn: Callable[[Any], object], label: str, trace: SpanSink) -> None:
        self.name, self.fn, self.label, self.trace = name, fn, label, trace

    def __call__(self, data: object) -> object:
        began = time.perf_counter()
        try:
            return self.fn(data)
        finally:
            self.trace.span(self.name, self.label, began, time.perf_counter())


def traced(steps: Sequence[Step], trace: SpanSink, key: Optional[Key], paths: Sequence[str]) -> List[Step]:
    """``steps`` on one batch (``key``: its place; ``paths``: its files), each a span of it in ``trace``.
    Callers check for a trace first: without one, the steps run as they are."""
    label = batch_label(key, tuple(paths))
    return [(name, _Span(name, fn, label, trace)) for name, fn in steps]


def _same(data: object) -> object:
    return data


Outcome = Union[object, StepFailed]  # a batch's result, or the step that failed on it


def run_each(steps: Sequence[Step], datas: Sequence[object], prepare: Callable[[Any], object] = _same,
             busy: Optional[BusySink] = None, keys: Optional[Sequence[Key]] = None) -> List[Outcome]:
    """``run_steps`` on every batch of a group (``keys``: each batch's); a batch that fails does not
    stop the others. The group's time goes to ``busy`` (``GroupClock``)."""
    out: List[Outcome] = []
    with GroupClock(busy, steps) as clock:
        trace = clock.trace
        for k, data in enumerate(datas):
            key = None if keys is None else keys[k]
            mine = steps if trace is None else traced(steps, trace, key, getattr(data, "paths", ()))
            try:
                out.append(run_steps(mine, prepare(data), clock.steps, key))
            except StepFailed as failed:
                out.append(failed)
    return out


def run_stacked(steps: Sequence[Step], datas: Sequence[object],
                busy: Optional[BusySink] = None) -> Optional[StackedOutputs]:
    """The outputs of ``steps`` on ``datas``, computed at once for the whole group when
    ``datas`` are ``StackedRows``, else (or when that cannot be) ``None``.

    Every step must offer ``on_stacked(columns)``: the step on all the batches at once
    (a dict whose values have a leading step axis), or ``None`` when it cannot. Only
    the loader's own steps offer it (``IdentityDataset``, the built-in collators,
    pinning), never user code, so a failure loses nothing: the caller runs the group
    per batch, where it is pinned on its batch. Cheap (a few calls per field for the
    whole group): fine to run on the event loop.
    """
    if not isinstance(datas, StackedRows):
        return None
    try:
        with timed(busy, "encode"):
            columns = _on_stacked(steps, datas.columns, busy)
        if columns is None or any(column.shape[0] != len(datas) for column in columns.values()):
            return None
    except Exception:
        return None
    return StackedOutputs(columns)


def _on_stacked(steps: Sequence[Step], columns: Mapping[str, np.ndarray],
                busy: Optional[BusySink]) -> Optional[Mapping[str, np.ndarray]]:
    """Each step's ``on_stacked`` on what the step before gave, or ``None`` as soon as one cannot."""
    for name, fn in steps:
        on_stacked = getattr(fn, "on_stacked", None)
        with timed(busy, name):
            value = on_stacked(columns) if on_stacked is not None else None
        if value is None:
            return None
        columns = value
    return columns


class StackedOutputs(dict):
    """What the steps made of a whole ``Stacked`` group at once: each output with a leading step axis."""


class StackedRows(abc.Sequence):
    """Item ``k`` is ``{key: columns[key][k]}``, made when asked for; ``columns`` is there for
    stages that can work on the whole group at once (``run_stacked``)."""

    def __init__(self, columns: Dict[str, np.ndarray], count: int) -> None:
        self.columns = columns
        self._count = count

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, k: int) -> Dict[str, object]: ...

    @overload
    def __getitem__(self, k: slice) -> List[Dict[str, object]]: ...

    def __getitem__(self, k: Union[int, slice]) -> Union[Dict[str, object], List[Dict[str, object]]]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self._count))]
        if not -self._count <= k < self._count:
            raise IndexError(k)
        return {key: column[k] for key, column in self.columns.items()}


class StackedSegments(abc.Sequence):
    """Item ``k`` is batch ``k``'s ``Segments``: rows ``start + k * size`` to ``start + (k + 1) * size`` of
    one piece of arrays kept in a worker process, which can run the whole group at once (``PoolRunner``)."""

    def __init__(self, piece: "PieceRows", start: int, size: int, count: int) -> None:
        self.piece, self.start, self.size = piece, start, size
        self.paths = (piece.task.path,)
        self._count = count

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, k: int) -> "Segments": ...

    @overload
    def __getitem__(self, k: slice) -> List["Segments"]: ...

    def __getitem__(self, k: Union[int, slice]) -> Union["Segments", List["Segments"]]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self._count))]
        if not -self._count <= k < self._count:
            raise IndexError(k)
        first = self.start + (k % self._count) * self.size
        return Segments(((self.piece, first, first + self.size),))


def assemble(parts: Sequence[Tuple[Rows, int, int]], paths: Sequence[str]) -> Rows:
    """Rows ``start:end`` of each part, joined; a key mismatch names the files."""
    try:
        return concat([slice_rows(columns, start, end) for columns, start, end in parts], "batch")
    except ValueError as exc:
        raise ValueError(f"files {', '.join(map(repr, paths))} cannot share a batch: {exc}") from None


class _Path(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def epoch(self) -> int: ...


class PieceRows(Protocol):
    """What a runner needs of a piece of a file (``_stages.read.Piece``): its file, and its rows
    held here (``columns``) or kept in a worker process (``ref``)."""

    @property
    def task(self) -> _Path: ...

    @property
    def columns(self) -> Optional[Columns]: ...

    @property
    def ref(self) -> Any: ...


@dataclass(frozen=True)
class Segments:
    """A batch not assembled yet: rows ``start:end`` of each piece, in order.

    The pieces may be kept in worker processes; the runner decides where the
    rows are joined, so they move between processes only when they must.
    """

    parts: Tuple[Tuple[PieceRows, int, int], ...]

    @cached_property  # a batch's files are asked for on every hand-over of it
    def paths(self) -> Tuple[str, ...]:
        if len(self.parts) == 1:  # most batches: rows of one piece
            return (self.parts[0][0].task.path,)
        return tuple(dict.fromkeys(piece.task.path for piece, _, _ in self.parts))

    def local(self) -> Columns:
        return assemble([(cast(Columns, p.columns), start, end) for p, start, end in self.parts], self.paths)


BatchData = Union[Columns, Segments]  # a batch's rows as cut, before ``batch_encode``
