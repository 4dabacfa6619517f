"""Where user methods run: threads of the loop's executor, or worker processes.

Both runners offer the same two calls, so the stages do not care which is used:

* ``pieces(task, fetch)``: the pieces of one file, in order, as ``(n, columns, ref, dropped)``
  (``dropped``: the samples ``filter_fn`` dropped from the piece);
* ``run(datas)``: ``batch_encode`` then ``collate_batch`` on each batch of a
  group, given as ``Columns`` or as ``Segments`` (rows of pieces, possibly kept
  in workers); one ``Outcome`` per batch. ``StackedRows`` run at once on the
  loop when every step can (``run_stacked``), else like any other group.

User methods that run in this process go through a ``Lane`` (at most
``num_threads`` at once); reading a file's bytes ahead, which is only I/O, goes
through the run's ``ReadAhead`` (``_storage.bytes``).
"""
from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import itertools
import os
import threading
import time
import weakref
from typing import (
    Any,
    AsyncGenerator,
    Awaitable,
    Callable,
    Deque,
    Dict,
    Generator,
    List,
    Optional,
    Protocol,
    Sequence,
    Set,
    Tuple,
    TypeGuard,
    Union,
    cast,
)

from .._abc import is_thread_safe
from .._columns import Columns, n_rows, slice_rows
from .._stats import Busy, waited
from .._storage.bytes import ReadAhead
from .._storage.cached_file import ServedEntry
from .._storage.files import Served
from .filter import unbundle
from .measured import FEWER, HERE, SPLIT, SPREAD, Measured
from .pool import RemoteRef, WorkerPool, rebuild_error
from .reading import FileTask, pieces_with_end
from .steps import (
    BatchData,
    Key,
    Outcome,
    Segments,
    StackedOutputs,
    StackedSegments,
    Step,
    StepFailed,
    run_each,
    run_stacked,
)

_DONE = object()
_Job = Tuple[List[Tuple[object, int, int]], Tuple[str, ...], Optional[Key]]  # a worker's job: rows, paths, key


STEPS = (0,)  # a Lane priority: encoding and collating a group the consumer waits for


def read_priority(task: FileTask) -> Tuple[int, int, int]:
    """A Lane priority for reading ``task``: after the steps, earlier files first."""
    return (1, task.epoch, task.pos)


class Exclusive:
    """One lock per user object that is not thread-safe (``is_thread_safe``): a call
    ``using`` such objects holds their locks while it runs, wherever it runs from
    (the lane's threads, or ``len()`` counting in the caller's thread). A forked
    child gets fresh locks: one held by a thread of the parent would never be released."""

    def __init__(self, objects: Sequence[object]) -> None:
        self._locks = {id(obj): threading.Lock() for obj in objects if not is_thread_safe(obj)}
        _all_exclusive.add(self)

    def _renew(self) -> None:
        self._locks = {key: threading.Lock() for key in self._locks}

    def keys(self, uses: Sequence[object]) -> Tuple[int, ...]:
        """The locks a call using ``uses`` needs, in the one order every call takes them in."""
        return tuple(sorted({id(obj) for obj in uses if id(obj) in self._locks}))

    def call(self, keys: Tuple[int, ...], fn: Callable, *args: Any) -> Any:
        with contextlib.ExitStack() as held:
            for key in keys:
                held.enter_context(self._locks[key])
            return fn(*args)


_all_exclusive: "weakref.WeakSet[Exclusive]" = weakref.WeakSet()


def _renew_locks_in_child() -> None:
    for exclusive in list(_all_exclusive):
        exclusive._renew()


os.register_at_fork(after_in_child=_renew_locks_in_child)


