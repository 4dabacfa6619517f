"""Schedules (``Shuffle(schedule=...)``): the sources' weights as a function of the step, per tile of the
global order, the same for any world size, and exactly resumable at any step."""
from __future__ import annotations

from typing import List

import numpy as np
import pytest
from conftest import IdReader, ListCollator, spread_positions, state_after

import pyloader as pl
from pyloader.testing import check_resume

G = 6  # the global batch: world sizes 1, 2, 3 and 6 divide it
RAMP = [(0, [1.0, 0.0]), (24, [0.0, 1.0])]  # all of source 0 at step 0, all of source 1 from step 24 on


def _sources(tmp_path, sizes=((40, 20), (30, 25))) -> List[pl.Source]:
    """Sources of ids 0.., 1000..: one folder each."""
    out = []
    for k, files in enumerate(sizes):
        folder = tmp_path / f"s{k}"
        folder.mkdir(parents=True, exist_ok=True)
        at = 1000 * k
        for f, n in enumerate(files):
            (folder / f"p{f}.txt").write_text("".join(f"{at + i}\n" for i in range(n)))
            at += n
        out.append(pl.Source(str(folder)))
    return out


def scheduled(sources, world_size=1, rank=0, *, schedule=RAMP, block=24, num_epoch=1, workers=0, seed=42,
              drop_last=False, **shuffle) -> pl.DataLoader:
    return pl.DataLoader(IdReader(batch_size=G // world_size), pl.IdentityDataset(), ListCollator(), sources,
                         shuffle=pl.Shuffle(block=block, schedule=schedule, **shuffle), num_epoch=num_epoch,
                         workers=workers, random_seed=seed, drop_last=drop_last,
                         ranks=pl.Ranks(rank=rank, world_size=world_size))


def global_batches(sources, world_size=1, **kwargs) -> List[List[int]]:
    per_rank = []
    for rank in range(world_size):
        with scheduled(sources, world_size, rank, **kwargs) as ld:
            per_rank.append([[i for i, pad in zip(b["id"], b.get("__padding__", [False] * G)) if not pad]
                             for b in ld])
    return [sum((per_rank[r][k] for r in range(world_size)), []) for k in range(len(per_rank[0]))]


def share_of_source_1(batches: List[List[int]]) -> List[float]:
    return [float(np.mean(np.asarray(b) >= 1000)) for b in batches]


def test_stratified_batches_follow_the_weights_at_each_tiles_first_step(tmp_path):
    batches = global_batches(_sources(tmp_path), batching="stratified", num_epoch=2)
    span = 24 // G  # rows of a tile: the weights change every 4 steps
    assert len(batches) == 2 * 115 // G + 2  # 115 samples an epoch, none dropped
    for step, batch in enumerate(batches):
        if len(batch) < G:
            continue  # an epoch's short last batch: its rows of the longest columns
        weight = min(1.0, (step - step % span) / 24)  # the ramp at the tile's first step, held after step 24
        assert abs(np.mean(np.asarray(batch) >= 1000) - weight) <= 1 / G + 1e-9, (step, batch)


def test_a_callable_schedule_gives_what_its_points_give(tmp_path):
    sources = _sources(tmp_path)
    points = global_batches(sources, batching="stratified")
    ramp = global_batches(sources, batching="stratified",
                          schedule=lambda step: [max(0.0, 1 - step / 24), min(1.0, step / 24)])
    assert ramp == points


@pytest.mark.parametrize("batching", ["random", "per_source"])
def test_random_and_per_source_batches_follow_the_schedule_on_average(tmp_path, batching):
    sources = _sources(tmp_path, sizes=((200,), (200,)))
    shares = share_of_source_1(global_batches(sources, batching=batching, schedule=[(0, [1, 0]), (60, [0, 1])],
                                              block=12))  # tiles of 2 rows: weights at steps 0, 2, 4...
    assert len(shares) == 67 and shares[:2] == [0.0, 0.0] and set(shares[60:]) == {1.0}, shares
    assert np.mean(shares[:20]) < 0.35 < 0.65 < np.mean(shares[40:60]), shares
    if batching == "per_source":
        assert set(shares) <= {0.0, 1.0}, "each batch from one source"


def test_every_sample_of_a_source_comes_before_any_comes_twice_and_epochs_go_on_where_the_last_stopped(tmp_path):
    sources = _sources(tmp_path)
    with scheduled(sources, schedule=[(0, [1, 1])], batching="stratified", num_epoch=3) as ld:
        ids = [i for b in ld for i in b["id"]]
    assert len(ids) == 3 * 115
    for k, total in ((0, 60), (1, 55)):
        seen = [i - 1000 * k for i in ids if i // 1000 == k]
        counts = np.bincount(seen, minlength=total)
        assert counts.max() - counts.min() <= 1, "balanced: no sample seen twice before every one once"


def test_the_epoch_size_sets_the_samples_and_len_follows_it(tmp_path):
    ld = scheduled(_sources(tmp_path), epoch_size=40, num_epoch=3, drop_last=True)
    assert len(ld) == 3 * (40 // G)
    assert sum(len(b["id"]) for b in ld) == 3 * 36


def test_global_batches_are_the_same_for_every_world_size_and_under_workers(tmp_path):
    sources = _sources(tmp_path)
    one = global_batches(sources, num_epoch=2)
    for world_size in (2, 3):
        assert [sorted(b) for b in global_batches(sources, world_size, num_epoch=2)] == [sorted(b) for b in one]
    assert global_batches(sources, num_epoch=2, workers=2) == one


def test_the_order_is_a_pure_function_of_the_seed_the_epoch_and_the_schedule(tmp_path):
    sources = _sources(tmp_path)
    assert global_batches(sources) == global_batches(sources)
    assert global_batches(sources, seed=7) != global_batches(sources)
    assert global_batches(sources, schedule=[(0, [1, 1])]) != global_batches(sources)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_scheduled_run_resumes_exactly_at_every_position(tmp_path, workers):
    sources = _sources(tmp_path)
    n = check_resume(lambda: scheduled(sources, 2, 1, num_epoch=2, workers=workers, batching="stratified"),
                     positions=spread_positions if workers == 0 else [0, 5, 19, 20, 21, 39])
    assert n == 2 * -(-115 // G)


def test_a_state_resumes_under_another_world_size_and_another_schedule_is_refused(tmp_path):
    sources = _sources(tmp_path)
    whole = global_batches(sources)
    state = state_after(scheduled(sources, 2, 0), 5)
    rest = []
    for rank in range(3):
        resumed = scheduled(sources, 3, rank)
        resumed.load_state_dict(state)
        rest.append([[i for i, pad in zip(b["id"], b.get("__padding__", [False] * G)) if not pad] for b in resumed])
    assert [sorted(sum(parts, [])) for parts in zip(*rest)] == [sorted(b) for b in whole[5:]]
    with pytest.raises(ValueError, match="shuffle"):
        scheduled(sources, 2, 0, schedule=[(0, [1, 0]), (30, [0, 1])]).load_state_dict(state)


@pytest.mark.parametrize("schedule, error, words", [
    ([(0, [1, 0]), (0, [0, 1])], ValueError, "increase"),
    ([(0, [1, -1])], ValueError, ">= 0"),
    ([(0, [0, 0])], ValueError, "not all 0"),
    ([(-1, [1, 1])], ValueError, "integer step"),
    ([], TypeError, "non-empty"),
    ("fast first", TypeError, "callable"),
])
def test_a_bad_schedule_is_refused_when_the_group_is_made(schedule, error, words):
    with pytest.raises(error, match=words):
        pl.Shuffle(schedule=schedule)


def test_weights_of_the_wrong_length_are_refused_naming_the_step(tmp_path):
    with pytest.raises(ValueError, match=r"schedule\(0\).*one per Source"):
        list(scheduled(_sources(tmp_path), schedule=lambda step: [1, 2, 3]))
    with pytest.raises(ValueError, match="one per Source"):
        len(scheduled(_sources(tmp_path), schedule=[(0, [1, 2, 3])]))


def test_a_schedule_that_raises_keeps_its_exception_type(tmp_path):
    def broken(step):
        raise KeyError(f"no weights for step {step}")

    with pytest.raises(KeyError, match="no weights for step 0"):
        len(scheduled(_sources(tmp_path), schedule=broken))


def test_a_schedule_needs_sources_without_their_own_amounts(tmp_path):
    sources = _sources(tmp_path)
    with pytest.raises(ValueError, match="list of pyloader.Source"):
        pl.DataLoader(IdReader(batch_size=G), pl.IdentityDataset(), ListCollator(), sources[0].data_dir,
                      shuffle=pl.Shuffle(schedule=RAMP))
    with pytest.raises(ValueError, match="repeat and choose"):
        scheduled([pl.Source(sources[0].data_dir, repeat=2.0), sources[1]])


def test_a_source_without_samples_is_refused_naming_it(tmp_path):
    sources = _sources(tmp_path, sizes=((10,), (0,)))
    with pytest.raises(ValueError, match="source 1 has no samples"):
        len(scheduled(sources))
