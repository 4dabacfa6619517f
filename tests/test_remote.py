"""Remote storage: fsspec URLs, a real S3-compatible server on loopback, hidden latency."""
from __future__ import annotations

import json

import fsspec
import pytest
from conftest import moto_server

import pyloader as pl
from pyloader.collators import NumpyCollator
from pyloader.readers import JsonLinesReader, NumpyReader
from pyloader.testing import LatencyFileSystem

pytestmark = pytest.mark.timeout(120)


def jsonl(first_id: int, n: int) -> bytes:
    return "".join(json.dumps({"id": first_id + j}) + "\n" for j in range(n)).encode()


def ids(loader) -> list:
    return sorted(int(i) for batch in loader for i in batch["id"])


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on 127.0.0.1, credentials and endpoint in the usual environment variables."""
    import boto3

    with moto_server():
        client = boto3.client("s3")
        client.create_bucket(Bucket="train")
        for i in range(6):
            client.put_object(Bucket="train", Key=f"chunks/part-{i}.jsonl", Body=jsonl(i * 10, 10))
        client.put_object(Bucket="train", Key="chunks/.hidden", Body=b"not data")
        fsspec.config.conf.pop("s3", None)
        yield client


@pytest.mark.parametrize("num_workers", [0, 2])
def test_s3_listing_and_reading(s3, num_workers):
    loader = pl.DataLoader(JsonLinesReader(4), pl.IdentityDataset(), NumpyCollator(), "s3://train/chunks",
                           num_workers=num_workers, shuffle=True)
    assert loader.files == [f"s3://train/chunks/part-{i}.jsonl" for i in range(6)]
    assert ids(loader) == list(range(60))


def test_s3_missing_bucket_is_a_clear_error(s3):
    with pytest.raises(FileNotFoundError, match="s3://no-such-bucket/x"):
        pl.DataLoader(JsonLinesReader(4), pl.IdentityDataset(), NumpyCollator(), "s3://no-such-bucket/x")


def test_s3_key_deleted_after_listing_names_the_file(s3):
    s3.put_object(Bucket="train", Key="gone/a.jsonl", Body=jsonl(0, 3))
    s3.put_object(Bucket="train", Key="gone/b.jsonl", Body=jsonl(3, 3))
    loader = pl.DataLoader(JsonLinesReader(2), pl.IdentityDataset(), NumpyCollator(), "s3://train/gone")
    s3.delete_object(Bucket="train", Key="gone/b.jsonl")
    with pytest.raises(pl.PipelineError, match="s3://train/gone/b.jsonl") as info:
        list(loader)
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_memory_and_file_urls(tmp_path):
    fs = fsspec.filesystem("memory")
    for i in range(3):
        fs.pipe(f"/remote-test/part-{i}.jsonl", jsonl(i * 5, 5))
    loader = pl.DataLoader(JsonLinesReader(4), pl.IdentityDataset(), NumpyCollator(), "memory://remote-test")
    assert ids(loader) == list(range(15))
    for i in range(2):
        (tmp_path / f"p{i}.jsonl").write_bytes(jsonl(i * 4, 4))
    loader = pl.DataLoader(JsonLinesReader(4), pl.IdentityDataset(), NumpyCollator(), f"file://{tmp_path}")
    assert ids(loader) == list(range(8))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_latency_is_hidden_by_several_files_in_flight(num_workers):
    slow = LatencyFileSystem.register(f"slow{num_workers}", latency=0.05)
    fs = fsspec.filesystem(f"slow{num_workers}")
    for i in range(12):
        fs.pipe(f"/d/part-{i:02d}.jsonl", jsonl(i * 10, 10))
    loader = pl.DataLoader(JsonLinesReader(8), pl.IdentityDataset(), NumpyCollator(), f"slow{num_workers}:///d",
                           prefetch_files=4, num_workers=num_workers)
    assert ids(loader) == list(range(120))
    assert slow.max_in_flight >= 3  # files fetched side by side, not one after another
    assert slow.max_in_flight <= 4 + 1  # and no more than prefetch_files ahead (+ the current one)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_remote_file_larger_than_the_readahead_budget_is_streamed(num_workers):
    import numpy as np

    fs = fsspec.filesystem("memory")
    with fs.open(f"/big-remote{num_workers}/rows.npy", "wb") as f:
        np.save(f, np.arange(5000, dtype=np.int64))
    loader = pl.DataLoader(NumpyReader(256, key="id", piece_size=500), pl.IdentityDataset(), NumpyCollator(),
                           f"memory://big-remote{num_workers}", storage=pl.Storage(readahead_bytes=1000),
                           num_workers=num_workers,
                           start_method="fork" if num_workers else None)  # a worker reads it: it must see memory://
    assert ids(loader) == list(range(5000))


def test_open_file_serves_prefetched_bytes_only_inside(tmp_path):
    from pyloader._storage.files import prefetched

    with prefetched("memory://nowhere/x.txt", b"hello\n"):
        with pl.open_file("memory://nowhere/x.txt", "rt") as f:
            assert f.read() == "hello\n"
    with pytest.raises(FileNotFoundError):
        pl.open_file("memory://nowhere/x.txt").read()
