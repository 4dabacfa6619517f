"""Reading files' bytes ahead of their parser: one read-ahead over two byte sources.

The read stage asks ``ReadAhead.fetch(path, demand)`` for each file it reads ahead
(``prefetch_files`` of them) and hands the result to the reader's ``open_file``:

- local files are read with aiofiles, remote ones (any fsspec URL or chain) with their
  fsspec filesystem, through the local disk cache when there is one (``_storage.cache``), with
  transient errors retried (``_storage.remote``); both off the event loop;
- a file of at most ``readahead_bytes`` is read whole (``ServedBytes``); a larger one is
  read in blocks by a task that stays ahead of its parser (``BlockStream``), so that
  parsing a huge file never waits for its whole read, nor holds it in memory.

Contracts:

- The budget: the bytes read ahead and not yet taken by a parser (a whole file until its
  reader opens it, a block until its parser has read past it) stay within
  ``readahead_bytes``. A file the consumer is waiting for (``demand``), or a parser
  waiting for its next block, is never held back by the budget: it goes over by that
  file or block instead, so nothing can wait on the budget forever.
- Every byte is read once: a reader that does not open its files through ``open_file``
  (it would read each file twice) stops the local read-ahead after its first file, and a
  memory-mapped ``.npy`` (``NumpyReader(mmap=True)``) is never read ahead: it keeps its
  zero-copy path.
- A failure (a file deleted after listing, a refused permission, a remote error after its
  retries) is raised where the file is read, so it reaches the consumer in plan order,
  naming the file. A remote file is delivered once and whole: its retries happen block
  by block, before a block is handed on.
- With worker processes, remote files no larger than the budget are read ahead here and
  sent to the worker that parses them; local files, and larger remote ones, are read by
  the worker itself (their bytes would otherwise cross a socket: in ``bench_cold.py``
  sending 8 MiB ``.npy`` files to 2 workers ran at a third of the speed of the workers
  reading them).
- Every remote file read goes into the cache (when there is one and it fits): a larger one
  that a worker parses, or that its reader reads by byte ranges (``_reads_ranges``), is
  fetched into the cache here first, whole, a block at a time, and then read from its entry
  (``_storage.cached_file``). Without a cache, such a reader reads a larger remote file by
  its ranges itself: a stream in order would fetch it whole, then its ranges again.
- ``readahead_bytes=0``: nothing is read ahead, readers open their files themselves; but with a
  cache a remote file is fetched into it first (a block at a time, held only until it is on the
  disk, outside the budget) and served from its entry, so the cache works whatever the budget.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import io
import logging
import threading
import time
from typing import IO, TYPE_CHECKING, Any, Callable, ContextManager, Deque, Dict, List, Optional, Protocol, Tuple

import aiofiles
import aiofiles.os

from .._paths import local_path
from .cache import DiskCache, Entry, EntryWriter
from .cached_file import ServedEntry
from .files import SeekableRaw, Served, ServedBytes, direct_open, is_url
from .remote import RemoteRanges, awith_retries, filesystem, serialized, version

if TYPE_CHECKING:
    from aiofiles.threadpool.binary import AsyncBufferedReader

logger = logging.getLogger("pyloader")

DEFAULT_READAHEAD_BYTES = 256 * 2**20
MIN_BLOCK, MAX_BLOCK = 4 * 2**10, 8 * 2**20
_POLL_S = 1.0  # how often a parser waiting for a block checks that the loop is still there


class _IoExecutor(concurrent.futures.Executor):
    """Hands aiofiles' blocking calls to the loader's own threads: ``run_in_executor`` takes any
    executor, and an asyncio future returned by ``submit`` is used as it is."""

    def __init__(self, run_io: Callable[..., "asyncio.Future[object]"]) -> None:
        self._run_io = run_io

    def submit(self, fn: Callable, /, *args: object, **kwargs: object) -> Any:
        return self._run_io(functools.partial(fn, *args, **kwargs))


class _ByteSource(Protocol):
    """A file's bytes on the loop: a local file (``_LocalFile``) or a remote one (``_RemoteFile``)."""

    @property
    def size(self) -> Optional[int]: ...

    async def whole(self) -> bytes: ...

    async def read(self, start: int, n: int) -> bytes: ...

    async def close(self, complete: bool) -> None: ...


