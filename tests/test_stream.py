"""Stream mode: row r of batch k+1 continues row r of batch k; every sample once; nothing lost."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import STOP_WAYS, stop_early, wait_no_children, wait_no_threads
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pyloader as pl
from pyloader.collators import NumpyCollator, TorchCollator

pytestmark = pytest.mark.timeout(120)
FIRST, VALID, REPLAY, STREAM_ID, POSITION = "__first__", "__valid__", "__replay__", "__stream_id__", "__position__"


class PieceReader(pl.DataReader):
    """Sample ids ``file * 1000 + position``, streamed in pieces of ``piece`` lines."""

    def __init__(self, rows, piece=3, arrays=False):
        super().__init__(rows)
        self.piece = piece
        self.arrays = arrays  # pieces as int64 arrays (cut several steps at once) or lists (step by step)

    def read_file(self, path):
        raise AssertionError("stream mode must read through iter_file")

    def iter_file(self, path):
        with open(path) as f:
            ids = [int(line) for line in f]
        for start in range(0, len(ids), self.piece):
            part = ids[start:start + self.piece]
            if self.arrays:
                yield {"id": np.array(part, dtype=np.int64), "pair": np.array([[i, -i] for i in part]).reshape(-1, 2)}
            else:
                yield {"id": part, "pair": [[i, -i] for i in part]}


def write_streams(folder: Path, lengths) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, n in enumerate(lengths):
        (folder / f"s{i:03d}.txt").write_text("".join(f"{i * 1000 + p}\n" for p in range(n)))


def check_stream_epoch(batches, lengths, rows, seq_len, order):
    """Every invariant of one epoch of stream batches; returns the real samples seen."""
    width = seq_len or 1
    prev = [None] * rows  # (stream_id, next position)
    seen = []
    started = []
    for batch in batches:
        ids = np.asarray(batch["id"]).reshape(rows, width)
        valid = np.asarray(batch[VALID]).reshape(rows, width)
        first, replay = np.asarray(batch[FIRST]), np.asarray(batch[REPLAY])
        sid, pos = np.asarray(batch[STREAM_ID]), np.asarray(batch[POSITION])
        assert (valid & ~replay[:, None]).any(), "a batch of padding or replay only"
        for r in range(rows):
            if not valid[r].any():
                assert sid[r] == -1 and not first[r] and not replay[r]
                prev[r] = None
                continue
            file_index = order[sid[r]]
            n_valid = int(valid[r].sum())
            assert valid[r, :n_valid].all(), "padding only at the end of a window"
            expected = [file_index * 1000 + p for p in range(pos[r], pos[r] + n_valid)]
            assert ids[r, :n_valid].tolist() == expected
            if first[r]:
                assert pos[r] == 0
                if not replay[r]:
                    started.append(sid[r])
            else:
                assert prev[r] == (sid[r], pos[r]), f"row {r} does not continue its stream"
            if n_valid < width:
                assert pos[r] + n_valid == lengths[file_index], "window cut short before the file's end"
            if not replay[r]:
                seen.extend(expected)
            prev[r] = (sid[r], pos[r] + n_valid)
    nonempty = [s for s, f in enumerate(order) if lengths[f] > 0]
    assert started == nonempty, "rows must take the unread files in plan order"
    assert sorted(seen) == sorted(f * 1000 + p for f, n in enumerate(lengths) for p in range(n))
    return seen


def epoch_order(loader, epoch):
    if not loader.shuffle:
        return list(range(len(loader.files)))
    from pyloader._stages.source import FileSource  # the plan the loader follows

    return FileSource(loader.files, loader.num_epoch, True, loader.random_seed).order(epoch)


def run_stream(folder, rows, seq_len, padding_mode="zeros", shuffle=False, num_epoch=1, piece=3, seed=0,
               arrays=False):
    loader = pl.DataLoader(PieceReader(rows, piece, arrays), pl.IdentityDataset(), NumpyCollator(), str(folder),
                           stream=pl.Stream(seq_len=seq_len, padding_mode=padding_mode), shuffle=shuffle,
                           num_epoch=num_epoch, random_seed=seed, max_queue_size=2)
    per_epoch = {}
    for batch in loader:
        per_epoch.setdefault(loader.epoch, []).append(batch)
    return loader, per_epoch


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(0, 14), min_size=1, max_size=9),
       rows=st.integers(1, 6), seq_len=st.one_of(st.none(), st.integers(1, 5)),
       padding_mode=st.sampled_from(["zeros", "data"]), shuffle=st.booleans(), piece=st.integers(1, 5))
def test_stream_invariants(lengths, rows, seq_len, padding_mode, shuffle, piece):
    with tempfile.TemporaryDirectory() as tmp:
        write_streams(Path(tmp), lengths)
        loader, per_epoch = run_stream(tmp, rows, seq_len, padding_mode, shuffle, num_epoch=2, piece=piece)
        if sum(lengths) == 0:
            assert per_epoch == {}
            return
        assert sorted(per_epoch) == [0, 1]
        for epoch, batches in per_epoch.items():
            check_stream_epoch(batches, lengths, rows, seq_len, epoch_order(loader, epoch))
            if padding_mode == "zeros":
                assert not any(np.asarray(b[REPLAY]).any() for b in batches)
        _, again = run_stream(tmp, rows, seq_len, padding_mode, shuffle, num_epoch=2, piece=piece)
        for epoch in per_epoch:  # a function of the seed alone
            for a, b in zip(per_epoch[epoch], again[epoch]):
                assert all(np.array_equal(a[k], b[k]) for k in a)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(0, 90), min_size=1, max_size=7),
       rows=st.integers(1, 5), seq_len=st.one_of(st.none(), st.integers(1, 6)),
       padding_mode=st.sampled_from(["zeros", "data"]), piece=st.integers(1, 60))
def test_array_pieces_cut_at_once_match_step_by_step(lengths, rows, seq_len, padding_mode, piece):
    """Array pieces are cut several steps at a time; lists one step at a time: same batches."""
    with tempfile.TemporaryDirectory() as tmp:
        write_streams(Path(tmp), lengths)
        loader, fast = run_stream(tmp, rows, seq_len, padding_mode, shuffle=True, num_epoch=2, piece=piece,
                                  arrays=True)
        _, slow = run_stream(tmp, rows, seq_len, padding_mode, shuffle=True, num_epoch=2, piece=piece)
        assert sorted(fast) == sorted(slow)
        for epoch, batches in fast.items():
            check_stream_epoch(batches, lengths, rows, seq_len, epoch_order(loader, epoch))
            assert len(batches) == len(slow[epoch])
            for a, b in zip(batches, slow[epoch]):
                assert sorted(a) == sorted(b)
                for key in a:
                    assert np.asarray(a[key]).shape == np.asarray(b[key]).shape, key
                    assert np.array_equal(np.asarray(a[key]), np.asarray(b[key])), key


def test_data_padding_replays_delivered_files(tmp_path):
    write_streams(tmp_path, [9, 3, 3])
    _, per_epoch = run_stream(tmp_path, rows=3, seq_len=3, padding_mode="data")
    batches = per_epoch[0]
    assert len(batches) == 3  # the epoch ends once the long file is delivered
    replay = np.array([b[REPLAY] for b in batches])
    assert replay[1:, 1:].all() and not replay[:, 0].any()
    valid = np.array([b[VALID] for b in batches])
    assert valid.all()  # replayed rows carry real data


def test_zeros_padding_uses_pad_value_and_invalid_flags(tmp_path):
    write_streams(tmp_path, [5, 2])
    loader = pl.DataLoader(PieceReader(2), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                           stream=pl.Stream(seq_len=2, pad_value=-7))
    batches = list(loader)
    assert [b["id"].tolist() for b in batches] == [[[0, 1], [1000, 1001]], [[2, 3], [-7, -7]], [[4, -7], [-7, -7]]]
    assert [b[VALID].tolist() for b in batches] == [[[1, 1], [1, 1]], [[1, 1], [0, 0]], [[1, 0], [0, 0]]]


def test_more_rows_than_files(tmp_path):
    write_streams(tmp_path, [4, 4])
    _, per_epoch = run_stream(tmp_path, rows=5, seq_len=None)
    batches = per_epoch[0]
    assert len(batches) == 4
    assert all(b[VALID].tolist() == [True, True, False, False, False] for b in batches)


def test_torch_metadata_and_shapes(tmp_path):
    import torch

    write_streams(tmp_path, [7, 5, 6])
    loader = pl.DataLoader(PieceReader(2), pl.IdentityDataset(), TorchCollator(), str(tmp_path),
                           stream=pl.Stream(seq_len=4))
    batch = next(iter(loader))
    loader.close()
    assert batch["id"].shape == (2, 4) and batch[VALID].shape == (2, 4)
    for key in (FIRST, VALID, REPLAY, STREAM_ID, POSITION):
        assert isinstance(batch[key], torch.Tensor), key


def test_tf_dataset_carries_metadata(tmp_path):
    write_streams(tmp_path, [7, 5, 6])
    loader = pl.DataLoader(PieceReader(2), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                           stream=pl.Stream(seq_len=4))
    ds = loader.to_tf_dataset()
    assert ds.element_spec[VALID].shape.as_list() == [None, 4]
    total = sum(int((b[VALID].numpy() & ~b[REPLAY].numpy()[:, None]).sum()) for b in ds)
    assert total == 18


def test_user_methods_apply_to_stream_batches(tmp_path):
    write_streams(tmp_path, [6, 6])

    class Shift(pl.Dataset):
        def batch_encode(self, batch):
            return {"id": [[i + 1 for i in window] for window in batch["id"]]}

    loader = pl.DataLoader(PieceReader(2), Shift(), NumpyCollator(), str(tmp_path), stream=pl.Stream(seq_len=3))
    assert next(iter(loader))["id"].tolist() == [[1, 2, 3], [1001, 1002, 1003]]
    loader.close()


def test_metadata_names_cannot_collide(tmp_path):
    write_streams(tmp_path, [3])

    class Clash(pl.Dataset):
        def batch_encode(self, batch):
            return {"id": batch["id"], FIRST: batch["id"]}

    loader = pl.DataLoader(PieceReader(1), Clash(), NumpyCollator(), str(tmp_path), stream=True)
    with pytest.raises(ValueError, match="collide"):
        list(loader)


@pytest.mark.parametrize("kwargs,match", [
    ({"stream": True, "shuffle_buffer": 4}, "shuffle_buffer must be 0"),
    ({"stream": lambda: pl.Stream(seq_len=0)}, "Stream.seq_len must be an integer >= 1"),
    ({"stream": lambda: pl.Stream(padding_mode="repeat")}, "Stream.padding_mode must be one of"),
])
def test_stream_arguments_are_checked(tmp_path, kwargs, match):
    write_streams(tmp_path, [3])
    with pytest.raises(ValueError, match=match):
        pl.DataLoader(PieceReader(2), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                      **{k: v() if callable(v) else v for k, v in kwargs.items()})


def test_stream_read_error_names_the_file(tmp_path):
    write_streams(tmp_path, [6, 6, 6])

    class Broken(PieceReader):
        def iter_file(self, path):
            if path.endswith("s001.txt"):
                yield {"id": [1000]}
                raise OSError("bad sector")
            yield from super().iter_file(path)

    loader = pl.DataLoader(Broken(2, 2), pl.IdentityDataset(), NumpyCollator(), str(tmp_path), stream=True)
    with pytest.raises(pl.PipelineError, match="s001.txt"):
        list(loader)


class Same(pl.Dataset):
    """Returns its input like ``IdentityDataset``, but is user code: groups then go batch by batch."""

    def batch_encode(self, batch):
        return batch


def spy_collate_stacked(monkeypatch):
    """Record, for each group collated at once, how many batches it held."""
    from pyloader.collators._base import ArrayCollator

    made = []
    original = ArrayCollator.collate_stacked

    def spy(self, columns):
        out = original(self, columns)
        if out is not None:
            made.append(len(next(iter(columns.values()))))
        return out

    monkeypatch.setattr(ArrayCollator, "collate_stacked", spy)
    return made


@pytest.mark.parametrize("rows,seq_len", [(2, 4), (8, 32), (64, 32)])
def test_stream_groups_are_sized_in_samples(tmp_path, monkeypatch, rows, seq_len):
    """Small stream batches travel in larger groups (up to GroupSize.SAMPLES samples, never fewer
    than GroupSize.LIMIT batches nor more than GroupSize.MOST); the output is unchanged."""
    from pyloader._stages.batch import GroupSize

    limit = min(GroupSize.MOST, max(GroupSize.LIMIT, GroupSize.SAMPLES // (rows * seq_len)))
    length = seq_len * (2 * limit + 2)  # enough steps for the groups to grow to the limit
    write_streams(tmp_path, [length] * rows)
    made = spy_collate_stacked(monkeypatch)
    loader = pl.DataLoader(PieceReader(rows, piece=length, arrays=True), pl.IdentityDataset(),
                           NumpyCollator(), str(tmp_path), stream=pl.Stream(seq_len=seq_len))
    batches = list(loader)
    check_stream_epoch(batches, [length] * rows, rows, seq_len, order=list(range(rows)))
    assert max(made) == limit
    assert sum(made) == len(batches) - 1  # all but the last step, cut when every row's file is at its end


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("collator", ["numpy", "torch", "tf"])
def test_groups_collated_at_once_match_batch_by_batch(tmp_path, monkeypatch, collator, workers):
    """IdentityDataset and a built-in collator convert a whole group at once; user code goes
    batch by batch. Same batches, fields, types and dtypes either way."""
    from pyloader.collators import TFCollator

    write_streams(tmp_path, [90, 7, 61, 0, 45, 33])
    made = spy_collate_stacked(monkeypatch)
    make = {"numpy": NumpyCollator, "torch": TorchCollator, "tf": TFCollator}[collator]

    def run(dataset):
        loader = pl.DataLoader(PieceReader(3, 40, arrays=True), dataset, make(), str(tmp_path),
                               stream=pl.Stream(seq_len=4), shuffle=True, num_epoch=2, num_workers=workers)
        return list(loader)

    fast = run(pl.IdentityDataset())
    assert sum(made) > len(fast) // 2, "groups were not collated at once"
    made.clear()
    slow = run(Same())
    assert made == []
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        assert list(a) == list(b)
        for key in a:
            assert type(a[key]) is type(b[key]) and a[key].dtype == b[key].dtype, key
            assert np.array_equal(np.asarray(a[key]), np.asarray(b[key])), key


@pytest.mark.parametrize("arrays", [False, True])
def test_resume_mid_group_in_stream_mode(tmp_path, monkeypatch, arrays):
    """Resuming inside a group cut at once (array pieces) gives the rest of the run exactly."""
    write_streams(tmp_path, [70, 45, 90, 20])
    made = spy_collate_stacked(monkeypatch)

    def make():
        return pl.DataLoader(PieceReader(2, 50, arrays), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                             stream=pl.Stream(seq_len=3, padding_mode="data"), shuffle=True, num_epoch=2)

    full = [(b["id"].tolist(), b[VALID].tolist(), b[POSITION].tolist()) for b in make()]
    for taken in (5, 12):  # groups of 1, 2, 4, 8...: both land inside a group
        first = make()
        it = iter(first)
        head = [next(it) for _ in range(taken)]
        state = first.state_dict()
        first.close()
        resumed = make()
        resumed.load_state_dict(state)
        rest = [(b["id"].tolist(), b[VALID].tolist(), b[POSITION].tolist()) for b in head + list(resumed)]
        assert rest == full
    assert bool(made) == arrays


def test_resume_in_stream_mode(tmp_path):
    write_streams(tmp_path, [7, 3, 9, 4, 6])

    def make():
        return pl.DataLoader(PieceReader(2), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                             stream=pl.Stream(seq_len=2, padding_mode="data"), shuffle=True, num_epoch=2)

    full = [b["id"].tolist() for b in make()]
    first = make()
    it = iter(first)
    head = [next(it)["id"].tolist() for _ in range(5)]
    state = first.state_dict()
    first.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + [b["id"].tolist() for b in resumed] == full


def test_letters_example_prints_continuing_rows():
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "examples" / "stream_letters.py")], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr
    lines = [line.split("  ")[0] for line in out.stdout.splitlines()]
    assert lines[1] == "a_0;a_1;a_2;" and lines[8] == "h_0;h_1;h_2;"
    assert lines[11] == "a_3;a_4;a_5;" and lines[21] == "a_6;a_7;a_8;"


@pytest.mark.timeout(400)
def test_gru_example_learns():
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "examples" / "stream_gru.py"), "--epochs", "1", "--rows", "8",
                          "--max-steps", "120"],
                         capture_output=True, text=True, timeout=300,
                         # one torch thread (as test_distributed's): this GRU is too small to gain from more,
                         # and on a busy 2-core machine torch's spinning threads took 43 s instead of 12 s
                         env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    first, last = map(float, out.stdout.strip().splitlines()[-1].split()[1:4:2])
    assert last < first / 2


def test_a_file_per_row_is_read_ahead(tmp_path):
    """Rows whose files end together each need a new file at once: with prefetch_files=1
    stream mode still reads one file per row ahead (at the same time, given the threads)."""
    import threading
    import time

    write_streams(tmp_path, [4] * 8)
    lock = threading.Lock()
    reading, most = [0], [0]

    class Counting(PieceReader):
        thread_safe = True  # its state is guarded: reads may overlap

        def iter_file(self, path):
            with lock:
                reading[0] += 1
                most[0] = max(most[0], reading[0])
            time.sleep(0.2)  # long enough for the reads that are started together to overlap
            with lock:
                reading[0] -= 1
            yield from super().iter_file(path)

    loader = pl.DataLoader(Counting(4, piece=4), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                           stream=pl.Stream(seq_len=4), prefetch_files=1, num_threads=8,
                           num_workers=0)  # the overlap is counted in this process
    ids = sorted(int(i) for b in loader for i, ok in zip(np.ravel(b["id"]), np.ravel(b[VALID])) if ok)
    assert ids == sorted(f * 1000 + p for f in range(8) for p in range(4))
    assert most[0] >= 4, most[0]


class OpenFileReader(pl.DataReader):
    """Keeps each file open while its pieces are taken, so a row left mid-file holds a handle."""

    def read_file(self, path):
        raise AssertionError("stream mode must read through iter_file")

    def iter_file(self, path):
        with open(path) as f:
            part = []
            for line in f:
                part.append(int(line))
                if len(part) == 5:
                    yield {"id": np.array(part, dtype=np.int64)}
                    part = []
            if part:
                yield {"id": np.array(part, dtype=np.int64)}


def _open_data_files(folder: Path) -> list:
    import psutil

    return [f.path for f in psutil.Process().open_files() if f.path.startswith(str(folder))]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("how", STOP_WAYS)
def test_stopping_mid_stream_leaves_nothing(tmp_path, how, workers):
    """Rows stopped inside their files: no thread, worker process or open file of ours remains,
    and the next epoch still delivers every sample exactly once."""
    lengths = [200, 130, 170, 90, 210]
    write_streams(tmp_path / "data", lengths)

    def make():
        return pl.DataLoader(OpenFileReader(3), pl.IdentityDataset(), TorchCollator(), str(tmp_path / "data"),
                             stream=pl.Stream(seq_len=4), num_workers=workers, max_queue_size=2)

    again = stop_early(make, how, after=5)
    assert wait_no_threads(2.0) == [], "pyloader threads were left behind"
    assert wait_no_children(3.0) == [], "worker processes were left behind"
    assert _open_data_files(tmp_path / "data") == [], "data files were left open"

    seen = []
    for batch in again:
        keep = batch[VALID].numpy() & ~batch[REPLAY].numpy()[:, None]
        seen.extend(batch["id"].numpy()[keep].tolist())
    assert sorted(seen) == sorted(f * 1000 + p for f, n in enumerate(lengths) for p in range(n))
    assert wait_no_threads(2.0) == [] and _open_data_files(tmp_path / "data") == []


# -- rows from files that differ -----------------------------------------------------------------
def write_npy(folder: Path, arrays) -> None:
    for i, array in enumerate(arrays):
        np.save(folder / f"s{i:03d}.npy", array)


def rows_of(batches, rows):
    """Each row's valid samples, joined over the batches."""
    out = [[] for _ in range(rows)]
    for batch in batches:
        x = np.asarray(batch["x"]).reshape(rows, -1)
        valid = np.asarray(batch[VALID]).reshape(rows, -1)
        for r in range(rows):
            out[r].extend(x[r][valid[r]].tolist())
    return out


