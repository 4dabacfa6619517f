"""Tests for the built-in readers in pyloader.readers."""
from __future__ import annotations

import csv
import io
import json
import uuid
import zipfile
from pathlib import Path

import fsspec
import numpy as np
import pytest
from numpy.lib import format as npformat

from pyloader import DataReader
from pyloader._columns import concat
from pyloader.readers import CSVReader, JsonLinesReader, NumpyReader, TextLinesReader, _jsonl

pytestmark = pytest.mark.timeout(60)


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return str(path)


def memory_url(name):
    return f"memory://pyloader-tests/{uuid.uuid4().hex}/{name}"


def pieces_of(reader, path):
    return list(reader.iter_file(path))


def assert_same(a, b):
    assert list(a) == list(b)
    for key in a:
        if isinstance(a[key], np.ndarray) or isinstance(b[key], np.ndarray):
            np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]))
        else:
            assert a[key] == b[key]


def assert_streams_like_read(reader, path, piece_size):
    columns, n = reader.read_file(path)
    pieces = pieces_of(reader, path)
    assert all(0 < len(next(iter(p.values()))) <= piece_size for p in pieces)
    for piece in pieces:
        assert list(piece) == list(columns)
        for key, col in piece.items():
            assert type(col) is type(columns[key]) or isinstance(columns[key], np.memmap)
            if isinstance(col, np.ndarray):
                assert col.dtype == columns[key].dtype and col.shape[1:] == columns[key].shape[1:]
    if n == 0:
        assert pieces == []
    else:
        assert_same(concat(pieces), columns)
    return pieces


def raises_naming(path, call, *fragments):
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message
    return info.value


def both_ways(reader, path):
    """Call read_file and iter_file; each is checked on its own by the caller."""
    return [lambda: reader.read_file(path), lambda: list(reader.iter_file(path))]


def test_all_readers_are_data_readers():
    for cls in (JsonLinesReader, TextLinesReader, CSVReader, NumpyReader):
        reader = cls(batch_size=4, shuffle=True, random_seed=7)
        assert isinstance(reader, DataReader)
        assert (reader.batch_size, reader.shuffle, reader.random_seed) == (4, True, 7)


@pytest.mark.parametrize("cls", [JsonLinesReader, TextLinesReader, CSVReader, NumpyReader])
def test_bad_piece_size(cls):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="piece_size"):
            cls(piece_size=bad)


# ---------------------------------------------------------------- JSON Lines

JSONL = '{"a": 1, "b": "x"}\n\n{"a": 2, "b": "y"}\n  \n{"b": "z", "a": [3]}\n{"a": null, "b": ""}'


def test_jsonl_columns(tmp_path):
    path = write(tmp_path, "d.jsonl", JSONL)
    columns, n = JsonLinesReader().read_file(path)
    assert n == 4
    assert columns == {"a": [1, 2, [3], None], "b": ["x", "y", "z", ""]}


def test_jsonl_fields_select_and_ignore_other_keys(tmp_path):
    path = write(tmp_path, "d.jsonl", '{"a": 1, "b": 2, "c": 3}\n{"b": 5, "a": 4}\n')
    columns, n = JsonLinesReader(fields=["b"]).read_file(path)
    assert (columns, n) == ({"b": [2, 5]}, 2)


def test_jsonl_stream_matches_read(tmp_path):
    lines = [json.dumps({"i": i, "s": str(i) * (i % 3)}) for i in range(23)]
    path = write(tmp_path, "d.jsonl", "\n".join(lines) + "\n")
    reader = JsonLinesReader(piece_size=5)
    pieces = assert_streams_like_read(reader, path, 5)
    assert [len(p["i"]) for p in pieces] == [5, 5, 5, 5, 3]
    assert reader.read_file(path)[0]["i"] == list(range(23))


def test_jsonl_without_orjson(tmp_path, monkeypatch):
    monkeypatch.setattr(_jsonl, "_loads", json.loads)
    path = write(tmp_path, "d.jsonl", JSONL)
    assert JsonLinesReader().read_file(path)[1] == 4
    bad = write(tmp_path, "bad.jsonl", '{"a": 1}\n{"a": \n')
    error = raises_naming(bad, lambda: JsonLinesReader().read_file(bad), "line 2", "invalid JSON")
    assert isinstance(error.__cause__, json.JSONDecodeError)


