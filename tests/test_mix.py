"""Weighted mixing of sources: ``data_dir=[pyloader.Source(...), ...]`` (``pyloader/_mix.py``)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import List, Sequence

import pytest
from conftest import IdReader, ListCollator, wait_no_threads, write_chunks

import pyloader as pl
from pyloader.readers import JsonLinesReader

B_BASE = 1_000_000  # the ids of the JSONL source start here


def write_jsonl(folder: Path, sizes: Sequence[int]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    next_id = B_BASE
    for i, size in enumerate(sizes):
        lines = [json.dumps({"id": next_id + j}) for j in range(size)]
        (folder / f"b-{i:04d}.jsonl").write_text("\n".join(lines) + "\n")
        next_id += size


def mixed(tmp_path: Path, a_sizes: Sequence[int], b_sizes: Sequence[int], weights=(0.5, 0.5),
          batch_size: int = 10, reader_shuffle: bool = False, **kwargs) -> pl.DataLoader:
    """A loader over a text source (``IdReader``, ids from 0) and a JSONL source (ids from ``B_BASE``)."""
    if not (tmp_path / "a").exists():
        write_chunks(tmp_path / "a", a_sizes)
        write_jsonl(tmp_path / "b", b_sizes)
    sources = [pl.Source(str(tmp_path / "a"), weights[0]),
               pl.Source(str(tmp_path / "b"), weights[1], JsonLinesReader(batch_size, shuffle=reader_shuffle))]
    return pl.DataLoader(IdReader(batch_size, shuffle=reader_shuffle), pl.IdentityDataset(), ListCollator(),
                         sources, **kwargs)


def run(loader: pl.DataLoader) -> List[List[int]]:
    with loader:
        return [list(b["id"]) for b in loader]


def ids_of(batches: List[List[int]]) -> List[int]:
    return [i for b in batches for i in b]


@pytest.mark.timeout(120)
def test_two_sources_weighted_half_and_half_come_out_half_and_half_in_every_window_of_1000(tmp_path):
    loader = mixed(tmp_path, [500] * 20, [1000] * 8, weights=(1.0, 1.0), shuffle=True)
    ids = ids_of(run(loader))
    assert len(ids) > 8000
    for start in range(0, len(ids) - 999, 1000):
        share = sum(i >= B_BASE for i in ids[start:start + 1000]) / 1000
        assert abs(share - 0.5) < 0.08, (start, share)  # 5 standard deviations


@pytest.mark.timeout(120)
def test_weights_of_four_to_one_give_a_fifth_of_the_samples_to_the_light_source(tmp_path):
    ids = ids_of(run(mixed(tmp_path, [1000] * 10, [1000] * 5, weights=(4, 1))))
    share = sum(i >= B_BASE for i in ids) / len(ids)
    assert abs(share - 0.2) < 0.03


@pytest.mark.timeout(120)
def test_first_exhausted_ends_the_epoch_when_a_source_has_given_every_sample_once(tmp_path):
    loader = mixed(tmp_path, [300] * 10, [100, 150, 50], stop="first_exhausted")
    n = len(loader)  # before: afterwards it is the next epoch's
    batches = run(loader)
    ids = ids_of(batches)
    b = [i for i in ids if i >= B_BASE]
    assert sorted(b) == list(range(B_BASE, B_BASE + 300))  # the short source, each sample once, ...
    assert b == sorted(b)  # ... in its order
    a = [i for i in ids if i < B_BASE]
    assert a == list(range(len(a)))  # the long one's first samples, in order
    assert ids[-1] >= B_BASE  # the epoch ends with the short source's last sample
    assert all(len(x) == 10 for x in batches[:-1])  # batches are cut from the mixed stream
    assert n == len(batches)


@pytest.mark.timeout(120)
def test_the_default_stop_is_first_exhausted(tmp_path):
    default = ids_of(run(mixed(tmp_path, [300] * 3, [100])))
    assert default == ids_of(run(mixed(tmp_path, [300] * 3, [100], stop="first_exhausted")))


@pytest.mark.timeout(120)
def test_all_exhausted_restarts_the_short_source_until_every_source_gave_every_sample(tmp_path):
    loader = mixed(tmp_path, [300] * 10, [100, 150, 50], stop="all_exhausted")
    n = len(loader)
    batches = run(loader)
    ids = ids_of(batches)
    a = [i for i in ids if i < B_BASE]
    assert a == list(range(3000))  # the long source once, in order
    counts = Counter(i for i in ids if i >= B_BASE)
    assert set(counts) == set(range(B_BASE, B_BASE + 300)) and max(counts.values()) > 1  # restarted
    assert ids[-1] == 2999  # the epoch ends with the long source's last sample
    assert n == len(batches)


@pytest.mark.timeout(120)
def test_a_mixed_epoch_is_the_same_on_every_run_and_another_in_the_next_epoch(tmp_path):
    first = run(mixed(tmp_path, [200] * 5, [100] * 5, shuffle=True, reader_shuffle=True, num_epoch=2))
    again = run(mixed(tmp_path, [200] * 5, [100] * 5, shuffle=True, reader_shuffle=True, num_epoch=2))
    assert first == again
    n = len(first) // 2
    assert first[:n] != first[n:]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_mixed_run_gives_the_same_batches_with_workers_and_resumes_exactly(tmp_path, num_workers):
    def make(**kw):
        return mixed(tmp_path, [120] * 6, [70] * 4, shuffle=True, reader_shuffle=True, num_epoch=2,
                     stop="all_exhausted", **kw)

    reference = run(make())
    assert sum(map(len, reference)) > 0
    loader = make(num_workers=num_workers)
    with loader:
        it = iter(loader)
        head = [list(next(it)["id"]) for _ in range(len(reference) // 2 + 3)]
        state = json.loads(json.dumps(loader.state_dict()))
    resumed = make(num_workers=num_workers)
    resumed.load_state_dict(state)
    assert head + run(resumed) == reference


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_share_the_mixed_stream_with_equal_steps_each_sample_once(tmp_path, world_size):
    whole = ids_of(run(mixed(tmp_path, [130] * 5, [90] * 3, shuffle=True)))
    shares = []
    for rank in range(world_size):
        loader = mixed(tmp_path, [130] * 5, [90] * 3, shuffle=True, ranks=pl.Ranks(rank=rank, world_size=world_size))
        n = len(loader)
        batches = list(loader)
        assert len(batches) == n
        real = [i for b in batches for i, pad in zip(b["id"], b["__padding__"]) if not pad]
        shares.append((len(batches), real))
        loader.close()
    assert len({steps for steps, _ in shares}) == 1  # equal steps
    assert [i for _, real in shares for i in real] == whole  # contiguous shares of the one plan


@pytest.mark.timeout(120)
def test_a_mixed_run_resumes_exactly_under_ranks(tmp_path):
    def make():
        return mixed(tmp_path, [130] * 5, [90] * 3, shuffle=True, ranks=pl.Ranks(rank=1, world_size=2), num_epoch=2)

    reference = run(make())
    loader = make()
    with loader:
        it = iter(loader)
        head = [list(next(it)["id"]) for _ in range(5)]
        state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + run(resumed) == reference


@pytest.mark.timeout(120)
def test_a_state_saved_with_other_weights_or_stop_is_refused_naming_them(tmp_path):
    loader = mixed(tmp_path, [100] * 3, [100] * 3)
    state = loader.state_dict()
    with pytest.raises(ValueError, match="mix"):
        mixed(tmp_path, [100] * 3, [100] * 3, weights=(0.7, 0.3)).load_state_dict(state)
    with pytest.raises(ValueError, match="all_exhausted"):
        mixed(tmp_path, [100] * 3, [100] * 3, stop="all_exhausted").load_state_dict(state)
    mixed(tmp_path, [100] * 3, [100] * 3).load_state_dict(state)


def test_bad_sources_and_stop_values_are_refused_at_construction(tmp_path):
    write_chunks(tmp_path / "a", [5])
    with pytest.raises(ValueError, match="weight"):
        pl.Source(str(tmp_path / "a"), weight=0)
    with pytest.raises(ValueError, match="stop"):
        mixed(tmp_path, [5], [5], stop="longest")
    with pytest.raises(ValueError, match="stream"):
        mixed(tmp_path, [5], [5], stream=True)
    with pytest.raises(TypeError, match="Source"):
        pl.DataLoader(IdReader(4), pl.IdentityDataset(), ListCollator(),
                      [pl.Source(str(tmp_path / "a")), str(tmp_path / "a" / "part-0000.txt")])
    with pytest.raises(ValueError, match="one source only"):
        pl.DataLoader(IdReader(4), pl.IdentityDataset(), ListCollator(),
                      [pl.Source(str(tmp_path / "a")), pl.Source(str(tmp_path / "a"))])


@pytest.mark.timeout(60)
def test_a_source_with_no_samples_is_an_error_naming_it(tmp_path):
    write_chunks(tmp_path / "a", [5])
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "empty.txt").write_text("")
    loader = pl.DataLoader(IdReader(4), pl.IdentityDataset(), ListCollator(),
                           [pl.Source(str(tmp_path / "a")), pl.Source(str(tmp_path / "e"))])
    with loader, pytest.raises(ValueError, match="empty|no samples"):
        list(iter(loader))
    assert wait_no_threads() == []


@pytest.mark.timeout(120)
def test_stats_count_the_samples_each_source_gave(tmp_path):
    loader = mixed(tmp_path, [100] * 4, [60] * 2, weights=(3, 1), stop="all_exhausted")
    ids = ids_of(run(loader))
    sources = loader.stats["sources"]
    assert [s["samples"] for s in sources] == [sum(i < B_BASE for i in ids), sum(i >= B_BASE for i in ids)]
    assert [s["weight"] for s in sources] == [0.75, 0.25]
    assert sources[1]["data_dir"] == str(tmp_path / "b")


def test_a_loader_without_sources_reports_no_sources_in_its_stats(tmp_path):
    write_chunks(tmp_path / "a", [5])
    loader = pl.DataLoader(IdReader(4), pl.IdentityDataset(), ListCollator(), str(tmp_path / "a"))
    assert "sources" not in loader.stats


# -- shares smaller than the ranks, filters, counts of 0 ------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_rank_whose_mixed_share_is_empty_gets_a_padding_batch_as_a_plain_loader_gives_it(tmp_path, num_workers):
    """Source b has 1 sample: the first_exhausted epoch is 2 samples long, fewer than the 3 ranks."""
    shares = []
    for rank in range(3):
        loader = mixed(tmp_path, [40], [1], weights=(1, 1), batch_size=4, ranks=pl.Ranks(rank=rank, world_size=3),
                       num_workers=num_workers)
        with loader:
            batches = list(loader)
        assert len(batches) == 1  # the steps every rank gives
        shares.append([(i, bool(pad)) for b in batches for i, pad in zip(b["id"], b["__padding__"])])
    real = [i for share in shares for i, pad in share if not pad]
    assert sorted(real) == [0, B_BASE]  # the epoch's 2 samples, once across ranks
    empty = [share for share in shares if all(pad for _, pad in share)]
    assert len(empty) == 1 and len(empty[0]) == 1  # a padding batch of one sample, as a plain loader gives

    write_chunks(tmp_path / "plain", [2])
    plain = [list(pl.DataLoader(IdReader(4), pl.IdentityDataset(), ListCollator(), str(tmp_path / "plain"),
                                ranks=pl.Ranks(rank=rank, world_size=3), num_workers=0)) for rank in range(3)]
    assert [[list(b["__padding__"]) for b in p] for p in plain] == [[[bool(pad) for _, pad in s]] for s in shares]


def drop_ten_to_nineteen(sample):
    return not 10 <= sample["id"] < 20


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_filter_that_drops_a_whole_piece_of_a_mixed_source_works_as_without_mixing(tmp_path, num_workers):
    """File a/part-0001 (ids 10..19) is one piece and the filter drops all of it."""
    loader = mixed(tmp_path, [10, 10, 10], [10, 10], weights=(1, 1), batch_size=4, stop="all_exhausted",
                   filter_fn=drop_ten_to_nineteen, num_workers=num_workers)
    ids = ids_of(run(loader))
    kept = [i for i in range(30) if not 10 <= i < 20] + list(range(B_BASE, B_BASE + 20))
    assert set(ids) == set(kept)  # every sample the filter kept, as without mixing
    assert [i for i in ids if i < B_BASE] == [i for i in range(30) if not 10 <= i < 20]
    assert loader.stats["filtered_samples"] == 10


class CountsOneFileEmpty(IdReader):
    """Says a/part-0001 holds no samples (it holds 10)."""

    def count(self, path):
        return 0 if path.endswith("part-0001.txt") else super().count(path)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("world_size", [1, 2])
def test_a_mixed_file_counted_empty_that_holds_samples_is_an_error_naming_it(tmp_path, num_workers, world_size):
    write_chunks(tmp_path / "a", [10, 10, 10])
    write_jsonl(tmp_path / "b", [10, 10])
    errors = []
    for rank in range(world_size):
        loader = pl.DataLoader(CountsOneFileEmpty(4), pl.IdentityDataset(), ListCollator(),
                               [pl.Source(str(tmp_path / "a")), pl.Source(str(tmp_path / "b"), 1.0,
                                                                          JsonLinesReader(4))],
                               stop="all_exhausted", ranks=pl.Ranks(rank=rank, world_size=world_size),
                               num_workers=num_workers)
        with loader:
            try:
                list(loader)
            except pl.PipelineError as exc:
                errors.append(str(exc))
    assert len(errors) == 1  # one rank reads it to check
    assert "part-0001.txt" in errors[0] and "more samples than the 0 DataReader.count said" in errors[0]