class Lane:
    """Runs blocking calls ``threads`` at a time; a waiting call with a lower ``priority``
    starts first, calls of equal priority in the order they came.

    User methods that run in this process share one lane, ``num_threads`` wide. The
    loader's default lets every file read ahead and every group in flight run at
    once, which pays for methods that release the GIL; Python code holds it, so
    its threads only take turns, with each other and with the consumer, and every
    switch costs (a JSON parse and encode ran up to 10% slower in 8 threads than
    in 1). When calls wait, the steps go before reads and earlier files before
    later ones, so batches the consumer waits for are not queued behind files that
    are read ahead (as in a worker, ``_execution.worker``).

    A call names the user objects it ``uses``: it holds their ``Exclusive`` locks
    while it runs, and the lane does not start a call whose objects another call
    of its own is using (it waits without taking a thread). A call cancelled while
    its function runs frees its slot at once; the thread finishes the function
    on its own, still holding the locks.
    """

    def __init__(self, run_blocking: Callable, threads: int, exclusive: Exclusive) -> None:
        self._run_blocking = run_blocking
        self._free = threads
        self.exclusive = exclusive
        self._busy: Set[int] = set()  # the locks that calls now running hold
        self._waiting: List[Tuple[object, int, Tuple[int, ...], asyncio.Future]] = []
        self._order = itertools.count()

    def idle(self, keys: Tuple[int, ...]) -> bool:
        """No call of this lane holds any of ``keys`` (from ``Exclusive.keys``)."""
        return self._busy.isdisjoint(keys)

    async def run(self, fn: Callable, *args: Any, priority: Any = STEPS, uses: Sequence[Any] = ()) -> Any:
        keys = self.exclusive.keys(uses)
        if self._can_start(keys):
            self._take(keys)
        else:
            turn = asyncio.get_running_loop().create_future()
            bisect.insort(self._waiting, (priority, next(self._order), keys, turn))  # kept in the order they start
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():  # given the slot as it was cancelled
                    self._release(keys)
                raise
        try:
            return await self._run_blocking(self.exclusive.call, keys, fn, *args)
        finally:
            self._release(keys)

    def _can_start(self, keys: Tuple[int, ...]) -> bool:
        """A slot is free and no call of this lane holds any of ``keys``."""
        return self._free > 0 and self.idle(keys)

    def _take(self, keys: Tuple[int, ...]) -> None:
        self._free -= 1
        self._busy.update(keys)

    def _release(self, keys: Tuple[int, ...]) -> None:
        """Free a slot and ``keys``, and start the waiting calls that can start now, best priority first."""
        self._free += 1
        self._busy.difference_update(keys)
        kept: List[Tuple[object, int, Tuple[int, ...], asyncio.Future]] = []
        for k, entry in enumerate(self._waiting):
            if not self._free:  # nothing more can start: the rest wait, in their order
                kept.extend(self._waiting[k:])
                break
            turn, wanted = entry[3], entry[2]
            if turn.done():  # cancelled while waiting
                continue
            if self._can_start(wanted):
                self._take(wanted)
                turn.set_result(None)
            else:
                kept.append(entry)
        self._waiting = kept


def _local(data: BatchData) -> Columns:
    return data.local() if isinstance(data, Segments) else data


def _timed(steps: Sequence[Step], datas: List[BatchData], busy: Optional[Busy],
           keys: Optional[Sequence[Key]] = None) -> Tuple[List[Outcome], float]:
    start = time.perf_counter()
    return run_each(steps, datas, _local, busy, keys), (time.perf_counter() - start) / max(1, len(datas))


class LocalSteps:
    """The user's steps run in this process: in an executor thread, or on the loop itself
    when they are cheap.

    Batches whose steps take only microseconds (arrays already model-ready) are
    not worth a trip to another thread: once the last ``_WINDOW`` groups took
    less than ``INLINE_BELOW`` seconds per batch, groups run on the loop itself,
    until one takes longer.
    """

    INLINE_BELOW = 50e-6
    _WINDOW = 8
    _MEASURED = 3

    def __init__(self, steps: List[Step], lane: Lane, uses: Sequence[object], busy: Optional[Busy] = None) -> None:
        self.steps = steps
        self.lane = lane
        self.uses = uses
        self.busy = busy
        self._keys = lane.exclusive.keys(uses)
        self._recent: Deque[float] = collections.deque(maxlen=self._WINDOW)

    def cost(self) -> Optional[float]:
        """The least time per batch among the last groups (the first ones pay for warming up),
        or ``None`` until ``_MEASURED`` groups ran here."""
        return min(self._recent) if len(self._recent) >= self._MEASURED else None

    def _cheap(self) -> bool:
        """The last ``_WINDOW`` groups took less than ``INLINE_BELOW`` per batch, and the objects are free:
        the next group runs on the loop itself."""
        return (len(self._recent) == self._WINDOW and max(self._recent) < self.INLINE_BELOW
                and self.lane.idle(self._keys))

    async def run(self, datas: Sequence[BatchData],
                  keys: Optional[Sequence[Key]] = None) -> Union[List[Outcome], StackedOutputs]:
        """The steps on each batch (``keys``: each batch's, for ``pyloader.rng()``)."""
        done = run_stacked(self.steps, datas, self.busy)
        if done is not None:
            return done
        result, took = self.lane.exclusive.call(self._keys, _timed, self.steps, datas, self.busy, keys) \
            if self._cheap() else await self.lane.run(_timed, self.steps, datas, self.busy, keys, uses=self.uses)
        self._recent.append(took)
        return result


