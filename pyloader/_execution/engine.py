"""The background event loop that runs a pipeline, and the hand-over to the consumer.

Contracts: items arrive in order, a failure is raised as itself (``SystemExit`` and
``KeyboardInterrupt`` from user code included) after the items before it, and a
consumer's wait always has a way out (the loop thread dying, ``stop()``).
Cancelling an awaited ``aget()`` loses nothing. In a child made by ``os.fork()``
the runs inherited from the parent are dead: their threads do not exist there.
Touching them (``get``, ``stop``, collection, exit) never waits on the parent's
locks or touches the parent's loop, whose selector and wake-up pipe the child shares.
"""
from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import threading
import weakref
from traceback import clear_frames
from typing import Any, AsyncGenerator, Callable, List

from .._errors import Failure, PipelineError
from .handover import EMPTY, HandOver
from .threads import DaemonExecutor

_END = object()
_POLL_S = 1.0  # how often a waiting consumer checks that the loop thread is alive
_JOIN_S = 0.5  # how long stop() waits for threads still running a user method
_CLEANUP_S = 1.0  # how long a stopping loop waits for its leftover tasks to take their cancellation
_live: "weakref.WeakSet[Engine]" = weakref.WeakSet()
# Runs inherited through fork(), kept alive for the child's lifetime: collecting their loops
# and tasks would run the parent's clean-up code (finally blocks, loop.close()) in the child.
_inherited: List["Engine"] = []


@atexit.register
def _stop_all() -> None:
    """At interpreter exit, stop the runs nobody closed before the interpreter is torn down."""
    for engine in list(_live):
        engine.stop()


