"""``_stages.even.EvenSteps``: a rank gives every planned step, padding the holes skipped batches leave."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable, Dict, List, Sequence, Tuple

import numpy as np
import pytest

from pyloader._stages.batch import PADDING, Batch, Group
from pyloader._stages.even import PAD_FLAGS, EvenSteps

pytestmark = pytest.mark.timeout(30)

Step = Tuple[int, int]


def batch(epoch: int, index: int, meta: bool = True) -> Batch:
    flags = {PADDING: np.zeros(2, dtype=bool)} if meta else None
    return Batch(epoch, index, {"x": f"{epoch}.{index}"}, (f"f{epoch}",), flags)


async def made(groups: Sequence[Group]) -> AsyncIterator[Group]:
    for group in groups:
        await asyncio.sleep(0)
        yield group


def even(steps: Callable[[int], int], groups: Sequence[Sequence[Step]], epoch: int = 0, skip: int = 0,
         num_epoch: int = 1) -> List[Tuple[int, int, Any, bool]]:
    """(epoch, index, data, padding?) of each batch ``EvenSteps`` gives for groups of the given steps."""
    made_groups = [[batch(e, i) for e, i in group] for group in groups]

    async def run() -> List[Group]:
        return [g async for g in EvenSteps(steps, epoch, skip, num_epoch).iterate(made(made_groups))]

    out = asyncio.run(asyncio.wait_for(run(), 10))
    return [(b.epoch, b.index, b.data["x"], bool((b.meta or {}).get(PADDING, np.zeros(1)).all()))
            for g in out for b in g]


def test_batches_that_all_came_pass_through_unchanged():
    out = even(lambda e: 3, [[(0, 0), (0, 1)], [(0, 2)]])
    assert out == [(0, 0, "0.0", False), (0, 1, "0.1", False), (0, 2, "0.2", False)]


def test_a_hole_is_filled_with_a_copy_of_the_next_batch_flagged_as_padding():
    out = even(lambda e: 4, [[(0, 0), (0, 2)], [(0, 3)]])
    assert out == [(0, 0, "0.0", False), (0, 1, "0.2", True), (0, 2, "0.2", False), (0, 3, "0.3", False)]


def test_holes_at_the_start_of_a_group_are_filled_before_it():
    out = even(lambda e: 3, [[(0, 0)], [(0, 2)]])
    assert [(e, i, pad) for e, i, _, pad in out] == [(0, 0, False), (0, 1, True), (0, 2, False)]


def test_holes_at_the_end_of_the_run_are_copies_of_its_last_batch_flagged_even_once_its_metadata_joined_it():
    groups = [[batch(0, 0), batch(0, 1)]]

    async def run() -> List[Group]:
        out = []
        async for group in EvenSteps(lambda e: 4, 0, 0, 1).iterate(made(groups)):
            out.append(group)
            for b in group:  # what the consumer does to each group as it comes (``attach_meta``)
                b.data, b.meta = {**b.data, **(b.meta or {})}, None
        return out

    out = [b for g in asyncio.run(asyncio.wait_for(run(), 10)) for b in g]
    assert [(b.index, b.data["x"]) for b in out] == [(0, "0.0"), (1, "0.1"), (2, "0.1"), (3, "0.1")]
    assert [bool(np.all(b.data[PADDING])) for b in out] == [False, False, True, True]


def test_holes_at_the_end_of_an_epoch_are_filled_from_the_next_epochs_first_batch():
    out = even(lambda e: 3, [[(0, 0)], [(1, 0), (1, 1), (1, 2)]], num_epoch=2)
    assert out[:3] == [(0, 0, "0.0", False), (0, 1, "1.0", True), (0, 2, "1.0", True)]
    assert [(e, i) for e, i, _, _ in out] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


def test_holes_at_the_end_of_the_run_are_filled_with_the_last_batch():
    out = even(lambda e: 2 if e == 0 else 3, [[(0, 0), (0, 1)], [(1, 0)]], num_epoch=2)
    assert out[2:] == [(1, 0, "1.0", False), (1, 1, "1.0", True), (1, 2, "1.0", True)]


def test_a_resumed_run_owes_only_the_steps_from_its_position():
    out = even(lambda e: 4, [[(0, 2), (0, 3)]], epoch=0, skip=2)
    assert [pad for *_, pad in out] == [False, False]


def test_an_epoch_planned_with_no_steps_owes_none():
    out = even(lambda e: 0 if e == 0 else 1, [[(1, 0)]], num_epoch=2)
    assert out == [(1, 0, "1.0", False)]


def test_a_run_with_no_batch_at_all_cannot_pad_and_says_so():
    with pytest.raises(RuntimeError, match="nothing to pad the 2 steps"):
        even(lambda e: 2, [])


def test_the_planned_steps_of_an_epoch_are_asked_for_once():
    asked: Dict[int, int] = {}

    def steps(epoch: int) -> int:
        asked[epoch] = asked.get(epoch, 0) + 1
        return 5

    even(steps, [[(0, 0)], [(0, 2)], [(0, 4)]])
    assert asked == {0: 1}


def test_a_padding_batch_has_every_metadata_field_saying_padding():
    meta = {key: np.zeros(3, dtype=type(value)) for key, value in PAD_FLAGS.items()}
    groups = [[Batch(0, 1, {"x": "0.1"}, ("f",), meta)]]

    async def run() -> List[Group]:
        return [g async for g in EvenSteps(lambda e: 2, 0, 0, 1).iterate(made(groups))]

    out = asyncio.run(asyncio.wait_for(run(), 10))
    padding = out[0][0]
    assert (padding.epoch, padding.index, padding.data) == (0, 0, {"x": "0.1"})
    assert padding.meta is not None
    assert {key: flags.tolist() for key, flags in padding.meta.items()} == {
        key: [value] * 3 for key, value in PAD_FLAGS.items()}
    assert not out[1][0].meta[PADDING].any(), "the batch copied keeps its own flags"


def test_holes_at_the_end_of_the_run_are_copied_from_the_last_batch_as_it_came_not_as_the_consumer_changed_it():
    """The consumer adds each batch's metadata to its data as it takes it (``_pipeline._with_meta``): the
    copy for the run's last holes is of the batch before that, flagged as padding in full."""
    async def run() -> List[Tuple[int, int, Any, Any]]:
        out = []
        async for group in EvenSteps(lambda e: 3, 0, 0, 1).iterate(made([[batch(0, 0)]])):
            for b in group:
                b.data, b.meta = {**b.data, **(b.meta or {})}, None  # as the consumer attaches it
                out.append((b.epoch, b.index, b.data["x"], b.data[PADDING].tolist()))
        return out

    out = asyncio.run(asyncio.wait_for(run(), 10))
    assert out == [(0, 0, "0.0", [False, False]), (0, 1, "0.0", [True, True]), (0, 2, "0.0", [True, True])]
