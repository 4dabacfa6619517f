"""Stages 4 and 5: applying a user method to each batch, several at once, in order."""
from __future__ import annotations

import asyncio
import dataclasses
from typing import AsyncIterator, Callable

from ._batch import Batch
from ._errors import ErrorHandler, Failure, Stats

_END = object()


class OrderedMap:
    """Runs ``fn(batch.data)`` off the event loop for up to ``concurrency`` batches at once.

    Results are yielded in input order, never in completion order, so the output
    does not depend on timing. A failure of ``fn`` goes through the error policy
    (the batch is then skipped and counted); an upstream failure is re-raised
    here, in order.
    """

    def __init__(self, stage: str, fn: Callable, run_blocking: Callable, concurrency: int,
                 errors: ErrorHandler, stats: Stats) -> None:
        self.stage = stage
        self.fn = fn
        self.run_blocking = run_blocking
        self.concurrency = concurrency
        self.errors = errors
        self.stats = stats

    async def iterate(self, batches: AsyncIterator[Batch], tasks: asyncio.TaskGroup) -> AsyncIterator[Batch]:
        queue: asyncio.Queue = asyncio.Queue(maxsize=self.concurrency)

        async def feed() -> None:
            try:
                async for batch in batches:
                    await queue.put((batch, asyncio.ensure_future(self.run_blocking(self.fn, batch.data))))
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                await queue.put(Failure(exc))
                return
            await queue.put(_END)

        feeder = tasks.create_task(feed(), name=f"pyloader-{self.stage}")
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    return
                if isinstance(item, Failure):
                    raise item.exc
                batch, future = item
                try:
                    data = await future
                except Exception as exc:
                    self.errors(self.stage, batch.paths, exc)
                    self.stats.skipped_batches += 1
                    continue
                yield dataclasses.replace(batch, data=data)
        finally:
            feeder.cancel()
            while not queue.empty():
                item = queue.get_nowait()
                if isinstance(item, tuple):
                    item[1].cancel()
