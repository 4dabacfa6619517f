"""Cached epochs (``cache_encoded``): encoded batches written to disk every ``update_every`` epochs
and read back by the epochs between, instead of reading the files and encoding them again.

Calls are counted in files (appended by every process, workers included), so a count holds
with ``num_workers=2``; each test makes its data and its cache folder in ``tmp_path``.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest
from conftest import spread_positions, wait_no_threads, write_chunks

import pyloader as pl
from pyloader._storage.codec import NotCacheable
from pyloader._storage.epoch_cache import EpochStore

pytestmark = pytest.mark.timeout(180)
SIZES = [9, 4, 15, 2, 7, 0, 11]  # 48 samples, ids 0..47, one empty file
N_IDS = sum(SIZES)


def calls(log: Path) -> List[str]:
    return log.read_text().splitlines() if log.exists() else []


def note(log: Optional[str], line: str) -> None:
    if log is not None:
        with open(log, "a") as f:  # one short append per call: whole lines, from any process
            f.write(line + "\n")


class CountingReader(pl.DataReader):
    """One id per line; every ``read_file`` call is noted in ``log``."""

    def __init__(self, batch_size: int = 4, log: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(batch_size, **kwargs)
        self.log = log

    def read_file(self, path: str) -> Tuple[Dict[str, list], int]:
        note(self.log, os.path.basename(path))
        ids = [int(line) for line in open(path) if line.strip()]
        return {"id": ids}, len(ids)

    def count(self, path: str) -> int:  # len() does not count as a read
        return sum(1 for line in open(path) if line.strip())


class Encoder(pl.Dataset):
    """Ragged token lists and strings per sample; with ``augment``, a fresh random draw per call,
    the same for every sample of the batch (as a random augmentation would be)."""

    def __init__(self, log: Optional[str] = None, augment: bool = False) -> None:
        self.log = log
        self.augment = augment

    def batch_encode(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        ids = list(batch["id"])
        note(self.log, " ".join(map(str, ids)))
        out = {"id": ids, "tokens": [[i] * (i % 4) for i in ids], "text": [f"<{i}>\u00e9\x00" for i in ids]}
        if self.augment:
            draw = int.from_bytes(os.urandom(6), "little")
            out["aug"] = [draw] * len(ids)
        return out


class AsIs(pl.DataCollator):
    """Hands the encoded batch over as it is: what the collator got is what the test sees."""

    thread_safe = True

    def collate_batch(self, features: Dict[str, Any]) -> Dict[str, Any]:
        return dict(features)


def make(folder: Path, cache: Optional[Path], *, K: Optional[int] = 3, batch_size: int = 4,
         read_log: Optional[Path] = None, encode_log: Optional[Path] = None, augment: bool = False,
         dataset: Optional[pl.Dataset] = None, limit: Optional[int] = None, **kwargs: Any) -> pl.DataLoader:
    kwargs.setdefault("num_workers", 0)  # the tests that run workers say so
    if kwargs["num_workers"]:
        kwargs.setdefault("start_method", "fork")
    reader = CountingReader(batch_size, None if read_log is None else str(read_log))
    cache_encoded = None if cache is None else {"dir": str(cache), "update_every": K, "limit": limit}
    return pl.DataLoader(reader, dataset or Encoder(None if encode_log is None else str(encode_log), augment),
                         AsIs(), str(folder), cache_encoded=cache_encoded, **kwargs)


def epochs_of(loader: pl.DataLoader) -> Dict[int, List[Dict[str, Any]]]:
    out: Dict[int, List[Dict[str, Any]]] = {}
    for batch in loader:
        assert loader.epoch is not None
        out.setdefault(loader.epoch, []).append(batch)
    return out


def key(batch: Dict[str, Any]) -> str:
    """A batch as comparable text (its ids, tokens, texts, padding flags)."""
    flags = batch["__padding__"].tolist() if "__padding__" in batch else None
    return json.dumps([batch["id"], batch["tokens"], batch["text"], flags])


def ids(batches: List[Dict[str, Any]]) -> List[int]:
    return sorted(i for b in batches for i, pad in zip(b["id"], b.get("__padding__", [False] * len(b["id"])))
                  if not pad)


# -- a cache hit ---------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_a_cache_hit_skips_read_file_and_batch_encode(tmp_path, workers):
    write_chunks(tmp_path / "data", SIZES)
    reads, encodes = tmp_path / "reads.log", tmp_path / "encodes.log"
    loader = make(tmp_path / "data", tmp_path / "cache", K=3, num_epoch=1, read_log=reads, encode_log=encodes,
                  num_workers=workers)
    first = [key(b) for b in loader]  # epoch 0: writes the cache
    assert len(calls(reads)) == 7 and len(calls(encodes)) == len(first) == 12
    for _ in range(2):  # epochs 1 and 2 read it
        again = [key(b) for b in loader]
        assert again == first  # no shuffling: the batches in the order they were written
    assert len(calls(reads)) == 7 and len(calls(encodes)) == 12
    stats = loader.stats["cache_encoded"]
    assert stats["epochs_written"] == 1 and stats["batches_written"] == 12 and stats["bytes_written"] > 0
    assert stats["epochs_read"] == 2 and stats["batches_read"] == 24
    assert stats["files_not_read"] == 2 * len(SIZES) and stats["writes_abandoned"] == 0
    assert loader.stats["files_read"] == 7  # only epoch 0's
    [b for b in loader]  # epoch 3 starts the next block: read and encoded again
    assert len(calls(reads)) == 14 and len(calls(encodes)) == 24
    loader.close()
    assert wait_no_threads() == []


@pytest.mark.parametrize("workers", [0, 2])
def test_the_cache_is_rewritten_every_update_every_epochs(tmp_path, workers):
    write_chunks(tmp_path / "data", SIZES)
    encodes = tmp_path / "encodes.log"
    loader = make(tmp_path / "data", tmp_path / "cache", K=2, num_epoch=6, augment=True, encode_log=encodes,
                  num_workers=workers)
    draws = {e: {d for b in batches for d in b["aug"]} for e, batches in epochs_of(loader).items()}
    assert sorted(draws) == list(range(6))
    for e in range(0, 6, 2):  # a writing epoch's draws are new; the epoch after it shows the same ones
        assert draws[e + 1] == draws[e]
        assert all(not (draws[e] & draws[other]) for other in range(6) if other // 2 != e // 2)
    assert len(calls(encodes)) == 3 * 12


def test_update_every_none_writes_once_then_only_reads(tmp_path):
    write_chunks(tmp_path / "data", SIZES)
    encodes = tmp_path / "encodes.log"
    loader = make(tmp_path / "data", tmp_path / "cache", K=None, num_epoch=5, augment=True, encode_log=encodes)
    draws = [sorted({d for b in batches for d in b["aug"]}) for batches in epochs_of(loader).values()]
    assert len(draws) == 5 and all(d == draws[0] for d in draws)
    assert len(calls(encodes)) == 12


# -- what a cached epoch delivers -----------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("settings", [{}, {"shuffle": True}, {"shuffle": True, "shuffle_buffer": 5},
                                      {"drop_last": True, "shuffle": True}, {"bucket": pl.Bucket("id")}])
def test_cached_epochs_deliver_the_samples_of_uncached_ones(tmp_path, workers, settings):
    write_chunks(tmp_path / "data", SIZES)
    cached = make(tmp_path / "data", tmp_path / "cache", K=3, num_epoch=6, batch_size=5, num_workers=workers,
                  **settings)
    plain = make(tmp_path / "data", None, num_epoch=6, batch_size=5, **settings)
    got, expected = epochs_of(cached), epochs_of(plain)
    assert len(cached) == len(plain) == sum(len(b) for b in got.values())
    for e in range(6):
        writer = got[e - e % 3]
        assert len(got[e]) == len(expected[e])
        # with drop_last the samples left out are those the writing epoch left out
        assert ids(got[e]) == ids(expected[e - e % 3])
        assert ids(got[e]) == ids(expected[e]) == list(range(N_IDS)) or settings.get("drop_last")
        assert Counter(map(key, got[e])) == Counter(map(key, writer))  # the writing epoch's batches
        if e % 3 == 0:
            assert [key(b) for b in got[e]] == [key(b) for b in expected[e]]  # a writing epoch is an uncached one
        if not settings.get("drop_last"):
            assert [len(b["id"]) for b in got[e]][-1] == N_IDS % 5 or N_IDS % 5 == 0  # the short batch stays last


def test_shuffled_cached_epochs_differ_in_batch_order_and_are_deterministic(tmp_path):
    write_chunks(tmp_path / "data", SIZES)

    def orders(cache: Path, shuffle: bool) -> List[List[str]]:
        loader = make(tmp_path / "data", cache, K=4, num_epoch=4, shuffle=shuffle)
        return [[key(b) for b in batches] for batches in epochs_of(loader).values()]

    first, second = orders(tmp_path / "a", True), orders(tmp_path / "b", True)
    assert first == second  # a pure function of random_seed and the epoch
    assert len({json.dumps(order) for order in first}) == 4  # every epoch in its own order
    assert all(sorted(order) == sorted(first[0]) for order in first)
    unshuffled = orders(tmp_path / "c", False)
    assert all(order == unshuffled[0] for order in unshuffled)  # without shuffling: as written


class ManyKinds(pl.Dataset):
    """Every kind of column the cache stores: the round trip must give these values and types back."""

    thread_safe = True

    def batch_encode(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        ids = [int(i) for i in batch["id"]]
        return {
            "ids": ids,
            "ragged": [list(range(i % 5)) for i in ids],
            "nested": [[[f"w{i}"] * (i % 2), []] for i in ids],
            "text": [("\x00" * (i % 2)) + f"t\u00e9\U0001f600{i}" + ("\ud800" if i % 3 == 0 else "") for i in ids],
            "raw": [bytes([i % 256]) * (i % 3) for i in ids],
            "floats": [i / 3 if i % 7 else float("nan") for i in ids],
            "flags": [i % 2 == 0 for i in ids],
            "pairs": [(i, -i) for i in ids],
            "array": np.array([[i, i + 0.5] for i in ids], dtype=np.float32),
            "arrays": [np.arange(i % 4, dtype=np.int16).reshape(1, -1) for i in ids],
            "scalars": [np.uint8(i) for i in ids],
            "tuple": tuple(ids),
            "objects": np.array([[i] * (i % 3) for i in ids] + [None], dtype=object)[:-1],
            "big": [2 ** 62 + i for i in ids],
        }


def same(a: Any, b: Any) -> bool:
    """Equal values and equal types, all the way down (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return all(same(x, y) for x, y in zip(a.tolist(), b.tolist())) if a.dtype == object else \
            bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and a != a:
        return b != b
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a == b
    return a == b


@pytest.mark.parametrize("workers", [0, 2])
def test_ragged_and_string_columns_round_trip_exactly(tmp_path, workers):
    write_chunks(tmp_path / "data", SIZES)
    loader = make(tmp_path / "data", tmp_path / "cache", K=2, num_epoch=2, dataset=ManyKinds(), num_workers=workers)
    written, read = epochs_of(loader).values()
    assert loader.stats["cache_encoded"]["epochs_read"] == 1
    assert len(written) == len(read) == 12
    for a, b in zip(written, read):
        assert same(a, b), (a, b)


class Unstorable(pl.Dataset):
    def batch_encode(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        return {"id": list(batch["id"]), "mixed": [1 if i % 2 else 2.5 for i in batch["id"]]}


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_column_that_cannot_be_cached_is_an_error_naming_it(tmp_path, on_error):
    write_chunks(tmp_path / "data", SIZES)
    loader = make(tmp_path / "data", tmp_path / "cache", dataset=Unstorable(), on_error=on_error)
    with pytest.raises(pl.PipelineError, match="cache_encoded.*'mixed'.*several types") as info:
        list(loader)
    assert isinstance(info.value, TypeError) and isinstance(info.value.original, NotCacheable)
    assert info.value.stage == "cache_encoded" and info.value.paths  # names the batch's files
    assert glob.glob(str(tmp_path / "cache" / "*" / "*")) == []  # nothing is left in the cache
    assert wait_no_threads() == []


# -- atomic writes ---------------------------------------------------------------------------------
CRASH = """
import os, sys
sys.path[:0] = [{root!r}, {tests!r}]
import pyloader._storage.epoch_cache as cache
real = os.replace
def replace(src, dst):
    if str(dst).endswith(".json"):
        os._exit(3)  # the process dies right before the manifest would mark the cache complete
    real(src, dst)
cache.os.replace = replace
from test_cache_encoded import make
from pathlib import Path
for batch in make(Path({data!r}), Path({cache!r}), K=3, num_epoch=2):
    pass
"""


def test_a_write_that_crashed_before_its_manifest_is_never_read(tmp_path):
    write_chunks(tmp_path / "data", SIZES)
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent(CRASH.format(
        root=str(Path(pl.__file__).parent.parent), tests=str(Path(__file__).parent),
        data=str(tmp_path / "data"), cache=str(tmp_path / "cache"))))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    left = glob.glob(str(tmp_path / "cache" / "*" / "*"))
    assert left and not [p for p in left if p.endswith(".json")]  # the batches are there, no manifest
    reads, encodes = tmp_path / "reads.log", tmp_path / "encodes.log"
    loader = make(tmp_path / "data", tmp_path / "cache", K=3, read_log=reads, encode_log=encodes)
    loader.set_epoch(1)  # an epoch that would read the cache of epoch 0
    batches = list(loader)
    assert ids(batches) == list(range(N_IDS))
    assert len(calls(reads)) == 7 and len(calls(encodes)) == 12  # read from the files
    stats = loader.stats["cache_encoded"]
    assert stats["epochs_read"] == 0 and stats["epochs_written"] == 1  # the first epoch finding none writes it
    assert len(glob.glob(str(tmp_path / "cache" / "*" / "*.json"))) == 1  # the dead writer's files are gone
    assert len(glob.glob(str(tmp_path / "cache" / "*" / "*" / "*.npz"))) == 12


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_left_before_its_end_leaves_no_cache(tmp_path, workers):
    write_chunks(tmp_path / "data", [50] * 60)  # 750 batches: far more than the pipeline holds ahead
    loader = make(tmp_path / "data", tmp_path / "cache", K=3, num_epoch=1, num_workers=workers, max_queue_size=2)
    it = iter(loader)
    for _ in range(5):
        next(it)
    it.close()
    assert wait_no_threads() == []
    assert glob.glob(str(tmp_path / "cache" / "*" / "*")) == []  # staging folder removed, no manifest
    assert loader.stats["cache_encoded"]["writes_abandoned"] == 1
    assert len(ids(list(loader))) == 3000  # epoch 1 finds no cache: encodes and writes it
    assert loader.stats["cache_encoded"]["epochs_written"] == 1 and loader.stats["cache_encoded"]["epochs_read"] == 0


# -- the size limit --------------------------------------------------------------------------------
def test_an_epoch_over_the_limit_is_not_cached_and_its_block_is_encoded(tmp_path, caplog):
    write_chunks(tmp_path / "data", SIZES)
    encodes = tmp_path / "encodes.log"
    loader = make(tmp_path / "data", tmp_path / "cache", K=3, num_epoch=4, encode_log=encodes, limit=3000)
    with caplog.at_level(logging.WARNING, logger="pyloader"):
        got = epochs_of(loader)
    assert all(ids(got[e]) == list(range(N_IDS)) for e in range(4))
    assert len(calls(encodes)) == 4 * 12  # every epoch encoded from the files
    stats = loader.stats["cache_encoded"]
    # epoch 0 and epoch 3 (the next block) tried and gave up; epochs 1 and 2 did not try again
    assert stats["writes_abandoned"] == 2 and stats["epochs_written"] == 0 and stats["epochs_read"] == 0
    assert "limit=3000" in caplog.text
    assert glob.glob(str(tmp_path / "cache" / "*" / "*")) == []
    roomy = make(tmp_path / "data", tmp_path / "cache2", K=3, num_epoch=2, limit=10 ** 6)
    list(roomy)
    assert roomy.stats["cache_encoded"]["epochs_read"] == 1


def test_a_cache_folder_that_cannot_be_written_leaves_the_epochs_to_the_files(tmp_path, monkeypatch, caplog):
    write_chunks(tmp_path / "data", SIZES)

    def full_disk(self: Any, epoch: int) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(EpochStore, "writer", full_disk)
    loader = make(tmp_path / "data", tmp_path / "cache", K=2, num_epoch=3)
    with caplog.at_level(logging.WARNING, logger="pyloader"):
        got = epochs_of(loader)
    assert all(ids(got[e]) == list(range(N_IDS)) for e in range(3))
    assert loader.stats["cache_encoded"]["writes_abandoned"] == 3  # each epoch tried, none could
    assert "No space left on device" in caplog.text


# -- ranks, settings, stale caches ---------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_two_ranks_share_one_dir(tmp_path, workers):
    write_chunks(tmp_path / "data", SIZES + [1])  # 49 samples: rank 1's share of 25 pads rank 0's of 24
    reads = tmp_path / "reads.log"
    ranks = [make(tmp_path / "data", tmp_path / "cache", K=2, batch_size=5, ranks=pl.Ranks(rank=r, world_size=2),
                  shuffle=True,
                  read_log=reads, num_workers=workers) for r in range(2)]
    plain = [make(tmp_path / "data", None, batch_size=5, ranks=pl.Ranks(rank=r, world_size=2), shuffle=True,
                  num_epoch=4)
             for r in range(2)]
    expected = [epochs_of(p) for p in plain]
    got: List[Dict[int, List[Dict[str, Any]]]] = [{}, {}]
    for epoch in range(4):  # the ranks take turns, epoch by epoch, on one folder
        for r in range(2):
            got[r][epoch] = list(ranks[r])
    assert len(glob.glob(str(tmp_path / "cache" / "rank*-of2-*"))) == 2
    for epoch in range(4):
        assert len(got[0][epoch]) == len(got[1][epoch]) == len(expected[0][epoch])  # equal steps
        assert sorted(ids(got[0][epoch]) + ids(got[1][epoch])) == list(range(N_IDS + 1))
        for r in range(2):
            writer = got[r][epoch - epoch % 2]
            assert Counter(map(key, got[r][epoch])) == Counter(map(key, writer))
            assert Counter(map(key, got[r][epoch - epoch % 2])) == Counter(map(key, expected[r][epoch - epoch % 2]))
    assert any("__padding__" in b and b["__padding__"].any() for b in got[0][1] + got[1][1])  # padding cached too
    for loader in ranks:
        assert loader.stats["cache_encoded"]["epochs_read"] == 2


def test_a_cache_of_other_settings_or_changed_data_is_not_read(tmp_path):
    write_chunks(tmp_path / "data", SIZES)
    list(make(tmp_path / "data", tmp_path / "cache", K=3))  # epoch 0 writes
    other = make(tmp_path / "data", tmp_path / "cache", K=3, batch_size=5)
    other.set_epoch(1)
    list(other)
    assert other.stats["cache_encoded"]["epochs_read"] == 0  # another batch size: another folder
    same_settings = make(tmp_path / "data", tmp_path / "cache", K=3)
    same_settings.set_epoch(1)
    list(same_settings)
    assert same_settings.stats["cache_encoded"]["epochs_read"] == 1
    path = tmp_path / "data" / "part-0000.txt"
    path.write_text(path.read_text().replace("1\n", "9\n", 1))  # same size, new content
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10 ** 9))
    changed = make(tmp_path / "data", tmp_path / "cache", K=3)
    changed.set_epoch(1)
    batches = list(changed)
    assert changed.stats["cache_encoded"]["epochs_read"] == 0
    assert 9 in batches[0]["id"][:3] and 1 not in batches[0]["id"]


