"""The loader's side of its worker processes: start, ask, gather, notice deaths, stop.

Everything here runs on the loader's event loop: replies are read by
``loop.add_reader`` callbacks, and a worker's death is seen through its process
sentinel, so no thread waits on a worker and a dead worker fails its pending
requests at once (naming the worker and what it was doing) instead of hanging.
"""
from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import signal
import socket
import sys
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _ipc
from ._errors import WorkerDied
from ._stats import Busy
from ._worker import worker_main


def default_start_method() -> str:
    """``fork`` starts fastest; after TensorFlow is imported forking is unsafe, so ``forkserver``."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and "tensorflow" not in sys.modules and sys.platform.startswith("linux"):
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def _describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class _Worker:
    def __init__(self, index: int, process: Any, sock: socket.socket, current: Any) -> None:
        self.index = index
        self.process = process
        self.current = current
        self.sock = sock
        self.pending: Dict[int, Tuple[asyncio.Future, str]] = {}
        self.outbox: List[Any] = []
        self.releases: List[int] = []
        self.dead: Optional[str] = None


class WorkerPool:
    """``num_workers`` processes serving ``_worker.worker_main`` requests."""

    def __init__(self, num_workers: int, reader: Any, steps: List[Tuple[str, Callable]],
                 worker_init_fn: Optional[Callable[[int], None]], start_method: Optional[str],
                 busy: Optional[Busy] = None) -> None:
        self.num_workers = num_workers
        self._args = (reader, steps, worker_init_fn)
        self._busy = busy
        self._busy_rows: List[Any] = []  # where each worker adds its seconds (``loader.stats``)
        self._method = start_method or default_start_method()
        self._workers: List[_Worker] = []
        self._ids = itertools.count()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        ctx = multiprocessing.get_context(self._method)
        self._busy_rows = self._busy.worker_rows(self.num_workers) if self._busy is not None else []
        for index in range(self.num_workers):
            ours, theirs = _ipc.channel_pair()
            # a forked worker inherits the loader's ends of its siblings' sockets: it closes them,
            # or a sibling would never see the end of file that tells it the loader has gone
            siblings = [w.sock.fileno() for w in self._workers] + [ours.fileno()] if self._method == "fork" else []
            current = ctx.RawValue("q", -1)  # the request the worker is running
            row = self._busy_rows[index] if self._busy_rows else None
            process = ctx.Process(target=worker_main, args=(index, theirs, siblings, current, *self._args, row),
                                  name=f"pyloader-worker-{index}", daemon=True)
            try:
                process.start()
            except Exception as exc:
                ours.close()
                theirs.close()
                self.close()
                raise RuntimeError(f"could not start worker {index} with start method {self._method!r} "
                                   f"(with spawn/forkserver the reader, dataset and collator must be picklable): "
                                   f"{exc}") from exc
            theirs.close()
            ours.setblocking(False)
            worker = _Worker(index, process, ours, current)
            self._workers.append(worker)
            self._loop.add_reader(ours.fileno(), self._readable, worker)
            self._loop.add_reader(process.sentinel, self._died, worker)

    def close(self, timeout: float = 1.0) -> None:
        """Stop every worker: close the sockets (workers exit on EOF), then kill what is left."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(worker.sock.fileno())
                self._loop.remove_reader(worker.process.sentinel)
                self._loop.remove_writer(worker.sock.fileno())
            worker.sock.close()
        for worker in self._workers:
            worker.process.join(timeout)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout)
            worker.process.close()
            self._fail(worker, died=False)
        if self._busy is not None:
            self._busy.fold(self._busy_rows)

    # -- requests --------------------------------------------------------------------
    def alive(self, index: int) -> bool:
        return self._workers[index].dead is None

    def least_loaded(self) -> int:
        live = [w for w in self._workers if w.dead is None] or self._workers
        return min(live, key=lambda w: len(w.pending)).index

    def post(self, index: int, message: tuple) -> None:
        """Send without waiting for a reply."""
        worker = self._workers[index]
        if worker.dead is None and not self._closed:
            self._send(worker, message)

    def request(self, index: int, op: str, *args: Any, doing: str) -> asyncio.Future:
        """Send ``(op, rid, *args)``; the future gets the reply (or the worker's failure)."""
        worker = self._workers[index]
        future = self._loop.create_future()
        if worker.dead is not None:
            future.set_exception(WorkerDied(f"{worker.dead}; cannot go on {doing}"))
            return future
        rid = next(self._ids)
        worker.pending[rid] = (future, doing)
        self._send(worker, (op, rid, *args))
        return future

    def release(self, index: int, pid: int) -> None:
        """Let a worker forget a piece; may be called from any thread (a finalizer)."""
        worker = self._workers[index]
        worker.releases.append(pid)
        if len(worker.releases) == 1 and not self._closed:
            try:
                self._loop.call_soon_threadsafe(self._flush_releases, worker)
            except RuntimeError:
                pass  # loop closed: the worker is gone too

    def new_id(self) -> int:
        return next(self._ids)

    def _flush_releases(self, worker: _Worker) -> None:
        pids, worker.releases = worker.releases, []
        if pids and worker.dead is None and not self._closed:
            self._send(worker, ("release", pids))

    def _send(self, worker: _Worker, message: tuple) -> None:
        if worker.outbox:
            worker.outbox.append(message)
            return
        try:
            _ipc.send(worker.sock, message)
        except BlockingIOError:  # the worker is busy and its socket full: send when writable
            worker.outbox.append(message)
            self._loop.add_writer(worker.sock.fileno(), self._writable, worker)
        except OSError:
            self._died(worker)

    def _writable(self, worker: _Worker) -> None:
        while worker.outbox:
            try:
                _ipc.send(worker.sock, worker.outbox[0])
            except BlockingIOError:
                return
            except OSError:
                self._died(worker)
                return
            worker.outbox.pop(0)
        self._loop.remove_writer(worker.sock.fileno())

    # -- replies and deaths ------------------------------------------------------------
    def _readable(self, worker: _Worker) -> None:
        while True:
            try:
                rid, ok, value = _ipc.recv(worker.sock)
            except BlockingIOError:
                return
            except (EOFError, OSError):
                self._died(worker)
                return
            future, _ = worker.pending.pop(rid, (None, ""))
            if future is None or future.done():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(rebuild_error(value))

    def _died(self, worker: _Worker) -> None:
        if worker.dead is not None or self._closed:
            return
        worker.process.join(0.5)
        running = worker.pending.get(worker.current.value)
        doing = running[1] if running is not None else "waiting for work"
        worker.dead = (f"worker {worker.index} (pid {worker.process.pid}) {_describe_exit(worker.process.exitcode)} "
                       f"while {doing}")
        self._loop.remove_reader(worker.sock.fileno())
        self._loop.remove_reader(worker.process.sentinel)
        self._fail(worker, died=True)

    def _fail(self, worker: _Worker, died: bool) -> None:
        pending, worker.pending = worker.pending, {}
        for future, doing in pending.values():
            if future.done():
                continue
            if died:
                future.set_exception(WorkerDied(f"{worker.dead}; cannot go on {doing}"))
            else:
                future.cancel()


def rebuild_error(value: Tuple[Optional[str], BaseException, str]) -> BaseException:
    """The worker's exception, with the worker's traceback attached as a note."""
    from ._map import StepFailed

    step, cause, text = value
    cause.add_note(f"--- in the worker process:\n{text.rstrip()}")
    if step is None:
        return cause
    failed = StepFailed(step)
    failed.__cause__ = cause
    return failed


class RemoteRef:
    """A piece kept in a worker; the worker forgets it when this object is collected."""

    __slots__ = ("worker", "pid", "__weakref__")

    def __init__(self, pool: WorkerPool, worker: int, pid: int) -> None:
        self.worker = worker
        self.pid = pid
        weakref.finalize(self, pool.release, worker, pid)
