"""Stream mode, continued: edge padding, time-major batches, slices of files, in-memory streams.

Each is checked against its definition (``check_epoch``) with 0 and 2 workers and
under ranks, and resumed at every position (of the first epoch, where the run is long).
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import pytest
from conftest import first_epoch_and_spread, spread_positions, wait_no_children, wait_no_threads
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_stream import PieceReader, epoch_order, write_streams

import pyloader as pl
from pyloader.collators import NumpyCollator, TorchCollator
from pyloader.testing import check_resume

pytestmark = pytest.mark.timeout(180)
FIRST, VALID, REPLAY, STREAM_ID, POSITION = "__first__", "__valid__", "__replay__", "__stream_id__", "__position__"
META = (FIRST, VALID, REPLAY, STREAM_ID, POSITION)


def as_numpy(batch: Dict[str, Any]) -> Dict[str, np.ndarray]:
    return {key: np.asarray(value) for key, value in batch.items()}


def check_epoch(batches: Sequence[Dict[str, Any]], streams: List[List[int]], starts: List[int], rows: int,
                seq_len: Optional[int], order: List[int], field: str = "id", time_major: bool = False,
                edge: bool = False, pad: int = 0) -> List[int]:
    """Every invariant of one epoch of stream batches whose stream ``e`` holds the ids
    ``streams[e]`` from row ``starts[e]`` of its file on (``order``: the epoch's streams in
    plan order, this rank's among them). Padding holds ``pad``, or with ``edge`` the row's last
    real sample. Returns the real samples seen."""
    width = seq_len or 1
    prev: List[Any] = [None] * rows  # (stream id, next position)
    last: List[Any] = [None] * rows  # the row's last real sample
    seen: List[int] = []
    for batch in map(as_numpy, batches):
        ids, valid = batch[field], batch[VALID]
        if time_major:
            assert ids.shape[:2] == (width, rows) and valid.shape == (width, rows)
            ids, valid = ids.swapaxes(0, 1), valid.T
        ids, valid = ids.reshape(rows, width), valid.reshape(rows, width)
        for r in range(rows):
            n = int(valid[r].sum())
            assert valid[r, :n].all(), "padding only at the end of a window"
            filler = last[r] if edge and n == 0 else ids[r, n - 1] if edge else pad
            assert (ids[r, n:] == (pad if filler is None else filler)).all(), (r, ids[r], last[r])
            if not n:
                assert batch[STREAM_ID][r] == -1 and not batch[FIRST][r]
                prev[r] = None
                continue
            e = order[batch[STREAM_ID][r]]
            offset = int(batch[POSITION][r]) - starts[e]
            assert ids[r, :n].tolist() == streams[e][offset:offset + n]
            if batch[FIRST][r]:
                assert offset == 0
            else:
                assert prev[r] == (batch[STREAM_ID][r], batch[POSITION][r]), f"row {r} does not continue its stream"
            if n < width:
                assert offset + n == len(streams[e]), "window cut short before the stream's end"
            assert not batch[REPLAY][r]
            seen.extend(streams[e][offset:offset + n])
            prev[r] = (batch[STREAM_ID][r], batch[POSITION][r] + n)
            last[r] = ids[r, n - 1]
    return seen


def file_streams(lengths: Sequence[int]) -> List[List[int]]:
    return [[f * 1000 + p for p in range(n)] for f, n in enumerate(lengths)]


def run_epochs(loader: pl.DataLoader) -> Dict[int, List[Dict[str, Any]]]:
    out: Dict[int, List[Dict[str, Any]]] = {}
    for batch in loader:
        out.setdefault(loader.epoch, []).append(as_numpy(batch))
    return out


# -- padding_mode="edge" ---------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("seq_len,arrays", [(None, False), (3, False), (3, True), (4, True)])
def test_edge_padding_repeats_each_rows_last_real_sample_flagged_not_valid(tmp_path, workers, seq_len, arrays):
    lengths = [7, 2, 30, 5, 11]
    write_streams(tmp_path, lengths)
    loader = pl.DataLoader(PieceReader(3, 4, arrays), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                           stream=pl.Stream(seq_len=seq_len, padding_mode="edge", pad_value=-1), shuffle=True,
                           num_epoch=2, num_workers=workers)
    epochs = run_epochs(loader)
    zeros = run_epochs(pl.DataLoader(PieceReader(3, 4, arrays), pl.IdentityDataset(), NumpyCollator(),
                                     str(tmp_path), stream=pl.Stream(seq_len=seq_len, pad_value=-1), shuffle=True,
                                     num_epoch=2))
    for epoch, batches in epochs.items():
        seen = check_epoch(batches, file_streams(lengths), [0] * 5, 3, seq_len, epoch_order(loader, epoch), edge=True,
                           pad=-1)
        assert sorted(seen) == sorted(i for s in file_streams(lengths) for i in s)
        assert any(not b[VALID].all() for b in batches), "the data makes padding"
        for b, z in zip(batches, zeros[epoch], strict=True):  # the same batches but for what pads them
            assert all(np.array_equal(b[key], z[key]) for key in META)
            assert np.array_equal(np.where(b[VALID], b["id"], 0), np.where(z[VALID], z["id"], 0))
    assert wait_no_children() == []


def test_edge_padding_of_a_row_that_never_had_a_sample_is_the_pad_value(tmp_path):
    write_streams(tmp_path, [4])
    batches = list(pl.DataLoader(PieceReader(2), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                                 stream=pl.Stream(seq_len=3, padding_mode="edge", pad_value=-5)))
    assert [b["id"].tolist() for b in batches] == [[[0, 1, 2], [-5, -5, -5]], [[3, 3, 3], [-5, -5, -5]]]
    assert [b[VALID].tolist() for b in batches] == [[[1, 1, 1], [0, 0, 0]], [[1, 0, 0], [0, 0, 0]]]
    assert [b["pair"][0, 1:].tolist() for b in batches][1] == [[3, -3], [3, -3]]


@pytest.mark.parametrize("seq_len", [None, 2])
def test_edge_padding_keeps_ranks_equal_and_resumes_exactly(tmp_path, seq_len):
    lengths = [9, 3, 14, 2, 6]
    write_streams(tmp_path, lengths)

    def make(rank):
        return pl.DataLoader(PieceReader(2, 5, arrays=True), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                             stream=pl.Stream(seq_len=seq_len, padding_mode="edge"),
                             ranks=pl.Ranks(rank=rank, world_size=2),
                             shuffle=True, num_epoch=2)

    runs = [run_epochs(make(rank)) for rank in range(2)]
    assert [sum(map(len, r.values())) for r in runs] == [len(make(0)), len(make(1))]
    assert len(make(0)) == len(make(1))
    for epoch in (0, 1):
        order = epoch_order(make(0), epoch)
        seen = [i for rank, r in enumerate(runs) for i in check_epoch(r[epoch], file_streams(lengths), [0] * 5, 2,
                                                                      seq_len, order, edge=True)]
        assert sorted(seen) == sorted(i for s in file_streams(lengths) for i in s)
    # seq_len=None: 28 one-sample steps, every position of the first epoch; seq_len=2: 14 steps, every one
    check_resume(lambda: make(1), first_epoch_and_spread if seq_len is None else None)
    assert wait_no_threads() == []


# -- time_major ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("arrays,padding_mode", [(False, "zeros"), (True, "zeros"), (True, "edge"), (False, "data")])
def test_time_major_batches_are_the_batch_major_ones_transposed(tmp_path, workers, arrays, padding_mode):
    lengths = [7, 2, 30, 5, 11]
    write_streams(tmp_path, lengths)

    def make(time_major):
        return pl.DataLoader(PieceReader(3, 4, arrays), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                             stream=pl.Stream(seq_len=4, time_major=time_major, padding_mode=padding_mode),
                             shuffle=True,
                             num_epoch=2, num_workers=workers)

    loader = make(True)
    tm, bm = run_epochs(loader), run_epochs(make(False))
    assert sorted(tm) == sorted(bm) == [0, 1]
    for epoch in tm:
        assert len(tm[epoch]) == len(bm[epoch])
        for t, b in zip(tm[epoch], bm[epoch]):
            assert t["id"].shape == (4, 3) and t["pair"].shape == (4, 3, 2) and t[VALID].shape == (4, 3)
            for key in ("id", "pair", VALID):
                assert np.array_equal(t[key], b[key].swapaxes(0, 1)), key
            for key in (FIRST, REPLAY, STREAM_ID, POSITION):
                assert np.array_equal(t[key], b[key]), key
        if padding_mode != "data":
            check_epoch(tm[epoch], file_streams(lengths), [0] * 5, 3, 4, epoch_order(loader, epoch), time_major=True,
                        edge=padding_mode == "edge")


def test_time_major_torch_tensors_under_ranks(tmp_path):
    import torch

    write_streams(tmp_path, [7, 5, 6, 9])
    runs = [list(pl.DataLoader(PieceReader(2, arrays=True), pl.IdentityDataset(), TorchCollator(), str(tmp_path),
                               stream=pl.Stream(seq_len=3, time_major=True), ranks=pl.Ranks(rank=rank, world_size=2)))
            for rank in range(2)]
    assert len(runs[0]) == len(runs[1])
    for batch in runs[0] + runs[1]:
        assert isinstance(batch["id"], torch.Tensor) and batch["id"].shape == (3, 2)
        assert batch[VALID].shape == (3, 2) and batch[FIRST].shape == (2,)


def test_time_major_needs_stream_windows(tmp_path):
    write_streams(tmp_path, [3])
    with pytest.raises(ValueError, match=r"Stream.time_major=True .* needs seq_len"):
        pl.Stream(time_major=True)
    with pytest.raises(ValueError, match="time_major=True has no effect without stream"):
        pl.DataLoader(PieceReader(2), pl.IdentityDataset(), NumpyCollator(), str(tmp_path), time_major=True)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(0, 60), min_size=1, max_size=6), rows=st.integers(1, 4),
       seq_len=st.one_of(st.none(), st.integers(1, 5)), time_major=st.booleans(),
       padding_mode=st.sampled_from(["zeros", "edge"]), piece=st.integers(1, 40))
def test_array_pieces_cut_at_once_match_step_by_step_in_every_layout(lengths, rows, seq_len, time_major,
                                                                    padding_mode, piece):
    """Array pieces (cut many steps at once) and list pieces (one step at a time) give the same batches."""
    time_major = time_major and seq_len is not None
    with tempfile.TemporaryDirectory() as tmp:
        write_streams(Path(tmp), lengths)
        runs = []
        for arrays in (True, False):
            loader = pl.DataLoader(PieceReader(rows, piece, arrays), pl.IdentityDataset(), NumpyCollator(), tmp,
                                   stream=pl.Stream(seq_len=seq_len, time_major=time_major, padding_mode=padding_mode,
                                                    pad_value=-1),
                                   shuffle=True)
            runs.append(run_epochs(loader))
        fast, slow = runs
        assert sorted(fast) == sorted(slow)
        for epoch, batches in fast.items():
            assert len(batches) == len(slow[epoch])
            check_epoch(batches, file_streams(lengths), [0] * len(lengths), rows, seq_len, epoch_order(loader, epoch),
                        time_major=time_major, edge=padding_mode == "edge", pad=-1)
            for a, b in zip(batches, slow[epoch]):
                assert sorted(a) == sorted(b)
                for key in a:
                    assert a[key].shape == b[key].shape and np.array_equal(a[key], b[key]), key


# -- slices of files ----------------------------------------------------------------------------------
def sliced(folder: Path) -> tuple:
    """A long file of 40 samples cut into slices of 10, 15 and 15, and a short whole file."""
    write_streams(folder, [40, 6])
    long, short = str(folder / "s000.txt"), str(folder / "s001.txt")
    entries = [(long, 0, 10), (long, 10, 25), short, (long, 25, 40)]
    streams = [list(range(0, 10)), list(range(10, 25)), [1000 + p for p in range(6)], list(range(25, 40))]
    return entries, streams, [0, 10, 0, 25]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("arrays", [False, True])
def test_slices_of_one_long_file_feed_several_rows(tmp_path, workers, arrays):
    entries, streams, starts = sliced(tmp_path)
    loader = pl.DataLoader(PieceReader(3, 4, arrays), pl.IdentityDataset(), NumpyCollator(), entries,
                           stream=pl.Stream(seq_len=3), num_workers=workers, num_epoch=2)
    planned = len(loader)
    epochs = run_epochs(loader)
    assert planned == sum(map(len, epochs.values())) == 2 * 7  # row 2 takes the last slice after the short file
    for batches in epochs.values():
        seen = check_epoch(batches, streams, starts, 3, 3, [0, 1, 2, 3])
        assert sorted(seen) == sorted(i for s in streams for i in s)
        assert batches[0][POSITION].tolist() == [0, 10, 0], "positions count rows of the file"
        assert batches[0][FIRST].tolist() == [True, True, True]


def test_slices_under_ranks_give_equal_steps_and_never_count_their_file(tmp_path):
    entries, streams, starts = sliced(tmp_path)
    entries = [e for e in entries if isinstance(e, tuple)]  # slices only: no count is needed

    class NoCount(PieceReader):
        def count(self, path):
            raise AssertionError("a slice's count is its length")

    runs, seen = [], []
    for rank in range(2):
        loader = pl.DataLoader(NoCount(1, arrays=True), pl.IdentityDataset(), NumpyCollator(), entries, stream=True,
                               ranks=pl.Ranks(rank=rank, world_size=2), shuffle=True, num_epoch=2)
        runs.append(len(loader))
        epochs = run_epochs(loader)
        assert sum(map(len, epochs.values())) == runs[-1]
        order = epoch_order(loader, 0)
        seen += check_epoch(epochs[0], [streams[0], streams[1], streams[3]], [0, 10, 25], 1, None, order)
    assert runs[0] == runs[1]
    assert sorted(seen) == list(range(40))


def test_a_slice_past_the_end_of_its_file_names_the_file_when_its_row_gets_there(tmp_path):
    write_streams(tmp_path, [12])
    path = str(tmp_path / "s000.txt")
    loader = pl.DataLoader(PieceReader(1), pl.IdentityDataset(), NumpyCollator(), [(path, 8, 20)], stream=True)
    got = []
    with pytest.raises(pl.PipelineError, match=r"s000\.txt.*has 12 samples, fewer than the slice 8:20"):
        for batch in loader:
            got.append(int(batch["id"][0]))
    assert got == [8, 9, 10]  # the step of sample 11 needs the file's next piece: the error, there


@pytest.mark.parametrize("entry,match", [
    (("a", 5, 2), "0 <= start <= end"), (("a", -1, 2), "0 <= start <= end"), (("a", 0, 2.5), "integer bounds"),
])
def test_bad_slices_are_refused(tmp_path, entry, match):
    write_streams(tmp_path, [3])
    entry = (str(tmp_path / "s000.txt"),) + entry[1:]
    with pytest.raises(ValueError, match=match):
        pl.DataLoader(PieceReader(1), pl.IdentityDataset(), NumpyCollator(), [entry], stream=True)


def test_slices_are_for_stream_mode(tmp_path):
    write_streams(tmp_path, [3])
    with pytest.raises(ValueError, match="outside stream mode"):
        pl.DataLoader(PieceReader(1), pl.IdentityDataset(), NumpyCollator(), [(str(tmp_path / "s000.txt"), 0, 2)])


def test_a_time_major_run_over_slices_resumes_exactly_and_refuses_other_bounds(tmp_path):
    entries, _, _ = sliced(tmp_path)

    def make(listed=entries):
        return pl.DataLoader(PieceReader(2, 4, arrays=True), pl.IdentityDataset(), NumpyCollator(), listed,
                             stream=pl.Stream(seq_len=3, padding_mode="edge", time_major=True), shuffle=True,
                             num_epoch=2)

    check_resume(make, first_epoch_and_spread)
    assert wait_no_threads() == []
    loader = make()
    next(iter(loader))
    state = loader.state_dict()
    loader.close()
    with pytest.raises(ValueError, match="files"):
        make(entries[:-1] + [(entries[-1][0], 26, 40)]).load_state_dict(state)


# -- in-memory streams -------------------------------------------------------------------------------
class Unused(pl.DataReader):
    """A reader that must not be called: in-memory streams need none of its methods."""

    def read_file(self, path):
        raise AssertionError("read_file called")

    def iter_file(self, path):
        raise AssertionError("iter_file called")

    def count(self, path):
        raise AssertionError("count called")


def memory_streams(lengths: Sequence[int]) -> List[np.ndarray]:
    return [np.arange(k * 1000, k * 1000 + n) for k, n in enumerate(lengths)]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("seq_len", [None, 3])
def test_in_memory_sequences_stream_like_files(workers, seq_len):
    lengths = [7, 0, 12, 3, 9]
    data = memory_streams(lengths)
    loader = pl.DataLoader(Unused(2), pl.IdentityDataset(), NumpyCollator(), iter(data),
                           stream=pl.Stream(seq_len=seq_len), num_workers=workers, shuffle=True, num_epoch=2)
    planned = len(loader)
    epochs = run_epochs(loader)
    assert planned == sum(map(len, epochs.values()))
    streams = [a.tolist() for a in data]
    for epoch, batches in epochs.items():
        seen = check_epoch(batches, streams, [0] * 5, 2, seq_len, epoch_order(loader, epoch), field="data")
        assert sorted(seen) == sorted(i for s in streams for i in s)
    upcoming = len(loader)  # epochs 2 and 3: other orders, other step counts
    again = list(loader)  # the iterator given was read once: the next iteration has the same streams
    assert len(again) == upcoming
    assert sum(int(b[VALID].sum()) for b in map(as_numpy, again)) == 2 * sum(lengths)


def test_in_memory_dicts_of_columns_keep_their_fields():
    streams = [{"id": [1, 2, 3], "word": ["a", "b", "c"]}, {"id": np.array([7, 8]), "word": ["x", "y"]}]
    batches = list(pl.DataLoader(Unused(2), pl.IdentityDataset(), NumpyCollator(), streams,
                                 stream=pl.Stream(seq_len=2)))
    assert [b["id"].tolist() for b in batches] == [[[1, 2], [7, 8]], [[3, 0], [0, 0]]]
    assert batches[0]["word"] == [["a", "b"], ["x", "y"]]  # strings stay a list (NumpyCollator)


@pytest.mark.parametrize("workers", [0, 2])
def test_in_memory_streams_under_ranks(workers):
    data = memory_streams([7, 12, 3, 9, 1])
    streams = [a.tolist() for a in data]
    steps, seen = [], []
    for rank in range(2):
        loader = pl.DataLoader(Unused(2), pl.IdentityDataset(), NumpyCollator(), data, stream=pl.Stream(seq_len=2),
                               ranks=pl.Ranks(rank=rank, world_size=2), num_workers=workers)
        steps.append(len(loader))
        batches = list(loader)
        assert len(batches) == steps[-1]
        seen += check_epoch(batches, streams, [0] * 5, 2, 2, epoch_order(loader, 0), field="data")
    assert steps[0] == steps[1] and sorted(seen) == sorted(i for s in streams for i in s)


def test_in_memory_streams_resume_exactly_and_refuse_other_data():
    data = memory_streams([7, 12, 3, 9])

    def make(streams=data):
        return pl.DataLoader(Unused(2), pl.IdentityDataset(), NumpyCollator(), streams,
                             stream=pl.Stream(seq_len=2, padding_mode="edge"),
                             shuffle=True, num_epoch=2)

    # every position: test_stream_resume's [memory-one-0], the same streams' settings in threads
    check_resume(make, spread_positions)
    assert wait_no_threads() == []
    loader = make()
    next(iter(loader))
    state = loader.state_dict()
    loader.close()
    with pytest.raises(ValueError, match="files"):
        make(data[:3] + [np.arange(10)]).load_state_dict(state)


@pytest.mark.parametrize("data_dir,kwargs,match", [
    ([np.arange(3), {"id": [1, 2], "x": [1]}], {"stream": True}, "in-memory stream 1 of data_dir: key 'x' has 1"),
    ([np.arange(3), 5], {"stream": True}, "in-memory stream 1 .*got int"),
    ([np.arange(3)], {}, "outside stream mode"),
])
def test_bad_in_memory_streams_are_refused(data_dir, kwargs, match):
    with pytest.raises(ValueError, match=match):
        pl.DataLoader(Unused(2), pl.IdentityDataset(), NumpyCollator(), data_dir, **kwargs)


def test_in_memory_streams_and_files_do_not_mix(tmp_path):
    write_streams(tmp_path, [3])
    with pytest.raises(ValueError, match="among files"):
        pl.DataLoader(Unused(2), pl.IdentityDataset(), NumpyCollator(), [str(tmp_path / "s000.txt"), np.arange(3)],
                      stream=True)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("padding_mode", ["zeros", "edge"])
def test_padding_steps_of_a_short_rank_give_list_samples_the_shape_of_its_other_steps(tmp_path, padding_mode, workers):
    write_streams(tmp_path, [9, 1])  # rank 1's one sample is one step; it pads two more, with no live row
    loader = pl.DataLoader(PieceReader(2, 2, arrays=False), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                           stream=pl.Stream(seq_len=3, padding_mode=padding_mode, pad_value=-5),
                           ranks=pl.Ranks(rank=1, world_size=2),
                           num_workers=workers)
    batches = list(loader)
    assert [b[VALID].any(axis=1).tolist() for b in batches] == [[True, False], [False, False], [False, False]]
    assert [b["pair"].shape for b in batches] == [(2, 3, 2)] * 3
    edge = [1000, -1000] if padding_mode == "edge" else [-5, -5]
    assert batches[1]["pair"].tolist() == [[edge] * 3, [[-5, -5]] * 3]


# -- samples that are not numbers or arrays: tuples, tensors, ragged lists ----------------------------
class SampleReader(pl.DataReader):
    """Streams one field, ``"x"``: ``make(id)`` for each id of the file (``write_streams``), in pieces of 2."""

    def __init__(self, rows, make):
        super().__init__(rows)
        self.make = make

    def read_file(self, path):
        raise AssertionError("stream mode must read through iter_file")

    def iter_file(self, path):
        with open(path) as f:
            ids = [int(line) for line in f]
        for start in range(0, len(ids), 2):
            yield {"x": [self.make(i) for i in ids[start:start + 2]]}


class AsIs(pl.DataCollator):
    def collate_batch(self, features):
        return dict(features)


def frames_and_label(i):
    """A sample as pytorch-stream-dataloader's iterators yield it: ``([frames], label)``."""
    return [np.full(2, i), np.full(2, -i)], i % 7


def stream_rows(batches, seq_len):
    """Each batch's ``"x"`` as ``(sample, valid)`` per row and step, in row order."""
    out = []
    for batch in batches:
        valid = np.asarray(batch[VALID]).reshape(len(batch["x"]), -1)
        rows = batch["x"] if seq_len else [[sample] for sample in batch["x"]]
        out.append([list(zip(row, flags)) for row, flags in zip(rows, valid.tolist())])
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("seq_len", [None, 2])
def test_stream_samples_that_are_tuples_batch_as_outside_stream_mode(tmp_path, workers, seq_len):
    write_streams(tmp_path, [5, 2])

    def make(**kwargs):
        return pl.DataLoader(SampleReader(2, frames_and_label), pl.IdentityDataset(), AsIs(), str(tmp_path),
                             num_workers=workers, **kwargs)

    outside = [sample for batch in make() for sample in batch["x"]]
    batches = list(make(stream=pl.Stream(seq_len=seq_len, pad_value=-1)))
    real, padding = [], []
    for row in (row for batch in stream_rows(batches, seq_len) for row in batch):
        for sample, valid in row:
            assert isinstance(sample, tuple) and isinstance(sample[0], list)
            (real if valid else padding).append(sample)
    by_id = sorted(real, key=lambda sample: sample[0][0][0])
    assert [(frames[0].tolist(), frames[1].tolist(), label) for frames, label in by_id] == \
        [(frames[0].tolist(), frames[1].tolist(), label) for frames, label in outside]
    assert padding and all(frames[0].tolist() == [-1, -1] and frames[0].dtype == np.int64 and label == -1
                           for frames, label in padding)


class Stacking(pl.DataCollator):
    """``torch.stack`` of each row's samples: every sample, padding too, must be a tensor."""

    def collate_batch(self, features):
        import torch

        return {"x": torch.stack([torch.stack(list(row)) for row in features["x"]])}


@pytest.mark.parametrize("workers", [0, 2])
def test_stream_padding_of_tensor_samples_is_tensors_that_stack(tmp_path, workers):
    import torch

    write_streams(tmp_path, [3, 1])
    for pad in (torch.tensor(-1), -1, torch.full((2,), -1)):
        loader = pl.DataLoader(SampleReader(2, lambda i: torch.tensor([i, i + 1])), pl.IdentityDataset(), Stacking(),
                               str(tmp_path), stream=pl.Stream(seq_len=2, pad_value=pad), num_workers=workers)
        got = [(b["x"].tolist(), b[VALID].tolist()) for b in loader]
        assert got == [([[[0, 1], [1, 2]], [[1000, 1001], [-1, -1]]], [[True, True], [True, False]]),
                       ([[[2, 3], [-1, -1]], [[-1, -1], [-1, -1]]], [[True, False], [False, False]])]


@pytest.mark.parametrize("pad, padding", [(-1, ([-1, -1], -1)), ((None, 0), (None, 0)), (([], 0), ([], 0))])
def test_stream_padding_of_tuple_samples_is_tuples(tmp_path, pad, padding):
    write_streams(tmp_path, [3])
    loader = pl.DataLoader(SampleReader(1, lambda i: ([i, i], i)), pl.IdentityDataset(), AsIs(), str(tmp_path),
                           stream=pl.Stream(seq_len=2, pad_value=pad), num_workers=0)
    assert [b["x"] for b in loader] == [[[([0, 0], 0), ([1, 1], 1)]], [[([2, 2], 2), padding]]]


def test_stream_padding_of_dict_samples_is_dicts(tmp_path):
    write_streams(tmp_path, [1])
    loader = pl.DataLoader(SampleReader(1, lambda i: {"frames": np.arange(2), "label": 3}), pl.IdentityDataset(),
                           AsIs(), str(tmp_path), stream=pl.Stream(seq_len=2, pad_value=-1), num_workers=0)
    (batch,) = list(loader)
    (real, padding), = batch["x"]
    assert padding["frames"].tolist() == [-1, -1] and padding["label"] == -1


@pytest.mark.parametrize("pad, padding", [([-1, -1], [[-1, -1], [-1, -1]]), (-1, [[-1] * 3, [-1] * 4])])
def test_stream_padding_of_ragged_list_samples_takes_the_pad_value_or_each_rows_shape(tmp_path, pad, padding):
    write_streams(tmp_path, [1, 2])  # row 0 ends after a sample of 3 numbers, row 1 after one of 4
    loader = pl.DataLoader(SampleReader(2, lambda i: [i] * (i % 1000 + 3)), pl.IdentityDataset(), AsIs(),
                           str(tmp_path), stream=pl.Stream(seq_len=3, pad_value=pad), num_workers=0)
    (batch,) = list(loader)
    assert batch["x"] == [[[0] * 3] + [padding[0]] * 2, [[1000] * 3, [1001] * 4, padding[1]]]
