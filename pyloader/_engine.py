"""The background event loop that runs a pipeline, and the hand-over to the consumer."""
from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
import weakref
from typing import Any, AsyncIterator, Callable

from ._errors import Failure
from ._handover import EMPTY, HandOver
from ._threads import DaemonExecutor

_END = object()
_POLL_S = 1.0  # how often a waiting consumer checks that the loop thread is alive
_JOIN_S = 0.5  # how long stop() waits for threads still running a user method
_live: "weakref.WeakSet[Engine]" = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    """At interpreter exit, stop the runs nobody closed before the interpreter is torn down."""
    for engine in list(_live):
        engine.stop()


class Engine:
    """Runs ``make(run_blocking, tasks)`` (an async iterator of items) on its own loop thread.

    Items wait in a bounded queue of ``max_queue_size``; ``get()`` takes the next
    one from any thread, ``aget()`` from another event loop. The end of the
    stream is ``StopIteration``/``StopAsyncIteration``; a failure is raised once,
    in order. ``stop()`` cancels everything and joins the thread; it is
    idempotent and safe from a finalizer.
    """

    def __init__(self, make: Callable[[Callable, asyncio.TaskGroup], AsyncIterator[Any]],
                 max_queue_size: int, threads: int, name: str = "pyloader") -> None:
        self._make = make
        self._executor = DaemonExecutor(threads, f"{name}-io")
        self._started = threading.Event()
        self._done = False
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._queue: HandOver = None  # type: ignore[assignment]
        self._task: asyncio.Task = None  # type: ignore[assignment]
        self._max_queue_size = max_queue_size
        self._thread = threading.Thread(target=self._run, name=f"{name}-loop", daemon=True)
        _live.add(self)
        self._thread.start()
        self._started.wait()

    # -- loop thread -------------------------------------------------------------
    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._queue = HandOver(self._max_queue_size, loop)
        self._task = loop.create_task(self._main())
        self._started.set()
        try:
            loop.run_until_complete(self._task)
        except BaseException:
            pass  # cancelled by stop(): the consumer is done
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()

        def run_blocking(fn: Callable, *args: Any) -> asyncio.Future:
            return loop.run_in_executor(self._executor, fn, *args)

        try:
            async with asyncio.TaskGroup() as tasks:
                async with contextlib.aclosing(self._make(run_blocking, tasks)) as items:
                    async for item in items:
                        await self._queue.put(item)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
                exc = exc.exceptions[0]
            await self._queue.put(Failure(exc))
        else:
            await self._queue.put(_END)
        await asyncio.Event().wait()  # keep the loop up until the consumer took the last item and stop()s

    # -- consumer side -------------------------------------------------------------
    def _unpack(self, item: Any) -> Any:
        if item is _END:
            self.stop()
            return _END
        if isinstance(item, Failure):
            self._done = True
            self.stop()
            raise item.exc
        return item

    def get(self) -> Any:
        """The next item; blocks the calling thread (not the loop)."""
        item = self._next()
        if item is _END:
            raise StopIteration
        return item

    def _next(self) -> Any:
        while not self._done:
            item = self._queue.get(_POLL_S)
            if item is not EMPTY:
                return self._unpack(item)
            if not self._thread.is_alive() and not self._done:
                self._done = True
                raise RuntimeError("pyloader's background loop stopped unexpectedly")
        return _END

    async def aget(self) -> Any:
        """The next item, awaited from another event loop (the wait runs in its executor)."""
        item = await asyncio.get_running_loop().run_in_executor(None, self._next)
        if item is _END:
            raise StopAsyncIteration
        return item

    def stop(self, timeout: float = 2.0) -> None:
        """Cancel the run, join the loop thread, and give the executor's threads a moment to
        leave user code: a thread still inside an extension (torch) while the interpreter
        shuts down can abort the process."""
        self._done = True
        if self._queue is not None:
            self._queue.close()
        if self._thread.is_alive():
            try:
                self._loop.call_soon_threadsafe(self._task.cancel)
            except RuntimeError:
                pass  # loop already closed
            if threading.current_thread() is not self._thread:
                self._thread.join(timeout)
        self._executor.shutdown(wait=True, cancel_futures=True, timeout=_JOIN_S)
        _live.discard(self)
