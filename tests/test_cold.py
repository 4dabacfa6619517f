"""Cold local storage (issue 23): local files are read ahead (aiofiles) within a byte budget and
served to readers through ``open_file``; nothing is read twice; errors met while reading ahead
reach the consumer in order, naming the file."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import List

import numpy as np
import pytest
from conftest import ListCollator, wait_no_threads

import pyloader as pl
from pyloader.collators import NumpyCollator
from pyloader.readers import NumpyReader

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[1]


def bytes_read() -> int:
    """Bytes this process has read through read() calls so far (page cache hits included; pages
    of a memory-mapped file are not read() calls)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def write_jsonl(folder: Path, n_files: int, rows: int, pad: int = 100) -> List[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n_files):
        path = folder / f"part-{i:03d}.jsonl"
        path.write_text("".join(json.dumps({"id": i * rows + j, "pad": "x" * pad}) + "\n" for j in range(rows)))
        paths.append(path)
    return paths


class ServedReader(pl.DataReader):
    """One JSON object per line, opened through ``open_file``; says for each sample whether its
    file came from the read-ahead (an object with no file name) rather than from the disk."""

    thread_safe = True

    def read_file(self, path):
        with pl.open_file(path, "rt", encoding="utf-8") as f:
            served = getattr(f.buffer if hasattr(f, "buffer") else f, "name", None) != path
            ids = [json.loads(line)["id"] for line in f]
        return {"id": ids, "served": [served] * len(ids)}, len(ids)


def served_loader(folder: Path, **kwargs) -> pl.DataLoader:
    return pl.DataLoader(ServedReader(8), pl.IdentityDataset(), ListCollator(), str(folder), **kwargs)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_local_files_are_read_ahead_and_served_to_the_reader_through_open_file(tmp_path, num_workers):
    write_jsonl(tmp_path / "data", 6, 50)
    batches = [b for b in served_loader(tmp_path / "data", num_workers=num_workers)]
    assert sorted(i for b in batches for i in b["id"]) == list(range(300))
    # with workers, each worker reads its files itself: sending their bytes would cost more
    assert [flag for b in batches for flag in b["served"]] == [num_workers == 0] * 300


def test_nothing_is_read_twice(tmp_path):
    paths = write_jsonl(tmp_path / "data", 8, 2000)  # 8 files of about 230 KB
    total = sum(p.stat().st_size for p in paths)
    [_ for _ in served_loader(tmp_path / "data")]  # imports and first-use costs out of the way
    before = bytes_read()
    batches = [b for b in served_loader(tmp_path / "data")]  # not list(): it would count the samples first
    read = bytes_read() - before
    assert sorted(i for b in batches for i in b["id"]) == list(range(16000))
    assert total <= read < 1.2 * total  # once, not once by the read-ahead and again by the reader


def test_a_reader_that_opens_its_files_itself_stops_the_local_readahead(tmp_path):
    paths = write_jsonl(tmp_path / "data", 24, 1000)
    total = sum(p.stat().st_size for p in paths)

    class PlainReader(pl.DataReader):
        def read_file(self, path):
            with open(path) as f:
                ids = [json.loads(line)["id"] for line in f]
            return {"id": ids}, len(ids)

    def run() -> list:
        loader = pl.DataLoader(PlainReader(8), pl.IdentityDataset(), ListCollator(), str(tmp_path / "data"))
        return sorted(i for b in loader for i in b["id"])

    run()
    before = bytes_read()
    assert run() == list(range(24000))
    assert bytes_read() - before < 1.5 * total  # only the files read ahead before the first one ended: twice


def test_readahead_bytes_zero_turns_the_readahead_off(tmp_path):
    write_jsonl(tmp_path / "data", 3, 10)
    batches = list(served_loader(tmp_path / "data", storage=pl.Storage(readahead_bytes=0)))
    assert sorted(i for b in batches for i in b["id"]) == list(range(30))
    assert not any(flag for b in batches for flag in b["served"])


@pytest.mark.timeout(60)
def test_the_byte_budget_holds_with_a_file_larger_than_the_budget(tmp_path):
    budget = 64 * 2**10
    data = tmp_path / "data"
    data.mkdir()
    big = os.urandom(2 * 2**20)
    (data / "a-big.bin").write_bytes(big)
    (data / "b-small.bin").write_bytes(b"s" * 1000)
    seen = {}

    class BlockReader(pl.DataReader):
        def read_file(self, path):
            start = bytes_read()
            got, ahead = [], 0
            with pl.open_file(path, "rb") as f:
                if path.endswith("a-big.bin"):
                    deadline = time.monotonic() + 20  # let the read-ahead fill its budget
                    while bytes_read() - start < budget // 2 and time.monotonic() < deadline:
                        time.sleep(0.01)
                while True:
                    chunk = f.read(4096)
                    if not chunk:
                        break
                    got.append(chunk)
                    ahead = max(ahead, bytes_read() - start - 4096 * len(got))
            seen[os.path.basename(path)] = ahead
            return {"data": [b"".join(got)]}, 1

    # the reader reports into this process's ``seen``: it runs here
    loader = pl.DataLoader(BlockReader(1), pl.IdentityDataset(), ListCollator(), str(data),
                           storage=pl.Storage(readahead_bytes=budget),
                           num_workers=0)
    assert [b["data"][0] for b in loader] == [big, b"s" * 1000]
    # read ahead: at least half the budget before the parser took any, and never more than the
    # budget plus one 16 KiB block over it and the 64 KiB buffer of the file object
    assert budget // 2 <= seen["a-big.bin"] <= budget + 16 * 2**10 + 64 * 2**10 + 8 * 2**10


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_file_deleted_after_listing_reaches_the_consumer_in_order_naming_it(tmp_path, num_workers):
    paths = write_jsonl(tmp_path / "data", 4, 8)
    loader = served_loader(tmp_path / "data", num_workers=num_workers)
    paths[2].unlink()
    got = []
    with pytest.raises(pl.PipelineError, match="part-002.jsonl") as info:
        for batch in loader:
            got.append(batch)
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value.__cause__, FileNotFoundError)
    assert [i for b in got for i in b["id"]] == list(range(16))  # every sample before it, in order
    assert [flag for b in got for flag in b["served"]] == [num_workers == 0] * 16
    paths[2].touch()
    skipping = served_loader(tmp_path / "data", num_workers=num_workers, on_error="skip")
    paths[2].unlink()
    assert [i for b in skipping for i in b["id"]] == list(range(16)) + list(range(24, 32))
    assert skipping.stats["skipped_files"] == 1
    assert wait_no_threads() == []


