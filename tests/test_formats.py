"""Formats (issue 19): compressed text files, Parquet and Arrow IPC files, and the block-wise fast
parsers of the line readers, which must give exactly what reading a line at a time gives."""
from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import lzma
import re
import subprocess
import sys
import tempfile
import tracemalloc
import uuid
import zlib
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple
from unittest import mock

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import ListCollator, ids_of, wait_no_children, wait_no_threads
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from hypothesis import given, settings
from hypothesis import strategies as st

import pyloader as pl
from pyloader._abc import is_thread_safe
from pyloader.collators import NumpyCollator
from pyloader.readers import (
    CSVReader,
    JsonLinesReader,
    NumpyReader,
    ParquetReader,
    TextLinesReader,
    _base,
    _csv,
    _jsonl,
)
from pyloader.readers._parquet import _columns

pytestmark = pytest.mark.timeout(120)

COMPRESS: Dict[str, Callable[[bytes], bytes]] = {
    ".gz": lambda data: gzip.compress(data, mtime=0),  # no timestamp: the same bytes every call
    ".bz2": lambda data: bz2.compress(data, 1),  # blocks of 100 kB: a damaged file still has good ones
    ".xz": lzma.compress,
    ".zst": lambda data: zstandard.ZstdCompressor().compress(data),
}
CODEC_ERRORS = {".gz": Exception, ".bz2": OSError, ".xz": lzma.LZMAError, ".zst": zstandard.ZstdError}


def memory_url(name: str) -> str:
    return f"memory://pyloader-formats/{uuid.uuid4().hex}/{name}"


def outcome(reader, path: str) -> Tuple:
    """What a reader makes of a file: its columns (read whole and as pieces) and count, or the error
    (message, cause's type) and the rows delivered as pieces before it."""
    try:
        columns = reader.read_file(path)
    except ValueError as e:
        delivered = []
        try:
            for piece in reader.iter_file(path):
                delivered.append(piece)
        except ValueError as again:
            assert str(again) == str(e)
        return "error", str(e), type(e.__cause__).__name__, delivered
    return "ok", columns, list(reader.iter_file(path))


# ---------------------------------------------------------------- compressed files

JSONL_LINES = [json.dumps({"id": i, "text": f"sample {i} é", "tags": [i % 3]}) for i in range(3000)]
LINE_READERS = {
    "jsonl": (lambda: JsonLinesReader(piece_size=512), ".jsonl", "\n".join(JSONL_LINES) + "\n"),
    "text": (lambda: TextLinesReader(piece_size=512), ".txt", "".join(f"line {i}\r\n\n" for i in range(3000))),
    "csv": (lambda: CSVReader(piece_size=512), ".csv",
            "id,text\n" + "".join(f'{i},"a, {i}\nb"\n' for i in range(3000))),
}


@pytest.mark.parametrize("suffix", sorted(COMPRESS))
@pytest.mark.parametrize("kind", sorted(LINE_READERS))
def test_a_compressed_text_file_reads_and_counts_as_its_plain_version_in_every_line_reader(tmp_path, kind, suffix):
    make, ext, text = LINE_READERS[kind]
    plain = tmp_path / f"plain{ext}"
    plain.write_bytes(text.encode())
    packed = tmp_path / f"packed{ext}{suffix}"
    packed.write_bytes(COMPRESS[suffix](text.encode()))
    reader = make()
    assert outcome(reader, str(packed)) == outcome(reader, str(plain))
    assert reader.count(str(packed)) == reader.count(str(plain)) == 3000 * (2 if kind == "text" else 1)


@pytest.mark.parametrize("suffix", sorted(COMPRESS))
def test_open_file_decompresses_local_and_remote_files_for_user_readers_unless_told_not_to(tmp_path, suffix):
    data = "".join(f"{i}\tline {i}\n" for i in range(1000)).encode()
    local = tmp_path / f"d.tsv{suffix}"
    local.write_bytes(COMPRESS[suffix](data))
    url = memory_url(f"d.tsv{suffix.upper()}")  # suffixes are matched whatever their case
    with fsspec.open(url, "wb") as f:
        f.write(COMPRESS[suffix](data))
    for path in (str(local), f"file://{local}", url):
        with pl.open_file(path, "rb") as f:
            assert f.read() == data
        with pl.open_file(path, "rt", encoding="utf-8") as f:
            assert f.readline() == "0\tline 0\n" and len(f.readlines()) == 999
        with pl.open_file(path, "rb", compression=None) as f:
            assert f.read() == COMPRESS[suffix](data)
    plain = tmp_path / "plain.bin"
    plain.write_bytes(COMPRESS[suffix](data))
    codec = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd"}[suffix]
    with pl.open_file(str(plain), "rb", compression=codec) as f:
        assert f.read() == data
    with pytest.raises(ValueError, match="unknown compression 'lz4'"):
        pl.open_file(str(plain), compression="lz4")


