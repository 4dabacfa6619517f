"""Replication (``Ranks(replication=R)``): the ranks of one tensor/sequence parallel group get identical
batches, the groups disjoint ones covering the epoch, in equal steps; any rank's state resumes."""
from __future__ import annotations

import json

import pytest
from conftest import IdReader, ListCollator, write_chunks

import pyloader as pl

pytestmark = pytest.mark.timeout(120)
PADDING = "__padding__"


def make(data, rank, world_size, replication, workers=0, **kwargs):
    return pl.DataLoader(IdReader(3), pl.IdentityDataset(), ListCollator(), data, shuffle=True,
                         num_workers=workers, num_epoch=2,
                         ranks=pl.Ranks(rank=rank, world_size=world_size, replication=replication), **kwargs)


def plain(loader):
    """Every batch of an iteration, its fields as lists."""
    return [{k: [int(x) for x in v] for k, v in b.items()} for b in loader]


def real_ids(batches):
    return [i for b in batches for i, pad in zip(b["id"], b.get(PADDING, [False] * len(b["id"]))) if not pad]


@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_of_a_group_get_identical_batches_and_groups_disjoint_ones_covering_the_epoch(tmp_path, workers):
    write_chunks(tmp_path, [10, 7, 13, 5])
    runs = []
    for rank in range(6):
        loader = make(str(tmp_path), rank, 6, 2, workers, shuffle_buffer=4)
        runs.append(plain(loader))
        loader.close()
    assert len({len(r) for r in runs}) == 1, "every rank takes the same steps"
    for group in range(3):
        assert runs[2 * group] == runs[2 * group + 1]
    got = sorted(real_ids(runs[0]) + real_ids(runs[2]) + real_ids(runs[4]))
    assert got == sorted(list(range(35)) * 2), "the three groups share out both epochs, each sample once"


def test_a_group_reads_what_one_rank_of_as_many_replicas_would(tmp_path):
    write_chunks(tmp_path, [10, 7, 13])
    replicated, single = make(str(tmp_path), 5, 6, 2), make(str(tmp_path), 2, 3, 1)
    assert (replicated.sharding.rank, replicated.sharding.world_size) == (2, 3)
    assert plain(replicated) == plain(single)
    replicated.close()
    single.close()


def test_a_state_saved_by_any_rank_of_any_group_resumes_every_rank(tmp_path):
    write_chunks(tmp_path, [10, 7, 13])
    expected = []
    for rank in range(4):
        loader = make(str(tmp_path), rank, 4, 2)
        expected.append(plain(loader)[4:])
        loader.close()
    saver = make(str(tmp_path), 3, 4, 2)
    it = iter(saver)
    for _ in range(4):
        next(it)
    state = json.loads(json.dumps(saver.state_dict()))
    it.close()
    saver.close()
    for rank in range(4):
        loader = make(str(tmp_path), rank, 4, 2)
        loader.load_state_dict(state)
        assert plain(loader) == expected[rank]
        loader.close()


def test_a_replication_that_does_not_divide_the_world_size_is_an_error(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"Ranks.replication \(4\) must divide world_size \(6\)"):
        pl.Ranks(rank=0, world_size=6, replication=4)
    with pytest.raises(ValueError, match=r"Ranks.replication must be an integer >= 1, got 0"):
        pl.Ranks(replication=0)
    write_chunks(tmp_path, [4])
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match=r"replication \(2\) must divide world_size \(3\)"):
        pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(tmp_path), ranks=pl.Ranks(replication=2))
