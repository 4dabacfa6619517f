"""Batches travel the pipeline in groups, and files are read with a ramp and spread
over workers: none of it may show in what the consumer gets, its order, its
errors or the loader's position."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from conftest import IdReader, ListCollator, ids_of, write_chunks
from worker_helpers import ListCollator as WorkerListCollator
from worker_helpers import NumReader, PassThrough, PidReader

import pyloader as pl
from pyloader._execution.reading import FileTask, pieces_with_end
from pyloader.collators import NumpyCollator
from pyloader.readers import NumpyReader

pytestmark = pytest.mark.timeout(120)


class FailOnBatch(pl.Dataset):
    """``batch_encode`` raises on the batch holding ``bad_id``."""

    def __init__(self, bad_id: int) -> None:
        self.bad_id = bad_id

    def batch_encode(self, batch_data):
        ids = [int(i) for i in batch_data["id"]]
        if self.bad_id in ids:
            raise ValueError(f"bad sample {self.bad_id}")
        return {"id": ids}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failed_batch_mid_group_raises_after_the_batches_before_it(tmp_path, workers):
    # one file of 400 samples in batches of 4: groups of up to 32 batches; batch 50 fails
    write_chunks(tmp_path / "d", [400])
    reader = IdReader(4) if workers == 0 else NumReader(4)
    loader = pl.DataLoader(reader, FailOnBatch(201), WorkerListCollator() if workers else ListCollator(),
                           str(tmp_path / "d"), num_workers=workers)
    got = []
    with pytest.raises(pl.PipelineError) as info:
        for batch in loader:
            got.append(batch)
    assert ids_of(got) == list(range(200))  # every batch before the failed one, in order
    assert "batch_encode" in str(info.value) and "bad sample 201" in str(info.value)
    assert loader.state_dict()["batches_in_epoch"] == 50


@pytest.mark.parametrize("workers", [0, 2])
def test_a_skipped_batch_mid_group_leaves_the_rest_of_the_group(tmp_path, workers):
    write_chunks(tmp_path / "d", [400])
    reader = IdReader(4) if workers == 0 else NumReader(4)
    loader = pl.DataLoader(reader, FailOnBatch(201), WorkerListCollator() if workers else ListCollator(),
                           str(tmp_path / "d"), num_workers=workers, on_error="skip")
    assert ids_of(loader) == list(range(200)) + list(range(204, 400))
    assert loader.stats["skipped_batches"] == 1


def test_position_advances_per_batch_handed_out_not_per_group(tmp_path):
    write_chunks(tmp_path / "d", [300, 200])
    loader = pl.DataLoader(IdReader(4), pl.IdentityDataset(), ListCollator(), str(tmp_path / "d"))
    it = iter(loader)
    for k in range(1, 41):
        next(it)
        assert loader.state_dict()["batches_in_epoch"] == k
    state = loader.state_dict()
    rest = ids_of(it)
    resumed = pl.DataLoader(IdReader(4), pl.IdentityDataset(), ListCollator(), str(tmp_path / "d"))
    resumed.load_state_dict(state)
    assert ids_of(resumed) == rest == list(range(160, 500))


def test_ready_batches_stay_within_max_queue_size(tmp_path):
    """Groups are counted batch by batch in the hand-over: a stalled consumer holds
    ``max_queue_size`` batches ready (or one group), not ``max_queue_size`` groups."""
    write_chunks(tmp_path / "d", [4 * 32 * 6])
    made = []

    class Counting(pl.DataCollator):
        def collate_batch(self, features):
            made.append(1)
            return {"id": list(features["id"])}

    # threads: every collate is counted here (with workers, 4 groups a worker are in flight)
    loader = pl.DataLoader(IdReader(4), pl.IdentityDataset(), Counting(), str(tmp_path / "d"), max_queue_size=8,
                           num_workers=0)
    it = iter(loader)
    next(it)
    time.sleep(0.5)  # let the pipeline fill up
    ahead = len(made) - 1
    # ready: at most max(max_queue_size, one group); in flight: 2 groups; one more being cut
    assert ahead <= 8 + 32 + 2 * 32 + 32, ahead
    assert ahead < 4 * 32 * 6 // 4 - 1  # it did stop: not the whole file
    loader.close()


def test_the_first_file_is_read_alone_until_the_first_batch_is_out(tmp_path):
    """With prefetch_files=4 the other files are not read while the first one is parsed."""
    write_chunks(tmp_path / "d", [8] * 6)
    events = []
    lock = threading.Lock()

    class Slow(IdReader):
        def read_file(self, path):
            with lock:
                events.append(("read", os.path.basename(path)))
            if path.endswith("part-0000.txt"):
                time.sleep(0.3)
            return super().read_file(path)

    class Mark(pl.DataCollator):
        def collate_batch(self, features):
            with lock:
                events.append(("collate", features["id"][0]))
            return {"id": list(features["id"])}

    loader = pl.DataLoader(Slow(4), pl.IdentityDataset(), Mark(), str(tmp_path / "d"), prefetch_files=4,
                           num_workers=0)  # the events are recorded in this process
    assert ids_of(loader) == list(range(48))
    assert events[0] == ("read", "part-0000.txt")
    assert events[1] == ("collate", 0), events[:4]
    assert sorted(e[1] for e in events if e[0] == "read") == [f"part-{i:04d}.txt" for i in range(6)]


def test_files_are_spread_over_the_workers(tmp_path):
    write_chunks(tmp_path / "d", [20] * 8)
    loader = pl.DataLoader(PidReader(4), PassThrough(), WorkerListCollator(), str(tmp_path / "d"),
                           num_workers=2)
    batches = list(loader)
    assert ids_of(batches) == list(range(160))
    reader_of = {}  # file -> pid of the worker that read it
    for batch in batches:
        for sample, pid in zip(batch["id"], batch["pid"]):
            reader_of[sample // 20] = pid
    pids = [reader_of[f] for f in range(8)]
    assert len(set(pids)) == 2
    # in turn: consecutive files on different workers, so one's batches never wait behind the other's
    assert all(pids[f] != pids[f + 1] for f in range(7)), pids


def _task(path: str, end=None) -> FileTask:
    return FileTask(epoch=0, pos=0, index=0, path=path, start=0, end=end)


def test_whole_file_readers_say_their_piece_is_the_last(tmp_path):
    path = write_chunks(tmp_path / "d", [10])[0]
    got = list(pieces_with_end(IdReader(4), _task(path)))
    assert [(piece["id"], last) for piece, last, _ in got] == [(list(range(10)), True)]


def test_streaming_readers_are_not_looked_ahead(tmp_path):
    path = write_chunks(tmp_path / "d", [10])[0]
    got = list(pieces_with_end(NumReader(4, piece=4), _task(path)))
    assert [(len(piece["id"]), last) for piece, last, _ in got] == [(4, False), (4, False), (2, False)]


def test_a_failure_found_by_the_look_ahead_comes_after_the_piece(tmp_path):
    path = write_chunks(tmp_path / "d", [10])[0]
    gen = pieces_with_end(IdReader(4), _task(path, end=12))  # count said 12 rows, the file has 10
    piece, last, _ = next(gen)
    assert piece["id"] == list(range(10)) and last is False
    with pytest.raises(ValueError, match="has 10 samples"):
        next(gen)


@pytest.mark.parametrize("workers", [0, 2])
def test_groups_of_numpy_batches_are_exact(tmp_path, workers):
    """Batches cut from one piece in a group are separate arrays with the right rows."""
    folder = tmp_path / "npy"
    folder.mkdir()
    for i in range(3):
        np.save(folder / f"c{i}.npy", np.arange(i * 1000, (i + 1) * 1000, dtype=np.int64).reshape(-1, 1))
    loader = pl.DataLoader(NumpyReader(batch_size=7), pl.IdentityDataset(),
                           NumpyCollator(), str(folder), num_workers=workers)
    batches = [b["x"][:, 0].copy() for b in loader]
    assert [len(b) for b in batches] == [7] * (3000 // 7) + [3000 % 7]
    assert np.array_equal(np.concatenate(batches), np.arange(3000))


# --- groups cut from one block (stream mode) --------------------------------------------------


class _Double:
    def __call__(self, data):
        return {"x": data["x"] * 2}

    def on_stacked(self, columns):
        return {"x": columns["x"] * 2}


class _Short(_Double):
    def on_stacked(self, columns):
        return {"x": columns["x"][:1]}


class _Broken(_Double):
    def on_stacked(self, columns):
        raise RuntimeError("no")


def test_stacked_rows_are_made_on_demand():
    from pyloader._execution.steps import StackedRows

    rows = StackedRows({"x": np.arange(6).reshape(3, 2)}, 3)
    assert len(rows) == 3 and rows[1]["x"].tolist() == [2, 3] and rows[-1]["x"].tolist() == [4, 5]
    assert [r["x"].tolist() for r in rows[1:]] == [[2, 3], [4, 5]]
    with pytest.raises(IndexError):
        rows[3]


def test_run_stacked_runs_only_when_every_step_can():
    from pyloader._execution.steps import StackedRows, run_each, run_stacked

    columns = {"x": np.arange(12).reshape(3, 4)}
    rows = StackedRows(columns, 3)
    out = run_stacked([("a", _Double()), ("b", _Double())], rows)
    assert out["x"].shape == (3, 4) and (out["x"] == columns["x"] * 4).all()
    assert [d["x"].tolist() for d in run_each([("a", _Double()), ("b", _Double())], rows)] == \
        (columns["x"] * 4).tolist()
    assert run_stacked([("a", _Double()), ("user", lambda d: d)], rows) is None  # user code: batch by batch
    assert run_stacked([("a", _Broken())], rows) is None  # the batch-by-batch run pins the failure
    assert run_stacked([("a", _Short())], rows) is None  # not one output per batch
    assert run_stacked([("a", _Double())], list(rows)) is None  # not stacked


def test_a_stacked_group_weighs_its_batches_in_the_hand_over():
    import asyncio

    from pyloader._execution.handover import HandOver
    from pyloader._stages.batch import Batch, Stacked

    async def main():
        queue = HandOver(4, asyncio.get_running_loop())
        group = Stacked([Batch(0, k, None, ()) for k in range(3)], {}, {})
        await queue.put(group)
        second = asyncio.ensure_future(queue.put(group))
        await asyncio.sleep(0.05)
        assert not second.done()  # 3 + 3 > 4: waits for room
        assert queue.get(1.0) is group
        await asyncio.wait_for(second, 5)

    asyncio.run(main())


# --- full batches of one piece of arrays, cut as one stacked group ---------------------------------


def _cut_groups(files, batch_size, stack):
    """The groups a ``Batcher`` cuts from ``files`` (one list of column dicts, its pieces, per file)."""
    import asyncio

    from pyloader._execution.reading import FileTask
    from pyloader._stages.batch import Batcher, Cut
    from pyloader._stages.read import Piece
    from pyloader._stages.source import EpochEnd

    class File:
        def __init__(self, k, pieces):
            self.task = FileTask(0, k, k, f"f{k}")
            offsets = np.cumsum([0] + [len(next(iter(p.values()))) for p in pieces])
            self.pieces = [Piece(self.task, int(o), len(next(iter(p.values()))), p) for o, p in zip(offsets, pieces)]

    async def items():
        for k, pieces in enumerate(files):
            yield File(k, pieces)
        yield EpochEnd(0)

    async def pieces_of(item):
        for piece in item.pieces:
            yield piece

    async def main():
        batcher = Batcher([f"f{k}" for k in range(len(files))], pieces_of, None, None, cut=Cut(batch_size, stack=stack))
        return [group async for group in batcher.iterate(items())]

    return asyncio.run(main())


def _rows_of(group):
    """Each batch's raw columns, as the map stage hands them to the steps."""
    from pyloader._stages.batch import Stacked

    if isinstance(group, Stacked):
        return list(group.rows())
    return [batch.data.local() for batch in group]