async def first_of(*events: asyncio.Event) -> None:
    """Wait until one of ``events`` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


class Budget:
    """Bytes read ahead, at most ``limit``: a request waits (in the order requests came) until
    its bytes fit, or until ``demand`` is set; then it goes over, and takes nothing."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiting: Deque[Tuple[int, "asyncio.Future[None]"]] = collections.deque()

    async def take(self, n: int, demand: asyncio.Event) -> int:
        """Wait for ``n`` bytes; the bytes taken (``n``, or 0 when ``demand`` came first)."""
        if not self._waiting:
            if self.used + n <= self.limit:
                return self._grant(n)
            if demand.is_set():
                return 0
        turn: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        waiter = (n, turn)
        self._waiting.append(waiter)
        demanded = asyncio.ensure_future(demand.wait())
        try:
            await asyncio.wait((turn, demanded), return_when=asyncio.FIRST_COMPLETED)  # not first_of: turn is a future
        except BaseException:  # cancelled: bytes granted meanwhile go back
            if turn.done():  # granted (only the finally below cancels it)
                self.give(n)
            raise
        finally:
            demanded.cancel()
            self._withdraw(waiter)
        return n if not turn.cancelled() else 0

    def _withdraw(self, waiter: Tuple[int, "asyncio.Future[None]"]) -> None:
        """A request that stopped waiting leaves the queue, unless its turn came (then it holds its bytes)."""
        _, turn = waiter
        if not turn.done():
            turn.cancel()
            self._waiting.remove(waiter)
            self._wake()  # the next one may fit now

    def _grant(self, n: int) -> int:
        self.used += n
        return n

    def give(self, n: int) -> None:
        if n:
            self.used -= n
            self._wake()

    def _wake(self) -> None:
        while self._waiting and self.used + self._waiting[0][0] <= self.limit:
            n, turn = self._waiting.popleft()
            self._grant(n)
            turn.set_result(None)


def _give_back(loop: asyncio.AbstractEventLoop, budget: Budget, n: int) -> None:
    """``budget.give(n)`` from any thread (nothing, once the run's loop is gone)."""
    if n:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the run, and its budget, are over
            loop.call_soon_threadsafe(budget.give, n)


class _LocalFile:
    """A local file's bytes, through aiofiles on the loader's threads."""

    def __init__(self, path: str, size: int, executor: _IoExecutor) -> None:
        self.path, self.size, self._executor = path, size, executor
        self._file: Optional[AsyncBufferedReader] = None

    @classmethod
    async def open(cls, path: str, executor: _IoExecutor) -> "_LocalFile":
        stat = await aiofiles.os.stat(path, executor=executor)
        return cls(path, stat.st_size, executor)

    async def whole(self) -> bytes:
        f = await aiofiles.open(self.path, "rb", executor=self._executor)
        try:
            return await f.read()
        finally:  # at once, here: a close sent to the executor never runs once a stopping run's threads are gone
            f._file.close()

    async def read(self, start: int, n: int) -> bytes:
        if self._file is None:
            self._file = await aiofiles.open(self.path, "rb", executor=self._executor)
        await self._file.seek(start)  # where it already is, a seek costs what a tell() to check it would
        return await self._file.read(n)

    async def close(self, complete: bool) -> None:
        f = self._file
        if f is not None:
            self._file = None
            try:
                await f.close()
            except RuntimeError:  # the run's threads are gone (it is stopping): close it here
                f._file.close()


def _holding(lock: ContextManager[object], fn: Callable, *args: object) -> Any:
    with lock:
        return fn(*args)


