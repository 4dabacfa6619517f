"""Rotation (``rotation=R``): each encoded sample served R times per epoch, at places spread through it.

Contracts:

* **Where.** Between ``batch_encode`` and ``collate_batch``. What ``batch_encode`` gives is cut into
  samples (one item per sample in every field; the same fields, and the same per-sample shape of an
  array field, in every batch, since samples of different batches share batches here), held
  (``_storage.held``), served R times, cut into batches of ``batch_size`` again and collated in this
  process (with workers, the workers read and encode). ``batch_encode`` runs once per sample and
  epoch, ``collate_batch`` on every batch served.
* **The schedule.** An epoch's encoded samples, in the order the loader serves them without
  rotation, are cut into windows of ``c = rotation_size // R`` samples (the epoch's last window may
  be shorter). Window ``j`` is served once in each of the phases ``j .. j + R - 1`` (its rounds
  ``0 .. R - 1``), so phase ``k`` serves a round of each of up to R windows, interleaved: cycle ``m``
  of the phase serves the ``m``-th sample of each window's round, the windows in an order drawn for
  that cycle. Round 0 is the arrival order; round ``r + 1`` sorts round ``r``'s samples by
  ``place + h * u`` (``u`` uniform in [0, 1), ``h = n // 2`` for a window of ``n`` samples), so a
  sample moves fewer than ``h`` places from one round to the next. Hence every sample is served
  exactly R times, its servings lie in consecutive phases, at least ``n - h + 1`` places apart (more
  than half a window; about R·c on average, R windows interleaving), and a batch mixes up to R windows.
  The draws come from ``(random_seed, epoch)``; with ``shuffle=False`` and no ``file_order`` from
  ``random_seed`` alone, so that every epoch is served in the same order.
* **Counts.** An epoch of N samples serves R·N, cut into ``ceil(R·N / batch_size)`` batches, only the
  last one short; with ``drop_last`` the short batch is dropped before rotating, leaving
  ``R·floor(N / batch_size)`` full ones (``_stages.shard.batches_of``). ``len()`` and the steps ranks plan
  count so.
* **Held.** At most ``R·c <= rotation_size`` samples: the windows in play, plus what is left of the
  group of encoded batches that filled the newest one (the next window's first samples). With
  ``rotation_dir`` the sealed windows are on disk (never more than ``rotation_size`` samples) and
  only the window being filled is in memory. The stage learns that an epoch has ended when a batch
  of the next epoch (or the run's end) arrives; the epoch's last phases wait for that.
* **Ranks.** Each rank rotates its own share (padding samples too, still flagged). The steps every
  rank gives are planned from the counts (``steps``); the stage never gives more, and tops an epoch
  short of samples (lost to skipped errors) up with copies of its last batch flagged as padding, as
  the batcher does without rotation (a resumed run makes the same ones); ``EvenSteps`` fills the
  holes batches skipped in ``collate_batch`` leave.
* **Resume.** A resumed epoch is served again from its start (its samples read and encoded again;
  the batches before the position are not collated, ``_pipeline``): the schedule is a pure function
  of the samples, the seed and the epoch.
* **Errors.** A batch whose samples cannot be rotated (fields of unequal lengths, fields or shapes
  that change) fails at stage ``rotation``, naming its files; ``on_error`` handles it like a failed
  ``batch_encode``. A window that cannot be written to ``rotation_dir`` (a field that cannot be
  stored without pickle, ``_storage.codec``; the disk) stops the iteration, whatever ``on_error`` says
  (stage ``rotation``, naming the window's files).
"""
from __future__ import annotations

import collections
import dataclasses
from typing import AsyncIterator, Callable, Deque, Dict, List, Optional, Tuple

import numpy as np

from .._columns import Columns, Provenance, Traced, check_columns, concat, interleave, n_rows, slice_rows
from .._errors import ErrorHandler, PipelineError
from .._rng import ROTATION, derive_rng
from .._stats import Stats
from .._storage.held import Held, HeldRows, Window
from .batch import PADDING, Batch, Group, GroupSize

