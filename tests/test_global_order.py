"""The global order (``shuffle=Shuffle(...)``): one permutation of every sample, made a block at a time,
the same global batches for any world size, elastic resume at any global batch."""
from __future__ import annotations

import json
from typing import Dict, List

import numpy as np
import pytest
from conftest import IdReader, ListCollator, ids_of, state_after, write_chunks

import pyloader as pl
from pyloader.readers import JsonLinesReader, TextLinesReader, _ranges
from pyloader.testing import check_resume

G = 12  # the global batch in these tests: world sizes 1, 2, 3, 4, 6 and 12 divide it
SIZES = [37, 5, 0, 40, 23, 1, 30, 14]  # 150 samples, one file empty


class RangeReader(IdReader):
    """An ``IdReader`` that reads a range straight from the file, and counts the ranges it read."""

    def __init__(self, batch_size=4, **kwargs):
        super().__init__(batch_size, **kwargs)
        self.ranges = []

    def read_range(self, path, start, stop):
        self.ranges.append((path, start, stop))
        with open(path) as f:
            ids = [int(line) for k, line in enumerate(f) if start <= k < stop]
        return {"id": ids}, len(ids)


def loader(folder, world_size=1, rank=0, *, reader=IdReader, block=60, num_epoch=1, seed=42, drop_last=False,
           workers=0, global_batch=G) -> pl.DataLoader:
    return pl.DataLoader(reader(batch_size=global_batch // world_size), pl.IdentityDataset(), ListCollator(),
                         str(folder), shuffle=pl.Shuffle(block=block), random_seed=seed, num_epoch=num_epoch,
                         drop_last=drop_last, ranks=pl.Ranks(rank=rank, world_size=world_size),
                         workers=workers)


def global_batches(folder, world_size, **kwargs) -> List[List[int]]:
    """Every global batch of the run: rank slices joined in rank order, padding left out."""
    per_rank = []
    for rank in range(world_size):
        with loader(folder, world_size, rank, **kwargs) as ld:
            per_rank.append([[i for i, pad in zip(b["id"], b.get("__padding__", [False] * len(b["id"]))) if not pad]
                             for b in ld])
    steps = {len(batches) for batches in per_rank}
    assert len(steps) == 1, f"ranks took different steps: {steps}"
    return [sum((per_rank[r][k] for r in range(world_size)), []) for k in range(steps.pop())]


@pytest.fixture
def data(tmp_path):
    write_chunks(tmp_path / "d", SIZES)
    return tmp_path / "d"


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_delivers_every_sample_once_in_an_order_no_file_order_gives(data, workers):
    with loader(data, workers=workers, num_epoch=2) as ld:
        epochs = [[], []]
        for batch in ld:
            epochs[ld.epoch].extend(batch["id"])
    for ids in epochs:
        assert sorted(ids) == list(range(sum(SIZES)))
    assert epochs[0] != epochs[1], "each epoch has its own order"
    first_batch = epochs[0][:G]
    assert len({i // 20 for i in first_batch}) > 4, "a batch mixes samples from all over the data"


def test_global_batches_are_the_same_for_every_world_size_dividing_the_global_batch(data):
    one = global_batches(data, 1)
    assert sorted(i for b in one for i in b) == list(range(sum(SIZES)))
    for world_size in (2, 3, 4, 6):
        got = global_batches(data, world_size)
        assert [sorted(b) for b in got] == [sorted(b) for b in one], f"world_size={world_size}"


def test_global_batches_are_the_same_under_workers(data):
    assert global_batches(data, 2, workers=2) == global_batches(data, 2, workers=0)


def test_the_order_is_a_pure_function_of_the_seed_and_the_epoch(data):
    a, b, c = (ids_of(loader(data, seed=seed)) for seed in (1, 1, 2))
    assert a == b and a != c


def test_drop_last_leaves_out_a_partial_global_batch_and_every_batch_is_full(data):
    got = global_batches(data, 3, drop_last=True)
    assert all(len(b) == G for b in got)
    assert len(got) == sum(SIZES) // G
    assert len(set(i for b in got for i in b)) == len(got) * G


def test_ranks_take_equal_steps_and_len_says_them(data):
    lengths = set()
    for rank in range(4):
        ld = loader(data, 4, rank)
        batches = list(ld)
        lengths.add((len(ld), len(batches)))
    assert lengths == {(-(-sum(SIZES) // G),) * 2}


def test_a_block_of_the_whole_data_and_a_block_of_one_batch_both_cover_the_epoch(data):
    for block in (1, G, 10_000):
        assert sorted(ids_of(loader(data, block=block))) == list(range(sum(SIZES)))


def test_a_reader_with_read_range_reads_each_range_alone(data):
    reader = RangeReader(batch_size=G)
    ld = pl.DataLoader(reader, pl.IdentityDataset(), ListCollator(), str(data), shuffle=pl.Shuffle(block=60),
                       workers=0)
    assert sorted(ids_of(ld)) == list(range(sum(SIZES)))
    assert sum(stop - start for _, start, stop in reader.ranges) == sum(SIZES), "every sample read once"
    assert len(reader.ranges) > len([n for n in SIZES if n]), "a file read in ranges, not whole"


@pytest.mark.parametrize("reader", [TextLinesReader, JsonLinesReader])
def test_the_built_in_line_readers_follow_the_global_order(tmp_path, reader):
    folder = tmp_path / "j"
    folder.mkdir()
    for f in range(3):
        (folder / f"p{f}.txt").write_text("".join(json.dumps({"text": str(f * 10 + i)}) + "\n" for i in range(10)))
    ld = pl.DataLoader(reader(batch_size=4), pl.IdentityDataset(), ListCollator(), str(folder),
                       shuffle=pl.Shuffle(block=8), workers=0)
    key = "text"
    got = [b[key][k] for b in ld for k in range(len(b[key]))]
    values = sorted(json.loads(v)["text"] if reader is TextLinesReader else v for v in got)
    assert values == sorted(str(i) for i in range(30))


def _state_after(folder, world_size, steps, **kwargs) -> Dict:
    """Rank 0's state after ``steps`` global batches under ``world_size`` (every rank's is the same)."""
    return state_after(loader(folder, world_size, 0, **kwargs), steps)


@pytest.mark.parametrize("before, after", [(2, 3), (4, 2), (3, 1), (1, 6)])
def test_a_state_resumes_under_another_world_size_with_every_sample_once(data, before, after):
    whole = global_batches(data, 1)
    steps = 5
    state = _state_after(data, before, steps)
    rest = []
    for rank in range(after):
        ld = loader(data, after, rank)
        ld.load_state_dict(state)
        rest.append([[i for i, pad in zip(b["id"], b.get("__padding__", [False] * len(b["id"]))) if not pad]
                     for b in ld])
    resumed = [sum((rest[r][k] for r in range(after)), []) for k in range(len(rest[0]))]
    assert [sorted(b) for b in resumed] == [sorted(b) for b in whole[steps:]]


def test_a_state_under_another_global_batch_is_refused_naming_it(data):
    state = _state_after(data, 2, 3)
    ld = loader(data, 2, 0, global_batch=8)
    with pytest.raises(ValueError, match="batch_size"):
        ld.load_state_dict(state)


@pytest.mark.parametrize("workers", [0, 2])
def test_it_resumes_exactly_at_every_position(data, workers):
    def make():
        return loader(data, 3, 1, num_epoch=2, workers=workers)
    n = check_resume(make, positions=None if workers == 0 else [0, 1, 6, 13, 14, 20])
    assert n == 2 * -(-sum(SIZES) // G)


def test_a_rank_with_nothing_in_the_last_global_batch_pads_it_and_resumes_there_exactly(tmp_path):
    write_chunks(tmp_path / "d", SIZES + [2])  # 152 samples: the last global batch holds 8 of 12
    for rank in range(6):  # 2 samples a rank: the ranks past the 8 samples get a padding batch
        check_resume(lambda r=rank: loader(tmp_path / "d", 6, r, num_epoch=2), positions=[11, 12, 13, 25])


@pytest.mark.parametrize("options, word", [
    (dict(order=pl.Order(shuffle_buffer=10)), "shuffle_buffer"),
    (dict(stream=True), "stream"),
    (dict(order=pl.Order(filter_fn=lambda s: True)), "filter_fn"),
])
def test_orders_it_replaces_and_features_it_does_not_compose_with_yet_are_refused(data, options, word):
    with pytest.raises(ValueError, match=word):
        pl.DataLoader(IdReader(batch_size=4), pl.IdentityDataset(), ListCollator(), str(data),
                      shuffle=pl.Shuffle(), **options)


def test_the_reader_shuffle_is_refused_beside_it(data):
    with pytest.raises(ValueError, match="DataReader\\(shuffle=False\\)"):
        pl.DataLoader(IdReader(batch_size=4, shuffle=True), pl.IdentityDataset(), ListCollator(), str(data),
                      shuffle=pl.Shuffle())


def test_batches_mix_single_class_files_about_as_well_as_a_random_permutation(tmp_path):
    """100 files of one class each: a block of 10% of the data mixes each batch as a uniform permutation does."""
    folder = tmp_path / "classes"
    write_chunks(folder, [100] * 100)
    batch = 50
    ld = pl.DataLoader(IdReader(batch_size=batch), pl.IdentityDataset(), ListCollator(), str(folder),
                       shuffle=pl.Shuffle(block=1000), workers=0, drop_last=True)
    ours = np.mean([_tv(np.asarray(b["id"]) // 100) for b in ld])
    rng = np.random.default_rng(0)
    ideal = np.mean([_tv(p // 100) for p in rng.permutation(10_000)[: 10_000 // batch * batch].reshape(-1, batch)])
    assert ours <= ideal + 0.05 * (1 - ideal)


def _tv(classes: np.ndarray) -> float:
    """Total-variation distance of a batch's class histogram from the uniform one over 100 classes."""
    hist = np.bincount(classes, minlength=100) / len(classes)
    return 0.5 * float(np.abs(hist - 0.01).sum())


@pytest.mark.parametrize("skip_blank", [False, True])
def test_a_line_reader_reads_a_range_from_its_bytes_as_iter_file_gives_it(tmp_path, skip_blank):
    path = tmp_path / "lines.txt"
    lines = [f"line {i}" if i % 7 else "  " for i in range(300)]
    path.write_text("\n".join(lines) + "\n")
    assert _ranges.line_table(str(path), "utf-8", skip_blank) is not None
    reader = TextLinesReader(skip_blank=skip_blank)
    whole = [t for piece in reader.iter_file(str(path)) for t in piece["text"]]
    for start, stop in [(0, 1), (5, 70), (63, 64), (64, 200), (len(whole) - 3, len(whole))]:
        columns, n = reader.read_range(str(path), start, stop)
        assert n == stop - start and list(columns["text"]) == whole[start:stop], (start, stop)


def test_a_compressed_line_file_is_read_through_iter_file_up_to_its_range(tmp_path):
    import gzip
    path = tmp_path / "lines.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps({"i": i}) + "\n" for i in range(100))
    columns, n = JsonLinesReader().read_range(str(path), 40, 45)
    assert n == 5 and list(columns["i"]) == [40, 41, 42, 43, 44]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_built_in_reader_reading_ranges_from_its_bytes_gives_the_same_global_batches_for_any_world_size(
        data, workers):
    def batches(world_size):
        per_rank = []
        for rank in range(world_size):
            ld = pl.DataLoader(
                TextLinesReader(batch_size=G // world_size, piece_size=2), pl.IdentityDataset(), ListCollator(),
                str(data), shuffle=pl.Shuffle(block=36), ranks=pl.Ranks(rank=rank, world_size=world_size),
                workers=workers)
            per_rank.append([[t for t, pad in zip(b["text"], b.get("__padding__", [False] * len(b["text"])))
                              if not pad] for b in ld])
        return [sorted(sum((per_rank[r][k] for r in range(world_size)), [])) for k in range(len(per_rank[0]))]
    one = batches(1)
    assert sorted(int(t) for b in one for t in b) == list(range(sum(SIZES)))
    assert batches(2) == one and batches(3) == one


def test_the_index_holds_where_samples_start_and_ranges_are_read_from_it_without_reading_the_file_whole(
        tmp_path, monkeypatch):
    from pyloader import _cli
    from pyloader._storage import count_index

    folder = tmp_path / "idx"
    folder.mkdir()
    for f in range(3):
        (folder / f"p{f}.jsonl").write_text("".join(json.dumps({"i": f * 100 + i}) + "\n" for i in range(100)))
    assert _cli.main(["index", str(folder), "--reader", "jsonl"]) == 0
    entries = json.loads((folder / count_index.INDEX_NAME).read_text())["files"]
    assert {e["count"] for e in entries.values()} == {100} and all(len(e["runs"]["at"]) == 2 for e in entries.values())

    def no_table(*args):
        raise AssertionError("the table was made from the file's bytes, not read from the index")
    monkeypatch.setattr(_ranges, "line_table", no_table)
    ld = pl.DataLoader(JsonLinesReader(batch_size=10), pl.IdentityDataset(), ListCollator(), str(folder),
                       shuffle=pl.Shuffle(block=40), workers=0)
    assert sorted(i for b in ld for i in b["i"]) == list(range(300))


def test_the_default_placement_delivers_every_sample_once_in_the_same_order(tmp_path):
    folder = tmp_path / "many"
    write_chunks(folder, [300] * 12)
    def ids(**kwargs):
        return ids_of(pl.DataLoader(IdReader(batch_size=16), pl.IdentityDataset(), ListCollator(), str(folder),
                                    shuffle=pl.Shuffle(block=512), num_epoch=2, **kwargs))
    default = ids()
    assert sorted(default) == sorted(list(range(3600)) * 2)
    assert default == ids(workers=0)


# -- amounts: epoch_size, weighted sources, repeat, choose, batching ------------------------------------
def _mixed(tmp_path, sizes_by_source=((40, 20), (30,), (7, 8, 9)), amounts=None):
    """Sources of ids 0.., 1000.., 2000..: one folder each."""
    sources = []
    for k, sizes in enumerate(sizes_by_source):
        folder = tmp_path / f"s{k}"
        folder.mkdir(parents=True)
        at = 1000 * k
        for f, n in enumerate(sizes):
            (folder / f"p{f}.txt").write_text("".join(f"{at + i}\n" for i in range(n)))
            at += n
        sources.append(pl.Source(str(folder), **(amounts or {}).get(k, {})))
    return sources


def mixed_loader(sources, world_size=1, rank=0, *, workers=0, num_epoch=1, **shuffle):
    return pl.DataLoader(IdReader(batch_size=G // world_size), pl.IdentityDataset(), ListCollator(), sources,
                         shuffle=pl.Shuffle(block=48, **shuffle), num_epoch=num_epoch, workers=workers,
                         ranks=pl.Ranks(rank=rank, world_size=world_size))


def _by_epoch(ld) -> List[List[int]]:
    out: List[List[int]] = []
    for batch in ld:
        while len(out) <= ld.epoch:
            out.append([])
        out[ld.epoch].extend(i for i, pad in zip(batch["id"], batch.get("__padding__", [False] * 99)) if not pad)
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_a_smaller_epoch_size_gives_disjoint_parts_that_together_cover_the_data(data, workers):
    ld = loader(data, workers=workers, num_epoch=3)
    ld = pl.DataLoader(IdReader(batch_size=G), pl.IdentityDataset(), ListCollator(), str(data),
                       shuffle=pl.Shuffle(block=60, epoch_size=50), num_epoch=3, workers=workers)
    epochs = _by_epoch(ld)
    assert [len(e) for e in epochs] == [50, 50, 50] and len(ld) == 3 * -(-50 // G)
    assert sorted(i for e in epochs for i in e) == list(range(150))


def test_a_larger_epoch_size_repeats_the_data_as_evenly_as_it_can(data):
    ld = pl.DataLoader(IdReader(batch_size=G), pl.IdentityDataset(), ListCollator(), str(data),
                       shuffle=pl.Shuffle(block=60, epoch_size=400))
    (epoch,) = _by_epoch(ld)
    seen = np.bincount(epoch, minlength=150)
    assert len(epoch) == 400 and seen.min() == 2 and seen.max() == 3


def test_weighted_sources_give_their_shares_until_the_first_runs_out(tmp_path):
    sources = _mixed(tmp_path)
    sources = [pl.Source(s.data_dir, weight=w) for s, w in zip(sources, (2, 1, 1))]
    (epoch,) = _by_epoch(mixed_loader(sources))
    per = np.bincount(np.asarray(epoch) // 1000, minlength=3)
    assert per.tolist() == [48, 24, 24]  # source 2 (24 samples) runs out first: 2:1:1 of 96
    assert len(set(epoch)) == len(epoch)


def test_repeat_and_choose_set_a_sources_samples_per_epoch_and_balanced_sampling_covers_it(tmp_path):
    sources = _mixed(tmp_path, amounts={0: {"repeat": 0.5}, 1: {"choose": 75}, 2: {"repeat": 1}})
    epochs = _by_epoch(mixed_loader(sources, num_epoch=2))
    for epoch in epochs:
        assert np.bincount(np.asarray(epoch) // 1000, minlength=3).tolist() == [30, 75, 24]
    first_source = [i for e in epochs for i in e if i < 1000]
    assert sorted(first_source) == list(range(60)), "two halves of source 0: disjoint, covering it"


def test_fixed_sampling_takes_the_same_subset_every_epoch(tmp_path):
    sources = _mixed(tmp_path, amounts={0: {"repeat": 0.25, "sampling": "fixed"}})
    epochs = _by_epoch(mixed_loader(sources, num_epoch=3))
    subsets = [sorted(i for i in e if i < 1000) for e in epochs]
    assert len(subsets[0]) == 15 and subsets[0] == subsets[1] == subsets[2]


def test_stratified_batches_hold_each_sources_share_within_one_sample(tmp_path):
    sources = _mixed(tmp_path, sizes_by_source=((300,), (150,), (150,)),
                     amounts={0: {"choose": 288}, 1: {"choose": 144}, 2: {"choose": 144}})
    ld = mixed_loader(sources, batching="stratified")
    batches = [np.bincount(np.asarray(b["id"]) // 1000, minlength=3) for b in ld]
    assert all(np.abs(c - [6, 3, 3]).max() <= 1 for c in batches[:-1])
    assert sum(c.sum() for c in batches) == 576


def test_per_source_batches_each_come_from_one_source(tmp_path):
    sources = _mixed(tmp_path, sizes_by_source=((96,), (48,), (48,)), amounts={k: {"repeat": 1} for k in range(3)})
    ld = mixed_loader(sources, batching="per_source")
    kinds = [set(np.asarray(b["id"]) // 1000) for b in ld]
    assert all(len(k) == 1 for k in kinds) and sorted(k.pop() for k in kinds).count(0) == 8


@pytest.mark.parametrize("before, after", [(2, 3), (4, 2), (3, 1)])
def test_weighted_sources_resume_under_another_world_size_with_every_sample_once(tmp_path, before, after):
    sources = _mixed(tmp_path, amounts={0: {"repeat": 0.5}, 1: {"choose": 40}})
    whole = _by_epoch(mixed_loader(sources))[0]
    state = state_after(mixed_loader(sources, before, 0), 3)
    rest = []
    for rank in range(after):
        resumed = mixed_loader(sources, after, rank)
        resumed.load_state_dict(state)
        rest.extend(i for b in resumed for i, pad in zip(b["id"], b.get("__padding__", [False] * 99)) if not pad)
    assert sorted(rest) == sorted(whole[3 * G:])


def test_amounts_without_the_global_order_are_refused_naming_it(tmp_path):
    sources = _mixed(tmp_path, amounts={0: {"repeat": 0.5}})
    with pytest.raises(ValueError, match="Shuffle"):
        pl.DataLoader(IdReader(batch_size=4), pl.IdentityDataset(), ListCollator(), sources, shuffle=True)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mixed_global_order_resumes_exactly_at_every_position(tmp_path, workers):
    sources = _mixed(tmp_path, amounts={0: {"repeat": 0.5}, 1: {"choose": 40}})
    check_resume(lambda: mixed_loader(sources, 2, 1, num_epoch=2, workers=workers, batching="stratified"),
                 positions=None if workers == 0 else [0, 3, 7, 9])


def test_amounts_hold_for_random_configurations(tmp_path):
    """Per-source counts per epoch equal the requested amounts, whatever the sizes, amounts and world size."""
    rng = np.random.default_rng(7)
    for case in range(6):
        sizes = tuple(tuple(int(n) for n in rng.integers(0, 30, size=rng.integers(1, 4))) for _ in range(3))
        sizes = tuple(s if sum(s) else (5,) for s in sizes)
        amounts = {0: {"repeat": float(rng.choice([0.3, 1.0, 2.5]))}, 1: {"choose": int(rng.integers(0, 60))}}
        sources = _mixed(tmp_path / str(case), sizes_by_source=sizes, amounts=amounts)
        world, batching = int(rng.choice([1, 2, 3])), str(rng.choice(["random", "stratified"]))
        got = []
        for rank in range(world):
            got += [i for b in mixed_loader(sources, world, rank, batching=batching)
                    for i, pad in zip(b["id"], b.get("__padding__", [False] * 99)) if not pad]
        per = np.bincount(np.asarray(got, dtype=int) // 1000, minlength=3)
        assert per[0] == round(amounts[0]["repeat"] * sum(sizes[0])) and per[1] == amounts[1]["choose"], (case, per)
        assert per[2] == sum(sizes[2]), (case, per)  # the only source left to share: all of it
