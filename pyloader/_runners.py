"""Where user methods run: threads of the loop's executor, or worker processes.

Both runners offer the same two calls, so the stages do not care which is used:

* ``pieces(task, fetch)``: the pieces of one file, in order, as ``(n, columns, ref)``;
* ``run(data)``: ``batch_encode`` then ``collate_batch`` on a batch given as
  ``Columns`` or as ``Segments`` (rows of pieces, possibly kept in workers).
"""
from __future__ import annotations

import collections
import time
from typing import Any, AsyncIterator, Callable, Deque, List, Optional, Sequence, Tuple, Union

from ._abc import DataReader
from ._batch import Segments
from ._columns import Columns, n_rows, slice_rows
from ._files import is_url
from ._map import Step, run_steps
from ._pool import RemoteRef, WorkerPool
from ._read import file_pieces
from ._remote import fetch_bytes
from ._source import FileTask

_DONE = object()
PREFETCH_MAX_BYTES = 256 * 2**20  # a larger remote file is streamed by its reader instead


async def _fetch_remote(run_blocking: Callable, task: FileTask) -> Optional[bytes]:
    """A remote file's bytes, fetched while earlier files are being worked on (hides latency)."""
    if not is_url(task.path):
        return None
    return await run_blocking(fetch_bytes, task.path, PREFETCH_MAX_BYTES)


BatchData = Union[Columns, Segments]


def _assemble_and_run(steps: Sequence[Step], data: BatchData) -> Any:
    return run_steps(steps, data.local() if isinstance(data, Segments) else data)


def _timed(steps: Sequence[Step], data: BatchData) -> Tuple[Any, float]:
    start = time.perf_counter()
    return _assemble_and_run(steps, data), time.perf_counter() - start


class ThreadRunner:
    """``num_workers=0``: everything in this process, off the event loop.

    Batches whose steps take only microseconds (arrays already model-ready) are
    not worth a trip to another thread: once the last ``_WINDOW`` batches each
    took less than ``INLINE_BELOW`` seconds, batches run on the loop itself,
    until one takes longer.
    """

    INLINE_BELOW = 50e-6
    _WINDOW = 8

    def __init__(self, reader: DataReader, steps: List[Step], run_blocking: Callable) -> None:
        self.reader = reader
        self.steps = steps
        self.run_blocking = run_blocking
        self._recent: Deque[float] = collections.deque(maxlen=self._WINDOW)

    async def pieces(self, task: FileTask, fetch: bool) -> AsyncIterator[Tuple[int, Columns, None]]:
        gen = file_pieces(self.reader, task, await _fetch_remote(self.run_blocking, task))
        try:
            while True:
                columns = await self.run_blocking(next, gen, _DONE)
                if columns is _DONE:
                    return
                yield n_rows(columns), columns, None
        finally:
            try:
                gen.close()  # the reader's own clean-up (closing its file)
            except ValueError:
                pass  # still running in the executor: it closes when collected

    async def run(self, data: BatchData) -> Any:
        cheap = len(self._recent) == self._WINDOW and max(self._recent) < self.INLINE_BELOW
        result, took = _timed(self.steps, data) if cheap else await self.run_blocking(_timed, self.steps, data)
        self._recent.append(took)
        return result


class PoolRunner:
    """``num_workers>0``: reading, encoding and collating in worker processes.

    A file is read by one worker, which keeps its pieces unless ``fetch`` asks
    for them; a batch whose rows all sit in one worker is encoded there without
    moving them. Other batches gather their rows here and go to the least busy
    worker. ``finish`` steps (e.g. making TF tensors) run here, off the loop.
    """

    def __init__(self, pool: WorkerPool, finish: List[Step], run_blocking: Callable) -> None:
        self.pool = pool
        self.finish = finish
        self.run_blocking = run_blocking

    async def pieces(self, task: FileTask, fetch: bool) -> AsyncIterator[Tuple[int, Optional[Columns], Any]]:
        data = await _fetch_remote(self.run_blocking, task)
        worker = self.pool.least_loaded()
        gid = self.pool.new_id()
        self.pool.post(worker, ("open", gid, task, data))
        try:
            while True:
                pid = self.pool.new_id()
                got = await self.pool.request(worker, "next", gid, pid, fetch, doing=f"reading {task.path!r}")
                if got is None:
                    return
                n, columns = got
                yield n, columns, (None if fetch else RemoteRef(self.pool, worker, pid))
        finally:
            self.pool.post(worker, ("close", gid))

    async def run(self, data: BatchData) -> Any:
        if isinstance(data, Segments):
            paths = data.paths
            workers = {p.ref.worker for p, _, _ in data.parts if p.ref is not None}
            if len(workers) == 1 and all(p.ref is not None for p, _, _ in data.parts):
                worker = workers.pop()
                spec = [(p.ref.pid, start, end) for p, start, end in data.parts]
            else:
                worker, spec = self.pool.least_loaded(), []
                for p, start, end in data.parts:
                    if p.ref is None:
                        part = slice_rows(p.columns, start, end)
                    else:
                        part = await self.pool.request(p.ref.worker, "fetch", p.ref.pid, start, end,
                                                       doing=f"sending rows of {p.task.path!r}")
                    spec.append((part, 0, end - start))
        else:
            worker, spec, paths = self.pool.least_loaded(), [(data, 0, n_rows(data))], ()
        doing = "encoding and collating a batch" + (f" of {', '.join(map(repr, paths))}" if paths else "")
        result = await self.pool.request(worker, "run", spec, paths, doing=doing)
        if self.finish:
            result = await self.run_blocking(run_steps, self.finish, result)
        return result