@pytest.mark.parametrize("piece", [1, 64])  # step by step, and many steps cut at once
@pytest.mark.parametrize("seq_len", [None, 3])
@pytest.mark.parametrize("first,second", [
    (np.arange(6, dtype=np.int64), np.full(6, 0.5)),
    (np.arange(6, dtype=np.int32), np.arange(6, dtype=np.int64) + 2**40),
])
def test_stream_rows_from_files_of_different_dtypes_take_their_common_dtype(tmp_path, piece, seq_len, first, second):
    from pyloader.readers import NumpyReader

    write_npy(tmp_path, [first, second])
    loader = pl.DataLoader(NumpyReader(2, piece_size=piece), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                           stream=pl.Stream(seq_len=seq_len))
    batches = list(loader)
    assert all(b["x"].dtype == np.result_type(first, second) for b in batches)
    assert rows_of(batches, 2) == [first.tolist(), second.tolist()]


def test_stream_rows_of_arrays_beside_rows_of_lists_keep_their_values(tmp_path):
    """One file read as an int64 array, the other as a list of floats: nothing is cast to the first."""
    write_streams(tmp_path, [4, 4])

    class Mixed(pl.DataReader):
        def read_file(self, path):
            raise AssertionError("stream mode must read through iter_file")

        def iter_file(self, path):
            with open(path) as f:
                ids = [int(line) for line in f]
            yield {"x": np.array(ids)} if path.endswith("s000.txt") else {"x": [i + 0.5 for i in ids]}

    batches = list(pl.DataLoader(Mixed(2), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                                 stream=pl.Stream(seq_len=2)))
    assert rows_of(batches, 2) == [[0, 1, 2, 3], [1000.5, 1001.5, 1002.5, 1003.5]]


