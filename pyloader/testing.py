"""Helpers for testing loaders: exact resume at every position, and slow storage.

``check_resume(make_loader)`` checks that a loader resumes exactly at every
position of a run: run it on your own reader, dataset, collator and settings::

    from pyloader.testing import check_resume

    check_resume(lambda: DataLoader(MyReader(4), MyDataset(), MyCollator(), "small_data/", shuffle=True))

``LatencyFileSystem`` is an in-memory fsspec filesystem that waits ``latency``
seconds before every file read, like a remote object store; register it under
a protocol of your choice and point ``data_dir`` at that protocol's URLs (it
needs fsspec, the ``remote`` extra; ``check_resume`` does not)::

    LatencyFileSystem.register("slow", latency=0.05)
    fs = fsspec.filesystem("slow"); fs.pipe("/data/part-0.jsonl", b"...")
    DataLoader(..., data_dir="slow:///data")
"""
from __future__ import annotations

import json
from collections import abc
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from ._loader import DataLoader

if TYPE_CHECKING:
    from ._storage.latency import LatencyFileSystem

__all__ = ["LatencyFileSystem", "check_resume"]

# one batch handed out: the loader's ``epoch`` then, and a copy of the batch's data
_Step = Tuple[Optional[int], object]


def __getattr__(name: str) -> type[LatencyFileSystem]:
    if name == "LatencyFileSystem":  # imported on first use: fsspec is an optional dependency
        from ._storage.latency import LatencyFileSystem

        return LatencyFileSystem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_resume(make_loader: Callable[[], DataLoader],
                 positions: Union[None, Iterable[int], Callable[[List[Optional[int]]], Iterable[int]]] = None) -> int:
    """Check that the loaders ``make_loader()`` builds resume exactly at every position.

    ``make_loader`` must build a new loader, with the same data and settings, on each
    call. The uninterrupted run is one loader's first iteration (``n`` batches) and its
    second one (the next epochs). Then for each position ``k`` in ``0..n`` (or in
    ``positions``), with a new loader:

    * take ``k`` batches of its first iteration in a ``for`` loop, take
      ``state_dict()``, and ``break`` (at ``k = n`` the loop runs to its end instead;
      at ``k = 0`` the iteration is started and closed). The batches must be the
      uninterrupted run's first ``k``; the state must survive ``json.dumps`` (strict
      JSON: no NaN) and ``json.loads``, and be the same after the ``break``;
    * load the state into another new loader, and into the same loader: each must
      then give exactly the rest of the uninterrupted run, iteration by iteration:
      the rest of the first iteration then the second, or, resumed at the end of
      the first (``k = n``), the second.

    Batches are compared exactly, every key (``__padding__``, ``__valid__`` and the
    other metadata included): NumPy arrays, torch and TensorFlow tensors by type,
    dtype, shape and values (NaN equal to NaN), lists and dicts item by item, other
    values by ``==``; so is ``loader.epoch`` after each batch. Every loader built
    is closed. Keep the data small: the check runs about ``2 * (n + 1)`` resumed runs.

    ``positions`` may also be a function: it gets ``loader.epoch`` after each batch of
    the uninterrupted first iteration (a list of ``n``) and returns the positions, for
    a long run to be checked at some of them (its epoch boundaries, say) without
    running it first to count its batches.

    Returns ``n``, the batches of the uninterrupted first iteration. Raises
    ``AssertionError`` naming the position, how the state was loaded, and the first
    batch and key that differ.

    Example:
        ```python
        check_resume(lambda: DataLoader(TextLinesReader(batch_size=4), IdentityDataset(), NumpyCollator(),
                                        "small_data/", shuffle=True, order=Order(shuffle_buffer=8)))
        ```
    """
    loader = make_loader()
    try:
        first, second = _run(loader), _run(loader)
    finally:
        loader.close()
    _expect(bool(first), "the uninterrupted iteration yielded no batch: there is no position to resume at")
    for k in _chosen(positions, first):
        _check_position(make_loader, first, second, k)
    return len(first)


