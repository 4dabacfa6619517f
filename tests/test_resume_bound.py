"""What a resumed iteration reads before its first batch: the file under the position, the files the
buffers' windows that hold it span (``shuffle_buffer``, ``bucket_buffer``), and the read-ahead — the
same near the start of an epoch as near its end."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Set, Tuple

import pytest
from conftest import IdReader, ListCollator, wait_no_threads, write_chunks

import pyloader as pl

pytestmark = pytest.mark.timeout(120)

FILES, SIZE, BATCH, PREFETCH = 80, 10, 4, 2  # 800 samples: 200 batches an epoch, 100 per rank
SHUFFLE_BUFFER, BUCKET_BUFFER = 30, 32
COLLATED = "collated"

BUFFERS: Dict[str, Dict[str, Any]] = {
    "none": {},
    "shuffle_buffer": {"shuffle_buffer": SHUFFLE_BUFFER},
    "bucket_by": {"bucket_by": "id", "bucket_buffer": BUCKET_BUFFER},
    "both": {"shuffle_buffer": SHUFFLE_BUFFER, "bucket_by": "id", "bucket_buffer": BUCKET_BUFFER},
}
RUNS: Dict[str, Dict[str, Any]] = {
    "plain": {},
    "workers": {"num_workers": 2},
    "ranks": {"rank": 1, "world_size": 2},
    "ranks_workers": {"rank": 0, "world_size": 2, "num_workers": 2},
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


def _reach(buffers: Dict[str, Any]) -> int:
    """The most samples that the buffers' windows holding a position span (the README's bound)."""
    shuffle, bucket = buffers.get("shuffle_buffer", 0), buffers.get("bucket_buffer", 0)
    return bucket + 2 * shuffle if shuffle and bucket else shuffle or bucket


def _spanned(samples: int) -> int:
    """The most files of ``SIZE`` samples that ``samples`` consecutive samples can touch, plus the one
    the position falls in."""
    return -(-samples // SIZE) + 1


def _make(folder, log, **kwargs) -> pl.DataLoader:
    return pl.DataLoader(LoggedReader(BATCH, log, shuffle=True, random_seed=5), pl.IdentityDataset(),
                         LoggedCollator(log), str(folder), prefetch_files=PREFETCH, **kwargs)


def _take(loader, it, k: int) -> List[Tuple[int, List[int]]]:
    got = []
    for _ in range(k):
        ids = list(next(it)["id"])
        got.append((loader.epoch, ids))
    return got


def _resume(tmp_path, kwargs: Dict[str, Any], where: float) -> Tuple[List, List, List, Set[str], pl.DataLoader]:
    """The uninterrupted run, the batches before and after a state taken at ``where`` of it, the
    files the resumed iteration read before its first batch, and the resumed loader."""
    full_loader = _make(tmp_path / "data", tmp_path / "full.log", **kwargs)
    full = _take(full_loader, iter(full_loader), len(full_loader))
    k = max(1, int(where * len(full)))
    loader = _make(tmp_path / "data", tmp_path / "first.log", **kwargs)
    it = iter(loader)
    head = _take(loader, it, k)
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()

    resumed = _make(tmp_path / "data", tmp_path / "resumed.log", **kwargs)
    resumed.load_state_dict(state)
    it = iter(resumed)
    tail = _take(resumed, it, 1)
    tail += [(resumed.epoch, list(batch["id"])) for batch in it]
    before_first = set(_read_before_first_batch(tmp_path / "resumed.log"))
    return full, head, tail, before_first, resumed


@pytest.mark.parametrize("where", [0.02, 0.5, 0.97])
@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("buffers", list(BUFFERS))
def test_a_resume_reads_the_files_under_its_position_and_its_windows_wherever_it_is(tmp_path, buffers, run,
                                                                                   where):
    write_chunks(tmp_path / "data", [SIZE] * FILES)
    full, head, tail, before_first, resumed = _resume(tmp_path, {**BUFFERS[buffers], **RUNS[run]}, where)
    assert head + tail == full
    first_epoch = [i for e, ids in full if e == full[0][0] for i in ids]
    assert len(first_epoch) == len(set(first_epoch))  # exactly once

    handed = {_file_of(i) for _, ids in head for i in ids}
    to_come = {_file_of(i) for _, ids in tail for i in ids}
    read_again = set((tmp_path / "resumed.log").read_text().splitlines()) & (handed - to_come)
    # of the files wholly handed out before the position (up to 79 of 80 here), only those the
    # windows holding it span are read again; the stats count them
    spanned = _spanned(_reach(BUFFERS[buffers]))
    assert len(read_again) <= resumed.stats["iteration"]["resume_files"] <= spanned, sorted(read_again)
    # before the first batch: those windows, the file under the position, the read-ahead, and what
    # the pipeline reads for the next group while the first one is made (the next window at most)
    assert len(before_first) <= 2 * spanned + PREFETCH, sorted(before_first)
    assert wait_no_threads() == []