def test_jsonl_crlf_and_bom(tmp_path):
    path = write(tmp_path, "d.jsonl", b'\xef\xbb\xbf{"a": 1}\r\n{"a": 2}\r\n')
    assert JsonLinesReader().read_file(path) == ({"a": [1, 2]}, 2)


def test_jsonl_empty_file(tmp_path):
    path = write(tmp_path, "d.jsonl", "")
    assert JsonLinesReader().read_file(path) == ({}, 0)
    assert JsonLinesReader(fields=["a"]).read_file(path) == ({"a": []}, 0)
    assert pieces_of(JsonLinesReader(), path) == []
    blank = write(tmp_path, "blank.jsonl", "\n  \n")
    assert JsonLinesReader().read_file(blank) == ({}, 0)


@pytest.mark.parametrize("text, line, what", [
    ('{"a": 1}\n{"a": 2\n', "line 2", "invalid JSON"),
    ('{"a": 1}\n\n[1, 2]\n', "line 3", "expected a JSON object"),
    ('"str"\n', "line 1", "expected a JSON object"),
    ('{"a": 1, "b": 2}\n{"a": 3}\n', "line 2", "missing key 'b'"),
    ('{"a": 1}\n{"a": 3, "z": 0}\n', "line 2", "unexpected keys ['z']"),
])
def test_jsonl_errors(tmp_path, text, line, what):
    path = write(tmp_path, "bad.jsonl", text)
    for call in both_ways(JsonLinesReader(piece_size=1), path):
        raises_naming(path, call, line, what)


def test_jsonl_error_chains_json_error(tmp_path):
    path = write(tmp_path, "bad.jsonl", '{"a": 1}\n{oops}\n')
    error = raises_naming(path, lambda: JsonLinesReader().read_file(path), "line 2")
    assert isinstance(error.__cause__, ValueError)


def test_jsonl_missing_selected_field(tmp_path):
    path = write(tmp_path, "bad.jsonl", '{"a": 1, "b": 1}\n{"a": 1}\n')
    raises_naming(path, lambda: JsonLinesReader(fields=["b"]).read_file(path), "line 2", "missing key 'b'")


def test_jsonl_not_utf8(tmp_path):
    path = write(tmp_path, "bad.jsonl", b'{"a": "ok"}\n{"a": "\xff\xfe"}\n')
    for call in both_ways(JsonLinesReader(), path):
        error = raises_naming(path, call, "line 2", "utf-8")
        assert isinstance(error.__cause__, UnicodeDecodeError)


def test_jsonl_memory_url():
    url = memory_url("d.jsonl")
    with fsspec.open(url, "wb") as f:
        f.write(JSONL.encode())
    reader = JsonLinesReader(piece_size=3)
    columns, n = reader.read_file(url)
    assert n == 4 and columns["a"] == [1, 2, [3], None]
    assert_streams_like_read(reader, url, 3)


def test_jsonl_bad_fields():
    for bad in ("a", [], ["a", "a"], [1]):
        with pytest.raises(ValueError, match="fields"):
            JsonLinesReader(fields=bad)


# ---------------------------------------------------------------- text lines


def test_text_columns(tmp_path):
    path = write(tmp_path, "t.txt", "one\ntwo\r\n\n  \nlast")
    assert TextLinesReader().read_file(path) == ({"text": ["one", "two", "", "  ", "last"]}, 5)
    assert TextLinesReader(field="line", skip_blank=True).read_file(path) == (
        {"line": ["one", "two", "last"]}, 3)
    assert TextLinesReader(strip_newline=False).read_file(path)[0]["text"] == [
        "one\n", "two\r\n", "\n", "  \n", "last"]


def test_text_trailing_newline_adds_no_sample(tmp_path):
    path = write(tmp_path, "t.txt", "a\nb\n")
    assert TextLinesReader().read_file(path) == ({"text": ["a", "b"]}, 2)


def test_text_stream_matches_read(tmp_path):
    path = write(tmp_path, "t.txt", "".join(f"line {i}\n" for i in range(10)) + "\n\n")
    for reader in (TextLinesReader(piece_size=3), TextLinesReader(piece_size=3, skip_blank=True)):
        pieces = assert_streams_like_read(reader, path, 3)
        assert len(pieces) > 1


