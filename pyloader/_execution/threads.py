"""A thread pool of daemon threads for user methods (``read_file``, ``batch_encode``, …).

``concurrent.futures.ThreadPoolExecutor`` joins its threads at interpreter exit,
so one stuck ``read_file`` would hang the exit of the whole program; these
threads never hold the interpreter up, and ``shutdown`` waits for them only as
long as it is told to. At interpreter exit, threads still inside a user method get
up to ``EXIT_GRACE_S`` in all to leave it: a thread inside an extension (torch)
while the interpreter is torn down can abort the process.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import queue
import threading
import time
import weakref
from typing import Callable, List, Optional, Tuple

_STOP = None
EXIT_GRACE_S = 5.0
_busy: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()  # threads of ours inside a call now


@atexit.register
def _let_user_code_finish() -> None:
    deadline = time.monotonic() + EXIT_GRACE_S
    for thread in list(_busy):
        thread.join(max(0.0, deadline - time.monotonic()))


class DaemonExecutor(concurrent.futures.Executor):
    def __init__(self, max_workers: int, name: str) -> None:
        self._work: "queue.SimpleQueue[Optional[Tuple[concurrent.futures.Future, Callable, tuple, dict]]]" = \
            queue.SimpleQueue()
        self._threads: List[threading.Thread] = []
        self._max_workers = max_workers
        self._name = name
        self._idle = threading.Semaphore(0)
        # reentrant: a finalizer run by the garbage collector inside ``submit`` (a loader dropped unclosed) may
        # shut this executor down from the same thread
        self._lock = threading.RLock()
        self._shutdown = False

    def submit(self, fn: Callable, /, *args: object, **kwargs: object) -> concurrent.futures.Future:
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit after shutdown")
            future: concurrent.futures.Future = concurrent.futures.Future()
            self._work.put((future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max_workers:
                thread = threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
                if self._shutdown:  # shut down meanwhile, by a finalizer the garbage collector ran in this call
                    self._work.put(_STOP)
            return future

    def _run(self) -> None:
        for item in iter(self._work.get, _STOP):
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                _busy.add(threading.current_thread())
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:
                    future.set_exception(exc)
                    del exc
                else:
                    future.set_result(result)
                finally:
                    _busy.discard(threading.current_thread())
            del item, future, fn, args, kwargs
            self._idle.release()

    def _cancel_queued(self) -> None:
        """Cancel every call not started yet (the caller holds the lock)."""
        while True:
            try:
                item = self._work.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP:
                item[0].cancel()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False, timeout: Optional[float] = None) -> None:
        """Stop the threads; with ``wait``, give them up to ``timeout`` seconds in all to finish
        the call they are in (a thread stuck in user code is left to end on its own)."""
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                self._cancel_queued()
            for _ in self._threads:
                self._work.put(_STOP)
        if wait:
            _join_all(self._threads, timeout)


def _join_all(threads: List[threading.Thread], timeout: Optional[float]) -> None:
    """Join ``threads``, waiting up to ``timeout`` seconds in all (``None``: until they end)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for thread in threads:
        if thread is threading.current_thread():  # shut down from one of its own threads: it ends after this
            continue
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
