"""Schedules: the weights of the sources as a function of the training step, under the global order.

``Shuffle(schedule=...)`` takes a callable ``step -> weights`` (one number >= 0 per ``Source``, not all 0)
or a list of ``(step, weights)`` points, interpolated linearly between them and held beyond the ends.
The step is the global batch counted from epoch 0's first (``e * batches_per_epoch + k``): the same for
every rank, world size and worker, and where a run resumed.

The weights act per tile (``_stages.tiles``): tile ``t`` of epoch ``e`` holds the rows of steps
``[s, s + S)``, ``s = e * B + t * S`` (``B``: the epoch's global batches; ``S``: the rows of a tile), and
its ``G`` columns go to the sources by the weights at ``s``:

* ``"stratified"``: in proportion, rounded so that every source's columns over the epoch's tiles stay
  within one of its running share (each tile gives what the running totals owe);
* ``"random"``: drawn from the weights (a multinomial of ``G``), from ``(random_seed, epoch, tile)``;
* ``"per_source"``: all ``G`` to one source, drawn from the weights.

An epoch holds ``Shuffle.epoch_size`` samples (``None``: the samples of all sources); a source gives what
its columns hold, taking its samples on from where the previous epoch stopped (``sampling="balanced"``)
or from its first (``"fixed"``), passing over them again as often as its columns need. Everything is a
pure function of ``(random_seed, epoch, schedule)``.
"""
from __future__ import annotations

import numbers
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .._rng import TILE_SPANS, derive_rng

Point = Tuple[int, Sequence[float]]
ScheduleLike = Union[Callable[[int], Sequence[float]], Sequence[Point]]
_SCHEDULE = 3  # a TILE_SPANS draw for a scheduled tile's columns (``tiles._PASS``, ``_EPOCH``, ``_TILES`` are 0-2)


def check_schedule(name: str, value: object) -> None:
    """A callable, or ``(step, weights)`` points with steps >= 0 increasing and weights of one length."""
    if value is None or callable(value):
        return
    points = _points(name, value)
    steps = [_point_step(name, point) for point in points]
    for point in points:
        _weights(f"{name} at step {point[0]}", point[1], len(points[0][1]))
    if any(b <= a for a, b in zip(steps, steps[1:])):
        raise ValueError(f"{name}: the points' steps must increase, got {steps}")


def _points(name: str, value: object) -> Sequence[Point]:
    if not isinstance(value, (list, tuple)) or not value:
        raise TypeError(f"{name} must be a callable step -> weights or a non-empty list of (step, weights) "
                        f"points, got {value!r}")
    return value


def _point_step(name: str, point: object) -> int:
    """The step of a ``(step, weights)`` point."""
    if not isinstance(point, (list, tuple)) or len(point) != 2 or not _is_step(point[0]):
        raise ValueError(f"{name}: each point must be (step, weights) with an integer step >= 0, got {point!r}")
    return int(point[0])


def as_schedule(value: object) -> object:
    """Points as a tuple of ``(step, weights)`` tuples (a group holds what cannot change); a callable as is."""
    if value is None or callable(value):
        return value
    return tuple((int(step), tuple(float(w) for w in weights)) for step, weights in value)  # type: ignore[attr-defined]


def describe(value: ScheduleLike) -> object:
    """A schedule as a state records it: its points, or the callable's qualified name."""
    if callable(value):
        return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', type(value).__qualname__)}"
    return [[int(step), [float(w) for w in weights]] for step, weights in value]


def _is_step(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0


def _weights(name: str, value: object, count: Optional[int]) -> np.ndarray:
    """``value`` as weights: ``count`` finite numbers >= 0 (when given), not all 0."""
    out = _numbers(name, value)
    if out.ndim != 1 or (count is not None and len(out) != count):
        raise ValueError(f"{name}: weights must be {count} numbers (one per Source), got {value!r}")
    if not np.isfinite(out).all() or (out < 0).any() or not out.sum() > 0:
        raise ValueError(f"{name}: weights must be finite numbers >= 0, not all 0, got {value!r}")
    return out


def _numbers(name: str, value: object) -> np.ndarray:
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name}: weights must be a sequence of numbers, got {value!r}") from exc


class Weights:
    """The schedule's weights at a step, normalized, for ``sources`` sources."""

    def __init__(self, schedule: ScheduleLike, sources: int) -> None:
        self.schedule = schedule
        self.sources = sources
        if not callable(schedule):
            self.steps = np.asarray([int(step) for step, _ in schedule], dtype=np.float64)
            self.points = np.stack([_weights(f"Shuffle.schedule at step {step}", w, sources) for step, w in schedule])

    def at(self, step: int) -> np.ndarray:
        if callable(self.schedule):
            w = _weights(f"Shuffle.schedule({step})", self.schedule(step), self.sources)
        else:
            w = np.array([np.interp(step, self.steps, self.points[:, k]) for k in range(self.sources)])
        return w / w.sum()


