"""Epochs across iterations, ``set_epoch``, ``len()``, late rank resolution, and the loader's lifecycle
as frameworks use it: one ``iter()`` per epoch, a second ``iter()``, pickling, moved data."""
from __future__ import annotations

import itertools
import json
import pickle
import shutil

import pytest
from conftest import IdReader, ListCollator, ids_of, wait_no_threads, write_chunks

import pyloader as pl
from pyloader.collators import NumpyCollator
from pyloader.readers import JsonLinesReader

pytestmark = pytest.mark.timeout(120)


def make(folder, batch_size=4, **kwargs):
    return pl.DataLoader(IdReader(batch_size, shuffle=kwargs.pop("reader_shuffle", False)), pl.IdentityDataset(),
                         ListCollator(), str(folder), **kwargs)


def epochs_of(loader, n):
    out = []
    for _ in range(n):
        out.append([(loader.epoch, b["id"]) for b in loader])
    return out


def test_each_iteration_is_the_next_epoch_with_its_own_order(tmp_path):
    write_chunks(tmp_path / "d", [5] * 8)
    loader = make(tmp_path / "d", shuffle=True, reader_shuffle=True)
    passes = epochs_of(loader, 3)
    assert [{e for e, _ in p} for p in passes] == [{0}, {1}, {2}]
    orders = [[i for _, ids in p for i in ids] for p in passes]
    assert all(sorted(o) == list(range(40)) for o in orders)
    assert len({tuple(o) for o in orders}) == 3  # reshuffled every epoch
    again = make(tmp_path / "d", shuffle=True, reader_shuffle=True)
    assert epochs_of(again, 3) == passes  # the same program gives the same sequence of orders


def test_an_iteration_runs_num_epoch_epochs_and_the_next_goes_on_after_them(tmp_path):
    write_chunks(tmp_path / "d", [6] * 3)
    loader = make(tmp_path / "d", num_epoch=2, shuffle=True)
    first, second = epochs_of(loader, 2)
    assert sorted({e for e, _ in first}) == [0, 1] and sorted({e for e, _ in second}) == [2, 3]


def test_set_epoch_chooses_the_epoch_of_the_next_iteration(tmp_path):
    write_chunks(tmp_path / "d", [5] * 6)
    reference = make(tmp_path / "d", shuffle=True)
    passes = epochs_of(reference, 4)
    loader = make(tmp_path / "d", shuffle=True)
    loader.set_epoch(3)
    assert epochs_of(loader, 1)[0] == passes[3]
    loader.set_epoch(1)
    assert epochs_of(loader, 2) == passes[1:3]
    with pytest.raises(ValueError, match="epoch"):
        loader.set_epoch(-1)


def test_an_iteration_left_early_makes_the_next_start_with_the_following_epoch(tmp_path):
    write_chunks(tmp_path / "d", [5] * 6)
    passes = epochs_of(make(tmp_path / "d", shuffle=True), 3)
    loader = make(tmp_path / "d", shuffle=True)
    for _ in loader:
        break
    assert epochs_of(loader, 1)[0] == passes[1]
    it = iter(loader)  # an iteration that handed out nothing is not an epoch
    it.close()
    assert epochs_of(loader, 1)[0] == passes[2]


def test_the_state_after_a_break_resumes_where_the_consumer_stopped(tmp_path):
    write_chunks(tmp_path / "d", [5] * 6)
    full = epochs_of(make(tmp_path / "d", shuffle=True), 1)[0]
    loader = make(tmp_path / "d", shuffle=True)
    for k, _ in enumerate(loader, 1):
        if k == 3:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = make(tmp_path / "d", shuffle=True)
    resumed.load_state_dict(state)
    assert [(resumed.epoch, b["id"]) for b in resumed] == full[3:]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_len_is_the_number_of_batches_an_iteration_yields(tmp_path, num_workers):
    sizes = [5, 0, 9, 3, 7, 1, 6]
    write_chunks(tmp_path / "d", sizes)
    settings = [dict(), dict(drop_last=True), dict(num_epoch=3), dict(batch_size=7, shuffle=True),
                dict(ranks=pl.Ranks(rank=1, world_size=3)),
                dict(ranks=pl.Ranks(rank=2, world_size=3, even_batches="drop")),
                dict(ranks=pl.Ranks(rank=0, world_size=4), drop_last=True, batch_size=3)]
    for kwargs in settings:
        loader = make(tmp_path / "d", num_workers=num_workers, **kwargs)
        n = len(loader)
        assert n == len(list(loader)), kwargs
        assert len(loader) == len(list(loader)), kwargs  # the next iteration too