Pieces = AsyncGenerator[Tuple[int, Optional[Columns], object, int], None]  # (n, columns, ref, dropped) of each piece
Run = Callable[..., Awaitable[Union[List[Outcome], StackedOutputs]]]  # (datas, keys=None)


class Runner(Protocol):
    """The one interface the stages see of where user code runs: ``ThreadRunner`` (threads of this
    process), ``PoolRunner`` (worker processes), or a runner wrapped for in-memory streams
    (``_stages.entries.with_memory``)."""

    run: Run  # ``batch_encode`` then ``collate_batch`` (and pinning) on each batch of a group

    def pieces(self, task: FileTask, fetch: bool, demand: asyncio.Event) -> Pieces:
        """The pieces of ``task``'s file, in order (``fetch``: their rows brought to this process)."""

    def encoding_only(self, uses: Sequence[object]) -> Run:
        """``run`` with ``batch_encode`` alone."""


class ThreadRunner:
    """``num_workers=0``: everything in this process, off the event loop (see ``LocalSteps``)."""

    def __init__(self, reader: object, steps: List[Step], lane: Lane, readahead: ReadAhead,
                 uses: Sequence[object], busy: Optional[Busy] = None) -> None:
        self.reader = reader  # a DataReader, or one bundled with filter_fn (``_execution.filter.Filtered``)
        self._reader_uses = (unbundle(reader)[0],)
        self.lane = lane
        self.readahead = readahead
        self.busy = busy
        self._steps, self._uses = steps, uses
        self.run = LocalSteps(steps, lane, uses, busy).run

    def encoding_only(self, uses: Sequence[object]) -> Run:
        """``run`` with the first step alone, ``batch_encode`` (``uses``: its object): an epoch whose
        encoded batches are cached (``_stages.cached_epochs``)."""
        return LocalSteps(self._steps[:1], self.lane, uses, self.busy).run

    async def pieces(self, task: FileTask, fetch: bool,
                     demand: asyncio.Event) -> AsyncGenerator[Tuple[int, Columns, None, int], None]:
        """The file's pieces, its bytes read ahead (``demand``: the consumer waits for this file)."""
        began = time.perf_counter()
        served = None if task.ranged else await self.readahead.fetch(task.path, demand)  # a range reads its own
        waited(self.busy, "read_bytes", task.path, began, self.readahead.io.take())
        gen = _Stepped(pieces_with_end(self.reader, task, served, self.busy))
        last = False
        try:
            while not last:
                item = await self.lane.run(gen.step, priority=read_priority(task), uses=self._reader_uses)
                if item is _DONE or item[1]:
                    self.readahead.unused(task.path, served)
                if item is _DONE:
                    return
                columns, last, dropped = item
                yield n_rows(columns), columns, None, dropped
        finally:
            gen.close()  # the reader's own clean-up (closing its file)
            if served is not None:
                served.release()


class _Stepped:
    """A generator stepped in executor threads and closed from the loop whenever the run is done
    with it: a close that comes while a step runs is made by that step's thread as it ends, so the
    reader's clean-up (closing its file) never waits for the garbage collector."""

    def __init__(self, gen: Generator[object, None, None]) -> None:
        self._gen = gen
        self._lock = threading.Lock()
        self._closing = False

    def step(self) -> object:
        with self._lock:
            item = next(self._gen, _DONE)
        if self._closing:
            self.close()
        return item

    def close(self) -> None:
        self._closing = True
        if self._lock.acquire(blocking=False):  # else the step running now closes it as it ends
            try:
                self._gen.close()
            finally:
                self._lock.release()


