"""Batches that are slices of a memory-mapped ``.npy`` cross from worker processes as
(file, offset, shape, dtype) and are mapped again in the loader's process (issue 30)."""
from __future__ import annotations

import gc
import json
import mmap
import os
import socket
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
from conftest import wait_no_children, wait_no_threads

import pyloader as pl
from pyloader._execution import ipc
from pyloader._npy import file_span
from pyloader.collators import NumpyCollator
from pyloader.readers import NumpyReader

pytestmark = pytest.mark.timeout(120)

ROWS, COLS, BATCH = 3000, 16, 256


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    rng = np.random.default_rng(7)
    for k in range(3):
        np.save(tmp_path / f"part-{k}.npy", rng.random((ROWS, COLS), dtype=np.float32) + k)
    return tmp_path


def mapped_files(folder: Path) -> List[str]:
    """The lines of this process's memory map that map a file of ``folder``."""
    with open("/proc/self/maps") as f:
        return [line for line in f if str(folder) in line]


def mapping_of(array: np.ndarray) -> str:
    """The path of the file that this process maps at ``array``'s first byte ('' for none)."""
    address = array.ctypes.data
    with open("/proc/self/maps") as f:
        for line in f:
            span, *rest = line.split(maxsplit=5)
            low, high = (int(x, 16) for x in span.split("-"))
            if low <= address < high:
                return rest[-1].strip() if len(rest) == 5 else ""
    return ""


def open_descriptors_to(folder: Path) -> List[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            out.append(target)
    return out


def loader(folder: Path, num_workers: int, dataset: Any = None, mmap: bool = True, **kwargs: Any) -> pl.DataLoader:
    return pl.DataLoader(NumpyReader(batch_size=BATCH, mmap=mmap), dataset or pl.IdentityDataset(), NumpyCollator(),
                         str(folder), num_workers=num_workers, **kwargs)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_mapped_from_a_npy_equals_the_one_read_by_copying(folder, num_workers):
    with loader(folder, num_workers, mmap=False) as copied:
        expected = [batch["x"] for batch in copied]
    with loader(folder, num_workers) as mapped:
        got = [batch["x"] for batch in mapped]
        files = {mapping_of(x) for x in got if x.flags.c_contiguous and x.base is not None}
    assert len(got) == len(expected) == -(-3 * ROWS // BATCH)
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)
    # batches within one file are views of that file, mapped in this process, wherever they were read
    assert files >= {str(folder / "part-0.npy"), str(folder / "part-1.npy")}
    got[0][0, 0] = -1.0  # copy on write: the file never changes
    assert np.load(folder / "part-0.npy")[0, 0] != -1.0


class WritesInPlace(pl.Dataset):
    """Changes its batch in place (in a worker, the map's pages turn private): those bytes are not the file's."""

    def batch_encode(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        batch["x"][:, 0] = -5.0
        return batch


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_written_in_place_arrives_as_written_not_as_the_file_holds_it(folder, num_workers):
    with loader(folder, num_workers, WritesInPlace()) as run:
        firsts = [batch["x"][:, 0] for batch in run]
    assert all((column == -5.0).all() for column in firsts)
    assert (np.load(folder / "part-0.npy")[:, 0] >= 0).all()


class Touches(pl.Dataset):
    """Changes (``how``) the file its first batch comes from, in the process that encodes it."""

    def __init__(self, path: Path, how: str) -> None:
        self.path, self.how = path, how

    def batch_encode(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        if self.path.exists():
            if self.how == "vanish":
                self.path.unlink()
            else:
                os.utime(self.path, ns=(1, 1))
        return batch


@pytest.mark.parametrize("how, error", [("vanish", FileNotFoundError), ("change", ValueError)])
def test_a_file_that_changes_or_vanishes_under_a_run_with_workers_is_a_clear_error_naming_it(folder, how, error):
    path = folder / "part-0.npy"
    for other in ("part-1.npy", "part-2.npy"):
        (folder / other).unlink()
    with loader(folder, 2, Touches(path, how)) as run:
        with pytest.raises(Exception) as info:
            list(run)
    chain, cause = [], info.value
    while cause is not None:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    found = [e for e in chain if isinstance(e, error) and f"file {str(path)!r}" in str(e)]
    assert found, [f"{type(e).__name__}: {e}" for e in chain]
    assert ("vanished while it was read" if how == "vanish" else "changed while it was read") in str(found[0])
    assert wait_no_threads() == [] and wait_no_children() == []


@pytest.mark.parametrize("num_workers", [0, 2])
def test_nothing_stays_mapped_or_open_after_a_run_of_mapped_batches(folder, num_workers):
    with loader(folder, num_workers, num_epoch=2) as run:
        total = 0
        for batch in run:
            total += len(batch["x"])
            held = batch
        assert mapped_files(folder)  # the last batch still maps its file
    assert total == 2 * 3 * ROWS
    del batch, held
    gc.collect()
    assert mapped_files(folder) == [] and open_descriptors_to(folder) == []
    assert wait_no_threads() == [] and wait_no_children() == []


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_run_of_mapped_batches_resumes_exactly(folder, num_workers):
    def run(state: Any = None, stop: int = -1) -> Any:
        with loader(folder, num_workers, shuffle=True, random_seed=3) as it:
            if state is not None:
                it.load_state_dict(state)
            out = []
            for batch in it:
                out.append(batch["x"][:, 0].copy())
                if len(out) == stop:
                    return out, json.loads(json.dumps(it.state_dict()))
            return out, None

    whole, _ = run()
    head, state = run(stop=7)
    tail, _ = run(state)
    assert len(head + tail) == len(whole)
    for a, b in zip(head + tail, whole):
        np.testing.assert_array_equal(a, b)


def test_an_array_crosses_as_a_span_of_its_file_only_while_it_holds_the_files_bytes(folder):
    reader = NumpyReader(piece_size=1000)
    piece = next(reader.iter_file(str(folder / "part-1.npy")))["x"]
    span = file_span(piece[10:20])
    assert span is not None and span.path == str(folder / "part-1.npy")
    assert span.offset == 128 + 10 * COLS * 4  # a version 1.0 header of 128 bytes
    assert file_span(np.array(piece[10:20])) is None  # a copy
    piece[500, 3] = 0.0  # written: that page is private now
    assert file_span(piece[500:501]) is None and file_span(piece[:10]) is not None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        ipc.send(ours, {"x": piece[10:400]}, tag=1)
        _, _, got = ipc.recv(theirs)
    assert mapping_of(got["x"]) == str(folder / "part-1.npy") and got["x"].ctypes.data != piece[10:].ctypes.data
    np.testing.assert_array_equal(got["x"], piece[10:400])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_columns_of_a_mapped_arrow_file_arrive_equal_and_mapped_from_the_file(tmp_path, num_workers):
    import pyarrow as pa

    from pyloader.readers import ParquetReader

    rng = np.random.default_rng(1)
    values = rng.random((4000, 8), dtype=np.float32)
    table = pa.table({"id": np.arange(4000), "v": pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), 8)})
    path = tmp_path / "t.arrow"
    with pa.ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=1000)
    with pl.DataLoader(ParquetReader(batch_size=250), pl.IdentityDataset(), NumpyCollator(), str(path),
                       num_workers=num_workers) as run:
        batches = [(batch["id"], batch["v"]) for batch in run]
        files = [mapping_of(v) for _, v in batches]
    np.testing.assert_array_equal(np.concatenate([i for i, _ in batches]), np.arange(4000))
    np.testing.assert_array_equal(np.concatenate([v for _, v in batches]), values)
    if num_workers:  # every batch crosses as a span of the file
        assert files.count(str(path)) == len(batches) == 16  # even those run after the file was closed there
        assert not batches[0][1].flags.writeable  # read-only, as Arrow's columns are here