WINDOW_BATCHES = GroupSize.LIMIT  # the default rotation_size: R windows of this many batches
_ROUNDS, _CYCLES = 0, 1  # the keys of the draws
Entries = Tuple[np.ndarray, np.ndarray, np.ndarray]  # samples served: their window, their row there, their round


def held_samples(times: int, given: Optional[int], batch_size: int) -> int:
    """The samples rotation holds at once: ``given``, else ``times`` windows of 32 batches."""
    return given or times * WINDOW_BATCHES * batch_size


def round_orders(n: int, rotation: int, rng: np.random.Generator) -> List[np.ndarray]:
    """A window of ``n`` samples' rows in each round: the arrival order, then each round its
    predecessor's, each sample moved fewer than ``n // 2`` places (see the module's contracts)."""
    orders = [np.arange(n)]
    jitter = n // 2
    for _ in range(1, rotation):
        keys = np.arange(n) + jitter * rng.random(n)
        orders.append(orders[-1][np.argsort(keys, kind="stable")])
    return orders


class _Feed:
    """The encoded groups, an epoch at a time."""

    def __init__(self, groups: AsyncIterator[Group]) -> None:
        self._groups = groups
        self._next: Optional[Group] = None

    async def epoch(self) -> Optional[int]:
        """The epoch of the next group; ``None`` at the end of the run (an iterator that has ended
        stays so)."""
        if self._next is None:
            self._next = await anext(self._groups, None)
        return None if self._next is None else self._next[0].epoch

    async def take(self, epoch: int) -> Optional[Group]:
        """The next group of ``epoch``; ``None`` once the epoch has ended."""
        if await self.epoch() != epoch:
            return None
        group, self._next = self._next, None
        return group


class Rotation:
    """Serves each encoded sample ``rotation`` times per epoch, re-batched (see the module's contracts).

    ``run_blocking(fn, *args)`` runs ``fn`` off the event loop (writing and reading held samples);
    ``steps(epoch)``, under ranks, is the number of batches every rank gives.
    """

    def __init__(self, rotation: int, held_samples: int, batch_size: int, drop_last: bool, seed: int,
                 by_epoch: bool, held: Held, errors: ErrorHandler, stats: Stats, run_blocking: Callable,
                 steps: Optional[Callable[[int], int]] = None) -> None:
        self.rotation = rotation
        self.window = held_samples // rotation
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.seed = seed
        self.by_epoch = by_epoch
        self.held = held
        self.errors = errors
        self.stats = stats
        self.run_blocking = run_blocking
        self.steps = steps

    async def iterate(self, groups: AsyncIterator[Group]) -> AsyncIterator[Group]:
        feed = _Feed(groups)
        while (epoch := await feed.epoch()) is not None:
            async for group in _Epoch(self, epoch, feed).serve():
                yield group

    def close(self) -> None:
        """Let go of every sample held (on disk: remove the run's folder)."""
        self.held.close()


class _Fields:
    """Checks that every batch cut into samples has the fields, and the per-sample shapes of its
    array fields, of the epoch's first one."""

    def __init__(self) -> None:
        self.fields: Optional[List[str]] = None
        self.shapes: Dict[str, Tuple[Tuple[int, ...], str]] = {}  # the array fields' per-sample shapes and kinds

    def check(self, data: object) -> Columns:
        columns = check_columns(data, None, "batch_encode's output, cut into samples by rotation")
        shapes = {key: (col.shape[1:], col.dtype.kind) for key, col in columns.items() if isinstance(col, np.ndarray)}
        if self.fields is None:
            self.fields, self.shapes = sorted(columns), shapes
        if sorted(columns) != self.fields:
            raise ValueError(f"batch_encode gave fields {sorted(columns)} here and {self.fields} before: "
                             f"rotation puts samples of different batches together, so every batch needs the "
                             f"same fields")
        for key, shape in shapes.items():
            before = self.shapes.get(key, shape)  # a field that held no array before is not compared
            if shape != before:
                raise ValueError(f"field {key!r} holds arrays of {shape[0]} (dtype kind {shape[1]!r}) per "
                                 f"sample here and of {before[0]} ({before[1]!r}) before: "
                                 f"rotation puts samples of different batches together, so pad in "
                                 f"collate_batch rather than in batch_encode")
        return dict(columns)