class PoolRunner:
    """``num_workers>0``: reading, encoding and collating in worker processes.

    A file is read by one worker, which keeps its pieces unless ``fetch`` asks
    for them; a batch whose rows all sit in one worker is encoded there without
    moving them. Other batches gather their rows here and go to the least busy
    worker. ``finish`` steps (e.g. making TF tensors) run here, off the loop.

    A group whose rows are all here already (stream mode, a shuffle buffer) runs
    here when its steps are cheaper than the trip to a worker and back
    (``RUN_HERE_BELOW`` per batch, measured on the first such groups and again
    every ``_REMEASURE`` groups): workers then only read and parse.
    """

    RUN_HERE_BELOW = 100e-6
    _REMEASURE = 64

    def __init__(self, pool: WorkerPool, finish: List[Step], lane: Lane, readahead: ReadAhead,
                 all_steps: List[Step], uses: Sequence[object], busy: Optional[Busy] = None, op: str = "run") -> None:
        self.pool = pool
        self.op = op  # the workers' request: "run" (every step of theirs) or "encode" (batch_encode alone)
        self.finish = finish
        self.lane = lane
        self.readahead = readahead
        self.uses = uses
        self.busy = busy
        self.here = LocalSteps(all_steps, lane, uses, busy)
        self._turn = 0
        self._sent = 0  # groups of rows here that went to workers since the last measurement

    def encoding_only(self, uses: Sequence[object]) -> Run:
        """``run`` with ``batch_encode`` alone, in the workers (``uses``: its object): an epoch whose
        encoded batches are cached, then collated in this process (``_stages.cached_epochs``)."""
        return PoolRunner(self.pool, [], self.lane, self.readahead, all_steps=self.here.steps[:1], uses=uses,
                          busy=self.busy, op="encode").run

    async def pieces(self, task: FileTask, fetch: bool, demand: asyncio.Event, fewer: bool = False) -> Pieces:
        """The file's pieces, read in a worker from the bytes read ahead here (a file larger than
        the read-ahead budget: from its cache entry, written here, else read by the worker itself);
        ``fewer``: in any worker but the last."""
        self.pool.check(f"reading {task.path!r}")
        began = time.perf_counter()
        served = None if task.ranged else await self.readahead.fetch(task.path, demand, streams=False)
        waited(self.busy, "read_bytes", task.path, began, self.readahead.io.take())
        worker = self._reader_for_next_file(fewer)
        gid = self.pool.new_id()
        self.pool.post(worker, ("open", gid, task, _sendable(served)))
        last = False
        try:
            while not last:
                pid = self.pool.new_id()
                got = await self.pool.request(worker, "next", gid, pid, fetch, doing=f"reading {task.path!r}")
                if served is not None:
                    served.release()  # the bytes are the worker's now
                if got is None:
                    return
                n, columns, last, dropped, row_bytes = got
                yield n, columns, (None if fetch else RemoteRef(self.pool, worker, pid, row_bytes)), dropped
        finally:
            self.pool.post(worker, ("close", gid))
            if served is not None:
                served.release()

    def _reader_for_next_file(self, fewer: bool = False) -> int:
        """The next live worker in turn: files go round the workers in plan order (``fewer``: all
        but the last, which then leaves its core to the consumer).

        A file's in-file batches run where it was read, so consecutive files on
        different workers means that while the consumer waits for one file's
        batches, the other workers encode the next files' (choosing "the least
        busy worker now" sent runs of files to one worker).
        """
        n = self.pool.num_workers - (fewer and self.pool.num_workers > 1)
        order = [(self._turn + i) % n for i in range(n)]
        worker = next((w for w in order if self.pool.alive(w)), order[0])
        self._turn = (worker + 1) % self.pool.num_workers
        return worker

    async def _gathered(self, data: BatchData, key: Optional[Key]) -> list:
        """Run a batch whose rows are not all in one worker: in the worker that keeps most of them,
        the others sent along (a batch that spans two files' pieces moves only the rows of the
        smaller part); with no rows in a worker, in the least busy one."""
        if not isinstance(data, Segments):
            whole: List[_Job] = [([(data, 0, n_rows(data))], (), key)]
            return await self.pool.request(self.pool.least_loaded(), self.op, whole, doing=_doing(whole))
        worker = _keeping_most(data, otherwise=self.pool.least_loaded())
        jobs: List[_Job] = [(await self._spec_in(worker, data), data.paths, key)]
        return await self.pool.request(worker, self.op, jobs, doing=_doing(jobs))

    async def _spec_in(self, worker: int, data: Segments) -> List[Tuple[object, int, int]]:
        """The rows of ``data`` as ``worker`` takes them: its own pieces by id, the rows held here and
        those fetched from other workers sent along."""
        spec: List[Tuple[object, int, int]] = []
        for p, start, end in data.parts:
            if p.ref is None:
                assert p.columns is not None, "a piece held here has its columns"
                spec.append((slice_rows(p.columns, start, end), 0, end - start))
            elif p.ref.worker == worker:
                spec.append((p.ref.pid, start, end))
            else:
                part = await self.pool.request(p.ref.worker, "fetch", p.ref.pid, start, end,
                                               doing=f"sending rows of {p.task.path!r}")
                spec.append((part, 0, end - start))
        return spec

    def _run_here(self, datas: Sequence[BatchData]) -> bool:
        if not _all_rows_here(datas):
            return False
        cost = self.here.cost()
        if cost is None or cost < self.RUN_HERE_BELOW or self._sent >= self._REMEASURE:
            self._sent = 0
            return True
        self._sent += 1
        return False

    async def run(self, datas: Sequence[BatchData],
                  keys: Optional[Sequence[Key]] = None) -> Union[List[Outcome], StackedOutputs]:
        """Consecutive batches kept in one worker go in one request, sent at once; a batch
        whose rows must be gathered first (a file boundary) does not hold them up. ``keys``:
        each batch's, for ``pyloader.rng()`` (they travel with the jobs)."""
        doing = _doing(_jobs_of(datas))
        self.pool.check(doing)
        done = run_stacked(self.here.steps, datas, self.busy)
        if done is not None:
            return done
        if self._whole_group(datas):
            return await self._stacked(datas, keys, doing)
        if self._run_here(datas):
            return await self.here.run(datas, keys)
        return await self._in_workers(datas, keys)

    def _whole_group(self, datas: Sequence[BatchData]) -> TypeGuard[StackedSegments]:
        """Whether ``datas`` go to their worker as one group (``_stacked``): batches of one piece kept there,
        run as they are (no ``finish``)."""
        return isinstance(datas, StackedSegments) and self.op == "run" and not self.finish

    async def _in_workers(self, datas: Sequence[BatchData], keys: Optional[Sequence[Key]]) -> List[Outcome]:
        """``datas`` run in the workers, consecutive batches of one worker in one request; then finished here."""
        replies = await asyncio.gather(*(self._requested(worker, jobs) for worker, jobs in _requests(datas, keys)),
                                       return_exceptions=True)
        outcomes = _outcomes(replies)
        if self.finish:
            outcomes = await self.lane.run(_finish_each, self.finish, outcomes, self.busy, uses=self.uses)
        return outcomes

    async def _stacked(self, datas: StackedSegments, keys: Optional[Sequence[Key]],
                       doing: str) -> Union[List[Outcome], StackedOutputs]:
        """A group of full batches of one piece kept in a worker, run there: at once where every step can
        (the outputs of all its batches, one message), else batch by batch."""
        ref = datas.piece.ref
        at_once, replies = await self.pool.request(
            ref.worker, "stacked", (ref.pid, datas.start, datas.size, len(datas)), datas.paths,
            None if keys is None else list(keys), doing=doing)
        if not at_once:
            return _outcomes([replies])
        ok, value = replies[0]
        return StackedOutputs(value) if ok else [_outcome(ok, value)] * len(datas)

    def _requested(self, worker: Optional[int], jobs: list) -> Awaitable[list]:
        if worker is None:
            return self._gathered(*jobs[0])
        return self.pool.request(worker, self.op, jobs, doing=_doing(jobs))