def test_text_empty_file(tmp_path):
    path = write(tmp_path, "t.txt", "")
    assert TextLinesReader().read_file(path) == ({"text": []}, 0)
    assert pieces_of(TextLinesReader(), path) == []


def test_text_decode_error(tmp_path):
    path = write(tmp_path, "t.txt", b"fine\nalso fine\nbad \xc3\x28 byte\n")
    for call in both_ways(TextLinesReader(piece_size=1), path):
        error = raises_naming(path, call, "line 3")
        assert isinstance(error.__cause__, UnicodeDecodeError)


def test_text_truncated_multibyte_at_end(tmp_path):
    path = write(tmp_path, "t.txt", b"ok\n\xe2\x82")
    raises_naming(path, lambda: TextLinesReader().read_file(path), "line 2")


def test_text_other_encodings(tmp_path):
    latin = write(tmp_path, "l.txt", "café\nnaïve\n".encode("latin-1"))
    assert TextLinesReader(encoding="latin-1").read_file(latin)[0]["text"] == ["café", "naïve"]
    utf16 = write(tmp_path, "u.txt", "a\nbé\nc".encode("utf-16"))
    reader = TextLinesReader(encoding="utf-16", piece_size=2)
    assert reader.read_file(utf16) == ({"text": ["a", "bé", "c"]}, 3)
    assert_streams_like_read(reader, utf16, 2)


def test_text_unknown_encoding():
    with pytest.raises(ValueError, match="encoding"):
        TextLinesReader(encoding="no-such-codec")


# ---------------------------------------------------------------- CSV

CSV = 'id,name,score\n1,ann,0.5\n\n2,"bob, jr",1.5\n3,"multi\nline",2\n'


def test_csv_columns(tmp_path):
    path = write(tmp_path, "d.csv", CSV)
    columns, n = CSVReader().read_file(path)
    assert n == 3
    assert columns == {"id": ["1", "2", "3"], "name": ["ann", "bob, jr", "multi\nline"],
                       "score": ["0.5", "1.5", "2"]}


def test_csv_converters_and_fields(tmp_path):
    path = write(tmp_path, "d.csv", CSV)
    reader = CSVReader(fields=["score", "id"], converters={"id": int, "score": float})
    assert reader.read_file(path) == ({"score": [0.5, 1.5, 2.0], "id": [1, 2, 3]}, 3)


def test_csv_no_header_and_delimiter(tmp_path):
    path = write(tmp_path, "d.tsv", "1\ta\r\n2\tb\r\n")
    reader = CSVReader(fields=["n", "s"], delimiter="\t", header=False, converters={"n": int})
    assert reader.read_file(path) == ({"n": [1, 2], "s": ["a", "b"]}, 2)


def test_csv_stream_matches_read(tmp_path):
    rows = "".join(f'{i},"v{i}\n{i}"\n' for i in range(11))
    path = write(tmp_path, "d.csv", "k,v\n" + rows)
    reader = CSVReader(piece_size=4, converters={"k": int})
    pieces = assert_streams_like_read(reader, path, 4)
    assert [len(p["k"]) for p in pieces] == [4, 4, 3]
    assert reader.read_file(path)[0]["k"] == list(range(11))


def test_csv_empty_file(tmp_path):
    path = write(tmp_path, "d.csv", "")
    assert CSVReader().read_file(path) == ({}, 0)
    assert CSVReader(fields=["a"], header=False).read_file(path) == ({"a": []}, 0)
    assert pieces_of(CSVReader(), path) == []
    header_only = write(tmp_path, "h.csv", "a,b\n")
    assert CSVReader().read_file(header_only) == ({"a": [], "b": []}, 0)


def test_csv_wrong_cell_count(tmp_path):
    path = write(tmp_path, "bad.csv", 'a,b\n1,2\n"x\ny",3\n4,5,6\n')
    for call in both_ways(CSVReader(piece_size=1), path):
        raises_naming(path, call, "line 5", "expected 2 cells, got 3")


def test_csv_converter_error(tmp_path):
    path = write(tmp_path, "bad.csv", "a\n1\nx\n")
    error = raises_naming(path, lambda: CSVReader(converters={"a": int}).read_file(path), "line 3", "'a'")
    assert isinstance(error.__cause__, ValueError)


