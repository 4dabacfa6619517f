"""Exactly-once delivery, batch shapes, shuffling and determinism of the core loader."""
from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest
from conftest import IdReader, ListCollator, ids_of, write_chunks

import pyloader as pl

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("sizes,batch_size", [
    ([10, 7, 13], 4), ([1] * 9, 4), ([0, 5, 0, 0, 3], 2), ([100], 7), ([3, 3], 16), ([5], 1),
])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_sample_exactly_once_and_batches_full(make_loader, sizes, batch_size, drop_last):
    loader = make_loader(sizes, batch_size=batch_size, drop_last=drop_last)
    batches = list(loader)
    total = sum(sizes)
    got = ids_of(batches)
    lengths = [len(b["id"]) for b in batches]
    if drop_last:
        assert got == list(range(total - total % batch_size))
        assert all(n == batch_size for n in lengths)
    else:
        assert got == list(range(total))
        assert all(n == batch_size for n in lengths[:-1])
        assert 1 <= lengths[-1] <= batch_size


def test_tail_of_one_file_joins_the_next(make_loader):
    batches = list(make_loader([5, 5, 5], batch_size=4))
    assert [b["id"] for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14]]


def test_last_batch_of_each_epoch_only(make_loader):
    batches = list(make_loader([5, 4], batch_size=4, num_epoch=3))
    assert [len(b["id"]) for b in batches] == [4, 4, 1] * 3
    assert ids_of(batches) == list(range(9)) * 3


def test_final_batch_of_one_sample_keeps_batch_dimension(tmp_path):
    from pyloader.collators import NumpyCollator

    write_chunks(tmp_path, [5])
    batches = list(pl.DataLoader(IdReader(4), pl.IdentityDataset(), NumpyCollator(), str(tmp_path)))
    assert [b["id"].shape for b in batches] == [(4,), (1,)]


class SlowConsumerReader(IdReader):
    pass


@pytest.mark.parametrize("reader_delay,consumer_delay", [(0.03, 0.0), (0.0, 0.005)])
def test_exactly_once_whatever_the_relative_speed(make_loader, reader_delay, consumer_delay):
    loader = make_loader([9, 11, 3, 17, 6], batch_size=4, max_queue_size=1,
                         reader=IdReader(4, delay=reader_delay))
    got = []
    for batch in loader:
        got.extend(batch["id"])
        time.sleep(consumer_delay)
    assert got == list(range(46))


class Overlap:
    """Counts the user-method calls running at once (each holds the call ``delay`` seconds, GIL released)."""

    def __init__(self, delay):
        self.delay = delay
        self.lock = threading.Lock()
        self.now = self.most = 0

    def __call__(self, fn, *args):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            time.sleep(self.delay)
            return fn(*args)
        finally:
            with self.lock:
                self.now -= 1


class OverlapReader(IdReader):
    def __init__(self, overlap, batch_size):
        super().__init__(batch_size)
        self.overlap = overlap

    def read_file(self, path):
        return self.overlap(super().read_file, path)


class OverlapEncode(pl.Dataset):
    def __init__(self, overlap):
        self.overlap = overlap

    def batch_encode(self, batch):
        return self.overlap(dict, batch)


@pytest.mark.parametrize("num_threads", [None, 1, 3])
def test_user_methods_run_num_threads_at_a_time(tmp_path, num_threads):
    """Without workers, read_file and batch_encode share ``num_threads`` threads (default: one per
    file read ahead and group in flight); the batches do not depend on it."""
    write_chunks(tmp_path, [6] * 12)
    overlap = Overlap(0.01)
    loader = pl.DataLoader(OverlapReader(overlap, 4), OverlapEncode(overlap), ListCollator(), str(tmp_path),
                           prefetch_files=6, num_threads=num_threads, num_workers=0)  # num_threads: this process
    assert ids_of(loader) == list(range(72))  # not list(loader): its len() would count in this thread
    if num_threads == 1:
        assert overlap.most == 1
    else:
        assert 1 < overlap.most <= (num_threads or (6 + 2))  # default: prefetch_files + 2 groups in flight


def test_lane_runs_steps_first_then_earlier_files_and_survives_cancelled_waiters():
    """The lane user methods share: a group's steps (the consumer waits for them) before reads,
    reads of earlier files first, ties in arrival order; a waiter cancelled does not keep a slot."""
    import asyncio

    from pyloader._execution.runners import Exclusive, Lane

    order = []

    async def main():
        loop = asyncio.get_running_loop()
        gate = threading.Event()
        lane = Lane(lambda fn, *args: loop.run_in_executor(None, fn, *args), 1, Exclusive(()))
        holder = asyncio.ensure_future(lane.run(gate.wait, 5))  # takes the only slot
        await asyncio.sleep(0)
        waiting = [asyncio.ensure_future(call) for call in (
            lane.run(order.append, "read f2", priority=(1, 0, 2)),
            lane.run(order.append, "read f1", priority=(1, 0, 1)),
            lane.run(order.append, "steps a"),
            lane.run(order.append, "cancelled"),
            lane.run(order.append, "steps b"))]
        await asyncio.sleep(0.05)
        waiting[3].cancel()
        gate.set()
        await asyncio.wait_for(asyncio.gather(holder, *waiting, return_exceptions=True), 5)
        await asyncio.wait_for(lane.run(order.append, "after"), 5)  # the slot came back

    asyncio.run(main())
    assert order == ["steps a", "steps b", "read f1", "read f2", "after"]