def test_a_damaged_cached_batch_is_an_error_naming_it(tmp_path):
    write_chunks(tmp_path / "data", SIZES)
    loader = make(tmp_path / "data", tmp_path / "cache", K=3, num_epoch=1)
    list(loader)
    victim = sorted(glob.glob(str(tmp_path / "cache" / "*" / "*" / "*.npz")))[3]
    data = bytearray(Path(victim).read_bytes())
    data[-40] ^= 0xFF
    Path(victim).write_bytes(bytes(data))
    with pytest.raises(pl.PipelineError, match="changed or damaged") as info:
        list(loader)
    assert info.value.stage == "cache_encoded" and os.path.basename(victim) in str(info.value)


# -- resume ----------------------------------------------------------------------------------------
def run_from(loader: pl.DataLoader) -> List[Tuple[Optional[int], str]]:
    return [(loader.epoch, key(b)) for b in loader]


def taken(loader: pl.DataLoader, it: Any, n: int) -> List[Tuple[Optional[int], str]]:
    out = []
    for _ in range(n):
        batch = next(it)
        out.append((loader.epoch, key(batch)))
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_in_a_cached_epoch_is_exact(tmp_path, workers):
    write_chunks(tmp_path / "data", SIZES)

    def fresh() -> pl.DataLoader:
        return make(tmp_path / "data", tmp_path / "cache", K=3, num_epoch=5, shuffle=True, num_workers=workers)

    full = run_from(fresh())
    assert len(full) == 60
    # without workers: every position of epoch 1 (the first read from the cache), and the spread of the
    # rest (epoch boundaries, writing and reading epochs); with workers (a pool per run), a few across it
    epochs = [epoch for epoch, _ in full]
    positions = sorted({*range(12, 25), *spread_positions(epochs)} - {60}) if not workers else [3, 12, 17, 30, 55]
    for k in positions:
        first = fresh()
        it = iter(first)
        head = taken(first, it, k)
        state = json.loads(json.dumps(first.state_dict()))
        first.close()
        epoch = (k - 1) // 12  # of the last batch handed out: a writing epoch records itself
        assert state["cached_from"] == (None if not k else epoch - epoch % 3)
        resumed = fresh()
        resumed.load_state_dict(state)
        assert head + run_from(resumed) == full, f"resumed after {k} batches"
        resumed.close()
    assert wait_no_threads() == []


