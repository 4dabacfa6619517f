"""Stages 4 and 5: ``batch_encode`` then ``collate_batch`` on each batch, several groups at once, in order."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable, List, Sequence, Tuple, Union

from ._batch import Group
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


Outcome = Union[Any, StepFailed]  # a batch's result, or the step that failed on it


def run_each(steps: Sequence[Step], datas: Sequence[Any], prepare: Callable[[Any], Any] = lambda d: d) -> List[Outcome]:
    """``run_steps`` on every batch of a group; a batch that fails does not stop the others."""
    out: List[Outcome] = []
    for data in datas:
        try:
            out.append(run_steps(steps, prepare(data)))
        except StepFailed as failed:
            out.append(failed)
    return out


class OrderedMap:
    """Runs ``run([batch.data, ...])`` (the user's steps, off the event loop) on up to
    ``concurrency`` groups at once; ``run`` gives one ``Outcome`` per batch.

    Results are yielded in input order, never in completion order, so the output
    does not depend on timing. A failed step goes through the error policy under
    its own name (that batch is then skipped and counted, the rest of its group
    goes on); an upstream failure is re-raised here, in order.
    """

    def __init__(self, run: Callable[[List[Any]], Awaitable[List[Outcome]]], concurrency: int, errors: ErrorHandler,
                 stats: Stats) -> None:
        self.run = run
        self.concurrency = concurrency
        self.errors = errors
        self.stats = stats

    async def iterate(self, groups: AsyncIterator[Group], tasks: asyncio.TaskGroup) -> AsyncIterator[Group]:
        queue: asyncio.Queue = asyncio.Queue(maxsize=self.concurrency)

        async def feed() -> None:
            try:
                async for group in groups:
                    future = asyncio.ensure_future(self.run([batch.data for batch in group]))
                    try:
                        await queue.put((group, future))
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
                group, future = item
                item = None
                done: Group = []
                for batch, outcome in zip(group, await future):
                    if isinstance(outcome, StepFailed):
                        try:
                            self.errors(outcome.step, batch.paths, outcome.__cause__)
                        except BaseException:
                            if done:
                                yield done  # the batches before the failed one still arrive, in order
                            raise
                        self.stats.skipped_batches += 1
                    else:
                        batch.data = outcome  # the group is this stage's alone: no copy of the Batch
                        done.append(batch)
                group = future = batch = None  # the raw rows: not kept alive while the consumer holds the loop back
                if done:
                    yield done
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
