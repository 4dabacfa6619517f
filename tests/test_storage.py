"""Remote storage (issue 19): fsspec URL chains, the local disk cache of remote files, and
retries of transient errors, against moto's S3 server on loopback and a fault-injecting TCP
proxy in front of it."""
from __future__ import annotations

import asyncio
import collections
import json
import random
import re
import select
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import fsspec
import numpy as np
import pytest
from conftest import moto_server, wait_no_threads

import pyloader as pl
from pyloader._storage.bytes import BlockStream, Budget
from pyloader._storage.remote import is_transient
from pyloader.collators import NumpyCollator
from pyloader.readers import JsonLinesReader, NumpyReader

pytestmark = pytest.mark.timeout(120)

_REQUEST = re.compile(rb"(GET|HEAD|PUT|POST|DELETE) (\S+) HTTP/1\.[01]\r\n")


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream_port``. It counts the HTTP requests it
    forwards and the bytes it sends back, and fails a ``share`` of the requests (chosen by its
    own seeded generator) by one of ``kinds``: resetting the connection as the request arrives
    (``reset``) or after a part of the response went through (``cut``), closing it halfway through
    the response's body (``body``), or answering an HTTP 503 or 500 itself (``503``, ``500``).
    Only requests ``faulty`` accepts fail; with ``fail_first``, each request (its method and path)
    fails the first ``fail_first`` times it is seen, whatever ``share``."""

    def __init__(self, upstream_port: int, seed: int = 0) -> None:
        self.upstream_port = upstream_port
        self.share = 0.0
        self.kinds: Tuple[str, ...] = ("reset", "cut")
        self.faulty: Callable[[str], bool] = lambda request: True
        self.fail_first = 0
        self._seen: Dict[str, int] = collections.Counter()
        self.requests: List[str] = []
        self.faults = 0
        self.received = 0  # bytes sent back to the clients (headers included)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.port = self._server.getsockname()[1]
        self._threads = [threading.Thread(target=self._accept, name="test-proxy", daemon=True)]
        self._threads[0].start()

    def gets(self, key_part: str) -> int:
        """GET requests for objects whose path contains ``key_part``."""
        with self._lock:
            return sum(1 for r in self.requests if r.startswith("GET ") and key_part in r and "list-type" not in r)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._relay, args=(client,), name="test-proxy-conn", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _decide(self, new_requests: List[str]) -> Optional[str]:
        with self._lock:
            self.requests.extend(new_requests)
            for request in new_requests:
                if not self.faulty(request):
                    continue
                self._seen[request] += 1
                if self._seen[request] <= self.fail_first or self._rng.random() < self.share:
                    self.faults += 1
                    return self._rng.choice(self.kinds)
        return None

    def _relay(self, client: socket.socket) -> None:
        deadline = time.monotonic() + 60
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
        except OSError:
            client.close()
            return
        pending = b""
        cut_after: Optional[int] = None
        halve = past_headers = False
        try:
            while not self._stop.is_set() and time.monotonic() < deadline:
                ready, _, _ = select.select([client, upstream], [], [], 0.2)
                if client in ready:
                    data = client.recv(65536)
                    if not data:
                        return
                    pending += data
                    lines = [f"{m[1].decode()} {m[2].decode()}" for m in _REQUEST.finditer(pending)]
                    pending = pending[-200:]
                    fault = self._decide(lines) if lines else None
                    if fault == "reset":
                        return _reset(client)
                    if fault in ("503", "500"):
                        return client.sendall(_error_response(int(fault), lines[-1].startswith("HEAD ")))
                    if fault == "cut":
                        cut_after = self._rng.randint(1, 300)
                    halve = halve or fault == "body"
                    upstream.sendall(data)
                if upstream in ready:
                    data = upstream.recv(65536)
                    if not data:
                        return
                    if halve:
                        data, close, past_headers = _halved(data, past_headers)
                        if close:
                            return client.sendall(data)
                    if cut_after is not None:
                        client.sendall(data[:cut_after])
                        return _reset(client)
                    client.sendall(data)
                    with self._lock:
                        self.received += len(data)
        except OSError:
            return
        finally:
            upstream.close()
            client.close()

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        for thread in self._threads:
            thread.join(2)


def _halved(data: bytes, past_headers: bool) -> Tuple[bytes, bool, bool]:
    """What to send of ``data``, a part of a response to be closed halfway through the first part of its
    body that comes: ``(bytes, close then, past the headers)``."""
    body = 0 if past_headers else data.find(b"\r\n\r\n") + 4
    if body < 4 and not past_headers:  # all headers still
        return data, False, False
    if len(data) == body:
        return data, False, True
    return data[:body + (len(data) - body + 1) // 2], True, True


def _error_response(status: int, head: bool) -> bytes:
    """An S3 error answer of HTTP ``status`` (no body to a HEAD), closing the connection."""
    code = {503: "SlowDown", 500: "InternalError"}[status]
    body = f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>try again</Message></Error>"
    head_lines = (f"HTTP/1.1 {status} {code}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
                  "Connection: close\r\n\r\n")
    return (head_lines + ("" if head else body)).encode()


def _reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST


def jsonl(first_id: int, n: int) -> bytes:
    return "".join(json.dumps({"id": first_id + j, "pad": "x" * 40}) + "\n" for j in range(n)).encode()


def ids(loader) -> list:
    return sorted(int(i) for batch in loader for i in batch["id"])


@pytest.fixture(scope="module")
def moto_port():
    """moto's S3 server on 127.0.0.1 with a bucket ``store``; credentials in the environment."""
    import boto3

    with moto_server() as port:
        boto3.client("s3").create_bucket(Bucket="store")
        yield port