def _after_fork_in_child() -> None:
    _inherited.extend(_live)
    _live.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _run_through(loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> None:
    """Run ``loop`` until ``future`` is done, or ends with an exception.

    A task whose code raises ``SystemExit`` or ``KeyboardInterrupt`` (user code run
    on the loop, or an executor's result) stops the loop with it: asyncio re-raises
    those out of ``run_until_complete``. The task holds the exception too, and whoever
    awaits it gets it, so the run goes on and delivers it in order.
    """
    while not future.done():
        try:
            loop.run_until_complete(future)
        except (SystemExit, KeyboardInterrupt):
            continue
        except BaseException:
            return  # the future failed or was cancelled (stop()): the consumer is done


def _unwrapped(exc: BaseException) -> BaseException:
    """The one error of a task group that failed with one (raised as itself), else ``exc``."""
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        clear_frames(exc.__traceback__)  # the group's frames, dropped with it, would hold the error in a cycle
        return exc.exceptions[0]
    return exc


class Engine:
    """Runs ``make(run_blocking, tasks)`` (an async iterator of items) on its own loop thread.

    Items wait in a bounded queue of ``max_queue_size``; ``get()`` takes the next
    one from any thread, ``aget()`` from another event loop. The end of the
    stream is ``StopIteration``/``StopAsyncIteration``; a failure is raised once,
    in order. ``stop()`` cancels everything and joins the thread; it is
    idempotent and safe from a finalizer.
    """

    def __init__(self, make: Callable[[Callable, asyncio.TaskGroup], AsyncGenerator[object, None]],
                 max_queue_size: int, threads: int, name: str = "pyloader") -> None:
        self._make = make
        self._executor = DaemonExecutor(threads, f"{name}-io")
        self._started = threading.Event()
        self._done = False
        self._stopping = False  # stop() was called: the run ends even where its cancellation was lost
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._queue: HandOver = None  # type: ignore[assignment]
        self._task: asyncio.Task = None  # type: ignore[assignment]
        self._pid = os.getpid()  # in another process (a forked child) this run is the parent's
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
            _run_through(loop, self._task)
            leftover = asyncio.all_tasks(loop)  # e.g. groups being encoded, cancelled as the run stopped
            for task in leftover:
                task.cancel()
            if leftover:
                _run_through(loop, asyncio.ensure_future(asyncio.wait(leftover, timeout=_CLEANUP_S), loop=loop))
            _run_through(loop, asyncio.ensure_future(loop.shutdown_asyncgens(), loop=loop))
        finally:
            loop.close()

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()

        def run_blocking(fn: Callable, *args: object) -> asyncio.Future:
            return loop.run_in_executor(self._executor, fn, *args)

        try:
            await self._produce(run_blocking)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            await self._queue.put(Failure(_unwrapped(exc)))
        else:
            await self._queue.put(_END)
        if self._stopping or asyncio.current_task().cancelling():  # type: ignore[union-attr]
            # stop() came as the run failed: a TaskGroup whose tasks failed raises their errors, not the cancel,
            # and in Python 3.11 its exit may even take the cancel back (uncancel()): the flag stays
            raise asyncio.CancelledError
        await asyncio.Event().wait()  # keep the loop up until the consumer took the last item and stop()s

    async def _produce(self, run_blocking: Callable) -> None:
        """Every item of the pipeline into the queue, in order, its tasks run in one task group."""
        async with asyncio.TaskGroup() as tasks:
            async with contextlib.aclosing(self._make(run_blocking, tasks)) as items:
                async for item in items:
                    await self._queue.put(item)

    # -- consumer side -------------------------------------------------------------
    def _unpack(self, item: object, join: float = 2.0) -> object:
        """The item itself, or ``_END``; a failure is raised. The run stops at either, joining
        its threads for up to ``join`` seconds."""
        if item is _END:
            self.stop(join)
            return _END
        if isinstance(item, Failure):
            self._done = True
            self.stop(join)
            # a user method's failure: the stages it crossed are noise
            item.throw(traceback=not isinstance(item.exc, PipelineError))
        return item

    def get(self) -> Any:
        """The next item; blocks the calling thread (not the loop)."""
        item = self._next()
        if item is _END:
            raise StopIteration
        return item

    def queued(self) -> int:
        """The items' weight (batches) waiting for the consumer now."""
        return self._queue.size if self._queue is not None else 0

    def _next(self) -> object:
        while self._pending():
            item = self._queue.get(_POLL_S)
            if item is not EMPTY:
                return self._unpack(item)
            self._check_alive()
        return _END

    async def aget(self) -> Any:
        """The next item, awaited on the caller's event loop; cancelling the wait takes nothing."""
        while self._pending():
            item = await self._queue.aget(_POLL_S)
            if item is not EMPTY:
                item = self._unpack(item, join=0.0)  # never block the caller's loop: atexit joins
                if item is _END:
                    break
                return item
            self._check_alive()
        raise StopAsyncIteration

    def _pending(self) -> bool:
        """Whether items may still come; in a forked child the parent's run raises, once."""
        if self._pid != os.getpid():
            self._fail_once("this pyloader iteration was started before os.fork(), in the parent process, "
                            "and does not run in this one: start a new iteration here")
        return not self._done

    def _check_alive(self) -> None:
        if not self._thread.is_alive():
            self._fail_once("pyloader's background loop stopped unexpectedly")

    def _fail_once(self, message: str) -> None:
        """End the run for the consumer with a ``RuntimeError`` of ``message``, unless it has ended."""
        if not self._done:
            self._done = True
            raise RuntimeError(message)

    def stop(self, timeout: float = 2.0) -> None:
        """Cancel the run, join the loop thread, and give the executor's threads a moment to
        leave user code: a thread still inside an extension (torch) while the interpreter
        shuts down can abort the process. In a forked child a run of the parent's is only
        marked done: its locks may be held forever, and its loop is shared with the parent.
        With ``timeout=0`` nothing is waited for, and the run stays on the list that is
        stopped (and joined) at interpreter exit until its loop thread has ended."""
        self._done = True
        if self._pid != os.getpid():
            return
        if self._queue is not None:
            self._queue.close()
        if self._thread.is_alive():
            self._cancel(timeout)
        self._executor.shutdown(wait=True, cancel_futures=True, timeout=min(timeout, _JOIN_S))
        if not self._thread.is_alive():
            _live.discard(self)

    def _cancel(self, timeout: float) -> None:
        """Cancel the running loop's task, and join its thread for up to ``timeout`` seconds (not from itself)."""
        self._stopping = True  # before the cancel: ``_main`` reads it once the pipeline is over, whatever ended it
        try:
            self._loop.call_soon_threadsafe(self._task.cancel)
        except RuntimeError:
            pass  # loop already closed
        if timeout and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