def test_resume_in_a_cached_epoch_whose_cache_is_gone_encodes_its_writer_again(tmp_path, caplog):
    write_chunks(tmp_path / "data", SIZES)

    def fresh(cache: str) -> pl.DataLoader:
        return make(tmp_path / "data", tmp_path / cache, K=3, num_epoch=3, shuffle=True)

    full = run_from(fresh("a"))
    first = fresh("b")
    it = iter(first)
    head = taken(first, it, 17)  # 5 batches into epoch 1, read from the cache
    state = first.state_dict()
    first.close()
    assert state["cached_from"] == 0
    resumed = fresh("c")  # another folder: the cache the state needs is not there
    resumed.load_state_dict(state)
    with caplog.at_level(logging.WARNING, logger="pyloader"):
        assert head + run_from(resumed) == full
    assert "encoding epoch 0 again" in caplog.text


@pytest.mark.parametrize("cache_gone", [False, True])
def test_a_state_saved_after_an_iteration_ended_resumes_the_next_epoch_in_its_blocks_cache(tmp_path, caplog,
                                                                                            cache_gone):
    write_chunks(tmp_path / "data", SIZES)

    def fresh(cache: str) -> pl.DataLoader:
        return make(tmp_path / "data", tmp_path / cache, K=3, num_epoch=2, shuffle=True)

    uninterrupted = fresh("ref")
    run_from(uninterrupted)
    expected = run_from(uninterrupted)  # epoch 2 reads the cache epoch 0 wrote; epoch 3 writes anew
    saver = fresh("a")
    run_from(saver)
    state = json.loads(json.dumps(saver.state_dict()))
    assert (state["epoch"], state["batches_in_epoch"], state["cached_from"]) == (2, 0, 0)
    resumed = fresh("b" if cache_gone else "a")  # "b": the cache the state needs is not there
    resumed.load_state_dict(state)
    with caplog.at_level(logging.WARNING, logger="pyloader"):
        assert run_from(resumed) == expected
    assert ("encoding epoch 0 again" in caplog.text) == cache_gone


