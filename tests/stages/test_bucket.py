"""``_stages.bucket.BucketWindows``: where an epoch's bucket windows and chains fall (the planning alone)."""
from __future__ import annotations

import pytest

from pyloader._stages.bucket import CHAIN, BucketWindows

pytestmark = pytest.mark.timeout(30)


def held_and_let_out(w: BucketWindows) -> list:
    """Each window of a chain: (samples it holds, samples it lets out), the longest carried to the next."""
    out, carried = [], 0
    for j in range(w.windows):
        holds = carried + w.own(j)
        last = j == w.windows - 1
        leaves = holds if last else holds - w.carry
        out.append((holds, leaves))
        carried = holds - leaves
    return out


@pytest.mark.parametrize("size, batch_size", [(32, 4), (35, 4), (8, 4), (4, 4), (7, 4), (100, 1), (64, 16)])
def test_a_chains_windows_hold_at_most_the_buffer_and_let_out_whole_batches(size: int, batch_size: int):
    w = BucketWindows.drawn(size, batch_size, seed=1, epoch=0)
    assert w.size == size // batch_size * batch_size, "the buffer is rounded down to whole batches"
    windows = held_and_let_out(w)
    assert all(holds <= w.size for holds, _ in windows)
    assert all(leaves % batch_size == 0 for _, leaves in windows)
    assert sum(leaves for _, leaves in windows) == w.chain == sum(w.own(j) for j in range(w.windows))
    assert w.chain % batch_size == 0


def test_windows_of_one_batch_carry_nothing_and_make_chains_of_one():
    w = BucketWindows.drawn(7, 4, seed=1, epoch=0)
    assert (w.size, w.carry, w.windows, w.chain) == (4, 0, 1, 4)


def test_windows_of_several_batches_carry_a_batch_less_one_within_chains_of_CHAIN():
    w = BucketWindows.drawn(32, 4, seed=1, epoch=0)
    assert (w.carry, w.windows) == (3, CHAIN)


def test_the_first_chain_ends_at_a_whole_batch_drawn_from_the_seed_and_the_epoch():
    offsets = [BucketWindows.drawn(32, 4, seed=2, epoch=e).offset for e in range(12)]
    assert offsets == [BucketWindows.drawn(32, 4, seed=2, epoch=e).offset for e in range(12)]
    chain = BucketWindows.drawn(32, 4, seed=2, epoch=0).chain
    assert all(o % 4 == 0 and 0 <= o < chain for o in offsets)
    assert len(set(offsets)) > 1, "the edges fall elsewhere from one epoch to the next"


def test_chains_tile_the_stream_each_position_in_exactly_one():
    w = BucketWindows(32, 4, 12, seed=0, epoch=0)
    starts = [0]
    while starts[-1] < 500:
        starts.append(w.end(starts[-1]))
    assert starts[:3] == [0, 12, 12 + w.chain]
    for position in range(500):
        start = w.start(position)
        assert start in starts and start <= position < w.end(start)
        assert w.reads_from(position, 500) == start


def test_a_resumed_buffer_starts_at_its_chain_and_drops_what_the_chain_let_out_before_the_position():
    w = BucketWindows(32, 4, 12, seed=0, epoch=0)
    position = 12 + w.chain + 5
    buffer = w.buffer((position, 1000))
    assert buffer.skip == 5
    assert buffer.windows is w
