"""The decompression layer under ``open_file`` (``_storage.compression``), read the ways readers read it."""
from __future__ import annotations

import bz2
import gzip
import io
import lzma

import pytest
import zstandard

import pyloader as pl
from pyloader._storage.compression import DecompressionError

pytestmark = pytest.mark.timeout(120)

# bz2 in blocks of 100 kB: a cut file still has whole ones
TEXT = b"".join(b"line %06d of a file that compresses well\n" % i for i in range(40000))
COMPRESS = {".gz": lambda data: gzip.compress(data, mtime=0),  # no timestamp: the same bytes every call
            ".bz2": lambda data: bz2.compress(data, 1), ".xz": lzma.compress,
            ".zst": lambda data: zstandard.ZstdCompressor().compress(data)}


@pytest.mark.parametrize("suffix", sorted(COMPRESS))
def test_small_reads_large_reads_and_lines_give_the_same_bytes_across_concatenated_members(tmp_path, suffix):
    path = tmp_path / f"t.txt{suffix}"
    path.write_bytes(COMPRESS[suffix](TEXT) + COMPRESS[suffix](TEXT[:1000]) + COMPRESS[suffix](b""))
    whole = TEXT + TEXT[:1000]
    with pl.open_file(str(path), "rb") as f:
        assert f.read() == whole
    with pl.open_file(str(path), "rb") as f:
        assert b"".join(iter(lambda: f.read(777), b"")) == whole
    with pl.open_file(str(path), "rb") as f:
        assert b"".join(iter(lambda: f.read1(1 << 20), b"")) == whole
    with pl.open_file(str(path), "rt", encoding="ascii") as f:
        assert f.readlines() == whole.decode().splitlines(True)


@pytest.mark.parametrize("suffix", sorted(COMPRESS))
def test_a_truncated_file_gives_its_bytes_then_an_error_naming_it_that_every_later_read_raises_again(
        tmp_path, suffix):
    packed = COMPRESS[suffix](TEXT)
    path = tmp_path / f"cut.txt{suffix}"
    path.write_bytes(packed[:len(packed) // 2])
    with pl.open_file(str(path), "rb") as f:
        with pytest.raises(DecompressionError, match=f"^file {str(path)!r}: truncated ") as info:
            f.read()
        assert isinstance(info.value.__cause__, EOFError)
    got = io.BytesIO()
    with pl.open_file(str(path), "rb") as f:
        with pytest.raises(DecompressionError):
            while True:
                got.write(f.read1(4096))
        for read in (f.read1, f.read):
            with pytest.raises(DecompressionError, match="truncated"):
                read(10)
    assert len(got.getvalue()) > len(TEXT) // 10 and TEXT.startswith(got.getvalue())


def test_an_empty_compressed_file_and_an_empty_file_read_as_empty(tmp_path):
    for name, data in (("e.txt.gz", gzip.compress(b"")), ("z.txt.gz", b""), ("z.txt.zst", b"")):
        (tmp_path / name).write_bytes(data)
        with pl.open_file(str(tmp_path / name), "rb") as f:
            assert f.read() == b""