@pytest.fixture
def s3(moto_port, monkeypatch):
    """A client of the bucket; s3fs goes through a fresh ``FaultProxy`` with its own retries
    turned off, so that every fault reaches pyloader's retries."""
    import boto3
    import s3fs

    proxy = FaultProxy(moto_port)
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    monkeypatch.setitem(fsspec.config.conf, "s3", {
        "endpoint_url": f"http://127.0.0.1:{proxy.port}",
        "config_kwargs": {"retries": {"total_max_attempts": 1}}})
    client = boto3.client("s3")
    client.proxy = proxy
    yield client
    proxy.close()


def put_files(client, prefix: str, n_files: int, rows: int = 10) -> Dict[str, bytes]:
    bodies = {}
    for i in range(n_files):
        bodies[f"{prefix}/part-{i}.jsonl"] = jsonl(i * rows, rows)
        client.put_object(Bucket="store", Key=f"{prefix}/part-{i}.jsonl", Body=bodies[f"{prefix}/part-{i}.jsonl"])
    return bodies


def loader_over(url: str, **kwargs) -> pl.DataLoader:
    return pl.DataLoader(JsonLinesReader(4), pl.IdentityDataset(), NumpyCollator(), url, **kwargs)


# -- URL chains ---------------------------------------------------------------------------------

@pytest.mark.parametrize("chain", ["filecache", "simplecache"])
def test_files_of_a_caching_chain_read_many_at_once_all_arrive(s3, tmp_path, monkeypatch, chain):
    """fsspec's caching filesystems are not thread-safe: two threads saving filecache's metadata at once lost
    one file's entry, and its open failed (``TypeError: cannot unpack non-iterable bool object``)."""
    put_files(s3, "many", 24, rows=2)
    for run in range(2):  # a fresh cache each time: every file is downloaded and its entry saved
        monkeypatch.setitem(fsspec.config.conf, chain, {"cache_storage": str(tmp_path / f"cache-{run}")})
        loader = loader_over(f"{chain}::s3://store/many", prefetch_files=8, num_workers=0)
        assert ids(loader) == list(range(48))


def test_simplecache_and_filecache_chains_are_listed_and_read(s3, tmp_path, monkeypatch):
    put_files(s3, "chain", 3)
    monkeypatch.setitem(fsspec.config.conf, "simplecache", {"cache_storage": str(tmp_path / "simple")})
    monkeypatch.setitem(fsspec.config.conf, "filecache", {"cache_storage": str(tmp_path / "file")})
    for chain in ("simplecache", "filecache"):
        loader = loader_over(f"{chain}::s3://store/chain")
        assert loader.files == [f"{chain}::s3://store/chain/part-{i}.jsonl" for i in range(3)]
        assert ids(loader) == list(range(30))
    for i in range(2):
        (tmp_path / f"local-{i}.jsonl").write_bytes(jsonl(i * 10, 10))
    loader = loader_over(f"simplecache::file://{tmp_path}/local-*.jsonl")
    assert len(loader.files) == 2 and ids(loader) == list(range(20))