@pytest.mark.parametrize("piece", [1, 64])
def test_stream_rows_with_samples_of_different_shapes_name_both_files(tmp_path, piece):
    from pyloader.readers import NumpyReader

    write_npy(tmp_path, [np.zeros((4, 3)), np.zeros((4, 4))])
    loader = pl.DataLoader(NumpyReader(2, piece_size=piece), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                           stream=pl.Stream(seq_len=2))
    with pytest.raises(ValueError, match=r"shape \(3,\) in file .*s000\.npy.* \(4,\) in file .*s001\.npy"):
        list(loader)


def test_stream_rows_whose_dtypes_have_no_common_one_name_both_files(tmp_path):
    from pyloader.readers import NumpyReader

    write_npy(tmp_path, [np.arange(4), np.arange(4).astype("datetime64[s]")])
    loader = pl.DataLoader(NumpyReader(2), pl.IdentityDataset(), NumpyCollator(), str(tmp_path), stream=True)
    with pytest.raises(TypeError, match=r"s000\.npy.*s001\.npy"):
        list(loader)


def test_stream_rows_whose_files_have_other_fields_name_both_files(tmp_path):
    """A field only some files have is not dropped without a word."""
    write_streams(tmp_path, [3, 3])

    class Extra(PieceReader):
        def iter_file(self, path):
            for piece in super().iter_file(path):
                yield {**piece, "extra": piece["id"]} if path.endswith("s001.txt") else piece

    with pytest.raises(ValueError, match=r"s000\.txt.*s001\.txt.*different fields"):
        list(pl.DataLoader(Extra(2), pl.IdentityDataset(), NumpyCollator(), str(tmp_path), stream=True))


@pytest.mark.parametrize("how", STOP_WAYS)
def test_stopping_a_stream_rank_mid_file_leaves_nothing(tmp_path, how):
    """Under ranks each row's pieces are checked against the file's count on the way: stopping
    inside the files still leaves no thread or open file behind."""
    write_streams(tmp_path / "data", [200, 130, 170, 90, 210])

    def make():
        return pl.DataLoader(OpenFileReader(2), pl.IdentityDataset(), TorchCollator(), str(tmp_path / "data"),
                             stream=pl.Stream(seq_len=4), max_queue_size=2, ranks=pl.Ranks(rank=0, world_size=2))

    again = stop_early(make, how, after=5)
    assert wait_no_threads(2.0) == [], "pyloader threads were left behind"
    assert _open_data_files(tmp_path / "data") == [], "data files were left open"
    assert len(list(again)) > 5
    assert wait_no_threads(2.0) == [] and _open_data_files(tmp_path / "data") == []
