"""The bounded queue between the event loop (producer) and the consumer's thread."""
from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any, Deque

EMPTY = object()  # get() timed out


def _weight(item: Any) -> int:
    return len(item) if isinstance(item, list) else 1


class HandOver:
    """Holds at most ``maxsize`` items, a list counting as its length (a group of
    batches); a list larger than that still goes in when the queue is empty. The
    loop side awaits ``put``; the consumer side blocks in ``get`` without a round
    trip through the loop, so a hand-over costs one condition-variable wake-up."""

    def __init__(self, maxsize: int, loop: asyncio.AbstractEventLoop) -> None:
        self._maxsize = maxsize
        self._loop = loop
        self._items: Deque[Any] = collections.deque()
        self._size = 0  # summed weights of the items held
        self._cond = threading.Condition(threading.Lock())
        self._space = asyncio.Event()
        self._closed = False

    async def put(self, item: Any) -> None:
        weight = _weight(item)
        while True:
            with self._cond:
                if not self._items or self._size + weight <= self._maxsize:
                    self._items.append(item)
                    self._size += weight
                    self._cond.notify()
                    return
                self._space.clear()
            await self._space.wait()

    def get(self, timeout: float) -> Any:
        """The next item, or ``EMPTY`` after ``timeout`` seconds or once closed."""
        with self._cond:
            if not self._items and not self._closed:
                self._cond.wait_for(lambda: self._items or self._closed, timeout)
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