class _RemoteFile:
    """A remote file's bytes through its fsspec filesystem, each call retried; served from, or
    written to, the disk cache when there is one."""

    def __init__(self, url: str, run_io: Callable, retries: int, cache: Optional[DiskCache],
                 on_close: Optional[Callable[[], None]] = None) -> None:
        self.url, self._run_io, self._retries, self._cache = url, run_io, retries, cache
        self._on_close = on_close
        self._fs, self._path = filesystem(url)
        self._lock = serialized(self._fs)
        self.size: Optional[int] = None
        self._version = ""
        self._remote = RemoteRanges(self._fs, self._path)
        self.entry: Optional[Entry] = None
        self._writer: Optional[EntryWriter] = None
        self._cached = _LocalFile("", 0, _IoExecutor(run_io))

    async def _call(self, fn: Callable, *args: object) -> Any:
        return await awith_retries(lambda: self._run_io(_holding, self._lock, fn, *args), repr(self.url),
                                   self._retries)

    async def open(self) -> None:
        info = await self._call(self._fs.info, self._path)
        self.size = info.get("size")
        self._version = version(info)
        entry = await self.cached_entry()
        if entry is not None:
            self._cached = _LocalFile(entry.data_path, entry.size, self._cached._executor)

    async def cached_entry(self) -> Optional[Entry]:
        """The file's entry in the cache: the one found by ``open``, else the one its read wrote."""
        if self.entry is None and self._cache is not None and self.size is not None:
            self.entry = await self._run_io(self._cache.lookup, self.url, self.size, self._version)
        return self.entry

    def block_size(self, default: int) -> int:
        return self.entry.block_size if self.entry is not None else default

    async def whole(self) -> bytes:
        if self.entry is not None:
            cached = await self._cached_whole(self.entry)
            if cached is not None:
                return cached
        # on S3 by range from the size known (s3fs's cat_file asks for it again, a HEAD before each GET)
        data = await (self._range(0, self.size) if self._remote.resumable and self.size is not None
                      else self._call(self._fs.cat_file, self._path))
        if self._cache is not None and self.size == len(data) and self._cache.fits(len(data)):
            await self._run_io(_store, self._cache, self.url, data, self._version)
        return data

    async def read(self, start: int, n: int) -> bytes:
        if self.entry is not None:
            cached = await self._cached_block(self.entry, start, n)
            if cached is not None:
                return cached
        block = await self._range(start, start + n)
        if start == 0 and self._cache is not None and self.size is not None and self._cache.fits(self.size):
            self._writer = await self._run_io(self._cache.writer, self.url, self.size, self._version, n)
        if self._writer is not None:
            await self._run_io(self._writer.add, block)
        return block

    async def _range(self, start: int, end: int) -> bytes:
        """Bytes ``start:end`` (fewer at the file's end), a request at a time, each asking for the bytes the
        ones before did not get: a body cut short is resumed from the byte it reached, and a request that got
        further than the one before counts its own attempts (``retries`` bounds the attempts of one request)."""
        got: List[bytes] = []
        await awith_retries(lambda: self._run_io(_holding, self._lock, self._remote.read_range, start, end, got),
                            repr(self.url), self._retries, lambda: sum(map(len, got)))
        return b"".join(got)

    async def _cached_whole(self, entry: Entry) -> Optional[bytes]:
        """The file from its cache entry, every block checked; ``None`` (the entry dropped) when it fails."""
        try:
            data = await self._cached.whole()
            why = "" if await self._run_io(_all_blocks_check, entry, data) else "a block failed its check"
        except OSError as exc:  # gone meanwhile (room made for another file), or not a file
            data, why = b"", f"reading it failed ({exc})"
        return await self._checked(entry, data, why)

    async def _cached_block(self, entry: Entry, start: int, n: int) -> Optional[bytes]:
        """Bytes ``start:start + n`` from the cache entry, checked; ``None`` (the entry dropped) when that fails."""
        index = start // entry.block_size
        try:
            block = await self._cached.read(start, n)
            why = "" if start % entry.block_size == 0 and await self._run_io(entry.check, index, block) \
                else f"block {index} failed its check"
        except OSError as exc:  # gone meanwhile (room made for another file), or not a file
            block, why = b"", f"reading block {index} failed ({exc})"
        return await self._checked(entry, block, why)

    async def _checked(self, entry: Entry, data: bytes, why: str) -> Optional[bytes]:
        """``data``, read from the cache entry, when ``why`` is empty; else ``None``: the entry is dropped
        (``why`` says what failed) and the rest comes from the remote file (the blocks before were sound)."""
        if not why:
            return data
        await self._run_io(self._cache.drop, entry, why)  # type: ignore[union-attr]
        self.entry = None
        await self._cached.close(False)
        return None

    async def close(self, complete: bool) -> None:
        try:
            await self._cached.close(complete)
            writer, self._writer = self._writer, None
            if writer is not None:
                await self._run_io(writer.commit if complete else writer.abort)
        finally:
            on_close, self._on_close = self._on_close, None
            if on_close is not None:
                on_close()


def _finished(fetching: Dict[str, asyncio.Event], path: str, done: asyncio.Event) -> None:
    done.set()
    if fetching.get(path) is done:
        del fetching[path]