def test_a_state_saved_in_a_cached_epoch_is_refused_under_another_world_size(tmp_path):
    write_chunks(tmp_path / "data", SIZES)
    first = make(tmp_path / "data", tmp_path / "cache", K=3, num_epoch=2, ranks=pl.Ranks(rank=0, world_size=2))
    it = iter(first)
    for _ in range(8):  # into epoch 1, read from the cache
        next(it)
    state = first.state_dict()
    first.close()
    assert state["cached_from"] == 0
    single = make(tmp_path / "data", tmp_path / "cache", K=3, num_epoch=2, ranks=pl.Ranks(rank=0, world_size=1))
    with pytest.raises(ValueError, match="cache_encoded"):
        single.load_state_dict(state)


def test_a_state_without_the_cache_is_refused_with_it(tmp_path):
    write_chunks(tmp_path / "data", SIZES)
    state = make(tmp_path / "data", None).state_dict()
    with pytest.raises(ValueError, match="cache_encoded"):
        make(tmp_path / "data", tmp_path / "cache").load_state_dict(state)


# -- settings --------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, error, words", [
    ({"dir": "c"}, ValueError, "missing \\['update_every'\\]"),
    ({"dir": "c", "update_every": 2, "every": 3}, ValueError, "unknown \\['every'\\]"),
    ({"dir": "c", "update_every": 1}, ValueError, "update_every must be an integer >= 2"),
    ({"dir": "c", "update_every": True}, ValueError, "update_every"),
    ({"dir": "c", "update_every": 2, "limit": 0}, ValueError, "limit must be an integer >= 1"),
    ({"dir": 3, "update_every": 2}, TypeError, "dir must be a folder"),
    (["c", 2], TypeError, "must be a dict or a pyloader.CacheEncoded"),
])
def test_cache_encoded_settings_are_checked(tmp_path, value, error, words):
    write_chunks(tmp_path / "data", SIZES)
    with pytest.raises(error, match=words):
        pl.DataLoader(CountingReader(4), Encoder(), AsIs(), str(tmp_path / "data"), cache_encoded=value)


