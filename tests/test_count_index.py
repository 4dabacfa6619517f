"""The index of sample counts (``_storage.count_index``, ``_counts``): used where it still matches the data,
counted again where it does not, never used for another reader, written safely, and giving the same run."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
from conftest import ListCollator

import pyloader as pl
from pyloader._cli import main as cli
from pyloader._storage import count_index as ix
from pyloader._storage.cache import DiskCache
from pyloader._storage.latency import LatencyFileSystem
from pyloader.readers import JsonLinesReader, TextLinesReader

pytestmark = pytest.mark.timeout(120)
SIZES = [5, 7, 3, 8, 6, 4, 9, 2]


def write_jsonl(folder: Path, sizes=SIZES) -> List[str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths, next_id = [], 0
    for k, n in enumerate(sizes):
        path = folder / f"part-{k:03d}.jsonl"
        path.write_text("".join(json.dumps({"id": next_id + j}) + "\n" for j in range(n)))
        next_id += n
        paths.append(str(path))
    return paths


def make_index(data: Any) -> None:
    assert cli(["index", str(data), "--reader", "jsonl"], out=lambda line: None) == 0


def loader_of(data: Any, reader: Any = None, **kwargs: Any) -> pl.DataLoader:
    kwargs.setdefault("num_workers", 0)
    return pl.DataLoader(reader or JsonLinesReader(batch_size=3), pl.IdentityDataset(), ListCollator(), data,
                         **kwargs)


def ids(batches: List[Dict[str, Any]]) -> List[List[int]]:
    return [list(b["id"]) for b in batches]


class OpenedFS(LatencyFileSystem):
    """A memory filesystem recording the files opened or fetched (the count index aside), and the most at once."""

    opened: List[str] = []
    open_now = 0
    most_open = 0

    def _note(self, path: str) -> None:
        if not path.endswith(ix.INDEX_NAME):
            cls = type(self)
            with cls._lock:
                cls.opened.append(path.rsplit("/", 1)[-1])
                cls.open_now += 1
                cls.most_open = max(cls.most_open, cls.open_now)
            time.sleep(cls.latency)
            with cls._lock:
                cls.open_now -= 1

    def cat_file(self, path: str, start: Any = None, end: Any = None, **kwargs: Any) -> bytes:
        self._note(path)
        return super(LatencyFileSystem, self).cat_file(path, start, end, **kwargs)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "r" in mode:
            self._note(path)
        return super(LatencyFileSystem, self)._open(path, mode, **kwargs)


def remote_data(protocol: str, tmp_path: Path, latency: float = 0.0) -> Any:
    """``protocol://data``: the JSON-lines files of ``SIZES`` on an ``OpenedFS``; its class."""
    fs_cls = OpenedFS.register(protocol, latency)
    fs_cls.opened, fs_cls.open_now, fs_cls.most_open = [], 0, 0
    fs = fs_cls()
    for path in write_jsonl(tmp_path / "src"):
        fs.pipe_file(f"/data/{os.path.basename(path)}", Path(path).read_bytes())
    return fs_cls


