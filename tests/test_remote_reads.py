"""What reading remote files costs at the storage (issue 28): a remote file larger than
``readahead_bytes`` goes into ``cache_dir`` whatever the workers, and a Parquet file is read by
the byte ranges it needs. Requests and bytes are counted by the proxy in front of moto's S3."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from test_storage import jsonl, moto_port, s3  # noqa: F401  # the fixtures: moto's S3 behind a counting proxy

import pyloader as pl
from pyloader.collators import NumpyCollator
from pyloader.readers import JsonLinesReader, ParquetReader

# workers are forked (they must see the proxy set up in this process) beside moto's and the proxy's threads
pytestmark = [pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore:pyloader. worker processes are forked while other threads")]


def fetched(s3) -> tuple:  # noqa: F811
    """(GET requests, bytes) the proxy has seen so far."""
    return s3.proxy.gets("/"), s3.proxy.received


def since(s3, before: tuple) -> tuple:  # noqa: F811
    now = fetched(s3)
    return now[0] - before[0], now[1] - before[1]


def workers(num_workers: int) -> dict:
    return {"num_workers": num_workers, "start_method": "fork" if num_workers else None}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_remote_file_larger_than_readahead_bytes_is_cached_whatever_the_workers(s3, tmp_path,  # noqa: F811
                                                                                    num_workers):
    prefix = f"large{num_workers}"
    bodies = [jsonl(i * 300, 300) for i in range(3)]  # about 20 KB each
    for i, body in enumerate(bodies):
        s3.put_object(Bucket="store", Key=f"{prefix}/part-{i}.jsonl", Body=body)
    total = sum(map(len, bodies))
    cache = tmp_path / "cache"

    def run(num_epoch: int) -> list:
        loader = pl.DataLoader(JsonLinesReader(16), pl.IdentityDataset(), NumpyCollator(), f"s3://store/{prefix}",
                               num_epoch=num_epoch, storage=pl.Storage(cache_dir=str(cache), readahead_bytes=4096),
                               **workers(num_workers))
        return sorted(int(i) for batch in loader for i in batch["id"])

    before = fetched(s3)
    assert run(3) == sorted(list(range(900)) * 3)
    gets, received = since(s3, before)
    assert total <= received < 1.2 * total + 20_000  # each file once (and the listing, headers), not once an epoch
    assert len(list(cache.glob("*.data"))) == 3
    before = fetched(s3)
    assert run(2) == sorted(list(range(900)) * 2)
    assert since(s3, before)[0] == 0  # a new loader: every file from the cache


def parquet_file(rows: int = 4000) -> bytes:
    """A Parquet file of about 2 MB: a large column ``blob`` and a small column ``id``, in row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    blobs = [rng.bytes(500) for _ in range(rows)]
    table = pa.table({"blob": pa.array(blobs, pa.binary()), "id": pa.array(np.arange(rows, dtype=np.int32))})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=1000, compression="none")
    return buf.getvalue()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_large_remote_parquet_file_is_read_by_the_ranges_of_its_selected_columns(s3, num_workers):  # noqa: F811
    body = parquet_file()
    key = f"ranges{num_workers}/part-0.parquet"
    s3.put_object(Bucket="store", Key=key, Body=body)
    loader = pl.DataLoader(ParquetReader(256, columns=["id"]), pl.IdentityDataset(), NumpyCollator(),
                           f"s3://store/{key}", storage=pl.Storage(readahead_bytes=2**18), **workers(num_workers))
    before = fetched(s3)
    assert sorted(int(i) for batch in loader for i in batch["id"]) == list(range(4000))
    gets, received = since(s3, before)
    assert received < 0.1 * len(body)  # the footer and the id chunks: not the whole file, nor twice
    assert gets <= 10


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_large_remote_parquet_file_is_fetched_once_into_the_cache_and_then_read_there(s3, tmp_path,  # noqa: F811
                                                                                        num_workers):
    body = parquet_file()
    key = f"cached{num_workers}/part-0.parquet"
    s3.put_object(Bucket="store", Key=key, Body=body)

    def run() -> list:
        loader = pl.DataLoader(ParquetReader(256, columns=["id"]), pl.IdentityDataset(), NumpyCollator(),
                               f"s3://store/{key}",
                               storage=pl.Storage(readahead_bytes=2**18, cache_dir=str(tmp_path / "cache")),
                               num_epoch=2, **workers(num_workers))
        return sorted(int(i) for batch in loader for i in batch["id"])

    before = fetched(s3)
    assert run() == sorted(list(range(4000)) * 2)
    received = since(s3, before)[1]
    assert len(body) <= received < 1.1 * len(body)  # once, whole, for both epochs
    before = fetched(s3)
    assert run() == sorted(list(range(4000)) * 2)
    assert since(s3, before)[0] == 0


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_corrupt_cache_entry_of_a_large_file_is_fetched_again_where_it_is_read(s3, tmp_path,  # noqa: F811
                                                                                 num_workers):
    body = parquet_file()
    key = f"corrupt{num_workers}/part-0.parquet"
    s3.put_object(Bucket="store", Key=key, Body=body)
    cache = tmp_path / "cache"

    def run() -> list:
        loader = pl.DataLoader(ParquetReader(256, columns=["id"]), pl.IdentityDataset(), NumpyCollator(),
                               f"s3://store/{key}", storage=pl.Storage(readahead_bytes=2**18, cache_dir=str(cache)),
                               **workers(num_workers))
        return sorted(int(i) for batch in loader for i in batch["id"])

    assert run() == list(range(4000))
    [data] = cache.glob("*.data")
    flipped = bytearray(data.read_bytes())
    flipped[-100] ^= 0xFF  # in the footer: every read needs it
    data.write_bytes(bytes(flipped))
    assert run() == list(range(4000))  # the block failed its check: the rest came from S3
    assert not data.exists()  # and the entry was dropped
    assert run() == list(range(4000))
    assert json.loads(data.with_suffix(".json").read_text())["size"] == len(body)  # written again


def test_a_cache_entry_gone_before_it_is_served_leaves_the_reader_the_remote_file(tmp_path):
    import fsspec

    from pyloader._storage.cache import Entry
    from pyloader._storage.cached_file import ServedEntry
    from pyloader._storage.files import prefetched

    url = "memory://gone-entry/part-0.bin"
    fsspec.filesystem("memory").pipe(url, b"remote bytes")
    entry = Entry(url, str(tmp_path / "let-go.data"), str(tmp_path / "let-go.json"), 12, 4096, ["0" * 64])
    with prefetched(url, ServedEntry(entry)):  # another loader sharing the cache let the entry go
        with pl.open_file(url, "rb") as f:
            assert f.read() == b"remote bytes"
