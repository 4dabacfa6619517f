"""What a process killed while writing leaves behind (issue 28): ``cache_dir``'s temporary files and
``rotation_dir``'s run folders are removed by the next run. Real processes are killed (SIGKILL) at
random points of their run, 20 times each."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from typing import List

import pytest
from conftest import ListCollator

import pyloader as pl
from pyloader.readers import TextLinesReader

pytestmark = pytest.mark.timeout(300)

KILLS = 10

_CHILD_HEAD = """
import sys
import pyloader as pl
from pyloader.readers import TextLinesReader

class Lists(pl.DataCollator):
    def collate_batch(self, features):
        return {k: list(v) for k, v in features.items()}
"""

# remote files (a slow in-memory filesystem) read in blocks, each written to cache_dir as it comes
CACHE_CHILD = _CHILD_HEAD + """
import fsspec
from pyloader.testing import LatencyFileSystem

LatencyFileSystem.register("killed", latency=0.003)
fs = fsspec.filesystem("killed")
for i in range(6):
    fs.pipe(f"/d/part-{i}.txt", b"".join(b"%07d\\n" % j for j in range(i * 20000, (i + 1) * 20000)))
loader = pl.DataLoader(TextLinesReader(512), pl.IdentityDataset(), Lists(), "killed:///d", num_workers=0,
                       cache_dir=sys.argv[1], cache_limit=int(sys.argv[2]), readahead_bytes=16384, num_epoch=50)
print("ready", flush=True)
for batch in loader:
    pass
"""

ROTATION_CHILD = _CHILD_HEAD + """
import time

class Slow(pl.IdentityDataset):
    def batch_encode(self, batch):
        time.sleep(0.002)
        return super().batch_encode(batch)

loader = pl.DataLoader(TextLinesReader(16), Slow(), Lists(), sys.argv[1], num_workers=0, num_epoch=50,
                       rotation=2, rotation_size=64, rotation_dir=sys.argv[2])
print("ready", flush=True)
for batch in loader:
    pass
"""


def kill_at_random_points(script: str, args: List[str], seed: int, after_each) -> None:
    """Run ``script`` ``KILLS`` times, each killed (SIGKILL) at a random point after it starts
    iterating; ``after_each()`` runs after every kill, the process reaped."""
    rng = random.Random(seed)
    for _ in range(KILLS):
        child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == b"ready\n"
            time.sleep(rng.uniform(0.02, 0.8))
            assert child.poll() is None, "the run ended before it was killed"
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(30)
            child.stdout.close()  # type: ignore[union-attr]
        after_each()


def test_temporary_files_of_writers_killed_while_filling_cache_dir_are_removed_by_the_next_run(tmp_path):
    cache, limit = tmp_path / "cache", 400_000
    left: List[int] = []

    def count_leftovers() -> None:
        left.append(len(list(cache.glob(".*.tmp"))))

    kill_at_random_points(CACHE_CHILD, [str(cache), str(limit)], seed=28, after_each=count_leftovers)
    print("temporary files after each kill:", left)
    assert sum(left) >= 3, f"the kills should have landed while files were written: {left}"
    pl.DataLoader(TextLinesReader(4), pl.IdentityDataset(), ListCollator(), [__file__], num_workers=0,
                  storage=pl.Storage(cache_dir=str(cache), cache_limit=limit))
    names = sorted(p.name for p in cache.iterdir())
    assert not [n for n in names if n.endswith(".tmp")], names
    assert sum(p.stat().st_size for p in cache.iterdir()) <= limit + 4096 * len(names)  # the descriptions


def test_run_folders_of_processes_killed_while_using_rotation_dir_are_removed_by_the_next_run(tmp_path):
    data, folder = tmp_path / "data", tmp_path / "rotation"
    data.mkdir()
    for i in range(4):
        (data / f"part-{i}.txt").write_text("".join(f"{j}\n" for j in range(i * 200, (i + 1) * 200)))
    left: List[int] = []

    def count_leftovers() -> None:
        left.append(len(list(folder.glob("pyloader-rotation-*"))))

    kill_at_random_points(ROTATION_CHILD, [str(data), str(folder)], seed=14, after_each=count_leftovers)
    print("run folders after each kill:", left)
    assert sum(left) >= 5, f"the kills should have landed while windows were on disk: {left}"
    loader = pl.DataLoader(TextLinesReader(16), pl.IdentityDataset(), ListCollator(), str(data), num_workers=0,
                           rotation=pl.Rotation(2, size=64, folder=str(folder)))
    assert sorted(int(x) for batch in loader for x in batch["text"]) == sorted(list(range(800)) * 2)
    assert list(folder.iterdir()) == []


def test_a_writer_is_dead_once_its_process_is_gone_and_never_when_it_cannot_be_told():
    from pyloader._storage import writers

    mine = writers.tag()
    assert not writers.dead(f".{mine}-abc.tmp")
    child = subprocess.Popen([sys.executable, "-c", "from pyloader._storage import writers; print(writers.tag())"],
                             stdout=subprocess.PIPE)
    theirs = child.communicate(timeout=60)[0].decode().strip()
    assert theirs.split("-")[1] == str(child.pid)
    assert writers.dead(f".{theirs}-abc.tmp")  # it has exited
    pid = os.getpid()
    assert writers.dead(f"pyloader-rotation-{mine.rsplit('-', 1)[0]}-1-x")  # this pid, another start time
    for name in (".tmp", "pyloader-rotation-abc", f".pywffffffffffff-{pid}-0-a.tmp", f".pywx-{child.pid}-0-a.tmp"):
        assert not writers.dead(name)  # no tag, or another machine's: only age tells