def test_csv_not_utf8(tmp_path):
    path = write(tmp_path, "bad.csv", b"a\nok\n\xff\n")
    raises_naming(path, lambda: CSVReader().read_file(path), "line 3")


def test_csv_header_problems(tmp_path):
    dup = write(tmp_path, "dup.csv", "a,a\n1,2\n")
    raises_naming(dup, lambda: CSVReader().read_file(dup), "line 1", "duplicate")
    path = write(tmp_path, "d.csv", "a,b\n1,2\n")
    raises_naming(path, lambda: CSVReader(fields=["c"]).read_file(path), "line 1", "'c'")
    raises_naming(path, lambda: CSVReader(converters={"c": int}).read_file(path), "line 1", "'c'")


def test_csv_bad_arguments():
    with pytest.raises(ValueError, match="fields"):
        CSVReader(header=False)
    with pytest.raises(ValueError, match="delimiter"):
        CSVReader(delimiter=";;")
    with pytest.raises(ValueError, match="not callable"):
        CSVReader(converters={"a": 3})
    with pytest.raises(ValueError, match="not in fields"):
        CSVReader(fields=["a"], converters={"b": int})


# ---------------------------------------------------------------- NumPy


def save_npy(tmp_path, name, array):
    path = tmp_path / name
    np.save(path, array)
    return str(path)


@pytest.mark.parametrize("mmap", [True, False])
def test_npy_columns(tmp_path, mmap):
    array = np.arange(30, dtype=np.float32).reshape(10, 3)
    path = save_npy(tmp_path, "a.npy", array)
    columns, n = NumpyReader(key="feat", mmap=mmap).read_file(path)
    assert n == 10 and list(columns) == ["feat"]
    assert isinstance(columns["feat"], np.ndarray)
    assert isinstance(columns["feat"], np.memmap) == mmap
    np.testing.assert_array_equal(columns["feat"], array)


@pytest.mark.parametrize("mmap", [True, False])
def test_npy_streams_in_pieces(tmp_path, mmap):
    array = np.arange(1000 * 4, dtype=np.int64).reshape(1000, 4)
    path = save_npy(tmp_path, "big.npy", array)
    reader = NumpyReader(mmap=mmap, piece_size=128)
    pieces = assert_streams_like_read(reader, path, 128)
    assert len(pieces) == 8 and [len(p["x"]) for p in pieces][-1] == 1000 - 7 * 128
    assert all(type(p["x"]) is np.ndarray for p in pieces)
    np.testing.assert_array_equal(np.concatenate([p["x"] for p in pieces]), array)


@pytest.mark.parametrize("array", [
    np.asfortranarray(np.arange(24.0).reshape(6, 4)),
    np.array([(1, 2.5), (3, 4.5), (5, 6.5)], dtype=[("i", "<i4"), ("f", ">f8")]),
    np.array(["a", "bb", "ccc"]),
    np.zeros((0, 3)),
    np.zeros((4, 0)),
])
@pytest.mark.parametrize("mmap", [True, False])
def test_npy_layouts(tmp_path, array, mmap):
    path = save_npy(tmp_path, "a.npy", array)
    reader = NumpyReader(mmap=mmap, piece_size=2)
    columns, n = reader.read_file(path)
    assert n == len(array)
    np.testing.assert_array_equal(columns["x"], array)
    assert columns["x"].dtype == array.dtype
    assert_streams_like_read(reader, path, 2)


def test_npz_columns_and_stream(tmp_path):
    path = str(tmp_path / "a.npz")
    arrays = {"ids": np.arange(50), "emb": np.random.default_rng(0).random((50, 8)),
              "lab": np.array([str(i) for i in range(50)])}
    np.savez_compressed(path, **arrays)
    reader = NumpyReader(piece_size=16)
    columns, n = reader.read_file(path)
    assert n == 50 and sorted(columns) == sorted(arrays)
    for key, array in arrays.items():
        np.testing.assert_array_equal(columns[key], array)
    pieces = assert_streams_like_read(reader, path, 16)
    assert [len(p["ids"]) for p in pieces] == [16, 16, 16, 2]


def test_npz_unequal_lengths(tmp_path):
    path = str(tmp_path / "a.npz")
    np.savez(path, a=np.zeros(5), b=np.zeros(4))
    for call in both_ways(NumpyReader(), path):
        raises_naming(path, call, "'b'")