class LinesOfText(pl.DataReader):
    """A user reader: one sample per line, through ``open_file`` in text mode."""

    thread_safe = True

    def read_file(self, path):
        with pl.open_file(path, "rt", encoding="utf-8") as f:
            ids = [int(line) for line in f]
        return {"id": ids}, len(ids)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_over_compressed_remote_files_gives_every_sample_once_on_every_rank(num_workers):
    base = memory_url("")
    for k, suffix in enumerate(sorted(COMPRESS)):
        with fsspec.open(f"{base}part-{k}.jsonl{suffix}", "wb") as f:
            f.write(COMPRESS[suffix]("".join(f'{{"id": {100 * k + i}}}\n' for i in range(7 + k)).encode()))
        with fsspec.open(f"{base}user-{k}.txt{suffix}", "wb") as f:
            f.write(COMPRESS[suffix]("".join(f"{100 * k + i}\n" for i in range(5)).encode()))
    expected = sorted(100 * k + i for k in range(4) for i in range(7 + k))
    seen = []
    for rank in range(2):
        with pl.DataLoader(JsonLinesReader(batch_size=3), pl.IdentityDataset(), ListCollator(), f"{base}part-*",
                           ranks=pl.Ranks(rank=rank, world_size=2), num_workers=num_workers) as loader:
            seen += [i for b in loader for i, pad in zip(b["id"], b["__padding__"]) if not pad]
    assert sorted(seen) == expected
    with pl.DataLoader(LinesOfText(4), pl.IdentityDataset(), ListCollator(), f"{base}user-*",
                       num_workers=num_workers) as loader:
        assert sorted(ids_of(loader)) == sorted(100 * k + i for k in range(4) for i in range(5))
    assert wait_no_threads() == [] and wait_no_children() == []