def resident_bytes(array: np.ndarray) -> int:
    """The bytes of the mapping under ``array`` that are in this process's page tables (``Rss`` in smaps)."""
    address, mapping = array.ctypes.data, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(x, 16) for x in head.split("-"))
                mapping = low <= address < high
            elif mapping and head == "Rss:":
                return int(line.split()[1]) * 1024
    raise AssertionError("no mapping under the array")


def kernel_populates() -> bool:
    """Whether this kernel has ``MADV_POPULATE_READ`` (Linux 5.14), asked of it directly."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    memory = np.zeros(2 * mmap.PAGESIZE, dtype=np.uint8)
    start = -memory.ctypes.data % mmap.PAGESIZE + memory.ctypes.data
    return libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(mmap.PAGESIZE), 22) == 0


@pytest.mark.parametrize("limit, populated", [(None, True), (4096, False)])
def test_a_mapped_piece_is_in_the_page_tables_once_read_unless_it_is_larger_than_the_limit(
        tmp_path, monkeypatch, limit, populated):
    """The consumer then takes no page fault on it; a piece over ``POPULATE_MAX``, or any piece where the
    kernel lacks ``MADV_POPULATE_READ``, is left to fault in. Only the piece is populated: the rest of the
    file (three times its size) is not (the kernel may map a few pages more)."""
    from pyloader import _npy

    if limit is not None:
        monkeypatch.setattr(_npy, "POPULATE_MAX", limit)
    populated = populated and kernel_populates()
    path = tmp_path / "big.npy"
    np.save(path, np.arange(256 * 1024, dtype=np.float32).reshape(-1, 64))  # 1 MiB, in the page cache
    piece = next(NumpyReader(piece_size=1024).iter_file(str(path)))["x"]  # the first quarter of the file
    assert piece.nbytes == 1024 * 256
    resident = resident_bytes(piece)
    assert (piece.nbytes <= resident < 4 * piece.nbytes) if populated else resident < piece.nbytes // 4, resident
    np.testing.assert_array_equal(piece[:, 0], np.arange(0, 1024 * 64, 64, dtype=np.float32))  # faults them in