@pytest.mark.parametrize("settings", [
    dict(stream=True), dict(stream=pl.Stream(seq_len=3)), dict(shuffle=True, stream=pl.Stream(seq_len=2)),
    dict(stream=True, ranks=pl.Ranks(rank=1, world_size=2)),
    dict(stream=True, ranks=pl.Ranks(rank=0, world_size=3, even_batches="drop"))])
def test_len_counts_the_steps_of_stream_mode(tmp_path, settings):
    sizes = [5, 0, 9, 3, 7, 1, 6, 11]
    write_chunks(tmp_path / "d", sizes)
    loader = pl.DataLoader(IdReader(3), pl.IdentityDataset(), NumpyCollator(), str(tmp_path / "d"), **settings)
    for _ in range(3):  # every epoch's file order has its own step count
        assert len(loader) == len(list(loader))


def test_len_counts_once_and_a_failing_count_makes_the_length_unknown(tmp_path):
    write_chunks(tmp_path / "d", [4, 4, 4])
    counted = []

    class Counting(IdReader):
        def count(self, path):
            counted.append(path)
            if path.endswith("0002.txt"):
                raise OSError("unreadable")
            return 4

    loader = pl.DataLoader(Counting(2), pl.IdentityDataset(), ListCollator(), str(tmp_path / "d"))
    with pytest.raises(TypeError, match="length is unknown.*part-0002.txt") as info:
        len(loader)
    assert isinstance(info.value.__cause__, OSError)
    assert bool(loader)  # truth does not count
    ok = pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(tmp_path / "d"))
    calls = []
    ok.datareader.count = lambda p: calls.append(p) or 4  # type: ignore[method-assign]
    assert len(ok) == len(ok) == 6
    assert len(calls) == 3


def test_rank_and_world_size_are_resolved_when_an_iteration_starts(tmp_path, monkeypatch):
    write_chunks(tmp_path / "d", [4] * 5)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    loader = make(tmp_path / "d", batch_size=2)  # built before the launcher sets the rank
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    got = [b["id"] for b in loader]
    reference = make(tmp_path / "d", batch_size=2, ranks=pl.Ranks(rank=1, world_size=2))
    assert got == [b["id"] for b in reference]
    assert sorted(i for b in got for i in b) == list(range(10, 20))
    assert loader.state_dict()["settings"]["rank"] == 1


def test_a_second_iter_ends_the_first_with_a_clear_error_never_silently(tmp_path):
    write_chunks(tmp_path / "d", [20, 20])
    loader = make(tmp_path / "d")
    first = iter(loader)
    next(first)
    second = iter(loader)
    with pytest.raises(RuntimeError, match="newer iter"):
        next(first)
    assert len(ids_of(second)) == 40
    with pytest.raises(RuntimeError, match="newer iter"):
        list(zip(loader, loader))
    loader.close()
    assert wait_no_threads() == []


def test_a_loader_pickles_at_any_time_without_its_running_iteration(tmp_path):
    write_chunks(tmp_path / "d", [6] * 4)
    loader = make(tmp_path / "d", shuffle=True)
    full = [b["id"] for b in make(tmp_path / "d", shuffle=True)]
    assert pickle.loads(pickle.dumps(loader)).state_dict() == loader.state_dict()
    it = iter(loader)
    head = [next(it)["id"] for _ in range(2)]
    copy = pickle.loads(pickle.dumps(loader))
    assert head + [b["id"] for b in copy] == full  # the copy resumes where the original was
    assert [b["id"] for b in it] == full[2:]  # the original goes on undisturbed
    loader.close()
    copy.close()