def test_a_glob_through_a_chain_keeps_the_chain_and_skips_hidden_names(s3, tmp_path, monkeypatch):
    put_files(s3, "globbed", 2)
    s3.put_object(Bucket="store", Key="globbed/_SUCCESS", Body=b"")
    monkeypatch.setitem(fsspec.config.conf, "simplecache", {"cache_storage": str(tmp_path / "simple")})
    loader = loader_over("simplecache::s3://store/globbed/*")
    assert loader.files == [f"simplecache::s3://store/globbed/part-{i}.jsonl" for i in range(2)]


# -- the disk cache -----------------------------------------------------------------------------

@pytest.mark.parametrize("readahead_bytes", [2**20, 256], ids=["whole", "blocks"])
def test_a_second_epoch_over_s3_fetches_nothing_that_fits_in_the_cache(s3, tmp_path, readahead_bytes):
    put_files(s3, f"epochs{readahead_bytes}", 4)
    url = f"s3://store/epochs{readahead_bytes}"
    plain = loader_over(url, num_epoch=3, storage=pl.Storage(readahead_bytes=readahead_bytes))
    assert ids(plain) == sorted(list(range(40)) * 3)
    without = s3.proxy.gets(url[len("s3:/"):])
    cached = loader_over(url, num_epoch=3,
                         storage=pl.Storage(cache_dir=str(tmp_path / "cache"), readahead_bytes=readahead_bytes))
    assert ids(cached) == sorted(list(range(40)) * 3)
    with_cache = s3.proxy.gets(url[len("s3:/"):]) - without
    first_file_gets = s3.proxy.gets("/part-0.jsonl")
    assert first_file_gets >= 2  # one per epoch without the cache, more in blocks
    assert without == 3 * (with_cache)  # 4 files (or their blocks) per epoch, against once in all
    again = loader_over(url, num_epoch=2,
                        storage=pl.Storage(cache_dir=str(tmp_path / "cache"), readahead_bytes=readahead_bytes))
    assert ids(again) == sorted(list(range(40)) * 2)
    assert s3.proxy.gets(url[len("s3:/"):]) == without + with_cache  # a new loader, a new run: still nothing


@pytest.mark.parametrize("num_workers", [0, 2])
def test_without_readahead_the_cache_still_serves_every_epoch_after_the_first(s3, tmp_path, num_workers):
    prefix = f"noreadahead{num_workers}"
    put_files(s3, prefix, 4)
    url = f"s3://store/{prefix}"
    storage = pl.Storage(cache_dir=str(tmp_path / "cache"), readahead_bytes=0)
    assert ids(loader_over(url, num_epoch=3, storage=storage, num_workers=num_workers)) == \
        sorted(list(range(40)) * 3)
    assert s3.proxy.gets(f"/{prefix}/") == 4  # each file once, into the cache
    assert len(list((tmp_path / "cache").glob("*.data"))) == 4
    assert ids(loader_over(url, storage=storage, num_workers=num_workers)) == list(range(40))
    assert s3.proxy.gets(f"/{prefix}/") == 4  # a new loader: every file from the cache


@pytest.mark.parametrize("readahead_bytes", [2**20, 0], ids=["whole", "none"])
def test_an_empty_remote_file_is_cached_like_any_other(s3, tmp_path, readahead_bytes):
    prefix = f"empty{readahead_bytes}"
    put_files(s3, prefix, 2)
    s3.put_object(Bucket="store", Key=f"{prefix}/part-2.jsonl", Body=b"")
    url, cache = f"s3://store/{prefix}", tmp_path / "cache"
    storage = pl.Storage(cache_dir=str(cache), readahead_bytes=readahead_bytes)
    assert ids(loader_over(url, num_epoch=3, storage=storage, num_workers=0)) == sorted(list(range(20)) * 3)
    assert s3.proxy.gets(f"/{prefix}/part-2.jsonl") == 0  # its size, 0, says it all: no GET, in any epoch
    entries = {json.loads(p.with_suffix(".json").read_text())["url"]: p for p in cache.glob("*.data")}
    assert len(entries) == 3 and entries[f"{url}/part-2.jsonl"].stat().st_size == 0


