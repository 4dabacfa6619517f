"""``_stages.map.OrderedMap``: groups run several at once, results in input order, failures in order."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncGenerator, AsyncIterator, List, Optional, Sequence, Tuple, cast

import pytest

from pyloader._errors import ErrorHandler, PipelineError
from pyloader._stages.batch import Batch, Group
from pyloader._stages.map import OrderedMap, StepFailed
from pyloader._stats import Stats

pytestmark = pytest.mark.timeout(30)


def group(first: int, n: int = 2) -> Group:
    return [Batch(0, first + k, first + k, (f"file-{first + k}",)) for k in range(n)]


async def made(groups: Sequence[Group], fail_after: Optional[int] = None) -> AsyncIterator[Group]:
    for k, g in enumerate(groups):
        if k == fail_after:
            raise OSError("upstream broke")
        await asyncio.sleep(0)
        yield g


def mapped(run: Any, groups: AsyncIterator[Group], concurrency: int = 3, on_error: str = "raise",
           stats: Optional[Stats] = None) -> Tuple[List[int], List[BaseException]]:
    """The indices of the batches the map gives, in order, and the error it raised (if any)."""
    stats = stats or Stats()
    stage = OrderedMap(run, concurrency, ErrorHandler(on_error, None, stats), stats)

    async def go() -> Tuple[List[int], List[BaseException]]:
        out: List[int] = []
        try:
            async with asyncio.TaskGroup() as tasks:
                async for g in stage.iterate(groups, tasks):
                    out.extend(b.data for b in g)
        except BaseExceptionGroup as group:  # what iterate raised, wrapped by the TaskGroup it ran in
            return out, list(group.exceptions)
        return out, []

    return asyncio.run(asyncio.wait_for(go(), 20))


def test_results_come_in_input_order_whatever_order_the_groups_finish_in():
    async def run(datas: Sequence[Any]) -> List[Any]:
        await asyncio.sleep(0.002 * (20 - datas[0]))  # later groups finish first
        return [d * 10 for d in datas]

    out, errors = mapped(run, made([group(2 * k) for k in range(10)]), concurrency=4)
    assert errors == [] and out == [10 * i for i in range(20)]


def test_at_most_concurrency_groups_run_at_once():
    running, most = [0], [0]

    async def run(datas: Sequence[Any]) -> List[Any]:
        running[0] += 1
        most[0] = max(most[0], running[0])
        await asyncio.sleep(0.005)
        running[0] -= 1
        return list(datas)

    out, errors = mapped(run, made([group(2 * k) for k in range(12)]), concurrency=3)
    assert errors == [] and out == list(range(24))
    # the docstring's and README's bound ("Bounded memory": 2 groups being encoded/collated); the queue of
    # ``concurrency`` futures, the one the consumer awaits and the one the feeder holds at ``put`` make it 2 more
    assert 1 < most[0] <= 3, f"{most[0]} groups ran at once with concurrency=3"


def test_groups_run_at_the_same_time_rather_than_one_after_the_other():
    started = []

    async def run(datas: Sequence[Any]) -> List[Any]:
        started.append(datas[0])
        await asyncio.sleep(0.05)
        return list(datas)

    async def watch() -> None:
        stats = Stats()
        stage = OrderedMap(run, 3, ErrorHandler("raise", None, stats), stats)
        async with asyncio.TaskGroup() as tasks:
            it = cast(AsyncGenerator[Group, None], stage.iterate(made([group(2 * k) for k in range(6)]), tasks))
            await anext(it)
            assert len(started) >= 2, "the next groups started while the first ran"
            await it.aclose()

    asyncio.run(asyncio.wait_for(watch(), 20))


def failing_on(bad: int) -> Any:
    async def run(datas: Sequence[Any]) -> List[Any]:
        await asyncio.sleep(0.001 * (10 - datas[0] % 10))
        out: List[Any] = []
        for d in datas:
            if d == bad:
                failed = StepFailed("batch_encode")
                failed.__cause__ = ValueError(f"cannot encode {d}")
                out.append(failed)
            else:
                out.append(d)
        return out
    return run


def test_a_failed_batch_is_raised_after_every_batch_before_it_came_through():
    out, errors = mapped(failing_on(5), made([group(2 * k) for k in range(5)]), concurrency=3)
    assert out == [0, 1, 2, 3, 4]
    assert len(errors) == 1 and isinstance(errors[0], PipelineError) and isinstance(errors[0], ValueError)
    assert errors[0].stage == "batch_encode" and errors[0].paths == ("file-5",)


def test_a_skipped_batch_leaves_the_rest_of_its_group_and_is_counted():
    stats = Stats()
    out, errors = mapped(failing_on(4), made([group(3 * k, 3) for k in range(3)]), on_error="skip", stats=stats)
    assert errors == [] and out == [0, 1, 2, 3, 5, 6, 7, 8]
    assert stats.skipped_batches == 1 and len(stats.errors) == 1


def test_an_upstream_failure_is_raised_in_order_after_the_groups_before_it():
    async def run(datas: Sequence[Any]) -> List[Any]:
        await asyncio.sleep(0.01)
        return list(datas)

    out, errors = mapped(run, made([group(2 * k) for k in range(5)], fail_after=3))
    assert out == [0, 1, 2, 3, 4, 5]
    assert len(errors) == 1 and isinstance(errors[0], OSError) and "upstream broke" in str(errors[0])


def test_closing_the_output_early_cancels_the_groups_still_running():
    cancelled = []

    async def run(datas: Sequence[Any]) -> List[Any]:
        try:
            await asyncio.sleep(0 if datas[0] == 0 else 30)
        except asyncio.CancelledError:
            cancelled.append(datas[0])
            raise
        return list(datas)

    async def go() -> None:
        stats = Stats()
        stage = OrderedMap(run, 3, ErrorHandler("raise", None, stats), stats)
        async with asyncio.TaskGroup() as tasks:
            it = cast(AsyncGenerator[Group, None], stage.iterate(made([group(2 * k) for k in range(8)]), tasks))
            assert [b.data for b in await anext(it)] == [0, 1]
            await asyncio.sleep(0.02)
            await it.aclose()
        await asyncio.sleep(0.01)

    asyncio.run(asyncio.wait_for(go(), 20))
    assert cancelled and 0 not in cancelled


def test_each_batch_is_given_its_rows_before_it_leaves():
    async def run(datas: Sequence[Any]) -> List[Any]:
        return ["encoded"] * len(datas)

    async def go() -> List[Batch]:
        stats = Stats()
        stage = OrderedMap(run, 2, ErrorHandler("raise", None, stats), stats)
        raw = [Batch(0, 0, {"x": [1, 2, 3]}, ("f",)), Batch(0, 1, {"x": [4]}, ("f",))]
        async with asyncio.TaskGroup() as tasks:
            return [b async for g in stage.iterate(made([raw]), tasks) for b in g]

    batches = asyncio.run(asyncio.wait_for(go(), 20))
    assert [(b.data, b.rows) for b in batches] == [("encoded", 3), ("encoded", 1)]
