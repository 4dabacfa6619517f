"""The bounded queue between the event loop (producer) and the consumer.

Contract: ``put`` is awaited on the producer's loop; ``get`` blocks a consumer
thread, ``aget`` is awaited on the consumer's own event loop. Neither consumer
call goes through the producer's loop, and neither takes an item unless it
returns it: an ``aget`` cancelled while it waits leaves every item in the queue.

It is the chain's last stage, but it lives here, with the engine that owns it
(``_execution.engine``): it is where batches cross from the loop's thread to the
consumer's, thread plumbing that knows nothing of batches (a group weighs its
length), so the engine imports it without reaching up into the stages.
"""
from __future__ import annotations

import asyncio
import collections
import threading
from typing import Deque, List, Tuple

EMPTY = object()  # get() timed out


def _weight(item: object) -> int:
    return len(item) if isinstance(item, list) else 1


def _resolve(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


Waiter = Tuple[asyncio.AbstractEventLoop, asyncio.Future]


def _wake(waiters: List[Waiter]) -> None:
    for loop, waiter in waiters:
        try:
            loop.call_soon_threadsafe(_resolve, waiter)
        except RuntimeError:
            pass  # the consumer's loop is closed: nobody waits there any more


class HandOver:
    """Holds at most ``maxsize`` items, a list counting as its length (a group of
    batches); a list larger than that still goes in when the queue is empty. The
    loop side awaits ``put``; the consumer side blocks in ``get`` without a round
    trip through the loop, so a hand-over costs one condition-variable wake-up;
    ``aget`` costs one ``call_soon_threadsafe`` to the consumer's loop."""

    def __init__(self, maxsize: int, loop: asyncio.AbstractEventLoop) -> None:
        self._maxsize = maxsize
        self._loop = loop
        self._items: Deque[object] = collections.deque()
        self._size = 0  # summed weights of the items held
        self._cond = threading.Condition(threading.Lock())
        self._space = asyncio.Event()
        self._waiters: List[Waiter] = []  # aget()s waiting on their loops
        self._closed = False

    async def put(self, item: object) -> None:
        weight = _weight(item)
        while True:
            with self._cond:
                if not self._items or self._size + weight <= self._maxsize:
                    self._items.append(item)
                    self._size += weight
                    self._cond.notify()
                    waiters, self._waiters = self._waiters, []
                    break
                self._space.clear()
            await self._space.wait()
        _wake(waiters)

    @property
    def size(self) -> int:
        """The summed weights of the items held now (a snapshot, read without the lock)."""
        return self._size

    def get(self, timeout: float) -> object:
        """The next item, or ``EMPTY`` after ``timeout`` seconds or once closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._items or self._closed, timeout)
        return self._take()

    async def aget(self, timeout: float) -> object:
        """``get`` awaited on the calling event loop, with no thread blocked for it."""
        loop = asyncio.get_running_loop()
        entry = None
        with self._cond:
            if not self._items and not self._closed:
                entry = (loop, loop.create_future())
                self._waiters.append(entry)
        if entry is not None:
            timer = loop.call_later(timeout, _resolve, entry[1])
            try:
                await entry[1]
            finally:
                timer.cancel()
                with self._cond:
                    if entry in self._waiters:
                        self._waiters.remove(entry)
        return self._take()

    def _take(self) -> object:
        """The first item (``EMPTY`` if none), and room made for the producer."""
        with self._cond:
            if not self._items:
                return EMPTY
            item = self._items.popleft()
            self._size -= _weight(item)
            waiting = not self._space.is_set()
        if waiting:
            try:
                self._loop.call_soon_threadsafe(self._space.set)
            except RuntimeError:
                pass  # the loop has stopped: nobody is waiting to put
        return item

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._items.clear()
            self._size = 0
            self._cond.notify_all()
            waiters, self._waiters = self._waiters, []
        _wake(waiters)
