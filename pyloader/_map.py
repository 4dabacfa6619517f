"""Stages 4 and 5: ``batch_encode`` then ``collate_batch`` on each batch, several batches at once, in order."""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence, Tuple

from ._batch import Batch
from ._errors import ErrorHandler, Failure, Stats

_END = object()
Step = Tuple[str, Callable[[Any], Any]]


class StepFailed(Exception):
    """``step`` (a user method's name) raised ``__cause__``."""

    def __init__(self, step: str) -> None:
        super().__init__(step)
        self.step = step


def run_steps(steps: Sequence[Step], data: Any) -> Any:
    """Apply the steps in turn; one call off the loop for all of them, so a batch
    crosses threads once rather than once per step."""
    for name, fn in steps:
        try:
            data = fn(data)
        except Exception as exc:
            raise StepFailed(name) from exc
    return data


class OrderedMap:
    """Runs ``run(batch.data)`` (the user's steps, off the event loop) on up to ``concurrency`` batches at once.

    Results are yielded in input order, never in completion order, so the output
    does not depend on timing. A failed step goes through the error policy under
    its own name (the batch is then skipped and counted); an upstream failure is
    re-raised here, in order.
    """

    def __init__(self, run: Callable[[Any], Awaitable[Any]], concurrency: int, errors: ErrorHandler,
                 stats: Stats) -> None:
        self.run = run
        self.concurrency = concurrency
        self.errors = errors
        self.stats = stats

    async def iterate(self, batches: AsyncIterator[Batch], tasks: asyncio.TaskGroup) -> AsyncIterator[Batch]:
        queue: asyncio.Queue = asyncio.Queue(maxsize=self.concurrency)

        async def feed() -> None:
            try:
                async for batch in batches:
                    future = asyncio.ensure_future(self.run(batch.data))
                    try:
                        await queue.put((batch, future))
                    except asyncio.CancelledError:
                        _discard(future)
                        raise
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                await queue.put(Failure(exc))
                return
            await queue.put(_END)

        feeder = tasks.create_task(feed(), name="pyloader-map")
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
                except StepFailed as failed:
                    self.errors(failed.step, batch.paths, failed.__cause__)
                    self.stats.skipped_batches += 1
                    continue
                yield dataclasses.replace(batch, data=data)
        finally:
            feeder.cancel()
            while not queue.empty():
                item = queue.get_nowait()
                if isinstance(item, tuple):
                    _discard(item[1])


def _discard(future: asyncio.Future) -> None:
    """Drop a batch's work: cancel it, or consume its outcome so asyncio does not log it."""
    if future.done():
        if not future.cancelled():
            future.exception()
    else:
        future.cancel()
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