def test_full_batches_of_one_piece_of_arrays_travel_as_one_stacked_group():
    from pyloader._stages.batch import Stacked

    x = np.arange(200 * 3, dtype=np.float32).reshape(200, 3)
    files = [[{"x": x[:90], "y": np.arange(90)}, {"x": x[90:150], "y": np.arange(90, 150)}],
             [{"x": x[150:], "y": np.arange(150, 200)}]]
    stacked, plain = _cut_groups(files, 8, True), _cut_groups(files, 8, False)
    assert [b.index for g in stacked for b in g] == [b.index for g in plain for b in g] == list(range(25))
    assert [b.paths for g in stacked for b in g] == [b.paths for g in plain for b in g]
    rows_stacked = [r for g in stacked for r in _rows_of(g)]
    rows_plain = [r for g in plain for r in _rows_of(g)]
    for a, b in zip(rows_stacked, rows_plain, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key])
    kinds = [(type(g).__name__, len(g)) for g in stacked]
    # groups grow 1, 2, 4, 8...: each holds the full batches at hand; two or more of one piece go stacked, and
    # a batch crossing into the next piece goes alone (90 rows: 1, 2, 4 and 4 batches, then 2 + 6 rows)
    assert kinds == [("list", 1), ("Stacked", 2), ("Stacked", 4), ("Stacked", 4), ("list", 1), ("Stacked", 6),
                     ("list", 1), ("Stacked", 6)], kinds
    group = stacked[2]
    assert isinstance(group, Stacked) and np.shares_memory(group.columns["x"], x)  # views: nothing copied
    assert all(not isinstance(g, Stacked) for g in plain)