def test_npy_zero_dim(tmp_path):
    path = save_npy(tmp_path, "s.npy", np.array(3.0))
    for call in both_ways(NumpyReader(key="val"), path):
        raises_naming(path, call, "'val'", "0-d")


def test_npy_empty_file(tmp_path):
    path = write(tmp_path, "e.npy", b"")
    for mmap in (True, False):
        for call in both_ways(NumpyReader(mmap=mmap), path):
            raises_naming(path, call, "empty")


@pytest.mark.parametrize("mmap", [True, False])
def test_npy_corrupt_and_truncated(tmp_path, mmap):
    good = save_npy(tmp_path, "good.npy", np.arange(100, dtype=np.float64))
    data = Path(good).read_bytes()
    cases = {
        "garbage.npy": b"this is not a numpy file at all",
        "trunc_data.npy": data[:-40],
        "trunc_header.npy": data[:20],
        "bad_header.npy": data[:10] + b"#" * 20 + data[30:],
    }
    for name, blob in cases.items():
        path = write(tmp_path, name, blob)
        for call in both_ways(NumpyReader(mmap=mmap, piece_size=7), path):
            error = raises_naming(path, call)
            assert error.__cause__ is not None or "empty" in str(error)


def test_npy_object_array_refused(tmp_path):
    path = str(tmp_path / "o.npy")
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    for mmap in (True, False):
        for call in both_ways(NumpyReader(mmap=mmap), path):
            raises_naming(path, call)


