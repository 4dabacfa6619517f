"""The global order (``shuffle=Shuffle(...)``): one permutation of every sample, made a block at a time,
the same global batches for any world size, elastic resume at any global batch."""
from __future__ import annotations

import json
from typing import Dict, List

import numpy as np
import pytest
from conftest import IdReader, ListCollator, ids_of, write_chunks

import pyloader as pl
from pyloader.readers import JsonLinesReader, TextLinesReader, _ranges
from pyloader.testing import check_resume

G = 12  # the global batch in these tests: world sizes 1, 2, 3, 4, 6 and 12 divide it
SIZES = [37, 5, 0, 40, 23, 1, 30, 14]  # 150 samples, one file empty


class RangeReader(IdReader):
    """An ``IdReader`` that reads a range straight from the file, and counts the ranges it read."""

    def __init__(self, batch_size=4, **kwargs):
        super().__init__(batch_size, **kwargs)
        self.ranges = 0

    def read_range(self, path, start, stop):
        self.ranges += 1
        with open(path) as f:
            ids = [int(line) for k, line in enumerate(f) if start <= k < stop]
        return {"id": ids}, len(ids)


def loader(folder, world_size=1, rank=0, *, reader=IdReader, block=60, num_epoch=1, seed=42, drop_last=False,
           num_workers=0, global_batch=G) -> pl.DataLoader:
    return pl.DataLoader(reader(batch_size=global_batch // world_size), pl.IdentityDataset(), ListCollator(),
                         str(folder), shuffle=pl.Shuffle(block=block), random_seed=seed, num_epoch=num_epoch,
                         drop_last=drop_last, ranks=pl.Ranks(rank=rank, world_size=world_size),
                         num_workers=num_workers)


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


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_epoch_delivers_every_sample_once_in_an_order_no_file_order_gives(data, num_workers):
    with loader(data, num_workers=num_workers, num_epoch=2) as ld:
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
    assert global_batches(data, 2, num_workers=2) == global_batches(data, 2, num_workers=0)


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
                       num_workers=0)
    assert sorted(ids_of(ld)) == list(range(sum(SIZES)))
    assert reader.ranges >= sum(-(-n // 5) for n in SIZES)  # spans of 60 // 12 = 5 samples


@pytest.mark.parametrize("reader", [TextLinesReader, JsonLinesReader])
def test_the_built_in_line_readers_follow_the_global_order(tmp_path, reader):
    folder = tmp_path / "j"
    folder.mkdir()
    for f in range(3):
        (folder / f"p{f}.txt").write_text("".join(json.dumps({"text": str(f * 10 + i)}) + "\n" for i in range(10)))
    ld = pl.DataLoader(reader(batch_size=4), pl.IdentityDataset(), ListCollator(), str(folder),
                       shuffle=pl.Shuffle(block=8), num_workers=0)
    key = "text"
    got = [b[key][k] for b in ld for k in range(len(b[key]))]
    values = sorted(json.loads(v)["text"] if reader is TextLinesReader else v for v in got)
    assert values == sorted(str(i) for i in range(30))


def _state_after(folder, world_size, steps, **kwargs) -> Dict:
    """Rank 0's state after ``steps`` global batches under ``world_size`` (every rank's is the same)."""
    ld = loader(folder, world_size, 0, **kwargs)
    it = iter(ld)
    for _ in range(steps):
        next(it)
    state = json.loads(json.dumps(ld.state_dict()))
    it.close()
    return state


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


@pytest.mark.parametrize("num_workers", [0, 2])
def test_it_resumes_exactly_at_every_position(data, num_workers):
    def make():
        return loader(data, 3, 1, num_epoch=2, num_workers=num_workers)
    n = check_resume(make, positions=None if num_workers == 0 else [0, 1, 6, 13, 14, 20])
    assert n == 2 * -(-sum(SIZES) // G)


@pytest.mark.parametrize("options, word", [
    (dict(shuffle_buffer=10), "shuffle_buffer"),
    (dict(stream=True), "stream"),
    (dict(filter_fn=lambda s: True), "filter_fn"),
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
                       shuffle=pl.Shuffle(block=1000), num_workers=0, drop_last=True)
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


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_built_in_reader_reading_ranges_from_its_bytes_gives_the_same_global_batches_for_any_world_size(
        data, num_workers):
    def batches(world_size):
        per_rank = []
        for rank in range(world_size):
            ld = pl.DataLoader(
                TextLinesReader(batch_size=G // world_size, piece_size=2), pl.IdentityDataset(), ListCollator(),
                str(data), shuffle=pl.Shuffle(block=36), ranks=pl.Ranks(rank=rank, world_size=world_size),
                num_workers=num_workers)
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
                       shuffle=pl.Shuffle(block=40), num_workers=0)
    assert sorted(i for b in ld for i in b["i"]) == list(range(300))


def test_the_default_placement_delivers_every_sample_once_in_the_same_order(tmp_path):
    folder = tmp_path / "many"
    write_chunks(folder, [300] * 12)
    def ids(**kwargs):
        return ids_of(pl.DataLoader(IdReader(batch_size=16), pl.IdentityDataset(), ListCollator(), str(folder),
                                    shuffle=pl.Shuffle(block=512), num_epoch=2, **kwargs))
    default = ids()
    assert sorted(default) == sorted(list(range(3600)) * 2)
    assert default == ids(num_workers=0)