class Composition:
    """Each tile's columns per source, epoch by epoch, and what each source gives every epoch.

    ``samples``: an epoch's samples; ``global_batch`` (``G``) and ``span`` (``S``) as the tiles'."""

    def __init__(self, weights: Weights, samples: int, global_batch: int, span: int, batching: str,
                 seed: int) -> None:
        self.weights = weights
        self.samples = samples
        self.g, self.s = global_batch, span
        self.batching = batching
        self.seed = seed
        self.tiles = -(-samples // (global_batch * span))
        self.steps = -(-samples // global_batch)  # an epoch's global batches
        self._columns: Dict[int, np.ndarray] = {}
        self._given: List[np.ndarray] = []  # each epoch's samples per source, from epoch 0 on
        self._before: List[np.ndarray] = [np.zeros(weights.sources, dtype=np.int64)]  # running totals of those

    def lengths(self, t: int) -> np.ndarray:
        """The samples of each of tile ``t``'s ``G`` columns: ``S``, or the last tile's share."""
        return column_lengths(min(self.samples - t * self.g * self.s, self.g * self.s), self.g)

    def columns(self, epoch: int) -> np.ndarray:
        """``[tile, source]``: the columns each source fills in each tile of ``epoch`` (the latest two kept)."""
        if epoch not in self._columns:
            if len(self._columns) >= 2:
                self._columns.pop(min(self._columns))
            self._columns[epoch] = self._drawn(epoch)
        return self._columns[epoch]

    def _drawn(self, epoch: int) -> np.ndarray:
        out = np.zeros((self.tiles, self.weights.sources), dtype=np.int64)
        owed = np.zeros(self.weights.sources)  # stratified: each source's running share less its columns
        for t in range(self.tiles):
            w = self.weights.at(epoch * self.steps + t * self.s)
            if self.batching == "stratified":
                owed += self.g * w
                out[t] = _fair(self.g, owed)
                owed -= out[t]
            else:
                out[t] = self._drawn_tile(w, derive_rng(self.seed, TILE_SPANS, _SCHEDULE, epoch, t))
        return out

    def _drawn_tile(self, w: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """A tile's columns per source drawn from the weights ``w``: each column (``"random"``), or the tile."""
        if self.batching == "random":
            return rng.multinomial(self.g, w)
        out = np.zeros(len(w), dtype=np.int64)
        out[rng.choice(len(w), p=w)] = self.g
        return out

    def given(self, epoch: int) -> np.ndarray:
        """The samples each source gives ``epoch``."""
        while len(self._given) <= epoch:
            self._given.append(self._samples_of(self.columns(len(self._given))))
            self._before.append(self._before[-1] + self._given[-1])
        return self._given[epoch]

    def _samples_of(self, columns: np.ndarray) -> np.ndarray:
        """The samples of each source in an epoch's tiles (``columns``): ``S`` a column, but in the last tile."""
        if not len(columns):
            return np.zeros(self.weights.sources, dtype=np.int64)
        last = np.bincount(np.repeat(np.arange(columns.shape[1]), columns[-1]),
                           weights=self.lengths(self.tiles - 1), minlength=columns.shape[1])
        return np.asarray(columns[:-1].sum(axis=0) * self.s + last.astype(np.int64), dtype=np.int64)

    def before(self, epoch: int) -> np.ndarray:
        """The samples each source gave the epochs before ``epoch``."""
        self.given(epoch)
        return self._before[epoch]


def column_lengths(n: int, g: int) -> np.ndarray:
    """``n`` samples as ``g`` columns of ``n // g`` or one more, the longer ones first."""
    base, extra = divmod(n, g)
    out = np.full(g, base, dtype=np.int64)
    out[:extra] += 1
    return out


def _fair(n: int, owed: np.ndarray) -> np.ndarray:
    """``n`` columns split by what each source is owed (largest remainders among those owed anything)."""
    want = np.maximum(owed, 0.0)
    exact = n * want / want.sum()
    out = np.floor(exact).astype(np.int64)
    short = n - int(out.sum())
    if short:
        out[np.argsort(out - exact, kind="stable")[:short]] += 1
    return out


def scheduled_samples(epoch_size: Optional[int], totals: Sequence[int], global_batch: int, drop_last: bool) -> int:
    """An epoch's samples under a schedule: ``epoch_size``, else all sources' (less a short last batch)."""
    n = int(sum(totals)) if epoch_size is None else epoch_size
    return n - n % global_batch if drop_last else n

