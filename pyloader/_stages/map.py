"""Stages 4 and 5: ``batch_encode`` then ``collate_batch`` on each batch, several groups at once, in order
(the steps themselves run through ``_execution.steps``, where the runners run them)."""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Awaitable, Callable, List, Optional, Tuple, Union, cast

from .._columns import n_rows
from .._errors import ErrorHandler, Failure
from .._execution.steps import Key, Outcome, Segments, StackedOutputs, StepFailed
from .._rng import USER_BATCH
from .._stats import Stats
from .batch import Group, Stacked, picked

_END = object()


def batch_rows(data: object) -> int:
    """The samples of a batch not encoded yet (its rows, as cut), for ``loader.stats``."""
    if isinstance(data, Segments):
        parts = data.parts
        if len(parts) == 1:  # most batches: one piece of one file
            return parts[0][2] - parts[0][1]
        return sum(end - start for _, start, end in parts)
    return n_rows(data) if isinstance(data, dict) else 0


class OrderedMap:
    """Runs ``run([batch.data, ...])`` (the user's steps, off the event loop) on up to
    ``concurrency`` groups at once; ``run`` gives one ``Outcome`` per batch. A ``Stacked``
    group's batches are given as ``StackedRows``; ``run`` may then give ``StackedOutputs``
    for the whole group (see ``run_stacked``).

    With ``draws`` (the loader's ``random_seed`` and this rank), each batch's steps draw
    ``pyloader.rng()`` from ``(*draws, epoch, index)``, given to ``run`` as ``keys``: a batch's
    place, not where or when it runs.

    Results are yielded in input order, never in completion order, so the output
    does not depend on timing. A failed step goes through the error policy under
    its own name (that batch is then skipped and counted, the rest of its group
    goes on); an upstream failure is re-raised here, in order.
    """

    def __init__(self, run: Callable[..., Awaitable[Union[List[Outcome], StackedOutputs]]],
                 concurrency: int, errors: ErrorHandler, stats: Stats, draws: Optional[Tuple[int, int]] = None) -> None:
        self.run = run
        self.draws = draws
        self.concurrency = concurrency
        self.errors = errors
        self.stats = stats

    def _run(self, group: Group) -> Awaitable[Union[List[Outcome], StackedOutputs]]:
        datas = group.rows() if isinstance(group, Stacked) else [batch.data for batch in group]
        return self.run(datas) if self.draws is None else self.run(datas, _keys(self.draws, group))

    async def iterate(self, groups: AsyncIterator[Group], tasks: asyncio.TaskGroup) -> AsyncIterator[Group]:
        queue: asyncio.Queue = asyncio.Queue()  # bounded by ``running``: at most its groups, and the end
        running = asyncio.Semaphore(self.concurrency)  # groups started and not yet taken by this stage's consumer

        async def feed() -> None:
            try:
                upstream = aiter(groups)
                while True:
                    await running.acquire()  # before the next group is asked for: no raw group waits here either
                    try:
                        group = await anext(upstream)
                    except StopAsyncIteration:
                        break
                    future = asyncio.ensure_future(self._run(group))
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
                    item.throw()
                group, future = item
                item = None
                try:
                    outcomes = await future
                finally:
                    running.release()
                _count_rows(group)
                done, error = self._done(group, outcomes)
                group = future = outcomes = None  # the raw rows: not kept alive while the consumer holds the loop back
                if done:
                    yield done  # with an error, the batches before the failed one still arrive, in order
                if error is not None:
                    raise error
        finally:
            feeder.cancel()
            _drop_queued(queue)

    def _done(self, group: Group,
              outcomes: Union[List[Outcome], StackedOutputs]) -> Tuple[Group, Optional[BaseException]]:
        """The batches of ``group`` given their outcomes, and the error that ends the run there, if any."""
        if isinstance(outcomes, StackedOutputs):  # a Stacked group run at once
            stacked = cast(Stacked, group)
            stacked.drop_rows()
            stacked.outputs = outcomes
            return stacked, None
        kept, error = self._settle(group, outcomes)
        return _kept(group, kept), error

    def _settle(self, group: Group, outcomes: List[Outcome]) -> Tuple[List[int], Optional[BaseException]]:
        """Each batch given its outcome (the group is this stage's alone: no copy of the Batch); a failed
        step goes through the error policy. The positions kept, and what the policy raised, if it did."""
        kept: List[int] = []
        for k, outcome in enumerate(outcomes):
            if not isinstance(outcome, StepFailed):
                group[k].data = outcome
                kept.append(k)
                continue
            try:
                self.errors(outcome.step, group[k].paths, outcome.__cause__ or outcome)
            except BaseException as exc:
                return kept, exc
            self.stats.skipped_batches += 1
        return kept, None


def _keys(draws: Tuple[int, int], group: Group) -> List[Key]:
    seed, rank = draws
    return [(seed, USER_BATCH, rank, batch.epoch, batch.index) for batch in group]


def _count_rows(group: Group) -> None:
    """Give each batch its ``rows`` while its raw data is still at hand (once: a batch that goes through
    a second map, or that was read from the cache of encoded batches, has them already)."""
    if isinstance(group, Stacked):
        rows = group.rows_each()
        for batch in group:
            batch.rows = rows
    else:
        for batch in group:
            if not batch.rows:
                batch.rows = batch_rows(batch.data)


def _kept(group: Group, kept: List[int]) -> Group:
    """The batches of ``group`` at positions ``kept``, encoded; a whole ``Stacked`` group stays one."""
    if isinstance(group, Stacked):
        group.drop_rows()
    return picked(group, kept)


def _drop_queued(queue: asyncio.Queue) -> None:
    """Drop the work of the groups left in ``queue``."""
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
