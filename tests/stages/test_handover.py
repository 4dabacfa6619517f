"""``_stages.handover.HandOver``: the bounded queue between the event loop and the consumer, built alone."""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, List

import pytest

from pyloader._stages.handover import EMPTY, HandOver

pytestmark = pytest.mark.timeout(30)


async def blocks(awaitable: Any, seconds: float = 0.1) -> bool:
    """Whether ``awaitable`` is still waiting after ``seconds`` (it is cancelled then)."""
    try:
        await asyncio.wait_for(awaitable, seconds)
    except asyncio.TimeoutError:
        return True
    return False


def test_put_waits_once_the_queue_holds_maxsize_items_until_one_is_taken():
    async def run() -> None:
        queue = HandOver(2, asyncio.get_running_loop())
        await queue.put("a")
        await queue.put("b")
        assert queue.size == 2
        putting = asyncio.ensure_future(queue.put("c"))
        await asyncio.sleep(0.05)
        assert not putting.done()
        assert await asyncio.to_thread(queue.get, 1.0) == "a"
        await asyncio.wait_for(putting, 5)
        assert [queue.get(0), queue.get(0), queue.get(0)] == ["b", "c", EMPTY]

    asyncio.run(asyncio.wait_for(run(), 20))


def test_a_group_counts_as_its_batches_not_as_one_item():
    async def run() -> None:
        queue = HandOver(4, asyncio.get_running_loop())
        await queue.put([1, 2, 3])
        assert queue.size == 3
        assert await blocks(queue.put([4, 5]))
        await asyncio.wait_for(queue.put(6), 5)
        assert queue.size == 4

    asyncio.run(asyncio.wait_for(run(), 20))


def test_a_group_larger_than_maxsize_still_goes_into_an_empty_queue():
    async def run() -> None:
        queue = HandOver(2, asyncio.get_running_loop())
        await asyncio.wait_for(queue.put(list(range(5))), 5)
        assert queue.size == 5
        assert await blocks(queue.put(0))

    asyncio.run(asyncio.wait_for(run(), 20))


def test_items_come_out_in_the_order_they_went_in():
    async def run() -> List[Any]:
        queue = HandOver(3, asyncio.get_running_loop())
        got: List[Any] = []

        def consume() -> None:
            while len(got) < 20:
                item = queue.get(5.0)
                assert item is not EMPTY
                got.append(item)

        consumer = asyncio.ensure_future(asyncio.to_thread(consume))
        for i in range(20):
            await queue.put(i if i % 3 else [i])
        await asyncio.wait_for(consumer, 10)
        return got

    assert asyncio.run(asyncio.wait_for(run(), 20)) == [i if i % 3 else [i] for i in range(20)]


def test_get_gives_empty_after_its_timeout():
    async def run() -> None:
        queue = HandOver(2, asyncio.get_running_loop())
        began = time.monotonic()
        assert queue.get(0.05) is EMPTY
        assert time.monotonic() - began >= 0.04

    asyncio.run(asyncio.wait_for(run(), 20))


def test_close_wakes_a_consumer_blocked_in_get():
    async def run() -> None:
        queue = HandOver(2, asyncio.get_running_loop())
        waiting = asyncio.ensure_future(asyncio.to_thread(queue.get, 20.0))
        await asyncio.sleep(0.05)
        began = time.monotonic()
        queue.close()
        assert await asyncio.wait_for(waiting, 5) is EMPTY
        assert time.monotonic() - began < 5

    asyncio.run(asyncio.wait_for(run(), 20))


def test_close_drops_what_the_queue_held():
    async def run() -> None:
        queue = HandOver(2, asyncio.get_running_loop())
        await queue.put([1, 2])
        queue.close()
        assert queue.size == 0 and queue.get(0) is EMPTY

    asyncio.run(asyncio.wait_for(run(), 20))


def test_aget_takes_items_on_the_consumers_own_loop_and_close_wakes_it():
    async def produce(queue_box: List[HandOver], ready: threading.Event, release: threading.Event) -> None:
        queue = HandOver(2, asyncio.get_running_loop())
        queue_box.append(queue)
        ready.set()
        await queue.put("first")
        while not release.is_set():
            await asyncio.sleep(0.01)
        queue.close()

    box: List[HandOver] = []
    ready, release = threading.Event(), threading.Event()
    producer = threading.Thread(target=lambda: asyncio.run(produce(box, ready, release)), daemon=True)
    producer.start()
    assert ready.wait(10)

    async def consume() -> List[Any]:
        queue = box[0]
        got = [await queue.aget(5.0)]
        waiting = asyncio.ensure_future(queue.aget(20.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        release.set()
        got.append(await asyncio.wait_for(waiting, 5))
        return got

    try:
        assert asyncio.run(asyncio.wait_for(consume(), 20)) == ["first", EMPTY]
    finally:
        release.set()
        producer.join(10)
    assert not producer.is_alive()


def test_an_aget_cancelled_while_it_waits_leaves_every_item_in_the_queue():
    async def run() -> None:
        queue = HandOver(3, asyncio.get_running_loop())
        waiting = asyncio.ensure_future(queue.aget(20.0))
        await asyncio.sleep(0.02)
        await queue.put("kept")  # wakes the aget, which is cancelled before it runs again
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert queue.size == 1 and queue.get(0) == "kept"

    asyncio.run(asyncio.wait_for(run(), 20))


def test_aget_gives_empty_after_its_timeout():
    async def run() -> None:
        queue = HandOver(2, asyncio.get_running_loop())
        assert await asyncio.wait_for(queue.aget(0.05), 5) is EMPTY

    asyncio.run(asyncio.wait_for(run(), 20))