def _chosen(positions: Union[None, Iterable[int], Callable[[List[Optional[int]]], Iterable[int]]],
            first: List[_Step]) -> List[int]:
    """The positions to check, of the ``n`` batches of the uninterrupted iteration ``first``: every one
    (``0..n``), those given, or those a callable picks from the batches' epochs."""
    n = len(first)
    if callable(positions):
        positions = positions([epoch for epoch, _ in first])
    chosen = list(range(n + 1) if positions is None else positions)
    outside = [k for k in chosen if not 0 <= k <= n]
    if outside:
        raise ValueError(f"positions {outside} are outside the uninterrupted iteration's 0..{n} batches")
    return chosen


def _check_position(make_loader: Callable[[], DataLoader], first: List[_Step], second: List[_Step],
                    k: int) -> None:
    """Stop a new loader after ``k`` batches; its state must resume a new loader and the same one."""
    n = len(first)
    rest, how = ([first[k:], second], "after the break") if k < n else ([second], "after the iteration's end")
    where = f"resumed at position {k} of {n}"
    loader = make_loader()
    try:
        head, state, left = _take(loader, k, n)
        _same([first[:k]], [head], f"{where}: the first {k} batches of a new loader (is the loader deterministic?)")
        if k < n:
            _expect(left == state, f"{where}: state_dict() after the break differs from the one taken at the "
                                   f"position: {left} != {state}")
        other = make_loader()
        try:
            _check_resumed(other, state, rest, f"{where}, its state loaded into a new loader")
        finally:
            other.close()
        _check_resumed(loader, left, rest, f"{where}, its state loaded into the same loader {how}")
    finally:
        loader.close()


def _check_resumed(loader: DataLoader, state: Dict[str, object], rest: List[List[_Step]], where: str) -> None:
    """Load ``state`` into ``loader``: its next iterations must be ``rest``."""
    loader.load_state_dict(state)
    _same(rest, [_run(loader) for _ in rest], where)


def _take(loader: DataLoader, k: int, n: int) -> Tuple[List[_Step], Dict[str, object], Dict[str, object]]:
    """The first ``k`` batches of an iteration, the state at ``k``, and the state once the loop is left."""
    where = f"state_dict() at position {k} of {n}"
    head: List[_Step] = []
    if k == 0:
        iter(loader).close()
        state = _json(loader.state_dict(), where)
        return head, state, state
    for batch in loader:
        head.append((loader.epoch, _copy(batch)))
        if len(head) == k:
            state = _json(loader.state_dict(), where)
            if k < n:
                break
    _expect(len(head) >= k, f"{where}: a new loader's first iteration yielded {len(head)} batches, not {n}")
    return head, state, _json(loader.state_dict(), f"{where}, after leaving the loop")


def _json(state: object, where: str) -> Dict[str, object]:
    try:
        text = json.dumps(state, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise AssertionError(f"{where} is not JSON-serializable: {exc}") from exc
    out = json.loads(text)
    _expect(isinstance(out, dict), f"{where} is a {type(state).__name__}, not a dict")
    return out


def _run(loader: DataLoader) -> List[_Step]:
    """One iteration: each batch, copied as it is handed out, with ``loader.epoch`` then."""
    return [(loader.epoch, _copy(batch)) for batch in loader]


def _copy(value: object) -> object:
    """``value`` with every array and tensor copied to a NumPy array (tagged with its type), so
    that the batches kept share no memory with the loader."""
    if isinstance(value, abc.Mapping):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = list(map(_copy, value))
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, np.ndarray):
        return _Array("ndarray", value.copy())
    return _copy_tensor(value)