def test_npz_corrupt_and_truncated(tmp_path):
    path = str(tmp_path / "good.npz")
    np.savez_compressed(path, a=np.arange(10000), b=np.arange(10000) * 2.0)
    data = Path(path).read_bytes()
    for name, blob in {"trunc.npz": data[: len(data) // 2], "flipped.npz": data[:200] + b"\0" * 400 + data[600:],
                       "head.npz": data[:4]}.items():
        bad = write(tmp_path, name, blob)
        for call in both_ways(NumpyReader(piece_size=1000), bad):
            error = raises_naming(bad, call)
            assert error.__cause__ is not None


def test_npy_memory_url():
    array = np.arange(300, dtype=np.int32).reshape(100, 3)
    url = memory_url("a.npy")
    with fsspec.open(url, "wb") as f:
        np.save(f, array)
    reader = NumpyReader(piece_size=32)  # mmap=True, but remote: read through open_file
    columns, n = reader.read_file(url)
    assert n == 100 and not isinstance(columns["x"], np.memmap)
    np.testing.assert_array_equal(columns["x"], array)
    pieces = assert_streams_like_read(reader, url, 32)
    assert len(pieces) == 4


def test_npz_memory_url():
    url = memory_url("a.npz")
    with fsspec.open(url, "wb") as f:
        np.savez(f, a=np.arange(7), b=np.ones((7, 2)))
    reader = NumpyReader(piece_size=3)
    columns, n = reader.read_file(url)
    assert n == 7 and sorted(columns) == ["a", "b"]
    assert len(assert_streams_like_read(reader, url, 3)) == 3


def test_npy_memory_url_truncated():
    url = memory_url("t.npy")
    with fsspec.open(url, "wb") as f:
        np.save(f, np.arange(100))
    with fsspec.open(url, "rb") as f:
        data = f.read()
    with fsspec.open(url, "wb") as f:
        f.write(data[:-8])
    for call in both_ways(NumpyReader(piece_size=10), url):
        raises_naming(url, call)


TRICKY_TEXT = {
    "plain": "x\ny\n\n  \nz",
    "bom_and_unicode_blanks": "\ufeffx\n\u00a0\n\u2003 \ny\n",
    "bom_then_blank": "\ufeff\n{\"a\": 1}\n",
    "empty": "",
    "only_newlines": "\n\n",
    "crlf": "a\r\nb\r\n",
}


@pytest.mark.parametrize("name", sorted(TRICKY_TEXT))
@pytest.mark.parametrize("make", [
    lambda: TextLinesReader(),
    lambda: TextLinesReader(skip_blank=True),
    lambda: TextLinesReader(skip_blank=True, encoding="utf-8-sig"),
    lambda: TextLinesReader(encoding="utf-16"),
], ids=["text", "text-skip-blank", "text-sig", "text-utf16"])
def test_fast_line_count_matches_reading(tmp_path, name, make):
    """``count`` (ranks split by it) counts newlines without decoding, and agrees with reading."""
    reader = make()
    path = tmp_path / "f.txt"
    path.write_bytes(TRICKY_TEXT[name].encode(reader.encoding))
    assert reader.count(str(path)) == sum(len(p[reader.field]) for p in reader.iter_file(str(path)))


@pytest.mark.parametrize("text", ['{"a":1}\n\n  \n{"a":2}', '\ufeff{"a":1}\n\u00a0\n{"a":3}\n', "",
                                  '\ufeff\n{"a":1}\n', '{"a":1}\r\n\r\n{"a":2}'])
def test_fast_jsonl_count_matches_reading(tmp_path, text):
    path = tmp_path / "f.jsonl"
    path.write_bytes(text.encode("utf-8"))
    reader = JsonLinesReader()
    assert reader.count(str(path)) == sum(len(p["a"]) for p in reader.iter_file(str(path)))


# ---------------------------------------------------------------- issue 18: malformed input


def test_a_csv_with_an_unterminated_quote_names_the_line(tmp_path):
    path = write(tmp_path, "open.csv", 'a,b\n1,2\n3,"never closed\n4,5\n6,7\n')
    for call in both_ways(CSVReader(piece_size=1), path):
        error = raises_naming(path, call, "line 3", "unterminated quoted field")
        assert isinstance(error.__cause__, csv.Error)


def test_a_csv_with_text_after_a_closing_quote_names_the_line_and_its_record(tmp_path):
    path = write(tmp_path, "after.csv", 'a,b\n1,"two\nlines" and more,2\n')
    for call in both_ways(CSVReader(), path):
        raises_naming(path, call, "line 3", "record starting on line 2")


def npy_bytes(shape, descr="<f8", data=b"", fortran_order=False):
    """A ``.npy`` file whose header says ``shape`` whatever ``data`` holds."""
    buf = io.BytesIO()
    npformat.write_array_header_1_0(buf, {"descr": descr, "fortran_order": fortran_order, "shape": shape})
    return buf.getvalue() + data


def all_three(reader, path):
    return both_ways(reader, path) + [lambda: reader.count(path)]


@pytest.mark.parametrize("shape, fortran_order", [((-5,), False), ((3, -2), False), ((0, -1), False),
                                                  ((-2, 3), True), ((True,), False)])
@pytest.mark.parametrize("mmap", [True, False])
def test_an_npy_header_with_a_negative_or_non_integer_shape_is_an_error_naming_the_file(
        tmp_path, shape, fortran_order, mmap):
    path = write(tmp_path, "bad.npy", npy_bytes(shape, data=b"\0" * 64, fortran_order=fortran_order))
    for call in all_three(NumpyReader(mmap=mmap), path):
        raises_naming(path, call, "shape")


@pytest.mark.parametrize("shape", [(1000,), (2 ** 62,), (2 ** 40, 2 ** 40)])
@pytest.mark.parametrize("mmap", [True, False])
def test_an_npy_header_promising_more_data_than_the_file_holds_fails_before_reading_and_in_count(
        tmp_path, shape, mmap):
    path = write(tmp_path, "short.npy", npy_bytes(shape, data=np.arange(10.0).tobytes()))
    for call in all_three(NumpyReader(mmap=mmap, piece_size=4), path):
        raises_naming(path, call, "truncated", "80")


def test_an_npz_member_whose_header_lies_is_an_error_naming_the_file(tmp_path):
    path = str(tmp_path / "bad.npz")
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("ok.npy", npy_bytes((2,), data=np.zeros(2).tobytes()))
        archive.writestr("neg.npy", npy_bytes((-2,)))
    for call in all_three(NumpyReader(), path):
        raises_naming(path, call, "shape")
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("big.npy", npy_bytes((1000,), data=np.zeros(2).tobytes()))
    for call in all_three(NumpyReader(), path):
        raises_naming(path, call, "truncated")


# Lines end at "\n" alone: the other characters str.splitlines breaks at stay inside a line.
LINE_ENDS = {
    "separators_x1c_to_x1f": ("a\n\x1c\n\x1d\x1e\x1f\nb\x1cc\n", ["a", "\x1c", "\x1d\x1e\x1f", "b\x1cc"]),
    "next_line_x85": ("a\n\x85\nb\x85c\n", ["a", "\x85", "b\x85c"]),
    "line_separator_u2028": ("a\n\u2028\u2029\nb\u2028c", ["a", "\u2028\u2029", "b\u2028c"]),
    "crlf_and_lone_cr": ("a\r\n\r\nb\rc\r\n", ["a", "", "b\rc"]),
    "no_final_newline": ("a\n\x1c", ["a", "\x1c"]),
    "byte_order_mark_only": ("\ufeff", ["\ufeff"]),
}


@pytest.mark.parametrize("name", sorted(LINE_ENDS))
@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "latin-1", "utf-16"])
def test_text_count_and_reading_split_lines_only_at_newline(tmp_path, name, encoding):
    text, lines = LINE_ENDS[name]
    if encoding == "latin-1":  # its own separators, \x85 and \x1c, and no byte order mark
        latin = str.maketrans({"\u2028": "\x85", "\u2029": "\x1c", "\ufeff": "\xff"})
        text, lines = text.translate(latin), [line.translate(latin) for line in lines]
    if encoding == "utf-8-sig":  # written as UTF-8: a lone byte order mark is what the codec drops
        lines = [] if text == "\ufeff" else lines
    path = write(tmp_path, "t.txt", text.encode("utf-8" if encoding == "utf-8-sig" else encoding))
    for skip_blank, expected in ((False, lines), (True, [line for line in lines if line.strip()])):
        reader = TextLinesReader(encoding=encoding, skip_blank=skip_blank, piece_size=2)
        assert reader.read_file(path)[0]["text"] == expected
        assert reader.count(path) == len(expected) == sum(len(p["text"]) for p in reader.iter_file(path))