@pytest.mark.parametrize("suffix", sorted(COMPRESS))
@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_compressed_file_is_an_error_naming_the_file_and_line_after_the_lines_before_it(
        tmp_path, suffix, damage, monkeypatch):
    monkeypatch.setattr(_base, "BLOCK_BYTES", 4096)
    rng = np.random.default_rng(0)
    text = "".join(f"line {i:05d} {rng.bytes(8 + i % 20).hex()}\n" for i in range(20000))
    packed = COMPRESS[suffix](text.encode())
    if damage == "truncated":
        packed = packed[:len(packed) * 2 // 3]
    else:  # what follows the compressed stream is not another one (damage inside a stream may
        # decode to wrong bytes before a checksum finds it, as it does with gzip's own reader)
        packed = packed + bytes(range(7, 250)) * 40
    path = tmp_path / f"bad.txt{suffix}"
    path.write_bytes(packed)
    reader = TextLinesReader(piece_size=1)
    delivered = []
    with pytest.raises(ValueError) as info:
        for piece in reader.iter_file(str(path)):
            delivered.append(piece["text"][0])
    named = f"file {str(path)!r}, line {len(delivered) + 1}: {damage} "
    assert str(info.value).startswith(named)
    assert delivered == [line.rstrip("\n") for line in text.splitlines(True)[:len(delivered)]]
    assert 1000 < len(delivered) < 20000 if damage == "truncated" else 19000 < len(delivered) <= 20000
    assert isinstance(info.value.__cause__, EOFError if damage == "truncated" else CODEC_ERRORS[suffix])
    for call in (lambda: reader.read_file(str(path)), lambda: reader.count(str(path)),
                 lambda: JsonLinesReader().count(str(path))):
        with pytest.raises(ValueError, match=f"^file {re.escape(repr(str(path)))}, line [0-9]+: {damage} "):
            call()


def _lines_of(n: int, first: int = 0) -> bytes:
    return "".join(f"line {i:06d} {'x' * (i % 40)}\n" for i in range(first, first + n)).encode()


def _gzip_corrupt_mid_stream() -> Tuple[bytes, bytes]:
    """A gzip file of 60,000 lines with a byte changed past its middle where zlib stops within the
    next kilobyte (not a checksum's finding at the end), and what decompresses before it stops."""
    original = gzip.compress(_lines_of(60000))
    at = len(original) * 3 // 5
    before = zlib.decompressobj(wbits=31)
    made = [before.decompress(original[:at])]
    while True:
        d, tried = before.copy(), []
        damaged = original[:at] + bytes([original[at] ^ 0xFF]) + original[at + 1:]
        try:
            for k in range(at, at + 1024):
                tried.append(d.decompress(damaged[k:k + 1]))
        except zlib.error:
            return damaged, b"".join(made + tried)
        made.append(before.decompress(original[at:at + 1]))
        at += 1


def _damaged(case: str) -> Tuple[str, bytes, bytes]:
    """(suffix, the damaged file, the bytes that decompress before the damage)."""
    if case == "gz cut at 60%":
        packed = gzip.compress(_lines_of(60000))[:len(gzip.compress(_lines_of(60000))) * 3 // 5]
        return ".gz", packed, zlib.decompressobj(wbits=31).decompress(packed)
    if case == "small gz cut":
        packed = gzip.compress(_lines_of(5000))
        packed = packed[:len(packed) * 7 // 10]
        return ".gz", packed, zlib.decompressobj(wbits=31).decompress(packed)
    if case == "gz corrupt mid-stream":
        return (".gz", *_gzip_corrupt_mid_stream())
    if case == "zst second frame cut":
        second = zstandard.ZstdCompressor().compress(_lines_of(4000, 4000))
        cut = second[:len(second) // 2]
        packed = zstandard.ZstdCompressor().compress(_lines_of(4000)) + cut
        return ".zst", packed, _lines_of(4000) + zstandard.ZstdDecompressor().decompressobj().decompress(cut)
    packed = lzma.compress(_lines_of(60000))
    packed = packed[:len(packed) * 3 // 5]
    return ".xz", packed, lzma.LZMADecompressor().decompress(packed)


DAMAGED = ["gz cut at 60%", "small gz cut", "gz corrupt mid-stream", "zst second frame cut", "xz cut at 60%"]


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_compressed_file_delivers_every_line_before_the_damage_and_count_names_the_same_line(
        tmp_path, case):
    suffix, packed, good = _damaged(case)
    path = tmp_path / f"bad.txt{suffix}"
    path.write_bytes(packed)
    whole = good[:good.rfind(b"\n") + 1].decode().splitlines()
    assert len(whole) > 3000
    first_lost = f"file {str(path)!r}, line {len(whole) + 1}: "
    reader = TextLinesReader()
    delivered: List[str] = []
    with pytest.raises(ValueError) as info:
        for piece in reader.iter_file(str(path)):
            delivered += piece["text"]
    assert str(info.value).startswith(first_lost)
    assert delivered == whole
    for count in (reader.count, JsonLinesReader().count):
        with pytest.raises(ValueError, match=f"^{re.escape(first_lost)}"):
            count(str(path))
    with pytest.raises(ValueError, match=f"^{re.escape(first_lost)}"):
        reader.read_file(str(path))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_skipping_a_damaged_gzip_delivers_every_line_before_the_damage(tmp_path, num_workers, caplog):
    _, packed, good = _damaged("gz cut at 60%")
    (tmp_path / "a-bad.txt.gz").write_bytes(packed)
    (tmp_path / "b-good.txt").write_bytes(_lines_of(10, 90000))
    whole = good[:good.rfind(b"\n") + 1].decode().splitlines()
    with pl.DataLoader(TextLinesReader(batch_size=1000), pl.IdentityDataset(), ListCollator(), str(tmp_path),
                       on_error="skip", num_workers=num_workers) as loader:
        seen = [line for batch in loader for line in batch["text"]]
        assert loader.stats["skipped_files"] == 1
    assert sorted(seen) == sorted(whole + _lines_of(10, 90000).decode().splitlines())
    assert f"line {len(whole) + 1}: truncated gzip data" in caplog.text


def test_decompression_streams_a_large_file_without_holding_it(tmp_path):
    line = "a fairly ordinary line of text, repeated until the file is large\n"
    n = (48 * 2**20) // len(line)
    path = tmp_path / "big.txt.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write((line * 4096).encode() * (n // 4096))
    reader = TextLinesReader(piece_size=4096)
    tracemalloc.start()
    try:
        total = sum(len(piece["text"]) for piece in reader.iter_file(str(path)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert total == n // 4096 * 4096
    assert peak < 16 * 2**20, f"held {peak / 2**20:.1f} MiB to stream a 48 MiB file"


def test_reading_zstd_files_without_zstandard_is_an_import_error_naming_the_extra(tmp_path, monkeypatch):
    path = tmp_path / "d.txt.zst"
    path.write_bytes(COMPRESS[".zst"](b"a\n"))
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(ImportError, match=r"pyloader-ml\[compression\]"):
        TextLinesReader().read_file(str(path))


def test_a_compressed_npy_file_is_read_as_a_stream(tmp_path):
    for name, array in (("c.npy.gz", np.arange(30.0).reshape(10, 3)),
                        ("f.npy.xz", np.asfortranarray(np.arange(30).reshape(10, 3)))):
        buffer = io.BytesIO()
        np.save(buffer, array)
        path = tmp_path / name
        path.write_bytes(COMPRESS[Path(name).suffix](buffer.getvalue()))
        reader = NumpyReader(piece_size=4)
        columns, n = reader.read_file(str(path))
        assert n == reader.count(str(path)) == 10
        np.testing.assert_array_equal(columns["x"], array)
        np.testing.assert_array_equal(np.concatenate([p["x"] for p in reader.iter_file(str(path))]), array)


def test_importing_the_readers_imports_neither_pyarrow_nor_zstandard():
    code = "import sys, pyloader, pyloader.readers; print(sorted({'pyarrow', 'zstandard'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------- the block-wise fast paths


_LINE_FILES = tempfile.TemporaryDirectory(prefix="pyloader-formats-")  # removed when the session ends


def lines_file(text: bytes, name: str) -> str:
    folder = Path(tempfile.mkdtemp(dir=_LINE_FILES.name))
    path = folder / name
    path.write_bytes(text)
    return str(path)


def by_line(reader, path: str) -> Tuple:
    """``outcome`` with every block parsed a line at a time, as the readers did before blocks."""
    with mock.patch.object(_jsonl, "_parse", lambda text: None), \
            mock.patch.object(_csv._ArrowBlocks, "make", classmethod(lambda cls, *args: None)):
        return outcome(reader, path)


CSV_PIECES = st.sampled_from(["a", "b", "é", " ", ",", ",", '"', '""', "\n", "\r\n", "\r", "\n\n"])
CSV_FIELDS = st.one_of(
    st.text(alphabet="ab é", max_size=4),
    st.lists(st.sampled_from(["a", ",", '""', "\n", "\r\n", "é"]), max_size=5).map(lambda s: '"' + "".join(s) + '"'),
    st.sampled_from(['a"b', '"a"b', '"open', '" x"']),
)


@st.composite
def csv_texts(draw: Any) -> str:
    if draw(st.booleans()):
        return draw(st.lists(CSV_PIECES, max_size=40).map("".join))
    rows = draw(st.lists(st.lists(CSV_FIELDS, min_size=2, max_size=3).map(",".join), max_size=8))
    return "h1,h2\n" + draw(st.sampled_from(["\n", "\r\n"])).join(rows) + draw(st.sampled_from(["", "\n"]))


@settings(max_examples=300, deadline=None)
@given(text=csv_texts(), block=st.sampled_from([1, 5, 16, 64, 2**20]),
       options=st.sampled_from([{}, {"fields": ["h2"]}, {"header": False, "fields": ["x", "y"]}, {"delimiter": " "}]))
def test_csv_blocks_parsed_by_pyarrow_give_what_csv_gives_line_by_line(text, block, options):
    path = lines_file(text.encode(), "d.csv")
    reader = CSVReader(piece_size=2, **options)
    expected = by_line(reader, path)
    with mock.patch.object(_base, "BLOCK_BYTES", block):
        assert outcome(reader, path) == expected


def test_csv_blocks_go_to_pyarrow_unless_csv_would_read_them_otherwise(tmp_path, monkeypatch):
    """A file of quoted fields over many blocks is parsed by pyarrow; one quote inside an unquoted
    field (``csv`` keeps it as text) sends the rest of the file to ``csv``, with the same result."""
    monkeypatch.setattr(_base, "BLOCK_BYTES", 256)
    rows = [f'{i},"x, ""{i}""\nnext line",{i * 0.5}\r\n' for i in range(200)]
    parsed = []
    parse = _csv._ArrowBlocks._parse
    monkeypatch.setattr(_csv._ArrowBlocks, "_parse",
                        lambda self, data, quoted: parsed.append(data.decode()) or parse(self, data, quoted))
    path = tmp_path / "d.csv"
    path.write_text("id,text,score\n" + "".join(rows), newline="")
    reader = CSVReader(piece_size=7)
    columns, n = reader.read_file(str(path))
    assert n == 200 and columns["text"][3] == 'x, "3"\nnext line' and columns["score"][4] == "2.0"
    assert "".join(parsed) == "".join(rows)
    rows[150] = '150,5" screen,75.0\r\n'
    path.write_text("id,text,score\n" + "".join(rows), newline="")
    assert outcome(reader, str(path)) == by_line(reader, str(path))
    parsed.clear()
    assert reader.read_file(str(path))[0]["text"][150] == '5" screen'
    assert 0 < len("".join(parsed)) <= len("".join(rows[:150]))


@pytest.mark.timeout(60)
def test_csv_files_are_parsed_by_pyarrow_in_forked_workers_after_the_loaders_process_did(tmp_path):
    """Workers forked after the loader's process parsed CSV with pyarrow parse with it too."""
    for k in range(6):
        (tmp_path / f"part-{k}.csv").write_text("id,text\n" + "".join(f'{100 * k + i},"a, {i}"\n' for i in range(50)))
    big = tmp_path.parent / f"{tmp_path.name}-big.csv"  # several blocks
    big.write_text("id,text\n" + "".join(f'{i},"a, {i}"\n' for i in range(300_000)))
    reader = CSVReader(batch_size=8)
    assert reader.read_file(str(big))[1] == 300_000
    with pl.DataLoader(reader, pl.IdentityDataset(), ListCollator(), str(tmp_path), num_workers=2,
                       start_method="fork") as loader:
        assert sorted(int(i) for i in ids_of(loader)) == sorted(100 * k + i for k in range(6) for i in range(50))
    assert wait_no_threads() == [] and wait_no_children() == []


def test_csv_values_longer_than_csvs_field_limit_are_still_refused(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,b\n1,short\n2," + "x" * 11 + "\n3,0123456789\n")
    before = csv.field_size_limit(10)
    try:
        with pytest.raises(ValueError, match=r"line 3: malformed CSV: field larger than field limit \(10\)"):
            CSVReader().read_file(str(path))
    finally:
        csv.field_size_limit(before)


JSON_LINES = st.one_of(
    st.sampled_from(['{"a": 1}', '{"a": 2, "b": "x"}', '{"b": 3, "a": [1]}', "", "  ", "\u2028", "[1]", "3",
                     '{"a": 1', '{"a": "é\\u00e9"}', '{"a": 1}\r', '{"c": 1}', '{"a": 1} {"a": 2}', "\ufeff{}"]),
    st.dictionaries(st.sampled_from("ab"), st.integers(-5, 5), min_size=1).map(json.dumps),
)


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(JSON_LINES, max_size=12), end=st.sampled_from(["", "\n"]),
       block=st.sampled_from([1, 8, 40, 2**20]), fields=st.sampled_from([None, ["a"], ["b", "a"]]))
def test_json_lines_parsed_a_block_at_a_time_give_what_line_by_line_parsing_gives(lines, end, block, fields):
    path = lines_file(("\n".join(lines) + end).encode(), "d.jsonl")
    reader = JsonLinesReader(fields=fields, piece_size=2)
    expected = by_line(reader, path)
    with mock.patch.object(_base, "BLOCK_BYTES", block):
        assert outcome(reader, path) == expected


def test_a_bad_json_line_in_a_later_block_is_named_with_the_message_of_its_own_parse(tmp_path, monkeypatch):
    monkeypatch.setattr(_base, "BLOCK_BYTES", 64)
    lines = [json.dumps({"id": i}) for i in range(100)]
    lines[56] = '{"id": 56'
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as expected:
        _jsonl._loads(lines[56] + "\n")
    delivered = []
    with pytest.raises(ValueError) as info:
        for piece in JsonLinesReader(piece_size=1).iter_file(str(path)):
            delivered += piece["id"]
    assert str(info.value) == f"file {str(path)!r}, line 57: invalid JSON: {expected.value}"
    assert delivered == list(range(56))


TEXT_PIECES = st.sampled_from(["a", "é", " ", "\n", "\r\n", "\r", "\x1c", "\u2028", "\x85", "\t"])


@settings(max_examples=200, deadline=None)
@given(text=st.lists(TEXT_PIECES, max_size=30).map("".join), block=st.sampled_from([1, 3, 16, 2**20]),
       encoding=st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "latin-1"]),
       strip=st.booleans(), skip_blank=st.booleans())
def test_text_lines_decoded_a_block_at_a_time_are_the_files_lines_split_at_newline(text, block, encoding, strip,
                                                                                    skip_blank):
    if encoding == "latin-1":
        text = text.replace("é", "\xe9").replace("\u2028", "\xa0")
    path = lines_file(text.encode(encoding), "t.txt")
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    if encoding == "utf-8-sig" and lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:]
    lines = [line for line in lines if line]
    if strip:
        lines = [line[:-2] if line.endswith("\r\n") else line[:-1] if line.endswith("\n") else line for line in lines]
    if skip_blank:
        lines = [line for line in lines if line.strip()]
    reader = TextLinesReader(encoding=encoding, strip_newline=strip, skip_blank=skip_blank, piece_size=3)
    with mock.patch.object(_base, "BLOCK_BYTES", block):
        assert reader.read_file(path) == ({"text": lines}, len(lines))
        assert [line for piece in reader.iter_file(path) for line in piece["text"]] == lines
        assert reader.count(path) == len(lines)


def test_bad_bytes_in_a_later_block_name_the_line_with_the_message_of_its_own_decoding(tmp_path, monkeypatch):
    monkeypatch.setattr(_base, "BLOCK_BYTES", 100)
    lines = [f"line {i}\n".encode() for i in range(300)]
    lines[211] = b"bad \xc3\x28 byte\n"
    path = tmp_path / "t.txt"
    path.write_bytes(b"".join(lines))
    with pytest.raises(UnicodeDecodeError) as expected:
        lines[211].decode("utf-8")
    delivered = []
    with pytest.raises(ValueError) as info:
        for piece in TextLinesReader(piece_size=1).iter_file(str(path)):
            delivered += piece["text"]
    assert str(info.value) == f"file {str(path)!r}, line 212: not valid utf-8: {expected.value}"
    assert isinstance(info.value.__cause__, UnicodeDecodeError)
    assert delivered == [f"line {i}" for i in range(211)]


# ---------------------------------------------------------------- Parquet and Arrow IPC


def write_parquet(path: Path, first_id: int, n: int, row_group_size: int = 4) -> pa.Table:
    """A file of ``n`` rows: int ids, floats, strings, ints with nulls, nested lists, 2-d embeddings."""
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    table = pa.table({
        "id": ids,
        "score": ids.astype(np.float32) / 2,
        "name": [f"row {i}" for i in ids],
        "maybe": pa.array([None if i % 3 == 0 else int(i) for i in ids], pa.int64()),
        "tags": [[int(i)] * int(i % 3) for i in ids],
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 2).astype(np.float32)), 2),
    })
    pq.write_table(table, path, row_group_size=row_group_size)
    return table


def test_parquet_row_groups_are_the_pieces_with_numpy_numbers_and_python_strings_and_nulls(tmp_path):
    path = tmp_path / "d.parquet"
    table = write_parquet(path, 10, 10, row_group_size=4)
    reader = ParquetReader()
    assert is_thread_safe(reader)
    pieces = list(reader.iter_file(str(path)))
    assert [len(p["id"]) for p in pieces] == [4, 4, 2]
    columns, n = reader.read_file(str(path))
    assert n == reader.count(str(path)) == 10
    for got in [columns] + [pieces[0]]:
        k = len(got["id"])
        assert isinstance(got["id"], np.ndarray) and got["id"].dtype == np.int64
        assert isinstance(got["score"], np.ndarray) and got["score"].dtype == np.float32
        assert got["name"] == table["name"].to_pylist()[:k]
        assert got["maybe"] == table["maybe"].to_pylist()[:k] and got["maybe"][2] is None
        assert got["tags"] == table["tags"].to_pylist()[:k]
        assert got["emb"].shape == (k, 2) and got["emb"][1].tolist() == [11.0, 11.0]
    np.testing.assert_array_equal(np.concatenate([p["id"] for p in pieces]), np.arange(10, 20))
    assert not pieces[1]["id"].flags.owndata and not pieces[1]["id"].flags.writeable  # a view of Arrow's buffer


@pytest.mark.parametrize("kind", [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(),
                                  pa.uint32(), pa.uint64(), pa.float16(), pa.float32(), pa.float64()])
def test_parquet_numbers_of_every_fixed_width_come_out_as_arrow_s_own_conversion_even_from_sliced_arrays(kind):
    values = pa.array(np.arange(7) * 3, pa.int64()).cast(kind)
    table = pa.table({"x": values, "pair": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(14)).cast(kind), 2)})
    for data in (table, table.slice(2, 4), table.slice(5)):
        got = _columns(data, ["x", "pair"])
        pairs = np.asarray(data["pair"].to_pylist(), want_dtype(kind))
        for name, want in (("x", data["x"].to_numpy()), ("pair", pairs)):
            assert got[name].dtype == want.dtype and got[name].tolist() == want.tolist(), (kind, name, len(data))