def test_the_cache_stores_raw_bytes_and_json_descriptions_only(s3, tmp_path):
    bodies = put_files(s3, "raw", 2)
    list(loader_over("s3://store/raw", storage=pl.Storage(cache_dir=str(tmp_path / "cache"))))
    files = sorted(p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith("counts-"))  # the index
    assert len(files) == 4 and all(name.endswith((".data", ".json")) for name in files)
    stored = {p.read_bytes() for p in (tmp_path / "cache").glob("*.data")}
    assert stored == set(bodies.values())
    for data in (tmp_path / "cache").glob("*.data"):
        described = json.loads(data.with_suffix(".json").read_text())
        assert described["url"].startswith("s3://store/raw/part-") and described["size"] in map(len, bodies.values())


def test_the_cache_lets_the_least_recently_used_entries_go_beyond_its_limit(s3, tmp_path):
    bodies = put_files(s3, "lru", 4)
    size = max(map(len, bodies.values()))
    cache = tmp_path / "cache"

    def kept() -> set:
        data = list(cache.glob("*.data"))
        assert sum(p.stat().st_size for p in data) <= 2 * size + 10
        return {json.loads(p.with_suffix(".json").read_text())["url"] for p in data}

    # one file fetched at a time: the order of use is the file order, whatever the read-ahead's timing
    list(loader_over("s3://store/lru", storage=pl.Storage(cache_dir=str(cache), cache_limit=2 * size + 10),
                     prefetch_files=1))
    first = kept()
    assert len(first) == 2 and "s3://store/lru/part-0.jsonl" not in first  # the first one used went first
    used, other = sorted(first)
    gets = s3.proxy.gets("/lru/")
    assert ids(loader_over([used], storage=pl.Storage(cache_dir=str(cache), cache_limit=2 * size + 10))) == \
        list(range(int(used[-7]) * 10, int(used[-7]) * 10 + 10))
    assert s3.proxy.gets("/lru/") == gets  # served from the cache, and now the most recently used
    s3.put_object(Bucket="store", Key="lru-new/part-9.jsonl", Body=jsonl(90, 10))
    assert ids(loader_over("s3://store/lru-new",
                           storage=pl.Storage(cache_dir=str(cache), cache_limit=2 * size + 10))) == \
        list(range(90, 100))
    assert kept() == {used, "s3://store/lru-new/part-9.jsonl"}  # the least recently used one went
    too_big = loader_over("s3://store/lru",
                          storage=pl.Storage(cache_dir=str(tmp_path / "small"), cache_limit=size - 20))
    assert ids(too_big) == list(range(40))
    assert not list((tmp_path / "small").glob("*.data"))  # larger than the limit: never cached


