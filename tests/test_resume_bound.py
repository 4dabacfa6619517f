"""What a resumed iteration reads before its first batch: the file under the position, the files the
buffers' state there is rebuilt from (``shuffle_buffer``, ``bucket_buffer``), and the read-ahead — the
same near the start of an epoch as near its end."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Set, Tuple

import pytest
from conftest import IdReader, ListCollator, take, wait_no_threads, write_chunks

import pyloader as pl

pytestmark = pytest.mark.timeout(120)

FILES, SIZE, BATCH, PREFETCH = 80, 10, 4, 2  # 800 samples: 200 batches an epoch, 100 per rank
SHUFFLE_BUFFER, BUCKET_BUFFER = 20, 24
COLLATED = "collated"

BUFFERS: Dict[str, Dict[str, Any]] = {
    "none": {},
    "shuffle_buffer": {"shuffle_buffer": SHUFFLE_BUFFER},
    "bucket_by": {"bucket": pl.Bucket("id", buffer=BUCKET_BUFFER)},
    "both": {"shuffle_buffer": SHUFFLE_BUFFER, "bucket": pl.Bucket("id", buffer=BUCKET_BUFFER)},
}
RUNS: Dict[str, Dict[str, Any]] = {
    "plain": {},
    "workers": {"num_workers": 2},
    "ranks": {"ranks": pl.Ranks(rank=1, world_size=2)},
    "ranks_workers": {"ranks": pl.Ranks(rank=0, world_size=2), "num_workers": 2},
    "shuffled": {"shuffle": True},
    "drop_last": {"drop_last": True},
}


class LoggedReader(IdReader):
    """Appends every file it reads to a log file (works from worker processes too)."""

    def __init__(self, batch_size, log, **kwargs):
        super().__init__(batch_size, **kwargs)
        self.log = str(log)

    def read_file(self, path):
        with open(self.log, "a") as f:
            f.write(os.path.basename(path) + "\n")
        return super().read_file(path)

    def count(self, path):  # a cheap count that reads no rows (as the built-in readers' do)
        with open(path) as f:
            return sum(1 for line in f if line.strip())


class LoggedCollator(ListCollator):
    """Marks in the log when it collates a batch: what was read before the first mark was read
    before the first batch was made (the consumer takes it a little later, the pipeline going on)."""

    def __init__(self, log):
        self.log = str(log)

    def collate_batch(self, features):
        with open(self.log, "a") as f:
            f.write(f"{COLLATED}\n")
        return super().collate_batch(features)


def _read_before_first_batch(log) -> List[str]:
    lines = log.read_text().splitlines()
    return lines[:lines.index(COLLATED)]


def _file_of(sample: int) -> str:
    return f"part-{sample // SIZE:04d}.txt"


def _behind(buffers: Dict[str, Any]) -> int:
    """The most samples before the position that a resumed iteration reads (the README's bound):
    those a shuffle buffer's samples can have come from, and the chain of bucket windows that holds it."""
    return 3 * buffers.get("shuffle_buffer", 0) + 4 * _bucket_buffer(buffers)


def _reach(buffers: Dict[str, Any]) -> int:
    """The most samples that a resumed iteration reads before its first batch (the README's bound):
    those, and what the buffers take in before they let out the first batch."""
    return 4 * buffers.get("shuffle_buffer", 0) + 5 * _bucket_buffer(buffers) + BATCH


def _next_group(buffers: Dict[str, Any]) -> int:
    """The most samples the pipeline takes in for its second group (2 batches) while the first is made:
    the next bucket window, if the first batch was a window's last."""
    return _bucket_buffer(buffers) + 2 * BATCH


def _bucket_buffer(buffers: Dict[str, Any]) -> int:
    return buffers["bucket"].buffer if "bucket" in buffers else 0


def _spanned(samples: int) -> int:
    """The most files of ``SIZE`` samples that ``samples`` consecutive samples can touch, plus the one
    the position falls in."""
    return -(-samples // SIZE) + 1


def _make(folder, log, **kwargs) -> pl.DataLoader:
    return pl.DataLoader(LoggedReader(BATCH, log, shuffle=True, random_seed=5), pl.IdentityDataset(),
                         LoggedCollator(log), str(folder), prefetch_files=PREFETCH, **kwargs)


def _resume(tmp_path, kwargs: Dict[str, Any], where: float) -> Tuple[List, List, List, Set[str], pl.DataLoader]:
    """The uninterrupted run, the batches before and after a state taken at ``where`` of it, the
    files the resumed iteration read before its first batch, and the resumed loader."""
    full_loader = _make(tmp_path / "data", tmp_path / "full.log", **kwargs)
    full = take(full_loader, iter(full_loader), len(full_loader))
    k = max(1, int(where * len(full)))
    loader = _make(tmp_path / "data", tmp_path / "first.log", **kwargs)
    it = iter(loader)
    head = take(loader, it, k)
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()

    resumed = _make(tmp_path / "data", tmp_path / "resumed.log", **kwargs)
    resumed.load_state_dict(state)
    it = iter(resumed)
    tail = take(resumed, it, 1)
    tail += [(resumed.epoch, list(batch["id"])) for batch in it]
    before_first = set(_read_before_first_batch(tmp_path / "resumed.log"))
    return full, head, tail, before_first, resumed


@pytest.mark.parametrize("where", [0.02, 0.5, 0.97])
@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("buffers", list(BUFFERS))
def test_a_resume_reads_the_files_under_its_position_and_its_buffers_state_wherever_it_is(tmp_path, buffers, run,
                                                                                         where):
    write_chunks(tmp_path / "data", [SIZE] * FILES)
    full, head, tail, before_first, resumed = _resume(tmp_path, {**BUFFERS[buffers], **RUNS[run]}, where)
    assert head + tail == full
    delivered = [i for _, ids in head + tail for i in ids]
    assert len(delivered) == len(set(delivered))  # exactly once
    if run in ("plain", "workers", "shuffled"):
        assert sorted(delivered) == list(range(FILES * SIZE))

    handed = {_file_of(i) for _, ids in head for i in ids}
    to_come = {_file_of(i) for _, ids in tail for i in ids}
    read_again = set((tmp_path / "resumed.log").read_text().splitlines()) & (handed - to_come)
    # of the files wholly handed out before the position (up to 79 of 80 here), only those the
    # buffers' state there can come from are read again; the stats count them, and the file under it
    behind = _spanned(_behind(BUFFERS[buffers]))
    assert len(read_again) <= behind - 1, sorted(read_again)
    assert len(read_again) <= resumed.stats["iteration"]["resume_files"] <= behind
    # before the first batch: those, the file under the position, what the buffers take in before
    # they let it out, and what the pipeline reads for the next group while the first one is made,
    # with the read-ahead
    bound = _spanned(_reach(BUFFERS[buffers]) + _next_group(BUFFERS[buffers])) + PREFETCH + 1
    assert len(before_first) <= bound, sorted(before_first)
    assert wait_no_threads() == []


@pytest.mark.parametrize("kwargs", [
    {"shuffle_buffer": 3},  # less than a batch: windows of 3, a batch cut from several
    {"shuffle_buffer": 10, "shuffle": True, "ranks": pl.Ranks(rank=1, world_size=2), "num_epoch": 2},
    {"shuffle_buffer": 9, "bucket": pl.Bucket("id", buffer=12), "ranks": pl.Ranks(rank=0, world_size=3),
     "drop_last": True},
], ids=["small_buffer", "ranks", "both_ranks_drop_last"])
def test_a_run_with_buffers_resumes_exactly_at_every_position_without_replaying_its_epoch(tmp_path, kwargs):
    write_chunks(tmp_path / "data", [7, 0, 12, 5, 9, 3, 11])

    def make():
        return pl.DataLoader(IdReader(BATCH, shuffle=True), pl.IdentityDataset(), ListCollator(),
                             str(tmp_path / "data"), **kwargs)

    full_loader = make()
    full = take(full_loader, iter(full_loader), len(full_loader))
    for k in range(1, len(full)):
        loader = make()
        head = take(loader, iter(loader), k)
        state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
        resumed = make()
        resumed.load_state_dict(state)
        assert head + [(resumed.epoch, list(b["id"])) for b in resumed] == full, f"resumed after {k} batches"
        assert resumed.stats["iteration"]["resume_batches"] == 0  # rebuilt from the windows, no epoch replayed
    assert wait_no_threads() == []


@pytest.mark.parametrize("buffer", [5, 8, 30])
def test_a_shuffle_buffer_keeps_no_sample_four_times_its_size(make_loader, buffer):
    """A sample leaves fewer than ``shuffle_buffer`` places before where it came (the buffer holds
    that many) and fewer than 4 x ``shuffle_buffer`` after (the stay a resume rebuilds the state from);
    every sample leaves once, in another order every epoch."""
    loader = make_loader([130, 60, 210, 90, 110] * 4, batch_size=BATCH, shuffle_buffer=buffer, num_epoch=2)
    batches = [(loader.epoch, list(b["id"])) for b in loader]
    orders = [[i for e, ids in batches if e == epoch for i in ids] for epoch in range(2)]
    for order in orders:
        assert sorted(order) == list(range(2400))
        moved = [place - sample for place, sample in enumerate(order)]
        assert -buffer < min(moved) and max(moved) < 4 * buffer, (min(moved), max(moved))
        assert max(moved) >= buffer  # it does move samples further than a window of its size would
    assert orders[0] != orders[1]