def test_a_state_resumes_after_the_data_folder_moved(tmp_path):
    write_chunks(tmp_path / "a" / "data", [5, 7, 3])
    loader = make(tmp_path / "a" / "data", shuffle=True)
    full = [b["id"] for b in loader]
    it = iter(make(tmp_path / "a" / "data", shuffle=True))
    it_loader = it._loader
    head = [next(it)["id"] for _ in range(2)]
    state = json.loads(json.dumps(it_loader.state_dict()))
    it.close()
    shutil.move(str(tmp_path / "a" / "data"), str(tmp_path / "elsewhere"))
    moved = make(tmp_path / "elsewhere", shuffle=True)
    moved.load_state_dict(state)
    assert head + [b["id"] for b in moved] == full
    (tmp_path / "elsewhere" / "part-0001.txt").write_text("1\n2\n")  # same name, other size
    changed = make(tmp_path / "elsewhere", shuffle=True)
    with pytest.raises(ValueError, match="files"):
        changed.load_state_dict(state)


def test_a_refused_state_shows_both_values(tmp_path):
    write_chunks(tmp_path / "d", [4, 4])
    state = make(tmp_path / "d", batch_size=4).state_dict()
    with pytest.raises(ValueError, match=r"batch_size \(saved 4, now 8\)"):
        make(tmp_path / "d", batch_size=8).load_state_dict(state)


def test_a_state_of_the_previous_format_still_loads(tmp_path):
    write_chunks(tmp_path / "d", [4, 4, 4])
    loader = make(tmp_path / "d", num_epoch=2)
    full = [b["id"] for b in loader]
    fingerprint = loader.state_dict()["settings"]
    import hashlib

    old = {"format": "pyloader.state/1", "epoch": 0, "batches_in_epoch": 2,
           "settings": {**fingerprint, "files": hashlib.sha1("\n".join(loader.files).encode()).hexdigest()}}
    resumed = make(tmp_path / "d", num_epoch=2)
    resumed.load_state_dict(old)
    assert [b["id"] for b in resumed] == full[2:]


def test_max_errors_counts_per_iteration(tmp_path):
    write_chunks(tmp_path / "d", [4, 4, 4])
    loader = pl.DataLoader(IdReader(2, fail_on={"part-0001.txt"}), pl.IdentityDataset(), ListCollator(),
                           str(tmp_path / "d"), on_error=pl.OnError("skip", max_errors=1))
    for _ in range(3):
        assert len(ids_of(loader)) == 8
    assert len(loader.stats["errors"]) == 3  # the stats count over the loader's life


def test_a_cuda_device_without_cuda_is_refused_when_the_loader_is_built(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal cannot happen here")
    write_chunks(tmp_path / "d", [4])
    with pytest.raises(ValueError, match="cuda"):
        make(tmp_path / "d", device="cuda")


def test_to_tf_dataset_declares_its_cardinality_and_each_pass_is_the_next_epoch(tmp_path):
    tf = pytest.importorskip("tensorflow")
    lines = [json.dumps({"x": [i, i + 1], "y": i}) for i in range(30)]
    (tmp_path / "d").mkdir()
    for k in range(10):
        (tmp_path / "d" / f"{k}.jsonl").write_text("\n".join(lines[k * 3:(k + 1) * 3]) + "\n")
    loader = pl.DataLoader(JsonLinesReader(batch_size=4, shuffle=True), pl.IdentityDataset(), NumpyCollator(),
                           str(tmp_path / "d"), shuffle=True)
    ds = loader.to_tf_dataset()
    assert int(ds.cardinality()) == 8
    passes = [[int(y) for b in ds for y in b["y"].numpy()] for _ in range(3)]
    assert all(sorted(p) == list(range(30)) for p in passes)
    assert len({tuple(p) for p in passes}) == 3
    assert loader.epoch == 2
    del tf


def test_product_of_settings_names_no_unknown_epoch(tmp_path):
    # every mode keeps loader.epoch in step with the batches it hands out
    write_chunks(tmp_path / "d", [3, 4, 5])
    for shuffle, num_epoch in itertools.product([False, True], [1, 2]):
        loader = make(tmp_path / "d", shuffle=shuffle, num_epoch=num_epoch)
        seen = [loader.epoch for _ in loader for _ in [0]]
        assert sorted(set(seen)) == list(range(num_epoch))
