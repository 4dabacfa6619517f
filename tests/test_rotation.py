"""Rotation: ``DataLoader(rotation=R, rotation_dir=None, rotation_size=None)`` (``pyloader/_rotation.py``)."""
from __future__ import annotations

import gc
import json
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import pytest
from conftest import IdReader, ListCollator, wait_no_threads, write_chunks

import pyloader as pl
from pyloader._rng import derive_rng
from pyloader._stages.rotation import round_orders

pytestmark = pytest.mark.timeout(120)

SIZES = [37, 21, 43, 5, 17]  # 123 samples: with batches of 4, 30 full ones and one of 3
N = sum(SIZES)
B = 4
PADDING = "__padding__"


class ArrayDataset(pl.Dataset):
    """Encodes each batch's ids as an array (the field ``rotation_dir`` keeps as ``c0.npy``)."""

    def batch_encode(self, batch_data):
        return {"id": np.asarray(batch_data["id"], dtype=np.int64)}


class CountingDataset(pl.Dataset):
    """Appends the ids it encodes to a file, one line per call (from any process)."""

    def __init__(self, log: Path) -> None:
        self.log = str(log)

    def batch_encode(self, batch_data):
        with open(self.log, "a") as f:
            f.write(" ".join(map(str, batch_data["id"])) + "\n")
        return {"id": list(batch_data["id"])}


class KindsDataset(pl.Dataset):
    """One field of every kind ``rotation_dir`` can hold."""

    def batch_encode(self, batch_data):
        ids = list(batch_data["id"])
        return {"id": ids, "array": np.asarray(ids, dtype=np.float32)[:, None] * [1, -1],
                "half": [i / 2 for i in ids], "even": [i % 2 == 0 for i in ids],
                "text": [f"sample {i} é" for i in ids], "raw": [bytes([i % 256]) * (i % 3) for i in ids],
                "tokens": [list(range(i % 5)) for i in ids], "pair": [(i, -i) for i in ids],
                "ragged": [np.full((i % 3, 2), i, dtype=np.int16) for i in ids],
                "scalar": [np.float32(i) for i in ids]}


class DictDataset(pl.Dataset):
    def batch_encode(self, batch_data):
        return {"id": list(batch_data["id"]), "info": [{"id": i} for i in batch_data["id"]]}


class UnevenDataset(pl.Dataset):
    def batch_encode(self, batch_data):
        return {"id": list(batch_data["id"]), "extra": list(batch_data["id"])[1:]}


class ShrinkingDataset(pl.Dataset):
    """Leaves each batch's first sample out."""

    def batch_encode(self, batch_data):
        return {"id": list(batch_data["id"])[1:]}


class PaddedPerBatchDataset(pl.Dataset):
    """Pads each batch to its own width: samples of different batches then cannot share a batch."""

    def batch_encode(self, batch_data):
        ids = list(batch_data["id"])
        return {"id": ids, "x": np.zeros((len(ids), 1 + max(ids) % 3))}


class MixedNumbersDataset(pl.Dataset):
    """Gives a field ints in some batches and floats in others."""

    def batch_encode(self, batch_data):
        ids = list(batch_data["id"])
        return {"id": ids, "score": [float(i) for i in ids] if ids[0] % 8 else ids}


class FailingCollator(ListCollator):
    def __init__(self, at: int) -> None:
        self.at, self.calls = at, 0

    def collate_batch(self, features):
        self.calls += 1
        if self.calls == self.at:
            raise ValueError("collate says no")
        return super().collate_batch(features)


def make(tmp_path: Path, sizes=SIZES, reader_shuffle: bool = False, dataset: Any = None,
         collator: Any = None, **kwargs: Any) -> pl.DataLoader:
    folder = tmp_path / "data"
    if not folder.exists():
        write_chunks(folder, sizes)
    kwargs.setdefault("num_workers", 0)  # the tests with workers ask for them
    return pl.DataLoader(IdReader(B, shuffle=reader_shuffle), dataset or pl.IdentityDataset(),
                         collator or ListCollator(), str(folder), **kwargs)


def run(loader: pl.DataLoader) -> List[List[int]]:
    with loader:
        return [[int(i) for i in b["id"]] for b in loader]


def ids_of(batches: List[List[int]]) -> List[int]:
    return [i for b in batches for i in b]


def files_under(folder: Path) -> List[Path]:
    """The files under ``folder`` now (folders removed meanwhile are passed over)."""
    return [Path(top, name) for top, _, names in os.walk(folder) for name in names]