def _all_blocks_check(entry: Entry, data: bytes) -> bool:
    size = entry.block_size
    return len(data) == entry.size and all(entry.check(k, data[k * size:(k + 1) * size])
                                           for k in range(-(-len(data) // size)))  # none for an empty file


def _store(cache: DiskCache, url: str, data: bytes, version: str) -> None:
    writer = cache.writer(url, len(data), version, MAX_BLOCK)
    try:
        writer.add(data)
    except BaseException:
        writer.abort()
        raise
    writer.commit()


class IoClock:
    """Seconds spent in storage calls on the loader's threads (``loader.stats``' ``read_bytes``): not the
    waits for a thread, for the budget or for the loop, which a loaded process stretches."""

    def __init__(self) -> None:
        self._spent = 0.0
        self._lock = threading.Lock()

    def call(self, fn: Callable, *args: object) -> Any:
        began = time.perf_counter()
        try:
            return fn(*args)
        finally:
            spent = time.perf_counter() - began
            with self._lock:
                self._spent += spent

    def take(self) -> float:
        """The seconds spent since the last ``take``."""
        with self._lock:
            spent, self._spent = self._spent, 0.0
        return spent


def _clocked_io(run_io: Callable, clock: IoClock, fn: Callable, *args: object) -> "asyncio.Future[object]":
    return run_io(clock.call, fn, *args)


class ReadAhead:
    """The read-ahead of one run: budget, byte sources, cache and retries (see the module docstring)."""

    def __init__(self, run_io: Callable, reader: object, limit: int = DEFAULT_READAHEAD_BYTES, retries: int = 0,
                 cache: Optional[DiskCache] = None) -> None:
        self.io = IoClock()
        run_io = functools.partial(_clocked_io, run_io, self.io)
        self._run_io = run_io
        self._executor = _IoExecutor(run_io)
        self._reader = reader
        self.budget = Budget(limit)
        self.block_size = max(MIN_BLOCK, min(MAX_BLOCK, limit // 4)) if limit else MAX_BLOCK  # 0: cache fills
        self.retries = retries
        self.cache = cache
        self.local = True  # local files are read ahead (until a reader shows it does not use open_file)
        self._fetching: Dict[str, asyncio.Event] = {}  # remote files being fetched into the cache

    async def fetch(self, path: str, demand: asyncio.Event, streams: bool = True) -> Optional[Served]:
        """What ``open_file(path)`` will serve, read (or, for a large file, being read) ahead;
        ``None`` when the reader is to open the file itself. ``streams=False`` (for a worker
        process): only remote files are read ahead, those larger than the budget into the cache."""
        if is_url(path):
            return await self._fetch_remote(path, demand, streams)
        # a worker process reads a local file itself: its bytes need not cross a socket;
        # readahead_bytes=0: readers open their local files themselves
        if not (streams and self.budget.limit and self.local) or _maps_itself(self._reader, path):
            return None
        source = await _LocalFile.open(local_path(path), self._executor)
        if source.size <= self.budget.limit:
            return await self._whole(source, demand)
        return BlockStream(path, source, source.size, self.budget, self.block_size)

    async def _fetch_remote(self, path: str, demand: asyncio.Event, streams: bool) -> Optional[Served]:
        if not self.budget.limit:
            return await self._into_cache(path, demand)
        source = await self._open_remote(path, demand)
        size = source.size
        if size is None or size <= self.budget.limit:
            return await self._whole(source, demand)
        if not streams or _reads_ranges(self._reader, path):
            return await self._by_ranges(source, size, demand)
        return BlockStream(path, source, size, self.budget, source.block_size(self.block_size))

    async def _into_cache(self, path: str, demand: asyncio.Event) -> Optional[Served]:
        """``readahead_bytes=0``: a remote file fetched into the cache (unknown size: not at all) and served
        from its entry; ``None`` (the reader opens the file itself) without a cache."""
        if self.cache is None:
            return None
        source = await self._open_remote(path, demand)
        if source.size == 0:
            return await self._whole(source, demand)
        return await self._by_ranges(source, source.size or 0, demand)

    async def _by_ranges(self, source: _RemoteFile, size: int, demand: asyncio.Event) -> Optional[ServedEntry]:
        """A large remote file read by byte ranges: from its cache entry when the cache can hold it,
        else (``None``) by the reader itself."""
        if self.cache is not None and self.cache.fits(size):
            return await self._cached(source, size, demand)
        await source.close(False)
        return None

    async def _open_remote(self, path: str, demand: asyncio.Event) -> _RemoteFile:
        """With a cache, a file already being fetched (the same file of the next epoch, read ahead
        while this epoch's copy is still on its way) waits for that copy: it then comes from the
        cache, unless the consumer waits for it first."""
        on_close = None
        if self.cache is not None:
            while path in self._fetching and not demand.is_set():
                await first_of(self._fetching[path], demand)
            if path not in self._fetching:
                done = self._fetching[path] = asyncio.Event()
                on_close = functools.partial(_finished, self._fetching, path, done)
        source = _RemoteFile(path, self._run_io, self.retries, self.cache, on_close)
        try:
            await source.open()
        except BaseException:
            await source.close(False)
            raise
        return source

    async def _whole(self, source: _ByteSource, demand: asyncio.Event) -> ServedBytes:
        taken = await self.budget.take(source.size or 0, demand)
        try:
            data = await source.whole()
        except BaseException:
            self.budget.give(taken)
            raise
        finally:
            await source.close(False)
        return ServedBytes(data, functools.partial(_give_back, asyncio.get_running_loop(), self.budget, taken))

    async def _cached(self, source: _RemoteFile, size: int, demand: asyncio.Event) -> Optional[ServedEntry]:
        """A large remote file (of ``size`` bytes) served from its cache entry, written first if there is
        none yet, a block at a time (each within the budget until it is on the disk); ``None`` when the
        entry went before it could be served (the reader then opens the remote file itself)."""
        complete = source.entry is not None
        try:
            pos = 0
            while not complete and pos < size:
                n = min(self.block_size, size - pos)
                taken = await self.budget.take(n, demand) if self.budget.limit else 0  # 0: into the cache alone
                try:
                    data = await source.read(pos, n)
                finally:
                    self.budget.give(taken)
                if not data:
                    raise ValueError(f"{source.url!r} ended at byte {pos}, before the {size} bytes "
                                     "it had when its read began")
                pos += len(data)
                complete = pos >= size
        finally:
            await source.close(complete)
        entry = await source.cached_entry()
        return None if entry is None else ServedEntry(entry)

    def unused(self, path: str, served: Optional[Served]) -> None:
        """The reader read ``path`` to its end without opening it through ``open_file``: it opens
        its files itself, so reading local files ahead would read each twice."""
        if served is not None and not served.claimed and not is_url(path) and self.local:
            self.local = False
            logger.debug("pyloader: the reader does not open its files through open_file: "
                         "local files are no longer read ahead in this run")


def _reads_ranges(reader: object, path: str) -> bool:
    """A reader that reads byte ranges anywhere in a file (``ParquetReader``: the footer, then the
    chunks of its columns, its ``_reads_ranges``) reads a large remote file by those ranges itself, or
    from its cache entry: streamed in order, it would be fetched whole and then its ranges again."""
    return _answer(reader, "_reads_ranges", path)


def _maps_itself(reader: object, path: str) -> bool:
    """A reader that maps a local file itself (zero copy: ``NumpyReader(mmap=True)`` and a ``.npy``, its
    ``_maps_itself``) would read it twice if it were read ahead. Asked, not looked up: storage imports no reader."""
    return _answer(reader, "_maps_itself", path)


def _answer(reader: object, question: str, path: str) -> bool:
    """The reader's answer to one of the read-ahead's questions about ``path``; no, when it has no such method."""
    ask = getattr(reader, question, None)
    return bool(ask is not None and ask(path))


class BlockStream(Served, SeekableRaw):
    """A large file served to its parser block by block, as a task on the loop reads them ahead.

    It seeks anywhere: within the blocks still held, by skipping ahead, or past the end
    (a size query); to an offset before the blocks still held it switches to opening the
    file itself (``direct_open``) and goes on from there. Served once: a second
    ``open_file`` of the path opens the file itself.
    """

    def __init__(self, path: str, source: _ByteSource, size: int, budget: Budget, block_size: int) -> None:
        io.RawIOBase.__init__(self)
        self.path = path
        self.size = size
        self._source, self._budget, self._block_size = source, budget, block_size
        self._loop = asyncio.get_running_loop()
        self._cond = threading.Condition()
        self._blocks: Deque[Tuple[int, bytes, int]] = collections.deque()  # (offset, bytes, budget taken)
        self._ended = False
        self._error: Optional[BaseException] = None
        self.claimed = False
        self._released = False
        self._pos = 0
        self._direct: Optional[IO[bytes]] = None
        self._hungry = asyncio.Event()  # the parser waits for a block: read it whatever the budget
        self._task = self._loop.create_task(self._produce(), name=f"pyloader-readahead:{path}")

    # -- the loop's side ---------------------------------------------------------------
    async def _produce(self) -> None:
        pos = 0
        try:
            while pos < self.size:
                n = min(self._block_size, self.size - pos)
                taken = await self._budget.take(n, self._hungry)
                try:
                    data = await self._source.read(pos, n)
                    if not data:
                        raise ValueError(f"{self.path!r} ended at byte {pos}, before the {self.size} bytes "
                                         "it had when its read began")
                except BaseException:
                    self._budget.give(taken)
                    raise
                with self._cond:
                    self._blocks.append((pos, data, taken))
                    self._cond.notify_all()
                self._hungry.clear()
                pos += len(data)
        except asyncio.CancelledError:
            self._end(RuntimeError(f"the read-ahead of {self.path!r} was stopped"))
            raise
        except BaseException as exc:
            self._end(exc)
        else:
            self._end(None)
        finally:
            try:
                await self._source.close(pos >= self.size)
            except Exception as exc:  # a cache entry not written: it is fetched again next time
                logger.debug("pyloader: closing the read of %r: %s", self.path, exc)

    def _end(self, error: Optional[BaseException]) -> None:
        with self._cond:
            self._ended = True
            self._error = error
            self._cond.notify_all()

    # -- the parser's side -------------------------------------------------------------
    def open(self) -> Optional[IO[bytes]]:
        with self._cond:
            if self.claimed or self._released:
                return None
            self.claimed = True
        return io.BufferedReader(self, buffer_size=64 * 2**10)


    def readinto(self, buffer: Any) -> int:
        if self._direct is not None:
            self._direct.seek(self._pos)
            n = self._direct.readinto(buffer)  # type: ignore[attr-defined]
            self._pos += n
            return n
        with self._cond:
            block = self._block_at_pos()
        if block is None:
            return self.readinto(buffer) if self._direct is not None else 0
        offset, data = block
        start = self._pos - offset
        n = min(len(buffer), len(data) - start)
        buffer[:n] = data[start:start + n]
        self._pos += n
        return n

    def _block_at_pos(self) -> Optional[Tuple[int, bytes]]:
        """The held block that has the byte at the position, waiting for it if it is yet to come;
        ``None`` at the end of the file, or once switched to reading the file itself. Blocks
        wholly before the position are let go."""
        while True:
            if self._pos >= self.size:
                return None
            self._let_go_before_pos()
            if self._first_holds_pos():
                return self._blocks[0][:2]
            if self._blocks or self._released:  # the position is before the blocks held
                self._go_direct()
                return None
            if self._ended:
                raise self._why_ended()
            self._wait()

    def _first_holds_pos(self) -> bool:
        """Whether the first block held begins at or before the position (blocks before it are let go)."""
        return bool(self._blocks) and self._blocks[0][0] <= self._pos

    def _why_ended(self) -> BaseException:
        """The error the read-ahead ended on before the position; ``ValueError`` where it had none."""
        return self._error if self._error is not None else ValueError(f"read-ahead of {self.path!r} ended early")

    def _let_go_before_pos(self) -> None:
        """Give back the budget of the held blocks that end before the position."""
        while self._blocks and self._blocks[0][0] + len(self._blocks[0][1]) <= self._pos:
            _, _, taken = self._blocks.popleft()
            _give_back(self._loop, self._budget, taken)

    def _wait(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._hungry.set)
        except RuntimeError:
            raise RuntimeError(f"the read-ahead of {self.path!r} stopped: the loader's loop is closed") from None
        self._cond.wait(_POLL_S)

    def _go_direct(self) -> None:
        self._direct = direct_open(self.path)
        self._stop()

    def _stop(self) -> None:
        """Stop reading ahead and give back the budget of the blocks held (``_cond`` held)."""
        if not self._ended:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the task is over
                self._loop.call_soon_threadsafe(self._task.cancel)
        while self._blocks:
            _give_back(self._loop, self._budget, self._blocks.popleft()[2])

    def close(self) -> None:
        if not self.closed:
            self.release()
            if self._direct is not None:
                self._direct.close()
        io.RawIOBase.close(self)

    def release(self) -> None:
        with self._cond:
            self._released = True
            self._stop()
