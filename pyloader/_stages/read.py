"""Stage 2: reading files — several at once, handed on strictly in plan order.

Each file is read by its own task that pulls ``DataReader`` pieces from the
runner (a thread of the executor or a worker process: the event loop never
blocks on I/O or parsing) into a small bounded queue, so a file's pieces wait
in memory only ``PIECES_AHEAD`` deep.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
from dataclasses import dataclass
from typing import AsyncGenerator, AsyncIterator, Callable, Deque, Iterator, List, Optional, Union

from .._columns import Columns
from .._errors import ErrorHandler, Failure
from .._execution.runners import Runner
from .._stats import Stats
from .source import EpochEnd, FileTask, SourceItem

PIECES_AHEAD = 2
_DONE = object()


@dataclass
class Piece:
    """Rows ``offset .. offset+n`` of one file (after the in-file shuffle; of its kept rows with ``filter_fn``).

    ``columns`` holds them here, or ``ref`` names the worker process that keeps them.
    """

    task: FileTask
    offset: int
    n: int
    columns: Optional[Columns] = None
    ref: object = None
    dropped: int = 0  # samples of the file that ``filter_fn`` dropped from this piece


class FileStream:
    """The pieces of one file, read ahead by a background task.

    A consumer that stops before the end (stream rows cut off at an epoch's end,
    errors) cancels the read, so no reader is left waiting on a full queue.
    """

    def __init__(self, task: FileTask, queue: asyncio.Queue, reader: asyncio.Task, demand: asyncio.Event) -> None:
        self.task = task
        self._queue = queue
        self._reader = reader
        self._demand = demand  # set once the consumer waits for this file: its read-ahead may exceed the budget

    def cancel(self) -> None:
        """The file is not wanted after all: stop reading it."""
        self._reader.cancel()

    async def pieces(self) -> AsyncGenerator[Piece, None]:
        offset = self.task.start
        self._demand.set()
        try:
            while True:
                item = await self._queue.get()
                if item is _DONE:
                    return
                if isinstance(item, Failure):
                    item.throw()
                n, columns, ref, dropped = item
                yield Piece(self.task, offset, n, columns, ref, dropped)
                offset += n
        finally:
            self._reader.cancel()


ReadItem = Union[FileStream, EpochEnd]
PiecesOf = Callable[[FileStream], AsyncGenerator[Piece, None]]  # a file's pieces, for batchers (``ReadFiles.pieces``)
OpenFile = Callable[[FileTask], FileStream]  # a file read now, outside the plan (``ReadFiles.open``: a replay)


class Ramp:
    """The end of the start-up ramp, signalled from downstream once the first batch is out.

    Whoever consumes the batches sets it; the read stage observes it (``ReadFiles``) and from
    then on reads ``prefetch_files`` ahead. Like an ``asyncio.Event``, but ``set`` tells its
    observers at once (no turn of the loop), so the read-ahead widens before the next batch is cut.
    """

    def __init__(self) -> None:
        self._set = False
        self._observers: List[Callable[[], None]] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            for observer in self._observers:
                observer()

    def observe(self, observer: Callable[[], None]) -> None:
        """Call ``observer`` once the ramp ends (now, if it has)."""
        self._observers.append(observer)
        if self._set:
            observer()


class ReadFiles:
    """Opens up to ``prefetch_files`` files ahead of the consumer, in plan order.

    Until ``ramp`` is set (once the first batch is out) only ``start_ahead`` files are
    read ahead of the one being batched (one per extra worker, none without workers),
    so the first file is not parsed while other files compete with it for the same cores.

    A failure of ``read_file``/``iter_file`` is delivered in order, where the
    file's pieces would have been: raised (``on_error="raise"``) or, once the
    policy chose to skip, the file ends early and counts in ``stats.skipped_files``.
    """

    def __init__(self, runner: Runner, fetch: bool, prefetch_files: int, errors: ErrorHandler, stats: Stats,
                 start_ahead: Optional[int] = None, ramp: Optional[Ramp] = None) -> None:
        self.runner = runner
        self.fetch = fetch  # bring every piece's rows here (shuffle buffer, stream mode)
        self.prefetch_files = prefetch_files
        self.errors = errors
        self.stats = stats
        self._tasks: asyncio.TaskGroup = None  # type: ignore[assignment]  # set by iterate()
        self._source: Iterator[SourceItem] = iter(())
        self._ahead: Deque[ReadItem] = collections.deque()
        self._files_ahead = 0  # the FileStreams in _ahead
        self._limit = prefetch_files
        if ramp is not None:
            if start_ahead is not None:
                self._limit = min(start_ahead, prefetch_files)
            ramp.observe(self._ramp_ended)

    def _ramp_ended(self) -> None:
        """Read ``prefetch_files`` ahead from now on."""
        if self._limit < self.prefetch_files:
            self._limit = self.prefetch_files
            if self._tasks is not None:  # iterating: open them now, not when the next file is taken
                self._fill()

    async def _read_one(self, task: FileTask, queue: asyncio.Queue, demand: asyncio.Event) -> None:
        try:
            async with contextlib.aclosing(self.runner.pieces(task, self.fetch, demand)) as pieces:
                async for piece in pieces:
                    await queue.put(piece)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # delivered in order, not where it happened
            await queue.put(Failure(exc))
            return
        await queue.put(_DONE)

    def open(self, task: FileTask) -> FileStream:
        """Start reading ``task``'s file now (outside the plan's read-ahead)."""
        queue: asyncio.Queue = asyncio.Queue(maxsize=PIECES_AHEAD)
        demand = asyncio.Event()
        reader = self._tasks.create_task(self._read_one(task, queue, demand), name=f"pyloader-read:{task.path}")
        return FileStream(task, queue, reader, demand)

    def _fill(self, need_one: bool = False) -> None:
        """Open files ahead of the one being batched, up to the limit (at least one when ``need_one``)."""
        while self._files_ahead < self._limit or (need_one and not self._ahead):
            item: Optional[SourceItem] = next(self._source, None)
            if item is None:  # the plan is over (an iterator, once exhausted, stays so)
                return
            if isinstance(item, EpochEnd):
                self._ahead.append(item)
            else:
                self._ahead.append(self.open(item))
                self._files_ahead += 1

    async def iterate(self, source: Iterator[SourceItem], tasks: asyncio.TaskGroup) -> AsyncIterator[ReadItem]:
        self._tasks, self._source = tasks, source
        while True:
            self._fill(need_one=True)
            if not self._ahead:
                return
            item = self._ahead.popleft()
            self._files_ahead -= isinstance(item, FileStream)
            self._fill()
            yield item

    async def pieces(self, stream: FileStream) -> AsyncGenerator[Piece, None]:
        """The pieces of ``stream``; a failure goes through the error policy."""
        try:
            async for piece in stream.pieces():
                self.stats.samples_read += piece.n
                self.stats.filtered_samples += piece.dropped
                yield piece
            self.stats.file_read(stream.task.epoch)
        except Exception as exc:
            self.errors("read_file", [stream.task.path], exc)
            self.stats.skipped_files += 1