def samples_on_disk(folder: Path) -> int:
    """The samples in the ``id`` field's files under ``folder`` (files written whole, or not yet)."""
    total = 0
    for path in (p for p in files_under(folder) if p.name == "c0.npy"):
        try:
            total += np.load(path, allow_pickle=False).shape[0]
        except (FileNotFoundError, OSError, ValueError):
            pass  # removed as it was read
    return total


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("rotation", [2, 3])
def test_every_sample_is_served_rotation_times_an_epoch_has_r_times_the_samples_and_len_agrees(
        tmp_path, rotation, drop_last):
    settings = dict(drop_last=drop_last, num_epoch=2, shuffle=True, reader_shuffle=True)
    plain = run(make(tmp_path, **settings))  # without rotation
    loader = make(tmp_path, rotation=pl.Rotation(rotation, size=8 * rotation), **settings)
    length = len(loader)
    batches = run(loader)
    kept = (120 if drop_last else N)
    assert length == len(batches) == 2 * (-(-rotation * kept // B))
    for epoch, without in ((batches[:length // 2], plain[:len(plain) // 2]),
                           (batches[length // 2:], plain[len(plain) // 2:])):
        assert len(ids_of(without)) == kept
        assert Counter(ids_of(epoch)) == Counter(ids_of(without) * rotation)  # each sample exactly R times
        assert all(len(b) == B for b in epoch[:-1])
        assert len(epoch[-1]) == (B if drop_last else rotation * N % B or B)


@pytest.mark.parametrize("rotation", [2, 3, 4])
def test_the_servings_of_a_sample_are_more_than_half_a_window_apart_and_no_batch_comes_twice(tmp_path, rotation):
    window = 40  # 10 batches; 240 samples: 6 full windows
    loader = make(tmp_path, sizes=[80, 60, 100], rotation=pl.Rotation(rotation, size=window * rotation),
                  shuffle=True, reader_shuffle=True)
    batches = run(loader)
    places: Dict[int, List[int]] = defaultdict(list)
    for place, i in enumerate(ids_of(batches)):
        places[i].append(place)
    gaps = [b - a for served in places.values() for a, b in zip(served, served[1:])]
    assert min(gaps) >= window - window // 2 + 1  # the schedule's bound: n - n // 2 + 1 for a window of n
    assert sum(gaps) / len(gaps) > window * rotation * 0.75  # about a phase apart: R windows interleave
    assert len({frozenset(b) for b in batches}) == len(batches)  # samples, not batches, are served again


def test_each_round_is_a_permutation_moving_every_sample_fewer_than_half_a_window_places():
    for n in (1, 2, 3, 10, 101):
        orders = round_orders(n, 6, derive_rng(5, 7))
        assert len(orders) == 6 and orders[0].tolist() == list(range(n))  # round 0: the arrival order
        for before, after in zip(orders, orders[1:]):
            assert sorted(after.tolist()) == list(range(n))
            moved = np.argsort(after) - np.argsort(before)  # each sample's place now minus before
            assert np.all(np.abs(moved) < max(1, n // 2))
        if n > 3:
            assert any(not np.array_equal(a, b) for a, b in zip(orders, orders[1:]))


def test_rotation_is_the_same_on_every_run_another_order_next_epoch_with_shuffle_and_seeded(tmp_path):
    first = run(make(tmp_path, rotation=pl.Rotation(3), shuffle=True, num_epoch=2))
    assert first == run(make(tmp_path, rotation=pl.Rotation(3), shuffle=True, num_epoch=2))
    half = len(first) // 2
    assert first[:half] != first[half:] and Counter(ids_of(first[:half])) == Counter(ids_of(first[half:]))
    assert first != run(make(tmp_path, rotation=pl.Rotation(3), shuffle=True, num_epoch=2, random_seed=7))


def test_without_shuffle_every_epoch_is_served_in_the_same_order(tmp_path):
    batches = run(make(tmp_path, rotation=pl.Rotation(3), num_epoch=2))
    half = len(batches) // 2
    assert batches[:half] == batches[half:]
    assert ids_of(batches)[:8] == list(range(8))  # the first window's first round: the arrival order


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_encode_runs_once_per_sample_and_epoch_and_workers_give_the_same_batches(tmp_path, num_workers):
    reference = run(make(tmp_path, rotation=pl.Rotation(3), shuffle=True, reader_shuffle=True, num_epoch=2))
    log = tmp_path / "encoded.log"
    loader = make(tmp_path, rotation=pl.Rotation(3), shuffle=True, reader_shuffle=True, num_epoch=2,
                  num_workers=num_workers,
                  dataset=CountingDataset(log))
    assert run(loader) == reference
    encoded = Counter(int(i) for line in log.read_text().splitlines() for i in line.split())
    assert encoded == Counter({i: 2 for i in range(N)})  # once per sample in each of the 2 epochs
    assert loader.stats["rotated_samples"] == 2 * 2 * N  # the 2nd and 3rd servings of each, each epoch
    assert loader.stats["iteration"]["rotated_samples"] == 2 * 2 * N


@pytest.mark.parametrize("num_workers", [0, 2])
def test_on_disk_samples_are_npy_files_holding_at_most_rotation_size_samples_removed_at_the_end(
        tmp_path, num_workers):
    folder = tmp_path / "rotation"
    expected = run(make(tmp_path, rotation=pl.Rotation(3, size=24), shuffle=True, dataset=ArrayDataset()))
    loader = make(tmp_path, rotation=pl.Rotation(3, size=24, folder=str(folder)), shuffle=True,
                  dataset=ArrayDataset(), num_workers=num_workers, max_queue_size=2)
    most, batches = 0, []
    with loader:
        for batch in loader:
            batches.append([int(i) for i in batch["id"]])
            most = max(most, samples_on_disk(folder))
            assert all(p.name.endswith((".npy", ".npy.tmp")) for p in files_under(folder))
    assert batches == expected
    assert 0 < most <= 24
    assert list(folder.iterdir()) == []  # the run's folder is gone


@pytest.mark.parametrize("how", ["break", "close", "error"])
def test_on_disk_samples_are_removed_when_an_iteration_ends_early(tmp_path, how):
    folder = tmp_path / "rotation"
    loader = make(tmp_path, rotation=pl.Rotation(3, size=24, folder=folder), dataset=ArrayDataset(),
                  collator=FailingCollator(at=20 if how == "error" else 0), max_queue_size=2)
    held = 0
    if how == "error":
        with pytest.raises(ValueError, match="collate says no"):
            for _ in loader:
                held = max(held, samples_on_disk(folder))
    else:
        for k, _ in enumerate(loader):
            held = max(held, samples_on_disk(folder))
            if k == 10:
                break
        if how == "close":
            loader.close()
        gc.collect()  # after a break, dropping the iterator ends the iteration
    assert held > 0
    assert list(folder.iterdir()) == []
    assert wait_no_threads() == []


def test_on_disk_every_kind_of_field_comes_back_as_it_does_from_memory(tmp_path):
    def batches(folder: Optional[Path] = None) -> List[Dict[str, Any]]:
        with make(tmp_path, rotation=pl.Rotation(2, size=10, folder=folder), shuffle=True,
                  dataset=KindsDataset()) as loader:
            return list(loader)

    memory, disk = batches(), batches(tmp_path / "rotation")
    assert len(memory) == len(disk) == -(-2 * N // B)
    for m, d in zip(memory, disk):
        assert m.keys() == d.keys() and all(same(m[key], d[key]) for key in m), (m, d)


def same(a: Any, b: Any) -> bool:
    """Equal values of the same types, all the way down."""
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and (
            all(map(same, a, b)) if a.dtype == object else np.array_equal(a, b))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


def test_rows_taken_from_memory_mapped_arrays_are_the_stored_batch_at_those_rows(tmp_path):
    from pyloader._storage import codec as _codec

    n = 5
    objects = np.empty(n, dtype=object)
    objects[:] = [[i] * i for i in range(n)]
    batch = {"ints": list(range(n)), "array": np.arange(2 * n, dtype=np.int16).reshape(n, 2),
             "nested": [[[i, -i], [], [i]] for i in range(n)], "pairs": tuple((i, -i) for i in range(n)),
             "text": ["", "é", "a\x00b", "\ud800", "z"], "raw": [bytes([i]) * i for i in range(n)],
             "complex": [complex(i, -i) for i in range(n)], "scalars": [np.float16(i) for i in range(n)],
             "ragged": [np.ones((i, 2), dtype=np.uint8) for i in range(n)], "objects": objects,
             "empty": [[] for _ in range(n)]}
    arrays = _codec.pack(batch)
    for name, array in arrays.items():
        np.save(tmp_path / f"{name}.npy", array, allow_pickle=False)
    mapped = {name: np.load(tmp_path / f"{name}.npy", mmap_mode="r", allow_pickle=False) for name in arrays}
    whole = _codec.unpack(arrays)
    assert all(same(batch[key], whole[key]) for key in batch)
    rows = np.array([3, 0, 4, 4, 1])
    taken = _codec.take(mapped, rows)
    for key, column in whole.items():
        expected = column[rows] if isinstance(column, np.ndarray) else type(column)(column[r] for r in rows)
        assert same(expected, taken[key]), key
    assert not any(isinstance(v, np.memmap) for v in taken["ragged"]) and not isinstance(taken["array"], np.memmap)


def test_a_field_rotation_dir_cannot_store_is_an_error_naming_it_and_memory_holds_it(tmp_path):
    folder = tmp_path / "rotation"
    with pytest.raises(TypeError, match="rotation_dir cannot store column 'info' .* items of type dict") as caught:
        run(make(tmp_path, rotation=pl.Rotation(2, folder=folder), dataset=DictDataset()))
    assert isinstance(caught.value, pl.PipelineError) and caught.value.stage == "rotation"
    assert "part-0000.txt" in str(caught.value)
    assert not folder.exists() or list(folder.iterdir()) == []
    assert len(run(make(tmp_path, rotation=pl.Rotation(2), dataset=DictDataset()))) == -(-2 * N // B)


def test_on_disk_a_field_is_stored_one_way_in_every_batch_and_a_folder_that_cannot_be_written_is_an_error(
        tmp_path):
    with pytest.raises(TypeError, match=r"column 'score' .* items of several types \(float, int\)") as caught:
        run(make(tmp_path, rotation=pl.Rotation(2, folder=tmp_path / "rotation"), dataset=MixedNumbersDataset()))
    assert caught.value.stage == "rotation" and "part-0000.txt" in str(caught.value)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(OSError) as caught:
        run(make(tmp_path, rotation=pl.Rotation(2, folder=tmp_path / "a-file")))
    assert isinstance(caught.value, pl.PipelineError) and caught.value.stage == "rotation"
    assert "part-0000.txt" in str(caught.value)


@pytest.mark.parametrize("dataset, ranks, match, stage", [
    # columns of different lengths are batch_encode's mistake, whatever comes after it
    (UnevenDataset(), {}, "'id' has 4 items, 'extra' has 3", "batch_encode"),
    (PaddedPerBatchDataset(), {}, "field 'x' holds arrays of", "rotation"),
    (ShrinkingDataset(), {"ranks": pl.Ranks(rank=0, world_size=2)}, "batch_encode gave 3 samples for 4 rows",
     "rotation"),
])
def test_samples_that_cannot_be_rotated_fail_their_batch_at_stage_rotation(tmp_path, dataset, ranks, match, stage):
    with pytest.raises(ValueError, match=match) as caught:
        run(make(tmp_path, rotation=pl.Rotation(2), dataset=dataset, **ranks))
    assert isinstance(caught.value, pl.PipelineError) and caught.value.stage == stage
    assert "part-0000.txt" in str(caught.value)
    if not ranks:  # (under ranks every batch would be skipped: nothing to pad the steps with, an error)
        skipping = make(tmp_path, rotation=pl.Rotation(2), dataset=dataset, on_error="skip")
        run(skipping)
        assert skipping.stats["skipped_batches"] > 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_workers, on_disk", [(0, False), (2, False), (0, True)])
def test_a_resumed_run_gives_exactly_the_batches_of_the_uninterrupted_one(tmp_path, num_workers, on_disk):
    def fresh() -> pl.DataLoader:
        return make(tmp_path, rotation=pl.Rotation(3, size=24, folder=tmp_path / "rotation" if on_disk else None),
                    shuffle=True, reader_shuffle=True, num_epoch=2,
                    num_workers=num_workers)

    reference = run(fresh())
    per_epoch = len(reference) // 2
    for position in (1, 40, per_epoch, per_epoch + 1, len(reference) - 1):
        loader = fresh()
        it = iter(loader)
        head = [[int(i) for i in next(it)["id"]] for _ in range(position)]
        state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
        resumed = fresh()
        resumed.load_state_dict(state)
        assert head + run(resumed) == reference, position
        replayed = position - per_epoch if position > per_epoch else position  # the epoch's, before the position
        assert resumed.stats["iteration"]["resume_batches"] == replayed


@pytest.mark.parametrize("num_workers", [0, 2])
def test_under_ranks_each_rank_rotates_its_share_with_equal_planned_steps(tmp_path, num_workers):
    def rank(r: int, **kwargs: Any) -> pl.DataLoader:
        return make(tmp_path, rotation=pl.Rotation(3, size=12), shuffle=True, ranks=pl.Ranks(rank=r, world_size=2),
                    num_workers=num_workers, **kwargs)

    served: Counter = Counter()
    steps = []
    for r in range(2):
        loader = rank(r)
        length = len(loader)
        with loader:
            batches = list(loader)
        assert length == len(batches)
        steps.append(length)
        served.update(int(i) for b in batches for i, pad in zip(b["id"], b[PADDING]) if not pad)
        padded = sum(int(pad) for b in batches for pad in b[PADDING])
        assert padded == (3 if r == 0 else 0)  # shares of 61 and 62: one sample padded, served 3 times
    assert steps == [-(-3 * 62 // B)] * 2
    assert served == Counter({i: 3 for i in range(N)})
    reference = run(rank(1))
    loader = rank(1)
    it = iter(loader)
    head = [[int(i) for i in next(it)["id"]] for _ in range(17)]
    state = loader.state_dict()
    loader.close()
    resumed = rank(1)
    resumed.load_state_dict(state)
    assert head + run(resumed) == reference


class FailOnce(pl.Dataset):
    def batch_encode(self, batch_data):
        if 50 in batch_data["id"]:
            raise ValueError("encode says no")
        return {"id": list(batch_data["id"])}


def test_under_ranks_a_batch_skipped_after_an_error_still_leaves_every_rank_its_planned_steps(tmp_path):
    for r in range(2):
        loader = make(tmp_path, rotation=pl.Rotation(3, size=12), ranks=pl.Ranks(rank=r, world_size=2), on_error="skip",
                      dataset=FailOnce(), collator=FailingCollator(at=7))
        planned = len(loader)
        with loader:
            batches = list(loader)
        assert len(batches) == planned == -(-3 * 62 // B)
        assert loader.stats["skipped_batches"] == (2 if r == 0 else 1)  # rank 0's share holds sample 50
        assert any(all(b[PADDING]) for b in batches)  # the missing steps are padding batches


@pytest.mark.parametrize("kwargs, match", [
    ({"rotation": lambda: pl.Rotation(0)}, "Rotation.times must be an integer >= 2"),
    ({"rotation": lambda: pl.Rotation(True)}, "Rotation.times must be an integer >= 2"),
    ({"rotation": lambda: pl.Rotation(3, size=2)}, r"Rotation.size \(the samples held\) must be >= times \(3\), got 2"),
    ({"rotation": lambda: pl.Rotation(3, size=2.5)}, "Rotation.size must be an integer >= 1"),
    ({"rotation": lambda: pl.Rotation(2), "cache_encoded": {"dir": "cache", "update_every": 2}}, "use one of them"),
    ({"rotation": lambda: pl.Rotation(2), "stream": True}, "stream mode keeps each row in file order"),
    ({"rotation": lambda: pl.Rotation(2), "bucket": pl.Bucket("id")}, "the batches of similar lengths bucket makes"),
])
def test_settings_that_make_no_sense_are_refused(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(tmp_path, **{k: v() if callable(v) else v for k, v in kwargs.items()})
    with pytest.raises(TypeError, match="Rotation.folder must be a folder's path, got 3"):
        pl.Rotation(2, folder=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rotation must be a pyloader.Rotation, got Ranks"):
        pl.DataLoader(IdReader(B), pl.IdentityDataset(), ListCollator(), str(tmp_path), rotation=pl.Ranks())


def test_a_state_saved_with_other_rotation_settings_or_mid_epoch_under_another_world_size_is_refused(tmp_path):
    loader = make(tmp_path, rotation=pl.Rotation(3), ranks=pl.Ranks(rank=0, world_size=2))
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    loader.close()
    with pytest.raises(ValueError, match="rotation"):
        make(tmp_path, ranks=pl.Ranks(rank=0, world_size=2)).load_state_dict(state)
    with pytest.raises(ValueError, match="rotation_size"):
        make(tmp_path, rotation=pl.Rotation(3, size=48), ranks=pl.Ranks(rank=0, world_size=2)).load_state_dict(state)
    with pytest.raises(ValueError, match="not supported .* with rotation"):
        make(tmp_path, rotation=pl.Rotation(3), ranks=pl.Ranks(rank=0, world_size=3)).load_state_dict(state)
    make(tmp_path, rotation=pl.Rotation(3),
         ranks=pl.Ranks(rank=1, world_size=2)).load_state_dict(state)  # another rank's: fine