def _requests(datas: Sequence[BatchData], keys: Optional[Sequence[Key]]) -> List[Tuple[Optional[int], list]]:
    """``(worker, jobs)`` for each run of consecutive batches kept in one worker, or
    ``(None, [(batch, key)])`` for a batch whose rows must be gathered."""
    parts: List[Tuple[Optional[int], list]] = []
    for k, data in enumerate(datas):
        key = None if keys is None else keys[k]
        kept = _kept_in_one_worker(data)
        if kept is None:
            parts.append((None, [(data, key)]))
            continue
        worker, spec = kept
        if not parts or parts[-1][0] != worker:
            parts.append((worker, []))
        parts[-1][1].append((spec, cast(Segments, data).paths, key))
    return parts


def _outcomes(replies: List[Any]) -> List[Outcome]:
    """Each batch's outcome in the workers' ``replies`` (from ``gather``: the first failed request raises)."""
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
    return [_outcome(ok, value) for reply in replies for ok, value in reply]


def _sendable(served: Optional[Served]) -> Union[None, bytes, ServedEntry]:
    """What of ``served`` goes to a worker: bytes, or a cache entry it reads from the disk itself."""
    return served if isinstance(served, ServedEntry) else getattr(served, "data", None)


def _jobs_of(datas: Sequence[BatchData]) -> list:
    """``datas`` as jobs for ``_doing``: only their paths."""
    if isinstance(datas, StackedSegments):
        return [(None, datas.paths)] * len(datas)
    return [(None, d.paths if isinstance(d, Segments) else ()) for d in datas]