@pytest.mark.parametrize("blank", ["\x1c", "\x1d\x1e\x1f", " \x1f\t", "\x85", "\u2028", "\u3000\r"])
def test_jsonl_count_agrees_with_reading_when_a_line_holds_only_unicode_whitespace(tmp_path, blank):
    text = '{"a": "x\u2028y\x85"}\n' + blank + '\n{"a": 2}\r\n' + blank + "\n" + '{"a": 3}'
    path = write(tmp_path, "d.jsonl", text)
    reader = JsonLinesReader(piece_size=1)
    assert reader.read_file(path) == ({"a": ["x\u2028y\x85", 2, 3]}, 3)
    assert reader.count(path) == 3


def test_fast_counting_is_left_to_reading_for_codecs_whose_bytes_cannot_tell(tmp_path):
    """Escapes and shifts (unicode_escape, ISO-2022) hide blanks and line ends from the raw bytes."""
    cases = {"unicode-escape": b"a\n\\u2028\nb\n", "iso2022_jp": "a\n\u3000\nb\n".encode("iso2022_jp")}
    for encoding, data in cases.items():
        path = write(tmp_path, "t.txt", data)
        reader = TextLinesReader(encoding=encoding, skip_blank=True)
        assert reader.read_file(path) == ({"text": ["a", "b"]}, 2)
        assert reader.count(path) == 2


class _Cycle:
    """Garbage whose collection runs Python code (``__del__``), so other threads get the GIL meanwhile."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        sum(range(50))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mmap", [True, False])
def test_npy_headers_read_by_many_threads_at_once_never_fail(tmp_path, mmap):
    """NumPy parses headers with ast, whose state CPython 3.11 shares between threads: two parses at once
    could fail with SystemError (python/cpython#106905) while the loader counted or read files in threads."""
    import gc
    import sys
    import threading

    path = save_npy(tmp_path, "a.npy", np.zeros((5, 3), np.float32))
    reader = NumpyReader(mmap=mmap)
    errors: list = []

    def count_often() -> None:
        for _ in range(3000):
            try:
                assert reader.count(path) == 5
            except Exception as exc:  # noqa: BLE001  # the failure is the test's result
                errors.append(exc)
                return
            _Cycle()

    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    gc.set_threshold(50)  # and collect garbage often: inside a parse too
    try:
        threads = [threading.Thread(target=count_often) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)
    assert errors == []