@pytest.mark.parametrize("readahead_bytes", [2**20, 256], ids=["whole", "blocks"])
def test_a_corrupt_or_truncated_cache_entry_is_detected_and_fetched_again(s3, tmp_path, readahead_bytes):
    prefix = f"damaged{readahead_bytes}"
    put_files(s3, prefix, 3, rows=20)
    cache = tmp_path / "cache"
    url = f"s3://store/{prefix}"
    list(loader_over(url, storage=pl.Storage(cache_dir=str(cache), readahead_bytes=readahead_bytes)))
    entries = {json.loads(p.with_suffix(".json").read_text())["url"]: p for p in cache.glob("*.data")}
    flipped = bytearray(entries[f"{url}/part-0.jsonl"].read_bytes())
    flipped[len(flipped) // 2] ^= 0x01  # same size, one bit off: "id": 1x becomes another number
    entries[f"{url}/part-0.jsonl"].write_bytes(bytes(flipped))
    with open(entries[f"{url}/part-1.jsonl"], "r+b") as f:
        f.truncate(100)  # a partial entry
    gets = {i: s3.proxy.gets(f"/{prefix}/part-{i}.jsonl") for i in range(3)}
    storage = pl.Storage(cache_dir=str(cache), readahead_bytes=readahead_bytes)
    assert ids(loader_over(url, storage=storage)) == list(range(60))
    after = {i: s3.proxy.gets(f"/{prefix}/part-{i}.jsonl") for i in range(3)}
    assert after[0] > gets[0] and after[1] > gets[1]  # both fetched again
    assert after[2] == gets[2]  # the sound one was not


def _nested_past_the_recursion_limit(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)


def _field(name: str, value) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        meta = json.loads(path.read_text())
        meta[name] = value
        path.write_text(json.dumps(meta))
    return damage


def _data_a_folder(path: Path) -> None:
    data = path.with_suffix(".data")
    data.unlink()
    data.mkdir()
    (data / "inside").write_text("x")


def _description_a_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


MALFORMED = {
    "block_size null": _field("block_size", None), "block_size 'abc'": _field("block_size", "abc"),
    "block_size 0": _field("block_size", 0), "block_size -1": _field("block_size", -1),
    "blocks null": _field("blocks", None), "blocks short": _field("blocks", []),
    "blocks of numbers": _field("blocks", [1]), "size '10'": _field("size", "10"),
    "a list": lambda path: path.write_text("[1, 2]"),
    "nested past the recursion limit": _nested_past_the_recursion_limit,
    "data a folder": _data_a_folder, "description a folder": _description_a_folder,
}


# an entry fetched whole has no blocks to damage: its damages are the others'
_WHOLE = [d for d in sorted(MALFORMED) if not d.startswith(("block", "blocks"))]


@pytest.mark.parametrize("damage,readahead_bytes", [(d, 256) for d in sorted(MALFORMED)] + [(d, 2**20) for d in _WHOLE],
                         ids=[f"{d}-blocks" for d in sorted(MALFORMED)] + [f"{d}-whole" for d in _WHOLE])
def test_a_cache_entry_with_a_malformed_description_is_a_miss_fetched_again(s3, tmp_path, damage, readahead_bytes):
    prefix = f"malformed-{readahead_bytes}-{sorted(MALFORMED).index(damage)}"
    put_files(s3, prefix, 2, rows=20)
    cache, url = tmp_path / "cache", f"s3://store/{prefix}"
    list(loader_over(url, storage=pl.Storage(cache_dir=str(cache), readahead_bytes=readahead_bytes)))
    descriptions = {json.loads(p.with_suffix(".json").read_text())["url"]: p.with_suffix(".json")
                    for p in cache.glob("*.data")}
    MALFORMED[damage](descriptions[f"{url}/part-0.jsonl"])
    gets = [s3.proxy.gets(f"/{prefix}/part-{i}.jsonl") for i in range(2)]
    storage = pl.Storage(cache_dir=str(cache), readahead_bytes=readahead_bytes)
    assert ids(loader_over(url, storage=storage)) == list(range(40))
    after = [s3.proxy.gets(f"/{prefix}/part-{i}.jsonl") for i in range(2)]
    assert after[0] > gets[0] and after[1] == gets[1]  # the malformed entry fetched again, the sound one not
    storage = pl.Storage(cache_dir=str(cache), readahead_bytes=readahead_bytes)
    assert ids(loader_over(url, storage=storage)) == list(range(40))
    assert [s3.proxy.gets(f"/{prefix}/part-{i}.jsonl") for i in range(2)] == after  # and cached again
    assert all(p.is_file() for p in cache.iterdir()) and len(list(cache.glob("*.data"))) == 2


def test_an_object_changed_after_it_was_cached_is_fetched_again(s3, tmp_path):
    put_files(s3, "changed", 1)
    cache = str(tmp_path / "cache")
    assert ids(loader_over("s3://store/changed", storage=pl.Storage(cache_dir=cache))) == list(range(10))
    s3.put_object(Bucket="store", Key="changed/part-0.jsonl", Body=jsonl(100, 12))
    assert ids(loader_over("s3://store/changed", storage=pl.Storage(cache_dir=cache))) == list(range(100, 112))


def test_two_loaders_sharing_a_cache_dir_never_see_a_torn_entry(s3, tmp_path):
    put_files(s3, "shared", 6, rows=200)
    cache = str(tmp_path / "cache")
    results: Dict[int, list] = {}

    def run(k: int) -> None:
        results[k] = ids(loader_over("s3://store/shared",
                                     storage=pl.Storage(cache_dir=cache, readahead_bytes=4096 if k else 2**20),
                                                                             num_epoch=3, shuffle=True,
                                     random_seed=k))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    assert results == {k: sorted(list(range(1200)) * 3) for k in range(2)}
    names = [p.name for p in Path(cache).iterdir()]
    assert len(names) == 12 and not [n for n in names if n.endswith(".tmp")]


def test_local_files_are_not_copied_into_the_cache(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_bytes(jsonl(0, 5))
    assert ids(loader_over(str(tmp_path / "data"),
                           storage=pl.Storage(cache_dir=str(tmp_path / "cache")))) == list(range(5))
    assert list((tmp_path / "cache").iterdir()) == []


# -- retries ------------------------------------------------------------------------------------

@pytest.mark.parametrize("num_workers,readahead_bytes", [(0, 2**20), (0, 300), (2, 2**20)],
                         ids=["whole", "blocks", "workers"])
def test_dropped_and_reset_connections_are_retried_and_every_sample_arrives_once(
        s3, tmp_path, num_workers, readahead_bytes):
    prefix = f"flaky{num_workers}-{readahead_bytes}"
    put_files(s3, prefix, 8, rows=25)
    s3.proxy.share = 0.3
    loader = loader_over(f"s3://store/{prefix}", num_epoch=2,
                         storage=pl.Storage(retries=12, readahead_bytes=readahead_bytes),
                                                                                 num_workers=num_workers)
    got = [int(i) for batch in loader for i in batch["id"]]
    assert sorted(got) == sorted(list(range(200)) * 2)  # every sample once per epoch, none twice
    assert s3.proxy.faults >= 5  # the proxy did fail requests, listing and reading both
    loader.close()
    assert wait_no_threads() == []


def test_a_file_that_keeps_failing_names_the_file_and_the_last_cause(s3):
    put_files(s3, "down", 2)
    loader = loader_over("s3://store/down", storage=pl.Storage(retries=2))
    s3.proxy.share = 1.0
    started = time.monotonic()
    with pytest.raises(pl.PipelineError, match="s3://store/down/part-0.jsonl") as info:
        list(loader)
    assert time.monotonic() - started < 30
    cause = info.value.__cause__
    assert is_transient(cause)
    assert any("after 3 attempts" in note for note in getattr(cause, "__notes__", []))


class KnownCount(JsonLinesReader):
    """Counts without opening the file (``JsonLinesReader.count`` opens it itself, for ``len(loader)``,
    retried by s3fs alone): every request to the file is the read's."""

    def count(self, path: str) -> int:
        return 10


@pytest.fixture
def s3_as_configured(moto_port, monkeypatch):
    """Like ``s3``, with s3fs and botocore at their own retry settings (5 attempts each)."""
    import boto3

    proxy = FaultProxy(moto_port)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": f"http://127.0.0.1:{proxy.port}"})
    client = boto3.client("s3")
    client.proxy = proxy
    yield client
    proxy.close()


@pytest.mark.parametrize("num_workers,readahead_bytes", [(0, 2**20), (0, 300), (2, 2**20)],
                         ids=["whole", "blocks", "workers"])
@pytest.mark.parametrize("retries", [0, 2])
def test_retries_bound_every_request_to_a_dead_object_whatever_s3fs_and_botocore_would_retry(
        s3_as_configured, retries, num_workers, readahead_bytes):
    s3, prefix = s3_as_configured, f"dead-{retries}-{num_workers}-{readahead_bytes}"
    put_files(s3, prefix, 1)
    loader = pl.DataLoader(KnownCount(4), pl.IdentityDataset(), NumpyCollator(), f"s3://store/{prefix}",
                           storage=pl.Storage(retries=retries, readahead_bytes=readahead_bytes),
                           num_workers=num_workers)
    s3.proxy.share = 1.0  # every request from now on is cut: the object is dead
    with pytest.raises(pl.PipelineError, match=f"s3://store/{prefix}/part-0.jsonl") as info:
        list(loader)
    with s3.proxy._lock:
        requests = [r for r in s3.proxy.requests if f"/{prefix}/part-0.jsonl" in r]
    assert len(requests) == retries + 1, requests
    assert is_transient(info.value.__cause__)


def test_a_missing_object_is_not_retried(s3):
    put_files(s3, "vanishing", 2)
    loader = loader_over("s3://store/vanishing", storage=pl.Storage(retries=5))
    s3.delete_object(Bucket="store", Key="vanishing/part-1.jsonl")
    with pytest.raises(pl.PipelineError, match="s3://store/vanishing/part-1.jsonl") as info:
        list(loader)
    assert isinstance(info.value, FileNotFoundError)
    assert not getattr(info.value.__cause__, "__notes__", None)  # given up at once


def test_listing_is_retried_too(s3):
    put_files(s3, "listed", 3)
    s3.proxy.share = 0.5
    loader = loader_over("s3://store/listed", storage=pl.Storage(retries=20))
    assert len(loader.files) == 3


def test_transient_errors_are_told_from_lasting_ones():
    import aiohttp
    from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

    def client_error(code: str, status: int) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": code},
                            "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")

    assert is_transient(client_error("SlowDown", 503))
    assert is_transient(client_error("InternalError", 500))
    assert not is_transient(client_error("NoSuchKey", 404))
    assert not is_transient(client_error("AccessDenied", 403))
    assert is_transient(ConnectionResetError(104, "Connection reset by peer"))
    assert is_transient(ConnectionClosedError(endpoint_url="http://127.0.0.1"))
    assert is_transient(ReadTimeoutError(endpoint_url="http://127.0.0.1"))
    translated = OSError(5, "SlowDown")
    translated.__cause__ = client_error("SlowDown", 503)
    assert is_transient(translated)  # as s3fs raises it
    request = aiohttp.RequestInfo(url="http://127.0.0.1/x", method="GET", headers={},  # type: ignore[arg-type]
                                  real_url="http://127.0.0.1/x")  # type: ignore[arg-type]
    assert is_transient(aiohttp.ClientResponseError(request, (), status=503))
    assert not is_transient(aiohttp.ClientResponseError(request, (), status=404))
    assert not is_transient(FileNotFoundError("gone"))
    assert not is_transient(PermissionError("no"))


def test_storage_arguments_are_checked(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(jsonl(0, 2))
    for bad in ({"retries": -1}, {"retries": 1.5}, {"cache_limit": 0, "cache_dir": "c"}, {"readahead_bytes": -1}):
        with pytest.raises(ValueError, match=f"Storage.{next(iter(bad))} must be an integer"):
            pl.Storage(**bad)
    with pytest.raises(TypeError, match="storage must be a pyloader.Storage, got dict"):
        loader_over(str(tmp_path), storage={"retries": 1})


def test_a_large_remote_npy_streams_through_the_cache(s3, tmp_path):
    import io

    buf = io.BytesIO()
    np.save(buf, np.arange(20000, dtype=np.int64))
    s3.put_object(Bucket="store", Key="big/rows.npy", Body=buf.getvalue())
    cache = str(tmp_path / "cache")
    for _ in range(2):
        loader = pl.DataLoader(NumpyReader(512, key="id", piece_size=1000), pl.IdentityDataset(), NumpyCollator(),
                               "s3://store/big", storage=pl.Storage(cache_dir=cache, readahead_bytes=16384))
        assert ids(loader) == list(range(20000))
    gets = s3.proxy.gets("/big/rows.npy")
    assert 0 < gets <= -(-len(buf.getvalue()) // 4096) + 1  # in blocks, and only the first time


class _EndsAfterOneBlock:
    """A byte source of 300 bytes by its size, whose bytes end after the first 100 (a file cut short)."""

    size = 300

    async def read(self, start: int, n: int) -> bytes:
        return b"x" * n if start == 0 else b""

    async def close(self, complete: bool) -> None:
        pass


def test_a_file_cut_short_while_read_ahead_fails_naming_it_and_gives_back_every_byte_of_its_budget() -> None:
    async def read_ahead() -> tuple:
        budget = Budget(1000)
        stream = BlockStream("cut.bin", _EndsAfterOneBlock(), 300, budget, 100)
        await asyncio.wait_for(asyncio.shield(stream._task), 5)
        held = budget.used  # the block read, kept for the parser
        error = None
        try:
            await asyncio.to_thread(stream.readall)
        except ValueError as exc:
            error = str(exc)
        stream.release()
        await asyncio.sleep(0.05)  # the budget is given back through the loop
        return held, budget.used, error

    held, left, error = asyncio.run(read_ahead())
    assert held == 100
    assert left == 0, f"{left} bytes of the read-ahead budget were never given back"
    assert error is not None and "'cut.bin' ended at byte 100, before the 300 bytes" in error