def want_dtype(kind: pa.DataType) -> np.dtype:
    return pa.array([], kind).to_numpy().dtype


def test_reading_parquet_numbers_and_strings_does_not_try_to_import_pandas(tmp_path):
    path = str(tmp_path / "d.parquet")
    write_parquet(tmp_path / "d.parquet", 0, 10, row_group_size=4)
    code = f"""
import sys
tried = []
class Watch:
    def find_spec(self, name, path=None, target=None):
        tried.append(name)
sys.meta_path.insert(0, Watch())
from pyloader.readers import ParquetReader
r = ParquetReader(columns=["id", "score", "name", "emb"])
cols, n = r.read_file({path!r})
pieces = list(r.iter_file({path!r}))
print(n, len(pieces), sorted(m for m in tried if m.split(".")[0] == "pandas"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.split() == ["10", "3", "[]"]  # pyarrow's to_numpy would import it: 0.4 s in every worker


def test_parquet_columns_select_and_a_missing_or_unreadable_one_names_the_file(tmp_path):
    path = tmp_path / "d.parquet"
    write_parquet(path, 0, 6)
    reader = ParquetReader(columns=["name", "id"])
    assert list(reader.read_file(str(path))[0]) == ["name", "id"]
    assert [list(p) for p in reader.iter_file(str(path))] == [["name", "id"]] * 2
    missing = ParquetReader(columns=["id", "nope"])
    for call in (lambda: missing.read_file(str(path)), lambda: list(missing.iter_file(str(path)))):
        with pytest.raises(ValueError, match=r"columns \['nope'\] are not in the file"):
            call()
    with pytest.raises(ValueError, match="columns"):
        ParquetReader(columns="id")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    truncated = tmp_path / "cut.parquet"
    truncated.write_bytes(path.read_bytes()[:200] + path.read_bytes()[-120:])
    for broken in (bad, truncated):
        for call in (lambda b=broken: reader.read_file(str(b)), lambda b=broken: list(reader.iter_file(str(b))),
                     lambda b=broken: reader.count(str(b))):
            with pytest.raises(ValueError, match=f"^file {str(broken)!r}: cannot read as Parquet") as info:
                call()
            assert isinstance(info.value.__cause__, pa.ArrowException)


def test_arrow_ipc_and_feather_files_are_read_like_parquet_a_record_batch_at_a_time(tmp_path):
    table = write_parquet(tmp_path / "d.parquet", 0, 10)
    feather.write_feather(table, tmp_path / "d.feather", chunksize=4)
    url = memory_url("d.arrow")
    with fsspec.open(url, "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
        writer.write_table(table, max_chunksize=3)
    reader = ParquetReader(columns=["id", "name", "emb"])
    expected = reader.read_file(str(tmp_path / "d.parquet"))
    for path, sizes in ((str(tmp_path / "d.feather"), [4, 4, 2]), (url, [3, 3, 3, 1])):
        columns, n = reader.read_file(path)
        assert n == reader.count(path) == 10
        assert columns["name"] == expected[0]["name"]
        np.testing.assert_array_equal(columns["emb"], expected[0]["emb"])
        assert [len(p["id"]) for p in reader.iter_file(path)] == sizes


def test_parquet_reader_without_pyarrow_is_an_import_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ImportError, match=r"pyloader-ml\[parquet\]"):
        ParquetReader()


class RangeFileSystem(AbstractFileSystem):
    """Files in memory served by ranged reads, which it records (like an object store)."""

    protocol = "ranges"
    store: Dict[str, bytes] = {}
    fetched: List[Tuple[str, int, int]] = []

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, **kwargs: Any) -> AbstractBufferedFile:
        return RangeFile(self, path, mode, block_size=block_size or 2**20, cache_options=cache_options,
                         size=len(self.store[self._strip_protocol(path)]), **kwargs)

    def info(self, path: str, **kwargs: Any) -> Dict[str, Any]:
        path = self._strip_protocol(path)
        return {"name": path, "size": len(self.store[path]), "type": "file"}


class RangeFile(AbstractBufferedFile):
    def _fetch_range(self, start: int, end: int) -> bytes:
        RangeFileSystem.fetched.append((self.path, start, end))
        return RangeFileSystem.store[self.path][start:end]


def test_a_remote_parquet_file_is_read_by_the_byte_ranges_its_columns_need(tmp_path):
    fsspec.register_implementation("ranges", RangeFileSystem, clobber=True)
    rng = np.random.default_rng(0)
    words = [rng.bytes(60).hex() for _ in range(30000)]  # 4 MB of strings that do not compress
    table = pa.table({"id": np.arange(30000), "words": words})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=10000, compression="none", use_dictionary=False)
    size = len(buffer.getvalue())
    RangeFileSystem.store["/d.parquet"] = buffer.getvalue()
    url = "ranges:///d.parquet"

    def fetched_by(call: Callable[[], Any]) -> int:
        RangeFileSystem.fetched.clear()
        call()
        return sum(end - start for _, start, end in RangeFileSystem.fetched)

    assert ParquetReader().count(url) == 30000
    assert fetched_by(lambda: ParquetReader().count(url)) <= 64 * 1024  # the footer's end of the file
    ids_only = ParquetReader(columns=["id"])
    assert fetched_by(lambda: list(ids_only.iter_file(url))) < size / 10
    assert np.concatenate([p["id"] for p in ids_only.iter_file(url)]).tolist() == list(range(30000))
    assert fetched_by(lambda: ParquetReader().read_file(url)) >= size * 0.9


@pytest.fixture
def parquet_dir(tmp_path):
    sizes = [9, 1, 14, 6]
    first = 0
    for k, n in enumerate(sizes):
        write_parquet(tmp_path / f"part-{k}.parquet", first, n, row_group_size=4)
        first += n
    return tmp_path, first


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_over_parquet_files_gives_every_row_once_with_workers_and_ranks(parquet_dir, num_workers):
    folder, total = parquet_dir
    reader = ParquetReader(batch_size=4, columns=["id", "name"])
    with pl.DataLoader(reader, pl.IdentityDataset(), ListCollator(), str(folder), num_workers=num_workers,
                       shuffle=True, num_epoch=2) as loader:
        got = [(i, name) for b in loader for i, name in zip(b["id"], b["name"])]
    assert sorted(got) == sorted([(i, f"row {i}") for i in range(total)] * 2)
    seen = []
    for rank in range(2):
        with pl.DataLoader(reader, pl.IdentityDataset(), ListCollator(), str(folder),
                           ranks=pl.Ranks(rank=rank, world_size=2),
                           num_workers=num_workers) as loader:
            assert len(loader) == len(list(loader))
            seen += [i for b in loader for i, pad in zip(b["id"], b["__padding__"]) if not pad]
    assert sorted(seen) == list(range(total))
    assert wait_no_threads() == [] and wait_no_children() == []


def test_a_loader_over_parquet_files_resumes_where_its_state_was_taken(parquet_dir):
    folder, _ = parquet_dir

    def make() -> pl.DataLoader:
        return pl.DataLoader(ParquetReader(batch_size=3, columns=["id"]), pl.IdentityDataset(), ListCollator(),
                             str(folder), shuffle=True, shuffle_buffer=5, num_epoch=2)

    with make() as whole:
        expected = [list(b["id"]) for b in whole]
    with make() as first:
        it = iter(first)
        head = [list(next(it)["id"]) for _ in range(7)]
        state = first.state_dict()
    with make() as resumed:
        resumed.load_state_dict(state)
        assert head + [list(b["id"]) for b in resumed] == expected


def test_parquet_files_stream_row_by_row_in_stream_mode(parquet_dir):
    folder, total = parquet_dir
    with pl.DataLoader(ParquetReader(batch_size=2, columns=["id", "score"]), pl.IdentityDataset(), NumpyCollator(),
                       str(folder), stream=pl.Stream(seq_len=3)) as loader:
        seen = []
        for batch in loader:
            real = batch["__valid__"] & ~batch["__replay__"][:, None]
            seen += batch["id"][real].tolist()
            np.testing.assert_array_equal(batch["score"][real], batch["id"][real] / 2)
    assert sorted(seen) == list(range(total))