# -- the index is used ---------------------------------------------------------------------
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_rank_with_an_index_opens_only_the_files_it_reads(tmp_path, num_workers):
    fs = remote_data(f"h33open{num_workers}", tmp_path)
    data = f"h33open{num_workers}://data"
    make_index(data)
    fs.opened.clear()
    with loader_of(data, ranks=pl.Ranks(rank=0, world_size=4), num_workers=num_workers) as loader:
        got = list(loader)
    stats = loader.stats["counting"]
    assert (stats["counted"], stats["indexed"]) == (0, len(SIZES))
    starts = [sum(SIZES[:k]) for k in range(len(SIZES))]  # rank 0 of 4 reads samples [0, 11): equal shares
    read = {f"part-{k:03d}.jsonl" for k in range(len(SIZES)) if starts[k] < sum(SIZES) // 4}
    assert len(read) == 2
    assert set(fs.opened) <= read  # never a file of another rank's share: nothing was counted
    fs.opened.clear()
    # other settings: the index is not this reader's, every file is counted
    with loader_of(data, ranks=pl.Ranks(rank=0, world_size=4), num_workers=num_workers,
                   reader=JsonLinesReader(3, fields=["id"])) as unindexed:
        assert ids(list(unindexed)) == ids(got)
    assert set(fs.opened) >= {f"part-{k:03d}.jsonl" for k in range(len(SIZES))}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_same_batches_length_and_resume_with_and_without_the_index(tmp_path, num_workers):
    write_jsonl(tmp_path / "plain")
    write_jsonl(tmp_path / "indexed")
    make_index(tmp_path / "indexed")
    settings = dict(shuffle=True, num_epoch=2, num_workers=num_workers)
    for rank in range(3):
        runs = {}
        for name in ("plain", "indexed"):
            with loader_of(str(tmp_path / name), ranks=pl.Ranks(rank=rank, world_size=3), **settings) as loader:
                length = len(loader)
                batches = ids(list(loader))
                assert length == len(batches)
            with loader_of(str(tmp_path / name), ranks=pl.Ranks(rank=rank, world_size=3), **settings) as loader:
                it = iter(loader)
                first = [next(it) for _ in range(3)]
                state = loader.state_dict()
            with loader_of(str(tmp_path / name), ranks=pl.Ranks(rank=rank, world_size=3), **settings) as resumed:
                resumed.load_state_dict(state)
                rest = ids(list(resumed))
            assert ids(first) + rest == batches
            runs[name] = (length, batches, loader.stats["counting"]["indexed"])
        assert runs["plain"][:2] == runs["indexed"][:2]
        assert (runs["plain"][2], runs["indexed"][2]) == (0, len(SIZES))


def test_a_file_changed_since_the_index_is_counted_again_and_named(tmp_path, caplog):
    paths = write_jsonl(tmp_path)
    make_index(tmp_path)
    with open(paths[2], "a") as f:
        f.write(json.dumps({"id": 1000}) + "\n")
    with caplog.at_level(logging.WARNING, logger="pyloader"), loader_of(
            str(tmp_path), ranks=pl.Ranks(rank=1, world_size=2)) as loader:
        length = len(loader)
    stats = loader.stats["counting"]
    assert (stats["counted"], stats["indexed"], stats["stale"]) == (1, len(SIZES) - 1, 1)
    assert paths[2] in caplog.text and "no longer matches 1 files" in caplog.text
    with loader_of(str(tmp_path), ranks=pl.Ranks(rank=1, world_size=2),
                   reader=JsonLinesReader(3, fields=["id"])) as unindexed:
        assert length == len(unindexed)
    cli_lines: List[str] = []
    assert cli(["index", str(tmp_path), "--reader", "jsonl"], out=cli_lines.append) == 0
    assert any("counted again" in line and paths[2] in line for line in cli_lines)
    assert "1 counted" in cli_lines[0]


def test_a_file_gone_since_it_was_listed_is_an_error_naming_it(tmp_path):
    paths = write_jsonl(tmp_path)
    make_index(tmp_path)
    loader = loader_of(paths, ranks=pl.Ranks(rank=0, world_size=2))
    os.unlink(paths[5])
    with pytest.raises(pl.PipelineError, match="part-005") as raised, loader:
        list(loader)
    assert isinstance(raised.value, FileNotFoundError)


# -- the index is not used where it is not this reader's ---------------------------------
def test_an_index_of_another_reader_or_other_settings_is_not_used(tmp_path, caplog):
    write_jsonl(tmp_path)
    make_index(tmp_path)
    for reader in (JsonLinesReader(3, fields=["id"]), TextLinesReader(3)):
        with caplog.at_level(logging.INFO, logger="pyloader"), loader_of(str(tmp_path), reader=reader) as loader:
            len(loader)
        assert (loader.stats["counting"]["counted"], loader.stats["counting"]["indexed"]) == (len(SIZES), 0)
        assert "was made for" in caplog.text
    with loader_of(str(tmp_path), reader=JsonLinesReader(batch_size=5, shuffle=True, random_seed=3)) as loader:
        len(loader)  # batch size, shuffle and seed change no count: the index is this reader's
    assert loader.stats["counting"]["indexed"] == len(SIZES)


def test_a_damaged_index_is_not_used_and_is_named(tmp_path, caplog):
    write_jsonl(tmp_path)
    index = tmp_path / ix.INDEX_NAME
    for damaged in ("{not json", json.dumps({"format": 1, "key": {}, "files": {"part-000.jsonl": {"count": -1}}})):
        index.write_text(damaged)
        with caplog.at_level(logging.WARNING, logger="pyloader"), loader_of(str(tmp_path)) as loader:
            assert len(loader) == -(-sum(SIZES) // 3)
        assert loader.stats["counting"]["counted"] == len(SIZES)
        assert str(index) in caplog.text
        caplog.clear()


# -- the index kept in cache_dir, and its writers ---------------------------------------
@pytest.mark.parametrize("num_workers", [0, 2])
def test_cache_dir_keeps_the_counts_for_every_later_loader(tmp_path, num_workers):
    write_jsonl(tmp_path / "data")
    cache = str(tmp_path / "cache")
    with loader_of(str(tmp_path / "data"), ranks=pl.Ranks(rank=0, world_size=2), storage=pl.Storage(cache_dir=cache),
                   num_workers=num_workers) as first:
        expected = ids(list(first))
    assert first.stats["counting"]["counted"] == len(SIZES)
    with loader_of(str(tmp_path / "data"), ranks=pl.Ranks(rank=0, world_size=2), storage=pl.Storage(cache_dir=cache),
                   num_workers=num_workers) as again:
        assert ids(list(again)) == expected
    assert (again.stats["counting"]["counted"], again.stats["counting"]["indexed"]) == (0, len(SIZES))
    assert not list((tmp_path / "data").glob("_*"))  # the loader never writes next to the data


def test_concurrent_writers_leave_one_valid_index(tmp_path):
    write_jsonl(tmp_path / "data")
    cache = str(tmp_path / "cache")
    errors: List[BaseException] = []
    lengths: List[int] = []

    def rank(r: int) -> None:
        try:
            for _ in range(5):
                with loader_of(str(tmp_path / "data"), ranks=pl.Ranks(rank=r, world_size=8),
                               storage=pl.Storage(cache_dir=cache)) as loader:
                    lengths.append(len(loader))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    written = [p for p in os.listdir(cache) if p.startswith("counts-")]
    assert len(written) == 1 and written[0].endswith(".json")
    found = json.loads(Path(cache, written[0]).read_text())
    assert sorted(e["count"] for e in found["files"].values()) == sorted(SIZES)
    assert len(set(lengths)) == 1


def test_writers_racing_on_one_path_never_leave_a_torn_index(tmp_path):
    path = str(tmp_path / "counts.json")
    key = ix.count_key(JsonLinesReader())
    stop = threading.Event()
    seen: List[Any] = []

    def write(w: int) -> None:
        for k in range(30):
            ix.write_index(path, key, {f"f{w}-{k}": ix.entry((k, "v"), k)})

    def read() -> None:
        while not stop.is_set():
            if os.path.exists(path):
                seen.append(ix.read_index(path, key))

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(w,)) for w in range(6)]
    for t in writers:
        t.start()
    for t in writers:
        t.join(timeout=60)
    stop.set()
    reader.join(timeout=10)
    one_whole_index_left(path, key, seen, [f"f{w}-29" for w in range(6)])