_PERMISSION_CHECK = textwrap.dedent("""
    import json, os, sys, tempfile
    import pyloader as pl
    sys.path.insert(0, {tests!r})
    from test_cold import served_loader, write_jsonl
    from pathlib import Path
    import multiprocessing.popen_fork, multiprocessing.popen_forkserver  # root's Python may be unreadable to nobody
    if os.geteuid() == 0:  # root reads anything: go on as nobody, everything imported
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    folder = Path(tempfile.mkdtemp())
    try:
        paths = write_jsonl(folder / "data", 3, 8)
        loader = served_loader(folder / "data")
        paths[1].chmod(0)
        got = []
        try:
            for batch in loader:
                got.extend(batch["id"])
        except pl.PipelineError as exc:
            print(json.dumps({{"got": got, "error": str(exc), "permission": isinstance(exc, PermissionError),
                              "cause": type(exc.__cause__).__name__}}))
    finally:
        for p in (folder / "data").iterdir():
            p.chmod(0o600)
            p.unlink()
        (folder / "data").rmdir()
        folder.rmdir()
""")


def test_a_file_that_may_not_be_read_reaches_the_consumer_in_order_naming_it():
    """In a process where permissions hold: this user's, or ``nobody``'s when this is root."""
    out = subprocess.run([sys.executable, "-c", _PERMISSION_CHECK.format(tests=str(ROOT / "tests"))],
                         capture_output=True, text=True, timeout=100, cwd="/tmp",
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["got"] == list(range(8))
    assert "part-001.jsonl" in result["error"] and result["permission"] and result["cause"] == "PermissionError"


def test_a_memory_mapped_npy_keeps_its_zero_copy_path(tmp_path):
    (tmp_path / "data").mkdir()
    rows = np.arange(400_000, dtype=np.int64)  # 3.2 MB
    np.save(tmp_path / "data" / "rows.npy", rows)

    def run() -> int:
        loader = pl.DataLoader(NumpyReader(4096, key="id", mmap=True), pl.IdentityDataset(), NumpyCollator(),
                               str(tmp_path / "data"))
        return sum(int(b["id"].sum()) for b in loader)

    run()
    before = bytes_read()
    assert run() == int(rows.sum())
    assert bytes_read() - before < 2**20  # mapped, not read: only the header went through read()


class SizeCollator(pl.DataCollator):
    """A batch's number of rows only: what crosses from a worker is not what is measured."""

    def collate_batch(self, features):
        return {"n": len(next(iter(features.values())))}


def worker_bytes_read() -> int:
    """Bytes the live child processes (the forked workers) have read through read() calls."""
    import psutil

    total = 0
    for child in psutil.Process().children():
        with open(f"/proc/{child.pid}/io") as f:
            total += int(next(line for line in f if line.startswith("rchar:")).split()[1])
    return total


@pytest.mark.parametrize("num_workers", [0, 2])
def test_each_local_file_is_read_once_by_the_process_that_parses_it(tmp_path, num_workers):
    from pyloader.readers import TextLinesReader

    paths = write_jsonl(tmp_path / "data", 6, 4000)  # 6 files of about 480 KB
    total = sum(p.stat().st_size for p in paths)
    # workers kept: Linux adds the reads of a child it reaps to its parent's, so they are measured while they live
    loader = pl.DataLoader(TextLinesReader(64), pl.IdentityDataset(), SizeCollator(), str(tmp_path / "data"),
                           num_workers=num_workers, start_method="fork" if num_workers else None,
                           persistent_workers=bool(num_workers))
    before = bytes_read()
    assert sum(batch["n"] for batch in loader) == 24000
    here, there = bytes_read() - before, worker_bytes_read()
    loader.close()
    if num_workers:
        assert here < 0.05 * total and total <= there < 1.2 * total  # the workers read them, once
    else:
        assert total <= here < 1.2 * total


def test_a_mixed_loader_keeps_the_zero_copy_path_of_memory_mapped_npy(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        np.save(tmp_path / name / "rows.npy", np.arange(200_000, dtype=np.int64))  # 1.6 MB each

    def run() -> int:
        sources = [pl.Source(str(tmp_path / name)) for name in ("a", "b")]
        loader = pl.DataLoader(NumpyReader(4096, key="id", mmap=True), pl.IdentityDataset(), NumpyCollator(),
                               sources, num_workers=0)
        return sum(len(b["id"]) for b in loader)

    n = run()
    before = bytes_read()
    assert run() == n > 300_000
    assert bytes_read() - before < 2**20  # mapped, not read: only the headers went through read()