class _Epoch:
    """One epoch's windows, and where its schedule stands."""

    def __init__(self, stage: Rotation, epoch: int, feed: _Feed) -> None:
        self.stage = stage
        self.epoch = epoch
        self.feed = feed
        self.key = epoch if stage.by_epoch else 0  # the epoch the draws are made for
        self.windows: Dict[int, HeldRows] = {}  # j: a Window filling, or sealed (``Held.seal``)
        self.orders: Dict[int, List[np.ndarray]] = {}  # j: its rows in each round, once sealed
        self.filling: Optional[int] = None
        self.pending: Deque[Tuple[Traced, Tuple[str, ...]]] = collections.deque()  # chunks (and their files)
        self.files: Dict[int, Dict[str, None]] = {}  # j: the files of its samples, for errors
        self.ended = False  # every sample of the epoch has arrived
        self.fields = _Fields()
        self.paths: Dict[Tuple[str, ...], int] = {}  # the files of the batches that came, by first arrival
        self.path_list: List[Tuple[str, ...]] = []
        self.out = _Cutter(self)

    async def serve(self) -> AsyncIterator[Group]:
        rotation = self.stage.rotation
        k = 0
        while await self._begin(k):
            lanes = self._lanes(k)
            order = derive_rng(self.stage.seed, ROTATION, self.key, _CYCLES, k).random(
                (self.stage.window, rotation)).argsort(axis=1)
            m = 0
            while True:
                ready = self._ready(k)
                if ready > m:
                    self.out.add(self._entries(k, lanes, order[m:ready], m))
                    m = ready
                    for group in await self.out.full():
                        yield group
                if self.filling != k:  # filled, and every cycle at hand served
                    break
                await self._pull()
            await self.out.settle()  # the samples served so far leave their windows: the oldest goes now
            self._drop(k - rotation + 1)
            k += 1
        for group in await self.out.end():
            yield group

    # -- windows ---------------------------------------------------------------------------
    async def _begin(self, k: int) -> bool:
        """Start phase ``k``: window ``k`` fills, unless every sample has gone into a window;
        ``False`` when no window is left to serve."""
        if self.pending or not self.ended:
            self.filling = k
            self.windows[k], self.files[k] = Window(self.stage.held), {}
            await self._fill()
        return any(j in self.windows for j in range(k - self.stage.rotation + 1, k + 1))

    def _lanes(self, k: int) -> np.ndarray:
        """The window in each lane (``j % rotation``) in phase ``k``; -1 where there is none."""
        lanes = np.full(self.stage.rotation, -1, dtype=np.int64)
        for j in range(max(0, k - self.stage.rotation + 1), k + 1):
            lanes[j % self.stage.rotation] = j
        return lanes

    def _size(self, j: int) -> int:
        return self.windows[j].n if j in self.windows else 0

    def _ready(self, k: int) -> int:
        """The cycles of phase ``k`` whose samples are all at hand: those the filling window has
        samples for, or (once filled) the whole phase."""
        if self.filling == k:
            return self._size(k)
        return max(self._size(j) for j in range(k - self.stage.rotation + 1, k + 1))

    async def _pull(self) -> None:
        """More samples for the filling window: the next group of encoded batches, or the epoch's end."""
        group = await self.feed.take(self.epoch)
        if group is None:
            self.ended = True
            await self._seal()
            return
        self.pending.extend(self._chunks(group))
        await self._fill()

    async def _fill(self) -> None:
        """The filling window takes the pending samples, up to its size (then it is sealed)."""
        j = self.filling
        assert j is not None, "a window is being filled"
        window = self.windows[j]
        assert isinstance(window, Window), "the filling window is not sealed yet"
        while self.pending and window.n < self.stage.window:
            chunk, paths = self._pending(self.stage.window - window.n)
            window.add(chunk)
            self.files[j].update(dict.fromkeys(paths))
        if window.n == self.stage.window:
            await self._seal()

    def _pending(self, room: int) -> Tuple[Traced, Tuple[str, ...]]:
        """The next pending chunk (and its files), cut to ``room`` samples: the rest stays pending, first."""
        held = self.stage.held
        chunk, paths = self.pending.popleft()
        n = held.rows(chunk)
        if n > room:
            self.pending.appendleft((held.cut(chunk, room, n), paths))
            chunk = held.cut(chunk, 0, room)
        return chunk, paths

    async def _seal(self) -> None:
        j, self.filling = self.filling, None
        assert j is not None, "a window is being filled"
        window, files = self.windows[j], self.files.pop(j)
        if not window.n:
            del self.windows[j]
            return
        rng = derive_rng(self.stage.seed, ROTATION, self.key, _ROUNDS, j)
        self.orders[j] = round_orders(window.n, self.stage.rotation, rng)
        try:
            self.windows[j] = await self.stage.run_blocking(self.stage.held.seal, f"{self.epoch}-{j}", window)
        except Exception as exc:  # writing it to rotation_dir failed
            raise PipelineError("rotation", list(files), exc) from exc

    def _drop(self, j: int) -> None:
        window = self.windows.pop(j, None)
        self.orders.pop(j, None)
        if window is not None:
            self.stage.held.drop(window)

    def _chunks(self, group: Group) -> List[Tuple[Traced, Tuple[str, ...]]]:
        """The samples of each encoded batch of ``group`` as a chunk to hold, with their files and
        metadata; a batch that cannot be cut into samples fails at stage ``rotation``."""
        chunks = []
        for batch in group:
            try:
                columns = self.fields.check(batch.data)
                n = n_rows(columns)
                if not n:
                    continue
                chunks.append((self.stage.held.chunk(Traced(columns, self._provenance(batch, n))), batch.paths))
            except (ValueError, TypeError) as exc:
                self.stage.errors("rotation", batch.paths, exc)
                self.stage.stats.skipped_batches += 1
        return chunks

    def _provenance(self, batch: Batch, n: int) -> Provenance:
        """What each of the ``n`` samples of ``batch`` keeps beside its fields: its batch's files, and
        under ranks its row's padding flag (the only metadata a batch has before rotation)."""
        meta = batch.meta or {}
        assert set(meta) <= {PADDING}, "batches come to rotation with their padding flags alone"
        files = np.full(n, self._path_id(batch.paths), dtype=np.int32)
        flags = meta.get(PADDING)
        if flags is None:
            return Provenance(batch_files=files)
        if len(flags) != n:
            raise ValueError(f"batch_encode gave {n} samples for {len(flags)} rows: under ranks each "
                             f"sample keeps its row's {PADDING} flag, so rotation needs one per row")
        return Provenance(padding=np.asarray(flags), batch_files=files)

    def _path_id(self, paths: Tuple[str, ...]) -> int:
        if paths not in self.paths:
            self.paths[paths] = len(self.path_list)
            self.path_list.append(paths)
        return self.paths[paths]

    # -- serving ---------------------------------------------------------------------------
    def _entries(self, k: int, lanes: np.ndarray, order: np.ndarray, first: int) -> Entries:
        """What cycles ``first ..`` of phase ``k`` serve (``order``: each cycle's lanes in turn)."""
        rotation = self.stage.rotation
        lane = order.ravel()
        cycle = np.repeat(np.arange(first, first + len(order)), rotation)
        sizes = np.array([self._size(j) for j in lanes.tolist()])
        keep = cycle < sizes[lane]
        window, cycle = lanes[lane[keep]], cycle[keep]
        rows = cycle.copy()  # round 0 (window k's, filling): the arrival order
        for j in np.unique(window[window != k]).tolist():
            at = window == j
            rows[at] = self.orders[j][k - j][cycle[at]]
        return window, rows, k - window

    def take(self, window: np.ndarray, rows: np.ndarray) -> Traced:
        """The samples at ``rows`` of ``window`` (one of each per sample), in that order."""
        return interleave(window, lambda j, at: self.windows[j].take(rows[at]), "rotation")

    def batch(self, index: int, rows: Traced) -> Batch:
        """Batch ``index`` of the rotated epoch, made of ``rows``: their columns, their files and
        padding flags from their provenance."""
        ids, flags = rows.provenance.batch_files, rows.provenance.padding
        assert ids is not None, "rotated rows carry their batches' files"
        paths = tuple(dict.fromkeys(p for i in np.unique(ids).tolist() for p in self.path_list[i]))
        return Batch(self.epoch, index, rows.columns, paths, None if flags is None else {PADDING: np.asarray(flags)})