def one_whole_index_left(path: str, key: Any, seen: List[Any], last_entries: List[str]) -> None:
    """After writers raced on ``path``: every read (``seen``) found a whole index, and the last rename
    won (a whole index holding one writer's last entry), with no temporary file left."""
    assert seen and all(s is not None for s in seen)
    final = ix.read_index(path, key)
    assert final is not None and any(name in final for name in last_entries)
    assert not [p for p in os.listdir(os.path.dirname(path)) if p.endswith(".tmp")]


_WRITER = """
import sys
from pyloader._storage import count_index as ix
from pyloader.readers import JsonLinesReader
path, w = sys.argv[1], sys.argv[2]
key = ix.count_key(JsonLinesReader())
print("ready", flush=True)
sys.stdin.readline()  # the test starts both writers at once
for k in range(150):
    ix.write_index(path, key, {f"f{w}-{k}": ix.entry((k, "v"), k)})
"""


def test_two_processes_writing_one_index_at_once_leave_a_whole_index_and_no_temporary_file(tmp_path):
    path = str(tmp_path / "counts-shared.json")
    key = ix.count_key(JsonLinesReader())
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, path, str(w)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for w in range(2)]
    try:
        assert all(p.stdout.readline().strip() == "ready" for p in procs)  # type: ignore[union-attr]
        for p in procs:
            p.stdin.write("go\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        seen: List[Any] = []
        while any(p.poll() is None for p in procs):
            if os.path.exists(path):
                seen.append(ix.read_index(path, key))
        assert [p.wait(timeout=60) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    one_whole_index_left(path, key, seen, [f"f{w}-149" for w in range(2)])


_KILLED_WRITER = """
import os, sys
from pyloader._storage import count_index as ix
from pyloader.readers import JsonLinesReader
os.replace = lambda *args: os._exit(9)  # killed after writing its temporary file, before renaming it
ix.write_index(sys.argv[1], ix.count_key(JsonLinesReader()), {"f": ix.entry((1, "v"), 1)})
"""


def test_the_temporary_index_of_a_writer_killed_before_its_rename_goes_with_the_next_cache(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    killed = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(cache / "counts-x.json")])
    assert killed.wait(timeout=60) == 9
    left = [p for p in os.listdir(cache) if p.endswith(".tmp")]
    assert len(left) == 1 and f"-{killed.pid}-" in left[0]  # its writer's tag
    DiskCache(str(cache), None)  # what the next loader with this cache_dir makes
    assert os.listdir(cache) == []


# -- counting without an index ------------------------------------------------------------
def test_counting_without_an_index_runs_many_files_at_once_and_says_how_long_it_took(tmp_path, caplog, capsys):
    fs = remote_data("h33many", tmp_path, latency=0.05)
    with caplog.at_level(logging.INFO, logger="pyloader"), \
            loader_of("h33many://data", ranks=pl.Ranks(rank=0, world_size=2), progress=True,
                      prefetch_files=2) as loader:
        list(loader)
    assert fs.most_open >= len(SIZES)  # every count at once, not prefetch_files at a time
    assert loader.stats["counting"]["counted"] == len(SIZES) and loader.stats["counting"]["seconds"] > 0
    assert "counting files" in next(r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch 0"))
    assert "pyloader: counting" in capsys.readouterr().err


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_run_closed_while_counting_leaves_no_count_behind_for_the_next(tmp_path, num_workers):
    write_jsonl(tmp_path)

    class SlowCount(JsonLinesReader):
        def count(self, path: str) -> int:
            time.sleep(0.1)
            return super().count(path)

    def make() -> pl.DataLoader:
        return loader_of(str(tmp_path), reader=SlowCount(3), ranks=pl.Ranks(rank=0, world_size=2),
                         num_workers=num_workers,
                         prefetch_files=1)

    with make() as fresh:
        expected = ids(list(fresh))
    with make() as loader:
        it = iter(loader)  # its run starts counting (SlowCount is not thread-safe: one file at a time)
        time.sleep(0.25)
        it.close()
        assert ids(list(loader)) == expected


@pytest.mark.parametrize("folder, path, name", [
    ("data", "data/a/b.jsonl", "a/b.jsonl"),
    ("data/", "data/a.jsonl", "a.jsonl"),
    ("./data", "data/a.jsonl", "a.jsonl"),
    ("data", "data/./a.jsonl", "a.jsonl"),
    ("data", "data//a.jsonl", "a.jsonl"),
    ("data/x", "data/x/../y/a.jsonl", "data/x/../y/a.jsonl"),
    ("data", "database/a.jsonl", "database/a.jsonl"),
    ("data", "other/a.jsonl", "other/a.jsonl"),
    (".", "a.jsonl", "a.jsonl"),
    ("file:///tmp/d", "file:///tmp/d/a.jsonl", "a.jsonl"),
    ("memory://d", "memory://d/sub/a.jsonl", "sub/a.jsonl"),
])
def test_a_name_in_the_index_is_the_path_below_the_folder_however_either_is_spelled(folder, path, name):
    assert ix.name_in(folder, path) == name
    if "://" not in folder:
        absolute = ix.name_in(os.path.abspath(folder), os.path.abspath(path))
        assert absolute == (name if not name.startswith(("data", "other")) else os.path.abspath(path))