def _copy_tensor(value: object) -> object:
    """A torch or TensorFlow tensor as a copied ``_Array``; anything else as it is."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch
        tensor = value.detach().cpu()
        try:
            array = np.array(tensor.numpy())
        except TypeError:  # bfloat16 and the like: exact as float32
            array = np.array(tensor.float().numpy())
        return _Array(f"torch {tensor.dtype}", array)
    if hasattr(value, "numpy") and hasattr(value, "dtype"):  # TensorFlow
        return _Array(f"tf {value.dtype.name}", np.array(value.numpy()))
    return value


class _Array:
    """A copied array, and the type it came as."""

    __slots__ = ("kind", "array")

    def __init__(self, kind: str, array: np.ndarray) -> None:
        self.kind, self.array = kind, array

    def difference(self, other: "_Array") -> Optional[str]:
        a, b = self.array, other.array
        if (self.kind, a.dtype, a.shape) != (other.kind, b.dtype, b.shape):
            return f"expected {self.kind} {a.dtype} {a.shape}, got {other.kind} {b.dtype} {b.shape}"
        differs = np.asarray(a != b)
        if a.dtype.kind in "fc":
            differs &= ~(np.isnan(a) & np.isnan(b))
        if not differs.any():
            return None
        at = tuple(np.argwhere(differs)[0].tolist())  # () for a 0-d array
        return f"values differ at {at}: expected {a[at].tolist()!r}, got {b[at].tolist()!r}"


def _difference(expected: Any, got: Any) -> Optional[str]:
    """Where ``got`` first differs from ``expected``, or ``None`` when they are equal. The values are
    ``_copy``'s: its containers are plain ``dict``, ``list`` and ``tuple``, its arrays ``_Array``."""
    if type(expected) is not type(got):
        return f"expected {type(expected).__name__}, got {type(got).__name__}"
    return _DIFFERENCES.get(type(expected), _value_difference)(expected, got)


def _dict_difference(expected: Dict[object, object], got: Dict[object, object]) -> Optional[str]:
    if list(expected) != list(got):
        return f"keys differ: expected {list(expected)}, got {list(got)}"
    return _first((f"key {key!r}", expected[key], got[key]) for key in expected)


def _items_difference(expected: Sequence[object], got: Sequence[object]) -> Optional[str]:
    if len(expected) != len(got):
        return f"expected {len(expected)} items, got {len(got)}"
    return _first((f"item {i}", e, g) for i, (e, g) in enumerate(zip(expected, got)))


def _value_difference(expected: object, got: object) -> Optional[str]:
    return None if expected == got else f"expected {expected!r}, got {got!r}"


# how ``_difference`` compares two values of one type (others: by ``==``)
_DIFFERENCES: Dict[type, Callable[..., Optional[str]]] = {
    _Array: _Array.difference, dict: _dict_difference, list: _items_difference, tuple: _items_difference,
}


def _first(pairs: Iterable[Tuple[str, Any, Any]]) -> Optional[str]:
    for name, expected, got in pairs:
        found = _difference(expected, got)
        if found is not None:
            return f"{name}: {found}"
    return None


def _same(expected: Sequence[List[_Step]], got: Sequence[List[_Step]], where: str) -> None:
    """Assert that each iteration of ``got`` is that of ``expected``, naming the first difference."""
    for it, (want, have) in enumerate(zip(expected, got), 1):
        for i, (want_step, have_step) in enumerate(zip(want, have)):
            found = _step_difference(want_step, have_step)
            _expect(found is None, f"{where}: iteration {it}, batch {i}: {found}")
        _expect(len(want) == len(have), f"{where}: iteration {it} yielded {len(have)} batches, expected {len(want)} "
                                        f"(the first {min(len(want), len(have))} equal)")


def _step_difference(expected: _Step, got: _Step) -> Optional[str]:
    """Where a batch handed out differs from the one expected (its data first, then ``loader.epoch``)."""
    (want_epoch, want_batch), (have_epoch, have_batch) = expected, got
    found = _difference(want_batch, have_batch)
    if found is None and want_epoch != have_epoch:
        found = f"loader.epoch: expected {want_epoch}, got {have_epoch}"
    return found


def _expect(ok: bool, message: str) -> None:
    """``AssertionError(message)`` unless ``ok`` (raised, not ``assert``ed: ``python -O`` keeps the check)."""
    if not ok:
        raise AssertionError(message)