class _Cutter:
    """Cuts the samples an epoch serves into batches of ``batch_size``, in groups."""

    def __init__(self, epoch: _Epoch) -> None:
        self.epoch = epoch
        self.stage = epoch.stage
        self.entries: List[Entries] = []
        self.count = 0  # samples in ``entries``
        self.carry: Optional[Traced] = None  # fewer than a batch of samples, taken already
        self.index = 0
        self.sizes = GroupSize()
        self.limit = None if self.stage.steps is None else self.stage.steps(epoch.epoch)
        self.last: Optional[Batch] = None  # under ranks: a copy of the last batch cut, to pad the epoch with

    def add(self, entries: Entries) -> None:
        self.entries.append(entries)
        self.count += len(entries[0])

    def _carried(self) -> int:
        return 0 if self.carry is None else n_rows(self.carry)

    async def _take(self, n: int) -> Traced:
        """The next ``n`` samples served, after those carried."""
        window, rows, rounds = (np.concatenate(parts) for parts in zip(*self.entries))
        rest = (window[n:], rows[n:], rounds[n:])
        self.entries, self.count = [rest], len(rest[0])
        self.stage.stats.rotated_samples += int(np.count_nonzero(rounds[:n]))
        taken = await self.stage.run_blocking(self.epoch.take, window[:n], rows[:n])
        carry, self.carry = self.carry, None
        return taken if carry is None else concat([carry, taken], "rotation")

    async def full(self) -> List[Group]:
        """The full batches at hand, in groups."""
        groups = []
        size = self.stage.batch_size
        while self._carried() + self.count >= size:
            n = min(self.sizes.take(), (self._carried() + self.count) // size)
            groups.append(self._cut(await self._take(n * size - self._carried()), n))
        return [group for group in groups if group]

    async def settle(self) -> None:
        """Take the samples served so far (fewer than a batch), so that their windows may go."""
        if self.count:
            self.carry = await self._take(self.count)

    async def end(self) -> List[Group]:
        """The epoch's last, short batch, alone in its group (unless ``drop_last``); under ranks, the
        planned steps the epoch still owes (samples lost to skipped errors)."""
        await self.settle()
        group = [] if self.carry is None or self.stage.drop_last else self._cut(self.carry, 1)
        return ([group] if group else []) + self._padding()

    def _cut(self, columns: Traced, n: int) -> Group:
        """``n`` batches of ``columns`` (the last may be short), none past the planned steps."""
        size, group = self.stage.batch_size, []
        for k in range(n):
            if self.limit is None or self.index < self.limit:
                group.append(self.epoch.batch(self.index, slice_rows(columns, k * size, (k + 1) * size)))
                if self.limit is not None:
                    self.last = dataclasses.replace(group[-1], data=dict(group[-1].data))
            self.index += 1
        return group

    def _padding(self) -> List[Group]:
        """Copies of the epoch's last batch flagged as padding, up to the planned steps (as the
        batcher pads a share short of samples): a resumed run makes the same ones."""
        last, groups = self.last, []
        while last is not None and self.limit is not None and self.index < self.limit:
            end = min(self.limit, self.index + GroupSize.LIMIT)
            flags = {key: np.ones(len(value), dtype=bool) for key, value in (last.meta or {}).items()}
            groups.append([dataclasses.replace(last, index=k, data=dict(last.data), meta=dict(flags))
                           for k in range(self.index, end)])
            self.index = end
        return groups
