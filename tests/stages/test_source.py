"""``_stages.source.FileSource``: each epoch's plan of files, built alone from made-up files and counts."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple

import pytest

from pyloader._stages.shard import Sharding
from pyloader._stages.source import Elastic, EpochEnd, FileSource, FileTask

pytestmark = pytest.mark.timeout(30)

FILES = [f"f{i:02d}" for i in range(12)]
COUNTS = [5, 3, 7, 2, 4, 6, 1, 8, 3, 5, 2, 4]


def rows_of(source: FileSource, tasks: Sequence[FileTask]) -> List[Tuple[int, int]]:
    """Every (file index, row) the tasks read, in order."""
    assert source.counts is not None
    out: List[Tuple[int, int]] = []
    for task in tasks:
        end = source.counts[task.index] if task.end is None else task.end
        out.extend((task.index, row) for row in range(task.start, end))
    return out


def ranked(world_size: int, rank: int, even_batches: str = "pad", shuffle: bool = True,
           counts: Sequence[Optional[int]] = COUNTS, elastic: Optional[Elastic] = None) -> FileSource:
    return FileSource(FILES, 3, shuffle, 7, Sharding(rank, world_size, even_batches), counts=counts, elastic=elastic)


def test_an_epochs_file_order_is_a_pure_function_of_the_seed_and_the_epoch():
    one, other = FileSource(FILES, 4, True, 7), FileSource(list(FILES), 4, True, 7)
    orders = [one.order(e) for e in range(4)]
    assert orders == [other.order(e) for e in range(4)]
    assert orders == [one.order(e) for e in range(4)]  # asked again: the same
    assert len({tuple(o) for o in orders}) == 4, "each epoch draws its own order"
    assert FileSource(FILES, 4, True, 8).order(0) != orders[0], "another seed, another order"


def test_a_shuffled_epoch_reads_every_file_once():
    source = FileSource(FILES, 2, True, 3)
    for epoch in range(2):
        tasks = list(source.tasks(epoch))
        assert sorted(t.index for t in tasks) == list(range(len(FILES)))
        assert [t.pos for t in tasks] == list(range(len(FILES)))
        assert all(t.path == FILES[t.index] and t.epoch == epoch for t in tasks)
        assert [t.index for t in tasks] != list(range(len(FILES)))


def test_without_shuffle_every_epoch_reads_the_files_whole_in_listed_order():
    source = FileSource(FILES, 2, False, 3)
    for epoch in range(2):
        tasks = list(source.tasks(epoch))
        assert [(t.index, t.start, t.end, t.pad) for t in tasks] == [(i, 0, None, False) for i in range(len(FILES))]


def test_iterate_gives_each_epoch_from_the_start_epoch_closed_by_an_epoch_end():
    source = FileSource(FILES[:2], 4, False, 3)
    items = list(source.iterate(start_epoch=1))
    assert [type(i).__name__ for i in items] == ["FileTask", "FileTask", "EpochEnd"] * 3
    assert [i.epoch for i in items if isinstance(i, EpochEnd)] == [1, 2, 3]
    assert [i.epoch for i in source.iterate(until=2) if isinstance(i, EpochEnd)] == [0, 1]


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_the_ranks_shares_are_disjoint_and_together_cover_the_epoch(world_size: int):
    seen: Set[Tuple[int, int]] = set()
    sizes = []
    for rank in range(world_size):
        source = ranked(world_size, rank)
        share = rows_of(source, [t for t in source.tasks(1) if not t.pad])
        assert not seen & set(share), "a row read by two ranks"
        seen |= set(share)
        sizes.append(len(share))
    assert seen == {(i, r) for i, n in enumerate(COUNTS) for r in range(n)}
    assert max(sizes) - min(sizes) <= 1


def test_a_ranks_share_is_a_contiguous_range_of_the_epochs_sample_stream():
    whole = FileSource(FILES, 3, True, 7, counts=COUNTS)
    stream = rows_of(whole, list(whole.tasks(2)))
    shares = [rows_of(s, [t for t in s.tasks(2) if not t.pad]) for s in (ranked(3, r) for r in range(3))]
    assert shares[0] + shares[1] + shares[2] == stream


@pytest.mark.parametrize("even_batches", ["pad", "drop"])
def test_every_rank_reads_as_many_samples_and_plans_as_many_steps(even_batches: str):
    total = sum(COUNTS)  # 50: shares of 17, 17, 16 over three ranks
    rows, steps = [], []
    for rank in range(3):
        source = ranked(3, rank, even_batches)
        rows.append(source.rows(0))
        steps.append(source.steps(0, 4, None, drop_last=False))
    want = -(-total // 3) if even_batches == "pad" else total // 3
    assert rows == [want] * 3
    assert steps == [-(-want // 4)] * 3


def test_pad_tops_a_short_rank_up_with_rows_flagged_as_padding():
    source = ranked(3, 0, "pad")  # the short rank: 16 of 50 samples (16, 17, 17), topped up to 17
    tasks = list(source.tasks(0))
    padding = [t for t in tasks if t.pad]
    assert padding and all(tasks.index(t) >= len(tasks) - len(padding) for t in padding), "padding comes last"
    assert len(rows_of(source, padding)) == 1
    assert len(rows_of(source, [t for t in tasks if not t.pad])) == 16


def test_drop_trims_the_long_ranks_to_the_shortest_share_with_no_padding():
    for rank in range(3):
        tasks = list(ranked(3, rank, "drop").tasks(0))
        assert not any(t.pad for t in tasks)
        assert len(rows_of(ranked(3, rank, "drop"), tasks)) == 16


def test_under_ranks_each_task_carries_its_files_count():
    source = ranked(2, 1)
    assert all(t.count == COUNTS[t.index] for t in source.tasks(0))


def test_a_file_whose_count_is_unknown_is_left_out_under_ranks():
    counts: List[Optional[int]] = list(COUNTS)
    counts[4] = None
    indices = {t.index for rank in range(2) for t in ranked(2, rank, counts=counts).tasks(0) if not t.pad}
    assert 4 not in indices
    assert indices == set(range(len(FILES))) - {4}


@pytest.mark.parametrize("skip", [0, 1, 5, 6, 19, 49, 50])
def test_tasks_after_reads_exactly_the_rows_after_a_resumed_position(skip: int):
    source = FileSource(FILES, 2, True, 11, counts=COUNTS)
    everything = rows_of(source, list(source.tasks(1)))
    after = list(source.tasks_after(1, skip))
    assert rows_of(source, after) == everything[skip:]
    ends, at = [], 0
    for task in source.tasks(1):
        at += COUNTS[task.index]
        ends.append((at, task.index))
    assert [t.index for t in after] == [index for end, index in ends if end > skip], "files wholly before: not read"


def test_tasks_after_under_ranks_skips_rows_of_this_ranks_share():
    source = ranked(2, 1)
    everything = rows_of(source, list(source.tasks(0)))
    assert rows_of(source, list(source.tasks_after(0, 9))) == everything[9:]


def test_iterate_resumes_only_its_first_epoch_past_skip_rows():
    source = FileSource(FILES, 3, True, 11, counts=COUNTS)
    items = list(source.iterate(start_epoch=1, skip_rows=10))
    first = [i for i in items if isinstance(i, FileTask) and i.epoch == 1]
    second = [i for i in items if isinstance(i, FileTask) and i.epoch == 2]
    assert rows_of(source, first) == rows_of(source, list(source.tasks(1)))[10:]
    assert second == list(source.tasks(2))


def test_an_elastic_resume_shares_out_exactly_what_the_earlier_ranks_left():
    batch_size, taken = 3, 2  # under 2 ranks, each rank took 2 batches of 3 of epoch 0
    delivered: Dict[Tuple[int, int], int] = {}
    for rank in range(2):
        before = ranked(2, rank)
        for row in rows_of(before, list(before.tasks(0)))[:taken * batch_size]:
            delivered[row] = delivered.get(row, 0) + 1
    elastic = Elastic(epoch=0, splits=((2, taken),), batch_size=batch_size)
    now: Dict[Tuple[int, int], int] = {}
    for rank in range(3):
        source = ranked(3, rank, elastic=elastic)
        for row in rows_of(source, [t for t in source.tasks(0) if not t.pad]):
            now[row] = now.get(row, 0) + 1
    assert set(delivered.values()) == {1} and set(now.values()) == {1}, "a row delivered twice"
    assert not set(delivered) & set(now)
    assert set(delivered) | set(now) == {(i, r) for i, n in enumerate(COUNTS) for r in range(n)}
    steps = {ranked(3, rank, elastic=elastic).steps(0, batch_size, None, False) for rank in range(3)}
    assert steps == {taken + 5}, "the 38 rows left: shares of 12, 13, 13, padded to 13: 5 batches of 3"


def test_an_elastic_resume_of_another_epoch_leaves_this_one_whole():
    elastic = Elastic(epoch=0, splits=((2, 2),), batch_size=3)
    assert list(ranked(3, 1, elastic=elastic).tasks(1)) == list(ranked(3, 1).tasks(1))


def test_in_stream_mode_a_rank_takes_every_world_size_th_file_of_the_epoch():
    order = FileSource(FILES, 1, True, 5).order(0)
    for rank in range(3):
        source = FileSource(FILES, 1, True, 5, Sharding(rank, 3), counts=COUNTS, whole_files=True)
        tasks = list(source.tasks(0))
        assert [t.index for t in tasks] == order[rank::3]
        assert all(t.start == 0 and t.end is None for t in tasks)


def test_a_slice_is_read_as_its_bounds_say():
    source = FileSource(["a", "b"], 1, False, 0, bounds=[(2, 5), None])
    tasks = list(source.tasks(0))
    assert [(t.start, t.end) for t in tasks] == [(2, 5), (0, None)]