def test_cache_encoded_is_refused_where_a_cached_epoch_cannot_stand_for_its_own(tmp_path):
    files = write_chunks(tmp_path / "data", SIZES)
    a_file = tmp_path / "file"
    a_file.write_text("")
    base = {"dir": str(tmp_path / "cache"), "update_every": 2}

    def order(files: List[str], epoch: int, rng: Any) -> List[str]:
        return files[:2]

    setattr(order, "drops_or_repeats", True)  # noqa: B010
    for kwargs, words in [({"stream": True, "datareader": CountingReader(4, shuffle=False)}, "stream mode"),
                          ({"data_dir": [pl.Source(files[:3]), pl.Source(files[3:])]}, "weighted sources"),
                          ({"file_order": order}, "drops_or_repeats"),
                          ({"cache_encoded": {**base, "dir": str(a_file)}}, "is not a folder")]:
        arguments = {"datareader": CountingReader(4), "dataset": Encoder(), "datacollator": AsIs(),
                     "data_dir": str(tmp_path / "data"), "cache_encoded": base, **kwargs}
        with pytest.raises(ValueError, match=words):
            pl.DataLoader(**arguments)
    loader = pl.DataLoader(CountingReader(4), Encoder(), AsIs(), str(tmp_path / "data"),
                           cache_encoded=pl.CacheEncoded(tmp_path / "cache", update_every=2))
    assert loader.cache_encoded == pl.CacheEncoded(tmp_path / "cache", 2, None)
    as_dict = pl.DataLoader(CountingReader(4), Encoder(), AsIs(), str(tmp_path / "data"), cache_encoded=base)
    assert as_dict.cache_encoded == pl.CacheEncoded(str(tmp_path / "cache"), 2, None)  # read back as given, checked
    assert pl.DataLoader(CountingReader(4), Encoder(), AsIs(), str(tmp_path / "data")).stats.get("cache_encoded") \
        is None
