"""``_stages.shuffle``: the shuffle buffer's draws (``Slots``) and the buffer fed from them, built alone."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import pytest

from pyloader._stages.shuffle import ROUND, Slots

pytestmark = pytest.mark.timeout(30)

SIZE, ROWS = 8, 300


def shuffled(slots: Slots, pieces: Sequence[int], rows: int = ROWS, resume: Optional[Tuple[int, int]] = None,
             first: int = 0) -> List[int]:
    """The ids ``first .. rows-1`` fed through ``slots``' buffer in pieces of the given sizes (cycled), as let out."""
    buffer, at, k = slots.buffer(resume), first, 0
    out: List[int] = []
    while at < rows:
        n = min(pieces[k % len(pieces)], rows - at)
        out.extend(int(i) for part in buffer.feed({"id": np.arange(at, at + n)}) for i in part["id"])
        at, k = at + n, k + 1
    out.extend(int(i) for part in buffer.drain() for i in part["id"])
    return out


def test_every_sample_leaves_the_buffer_exactly_once():
    out = shuffled(Slots(SIZE, 1, 0), [7])
    assert sorted(out) == list(range(ROWS))
    assert out != list(range(ROWS))


def test_what_leaves_does_not_depend_on_how_the_samples_arrive_in_pieces():
    slots = Slots(SIZE, 1, 0)
    assert shuffled(slots, [1]) == shuffled(Slots(SIZE, 1, 0), [300]) == shuffled(slots, [3, 50, 2, 17])


def test_the_order_is_a_pure_function_of_the_seed_and_the_epoch():
    first = shuffled(Slots(SIZE, 5, 2), [10])
    assert shuffled(Slots(SIZE, 5, 2), [10]) == first
    assert shuffled(Slots(SIZE, 5, 3), [10]) != first
    assert shuffled(Slots(SIZE, 6, 2), [10]) != first


def test_a_sample_stays_fewer_than_two_rounds_of_steps():
    out = shuffled(Slots(SIZE, 1, 0), [13])
    stays = [place + SIZE - sample for place, sample in enumerate(out[:ROWS - SIZE])]  # left at step place + SIZE
    assert max(stays) < 2 * ROUND * SIZE
    assert max(stays) > SIZE, "some samples stay longer than a FIFO of the buffer's size would keep them"


def test_each_round_renews_every_slot():
    slots = Slots(SIZE, 1, 0)
    for m in range(5):
        drawn = slots.round(m)
        assert len(drawn) == ROUND * SIZE
        assert set(drawn.tolist()) == set(range(SIZE))


def test_the_slots_held_before_a_step_are_the_positions_the_buffer_holds_there():
    slots = Slots(SIZE, 4, 1)
    held = list(range(SIZE))  # position each slot holds, followed step by step
    renewed = slots.renewed(SIZE, ROWS)
    for step in range(SIZE, ROWS):
        if step % 37 == 0:
            assert slots.held(step).tolist() == held
        held[int(renewed[step - SIZE])] = step
    assert slots.held(3).tolist() == [0, 1, 2]


@pytest.mark.parametrize("out", [0, 1, 5, 8, 40, 150, 292, 295, 299, 300])
def test_a_resumed_buffer_fed_from_reads_from_lets_out_what_the_uninterrupted_one_let_out(out: int):
    whole = shuffled(Slots(SIZE, 3, 0), [11])
    slots = Slots(SIZE, 3, 0)
    start = slots.reads_from(out, ROWS)
    assert out - (2 * ROUND - 1) * SIZE <= start <= out
    assert shuffled(slots, [11], resume=(out, ROWS), first=start) == whole[out:]


@pytest.mark.parametrize("out", [0, 2, 5])
def test_an_epoch_shorter_than_the_buffer_is_let_out_once_in_its_final_order_and_resumes_alike(out: int):
    whole = shuffled(Slots(SIZE, 3, 0), [2], rows=5)
    assert sorted(whole) == list(range(5))
    slots = Slots(SIZE, 3, 0)
    start = slots.reads_from(out, 5)
    assert shuffled(slots, [2], rows=5, resume=(out, 5), first=start) == whole[out:]