def _kept_in_one_worker(data: BatchData) -> Optional[Tuple[int, list]]:
    """The worker keeping every row of ``data`` and the batch's spec there, if there is one."""
    if not isinstance(data, Segments) or any(p.ref is None for p, _, _ in data.parts):
        return None
    workers = {p.ref.worker for p, _, _ in data.parts}
    if len(workers) != 1:
        return None
    return workers.pop(), [(p.ref.pid, start, end) for p, start, end in data.parts]


def _keeping_most(data: Segments, otherwise: int) -> int:
    """The worker keeping most rows of ``data`` (the first such in its parts), ``otherwise`` if none keeps any."""
    rows: Dict[int, int] = {}
    for p, start, end in data.parts:
        if p.ref is not None:
            rows[p.ref.worker] = rows.get(p.ref.worker, 0) + end - start
    return max(rows, key=rows.__getitem__, default=otherwise)


def _all_rows_here(datas: Sequence[BatchData]) -> bool:
    return all(not isinstance(data, Segments) or all(p.ref is None for p, _, _ in data.parts) for data in datas)


def _outcome(ok: bool, value: Any) -> Outcome:
    if ok:
        return value
    error = rebuild_error(value)
    if not isinstance(error, StepFailed):
        raise error  # not a user step's failure (rows that cannot share a batch): the run fails
    return error


def _doing(jobs: list) -> str:
    paths = list(dict.fromkeys(p for job in jobs for p in job[1]))  # a job: (spec, paths, key)
    return f"encoding and collating {len(jobs)} batch(es)" + (f" of {', '.join(map(repr, paths))}" if paths else "")


def _finish_each(steps: Sequence[Step], outcomes: List[Outcome], busy: Optional[Busy]) -> List[Outcome]:
    """The steps run here after the worker's, on the batches that did not fail there."""
    done = iter(run_each(steps, [o for o in outcomes if not isinstance(o, StepFailed)], busy=busy))
    return [o if isinstance(o, StepFailed) else next(done) for o in outcomes]


class MeasuredRunner:
    """``num_workers="auto"`` with workers started: each file read, and its batches encoded and collated,
    where ``measured`` places it (``_execution.measured``): in this process (``here``), in the workers
    (``there``), or read there and its rows fetched here (then encoded here, or spread over the
    workers). A group whose rows are all here, of files placed here or read there to be encoded here,
    runs here; any other goes through ``there``, which sends rows held here to the least busy worker."""

    def __init__(self, here: ThreadRunner, there: PoolRunner, measured: Measured) -> None:
        self.here, self.there, self.measured = here, there, measured
        self.run: Run = self._routed(here.run, there.run)

    def encoding_only(self, uses: Sequence[object]) -> Run:
        return self._routed(self.here.encoding_only(uses), self.there.encoding_only(uses))

    async def pieces(self, task: FileTask, fetch: bool, demand: asyncio.Event) -> Pieces:
        self.there.pool.check(f"reading {task.path!r}")
        place = self.measured.place(task.epoch, task.path, task.pos)
        pieces: Pieces = (self.here.pieces(task, fetch, demand) if place == HERE
                          else self.there.pieces(task, fetch or place in (SPLIT, SPREAD), demand,
                                                 fewer=place == FEWER))
        async with contextlib.aclosing(pieces):  # closed as soon as this is: the file's clean-up does not wait
            async for piece in pieces:
                yield piece

    def _routed(self, here: Run, there: Run) -> Run:
        async def run(datas: Sequence[BatchData],
                      keys: Optional[Sequence[Key]] = None) -> Union[List[Outcome], StackedOutputs]:
            if self._placed_here(datas):
                self.there.pool.check(_doing(_jobs_of(datas)))
                return await here(datas, keys)
            return await there(datas, keys)
        return run

    def _placed_here(self, datas: Sequence[BatchData]) -> bool:
        if not _all_rows_here(datas):
            return False
        files = [(p.task.epoch, p.task.path) for d in datas if isinstance(d, Segments) for p, _, _ in d.parts]
        return (self.measured.window_of(files) if files else self.measured.current.place) in (HERE, SPLIT)