def test_file_order_shuffle_is_seeded_and_changes_per_epoch(make_loader):
    sizes = [3] * 12
    a = make_loader(sizes, batch_size=3, shuffle=True, num_epoch=2, random_seed=7)
    first = [b["id"] for b in a]
    again = [b["id"] for b in a]
    assert first != again  # the next iteration runs the next two epochs
    b = make_loader(sizes, batch_size=3, shuffle=True, num_epoch=2, random_seed=7)
    assert [b["id"] for b in b] == first  # same seed, same epochs, same order
    epoch0, epoch1 = sum(first[:12], []), sum(first[12:], [])
    assert sorted(epoch0) == sorted(epoch1) == list(range(36))
    assert epoch0 != list(range(36)) and epoch0 != epoch1
    for batch in first:  # whole files, in-file order kept
        assert batch == list(range(batch[0], batch[0] + 3))


def test_another_seed_gives_another_order(tmp_path):
    write_chunks(tmp_path, [3] * 12)

    def order(seed):
        return ids_of(pl.DataLoader(IdReader(3), pl.IdentityDataset(), ListCollator(), str(tmp_path),
                                    shuffle=True, random_seed=seed))

    assert order(1) == order(1) and order(1) != order(2)


def test_in_file_shuffle_keeps_files_apart(make_loader):
    loader = make_loader([8, 8], batch_size=8, reader=IdReader(8, shuffle=True, random_seed=3), num_epoch=2)
    batches = [b["id"] for b in loader]
    assert sorted(batches[0]) == list(range(8)) and sorted(batches[1]) == list(range(8, 16))
    assert batches[0] != list(range(8))
    assert batches[:2] != batches[2:]  # another epoch, another in-file order
    again = make_loader([8, 8], batch_size=8, reader=IdReader(8, shuffle=True, random_seed=3), num_epoch=2)
    assert batches == [b["id"] for b in again]


def test_shuffle_buffer_mixes_files_and_is_deterministic(make_loader):
    loader = make_loader([20] * 10, batch_size=10, shuffle_buffer=50, num_epoch=2)
    batches = [b["id"] for b in loader]
    epoch0 = sum(batches[:20], [])
    assert sorted(epoch0) == list(range(200))
    files_per_batch = [len({i // 20 for i in b}) for b in batches[:20]]
    assert max(files_per_batch) >= 3
    again = make_loader([20] * 10, batch_size=10, shuffle_buffer=50, num_epoch=2)
    assert batches == [b["id"] for b in again]
    assert batches[:20] != batches[20:]


def test_global_random_state_is_never_touched(make_loader):
    random.seed(123)
    np.random.seed(123)
    py_state, np_state = random.getstate(), np.random.get_state()
    loader = make_loader([10] * 5, batch_size=3, shuffle=True, shuffle_buffer=7,
                         reader=IdReader(3, shuffle=True))
    list(loader)
    assert random.getstate() == py_state
    assert all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
               for a, b in zip(np.random.get_state(), np_state))


def test_first_batch_does_not_wait_for_other_files(tmp_path):
    """The first batch is handed over while every other file is still blocked."""
    write_chunks(tmp_path, [8, 8, 8])
    release = threading.Event()

    class Gated(IdReader):
        def read_file(self, path):
            if not path.endswith("part-0000.txt"):
                assert release.wait(10)
            return super().read_file(path)

    # the gate is an Event of this process: the reader runs here
    loader = pl.DataLoader(Gated(4), pl.IdentityDataset(), ListCollator(), str(tmp_path), num_workers=0)
    it = iter(loader)
    assert next(it)["id"] == [0, 1, 2, 3]
    assert next(it)["id"] == [4, 5, 6, 7]
    release.set()
    assert ids_of(it) == list(range(8, 24))


def test_epoch_attribute_follows_consumption(make_loader):
    loader = make_loader([4, 4], batch_size=4, num_epoch=3)
    assert loader.epoch is None
    seen = [loader.epoch for _ in loader]
    assert seen == [0, 0, 1, 1, 2, 2]


def test_stats_count_what_happened(make_loader):
    loader = make_loader([5, 0, 6], batch_size=4)
    list(loader)
    stats = loader.stats
    assert stats["files_read"] == 3 and stats["samples_read"] == 11 and stats["batches"] == 3
    assert stats["skipped_files"] == 0 and stats["errors"] == []


class NumpyIdReader(pl.DataReader):
    def read_file(self, path):
        ids = np.loadtxt(path, dtype=np.int64, ndmin=1)
        return {"id": ids, "sq": ids * ids}, len(ids)


def test_numpy_columns_stay_arrays(make_loader):
    batches = list(make_loader([7, 6], batch_size=5, reader=NumpyIdReader(5), shuffle_buffer=4))
    assert all(isinstance(b["id"], list) for b in batches)  # ListCollator makes lists
    got = ids_of(batches)
    assert sorted(got) == list(range(13))
    assert all(s == i * i for b in batches for i, s in zip(b["id"], b["sq"]))


def test_batch_encode_sees_each_batch(make_loader):
    class Double(pl.Dataset):
        def batch_encode(self, batch):
            return {"id": batch["id"], "twice": [2 * i for i in batch["id"]]}

    batches = list(make_loader([6, 3], batch_size=4, dataset=Double()))
    assert [b["twice"] for b in batches] == [[0, 2, 4, 6], [8, 10, 12, 14], [16]]