def test_pieces_of_lists_or_in_buffers_are_cut_batch_by_batch():
    files = [[{"x": list(range(64))}], [{"x": np.arange(64), "s": ["a"] * 64}]]
    from pyloader._stages.batch import Stacked

    assert not any(isinstance(g, Stacked) for g in _cut_groups(files, 4, True))


class _Doubled(pl.Dataset):
    """A user ``batch_encode`` on arrays: stacked groups fall back to it batch by batch."""

    def __init__(self, bad_first=None):
        self.bad_first = bad_first
        self.seen = []

    def batch_encode(self, batch_data):
        x = batch_data["x"]
        self.seen.append((type(x), x.shape))
        if self.bad_first is not None and x[0, 0] == self.bad_first:
            raise ValueError("bad batch")
        return {"x": x * 2}


def _npy_files(folder, sizes):
    folder.mkdir()
    start = 0
    for i, n in enumerate(sizes):
        np.save(folder / f"c{i}.npy", np.arange(start, start + n, dtype=np.int64).reshape(-1, 1))
        start += n
    return np.arange(start)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("collator", ["numpy", "torch", "tensorflow"])
def test_a_run_of_stacked_groups_gives_the_batches_a_plain_loop_cuts(tmp_path, collator, workers):
    ids = _npy_files(tmp_path / "npy", [1000, 37, 0, 2000, 5])
    if collator == "tensorflow":  # made in this process: with workers the group goes batch by batch
        import tensorflow as tf

        from pyloader.collators import TFCollator
        made, kind = TFCollator(), tf.Tensor
    elif collator == "torch":
        import torch

        from pyloader.collators import TorchCollator
        made, kind = TorchCollator(), torch.Tensor
    else:
        made, kind = NumpyCollator(), np.ndarray
    loader = pl.DataLoader(NumpyReader(batch_size=16), pl.IdentityDataset(), made, str(tmp_path / "npy"),
                           num_workers=workers)
    for _ in range(2):  # two epochs
        batches = []
        for k, batch in enumerate(loader):
            assert isinstance(batch["x"], kind) and tuple(batch["x"].shape[1:]) == (1,)
            assert loader.state_dict()["batches_in_epoch"] == k + 1  # per batch, not per group
            batches.append(np.asarray(batch["x"])[:, 0].copy())
        assert [len(b) for b in batches] == [16] * (len(ids) // 16) + [len(ids) % 16]
        assert np.array_equal(np.concatenate(batches), ids)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_user_encode_on_stacked_groups_sees_each_batch_and_a_failed_one_is_skipped_alone(tmp_path, workers):
    ids = _npy_files(tmp_path / "npy", [400, 400])
    dataset = _Doubled(bad_first=40)  # the 6th batch of 8 rows: inside a stacked group
    loader = pl.DataLoader(NumpyReader(batch_size=8), dataset, NumpyCollator(), str(tmp_path / "npy"),
                           num_workers=workers, on_error="skip")
    got = np.concatenate([b["x"][:, 0] for b in loader])
    assert np.array_equal(got, 2 * np.concatenate([ids[:40], ids[48:]]))
    assert loader.stats["skipped_batches"] == 1
    if not workers:
        assert set(dataset.seen) == {(np.ndarray, (8, 1))}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failed_batch_of_a_stacked_group_raises_after_the_batches_before_it(tmp_path, workers):
    ids = _npy_files(tmp_path / "npy", [800])
    loader = pl.DataLoader(NumpyReader(batch_size=8), _Doubled(bad_first=200), NumpyCollator(), str(tmp_path / "npy"),
                           num_workers=workers)
    got = []
    with pytest.raises(pl.PipelineError, match="bad batch") as info:
        for batch in loader:
            got.append(batch["x"][:, 0])
    assert np.array_equal(np.concatenate(got), 2 * ids[:200])
    assert isinstance(info.value, ValueError) and "c0.npy" in str(info.value)
    assert loader.state_dict()["batches_in_epoch"] == 25


def test_a_piece_a_worker_keeps_is_cut_into_stacked_groups_of_its_rows_there():
    from pyloader._execution.reading import FileTask
    from pyloader._execution.steps import Segments, StackedSegments
    from pyloader._stages.batch import Stacked
    from pyloader._stages.read import Piece

    class Ref:
        worker, pid, row_bytes = 1, 7, 8

    piece = Piece(FileTask(0, 0, 0, "f0"), 0, 100, None, Ref())
    rows = StackedSegments(piece, 10, 8, 3)
    assert len(rows) == 3 and rows.paths == ("f0",)
    assert [s.parts[0][1:] for s in rows] == [(10, 18), (18, 26), (26, 34)]
    assert rows[-1].parts == ((piece, 26, 34),) and isinstance(rows[0], Segments)
    assert [s.parts[0][1:] for s in rows[1:]] == [(18, 26), (26, 34)]
    with pytest.raises(IndexError):
        rows[3]
    group = Stacked([pl_batch(k) for k in range(3)], None, None, rows)
    assert group.rows() is rows and group.rows_each() == 8
    assert [b.data.parts[0][1:] for b in group.pick([0, 2])] == [(10, 18), (26, 34)]
    Ref.row_bytes = None  # its columns are not all arrays: cut batch by batch
    assert not any(isinstance(g, Stacked) for g in _cut_remote(Piece(FileTask(0, 0, 0, "f0"), 0, 100, None, Ref())))
    Ref.row_bytes = 8
    assert any(isinstance(g, Stacked) and g.remote is not None
               for g in _cut_remote(Piece(FileTask(0, 0, 0, "f0"), 0, 100, None, Ref())))


def pl_batch(k):
    from pyloader._stages.batch import Batch

    return Batch(0, k, None, ("f0",))


def _cut_remote(piece):
    import asyncio

    from pyloader._stages.batch import Batcher, Cut
    from pyloader._stages.source import EpochEnd

    class File:
        task = piece.task

    async def items():
        yield File()
        yield EpochEnd(0)

    async def pieces_of(item):
        yield piece

    async def main():
        batcher = Batcher(["f0"], pieces_of, None, None, cut=Cut(4, stack=True))
        return [group async for group in batcher.iterate(items())]

    return asyncio.run(main())


def test_stacked_groups_of_small_batches_grow_past_32_batches_within_the_samples_and_bytes_bounds():
    from pyloader._stages.batch import GroupSize

    small = _cut_groups([[{"x": np.zeros((64 * 1200, 2), np.float32)}]], 64, True)
    assert max(len(g) for g in small) == GroupSize.SAMPLES // 64 == 512  # 32,768 samples
    assert sum(len(g) for g in small) == 1200
    wide = np.broadcast_to(np.zeros((1, 1 << 18), np.float32), (4 * 200, 1 << 18))  # 1 MiB rows, 1 MiB held
    big = _cut_groups([[{"x": wide}]], 4, True)
    assert max(len(g) for g in big) == GroupSize.LIMIT  # 16 MiB is 4 batches: never fewer than 32
    assert GroupSize.of_small(4, 4 << 10) == 1024 and GroupSize.of_small(64, 64 << 10) == 256
