"""``_stages.shard``: which rank reads which rows, and that every rank plans the same steps."""
from __future__ import annotations

from typing import List, Tuple

import pytest

from pyloader._stages.shard import (
    Sharding,
    batches_of,
    bounds,
    planned_steps,
    ranges,
    rank_ranges,
    resolve,
    stream_shares,
    stream_target,
    undelivered,
)

pytestmark = pytest.mark.timeout(30)

ORDER = [3, 0, 2, 1, 4]
COUNTS = [4, 7, 1, 5, 6]  # 23 samples


def rows(part: List[Tuple[int, int, int]]) -> List[Tuple[int, int]]:
    """(file index, row) of each row of ``part`` (ranges naming files by their place in ``ORDER``)."""
    return [(ORDER[pos], row) for pos, start, end in part for row in range(start, end)]


def test_explicit_rank_and_world_size_win_over_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert resolve(1, 2, "drop") == Sharding(1, 2, "drop")
    assert resolve(None, None, "pad") == Sharding(3, 8, "pad")


@pytest.mark.parametrize("rank, world_size", [(2, 2), (-1, 2), (0, 0), (True, 2), (0, 2.0)])
def test_an_impossible_rank_or_world_size_is_refused(rank: object, world_size: object):
    with pytest.raises(ValueError, match="rank|world_size"):
        resolve(rank, world_size, "pad")  # type: ignore[arg-type]


def test_an_unknown_even_batches_is_refused():
    with pytest.raises(ValueError, match="even_batches"):
        resolve(0, 1, "wrap")


@pytest.mark.parametrize("total, world_size", [(23, 4), (3, 5), (0, 2), (10, 1)])
def test_the_ranks_ranges_differ_in_size_by_at_most_one_and_tile_the_epoch(total: int, world_size: int):
    cuts = bounds(total, world_size)
    sizes = [b - a for a, b in zip(cuts, cuts[1:])]
    assert cuts[0] == 0 and cuts[-1] == total and len(sizes) == world_size
    assert max(sizes) - min(sizes) <= 1


def test_ranges_cut_rows_of_the_epoch_stream_into_per_file_ranges():
    # the stream in ORDER: file 3 (5 rows), file 0 (4), file 2 (1), file 1 (7), file 4 (6)
    assert ranges(ORDER, COUNTS, 3, 11) == [(0, 3, 5), (1, 0, 4), (2, 0, 1), (3, 0, 1)]
    assert ranges(ORDER, COUNTS, 0, 0) == []


@pytest.mark.parametrize("world_size", [2, 3, 4, 7])
@pytest.mark.parametrize("even_batches", ["pad", "drop"])
def test_every_rank_plans_the_same_steps_and_its_rows_make_them(world_size: int, even_batches: str):
    sizes, steps = [], []
    for rank in range(world_size):
        s = Sharding(rank, world_size, even_batches)
        share, padding = rank_ranges(ORDER, COUNTS, s)
        sizes.append(len(rows(share)) + len(rows(padding)))
        steps.append(planned_steps(ORDER, COUNTS, s, 2, drop_last=False))
        if even_batches == "drop":
            assert padding == []
    assert len(set(sizes)) == 1 and len(set(steps)) == 1
    want = -(-23 // world_size) if even_batches == "pad" else 23 // world_size
    assert sizes[0] == want and steps[0] == -(-want // 2)


def test_padding_repeats_the_rows_after_the_share_wrapping_round_to_the_epochs_start():
    world_size = 4  # 23 rows: shares of 5, 6, 6, 6; rank 0 is topped up with one row
    share, padding = rank_ranges(ORDER, COUNTS, Sharding(0, world_size, "pad"))
    stream = rows(ranges(ORDER, COUNTS, 0, 23))
    assert rows(share) == stream[:5]
    assert rows(padding) == stream[5:6]
    last_share, last_padding = rank_ranges([0], [5], Sharding(2, 3, "pad"))  # 5 rows: 1, 2, 2
    assert rows_of_single(last_share) == [3, 4] and last_padding == []
    first_share, first_padding = rank_ranges([0], [5], Sharding(0, 3, "pad"))
    assert rows_of_single(first_share) == [0] and rows_of_single(first_padding) == [1]


def rows_of_single(part: List[Tuple[int, int, int]]) -> List[int]:
    return [row for _, start, end in part for row in range(start, end)]


def test_a_rank_with_nothing_of_its_own_is_padded_from_the_epochs_start():
    share, padding = rank_ranges([0], [2], Sharding(0, 3, "pad"))  # 2 rows over 3 ranks: 0, 1, 1
    assert share == [] and rows_of_single(padding) == [0]


@pytest.mark.parametrize("samples, batch_size, drop_last, rotation, want", [
    (10, 4, False, 1, 3), (10, 4, True, 1, 2), (8, 4, False, 1, 2), (0, 4, False, 1, 0),
    (10, 4, False, 3, 8), (10, 4, True, 3, 6)])
def test_batches_of_counts_the_short_batch_unless_dropped(samples: int, batch_size: int, drop_last: bool,
                                                         rotation: int, want: int):
    assert batches_of(samples, batch_size, drop_last, rotation) == want


def test_undelivered_leaves_the_rows_past_what_each_rank_took():
    # 20 rows under 2 ranks (0..10, 10..20), each took 2 batches of 3
    assert undelivered(20, [(2, 2)], 3, "pad") == [(6, 10), (16, 20)]
    # a second split of 4 ranks shares those 8 rows out (2 each) and each took 1 batch of 3: all of it
    assert undelivered(20, [(2, 2), (4, 1)], 3, "pad") == []


def test_in_stream_mode_ranks_take_every_world_size_th_file():
    assert stream_shares(list("abcdefg"), 3) == [list("adg"), list("be"), list("cf")]


def test_stream_target_is_the_longest_ranks_steps_with_pad_and_the_shortest_with_drop():
    lengths = [[4, 4], [2], [6, 1]]  # rows=1, width=2: 4, 1 and 4 steps
    assert stream_target(lengths, 1, 2, "pad") == 4
    assert stream_target(lengths, 1, 2, "drop") == 1
