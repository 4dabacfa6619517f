"""``pyloader.readers.TarReader``: webdataset-style shards, checked against shards ``tarfile`` and webdataset write."""
from __future__ import annotations

import gzip
import io
import json
import re
import tarfile
import uuid
from pathlib import Path
from typing import Any, Dict, List, Sequence

import numpy as np
import pytest
from conftest import few_positions, spread_positions

import pyloader as pl
from pyloader._columns import concat
from pyloader.collators import NumpyCollator
from pyloader.readers import TarReader, decode_image
from pyloader.readers._base import FileFormatError
from pyloader.testing import check_resume

pytestmark = pytest.mark.timeout(120)

Image = pytest.importorskip("PIL.Image", reason="Pillow is the test extra's (and the image extra's)")


def jpeg(seed: int, size=(12, 16)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(*size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=95)
    return out.getvalue()


def png(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(5, 7, 3), dtype=np.uint8)


def png_bytes(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def sample(i: int) -> Dict[str, bytes]:
    npy = io.BytesIO()
    np.save(npy, np.arange(3) * i)
    return {"jpg": jpeg(i), "cls": str(i % 3).encode(), "json": json.dumps({"id": i}).encode(),
            "txt": f"caption {i}".encode(), "seg.png": png_bytes(png(i)), "npy": npy.getvalue(), "bin": bytes([i])}


def write_shard(path: Path, samples: Sequence[tuple], mode: str = "w") -> str:
    """``samples``: ``(key, {ext: bytes})`` in order; members written key by key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, mode) as tar:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(path)


def numbered(ids: Sequence[int], folder: str = "") -> List[tuple]:
    return [(f"{folder}{i:06d}", sample(i)) for i in ids]


def test_a_tarfile_shard_reads_as_one_sample_per_key_with_a_column_per_extension_decoded(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "shard-0.tar", numbered(range(5), "train/"))
    columns, n = TarReader().read_file(path)
    assert n == 5
    assert list(columns) == ["__key__", "bin", "cls", "jpg", "json", "npy", "seg.png", "txt"]
    assert columns["__key__"] == [f"train/{i:06d}" for i in range(5)]
    assert columns["cls"] == [i % 3 for i in range(5)]
    assert columns["json"] == [{"id": i} for i in range(5)]
    assert columns["txt"] == [f"caption {i}" for i in range(5)]
    assert columns["bin"] == [bytes([i]) for i in range(5)]
    for i in range(5):
        np.testing.assert_array_equal(columns["npy"][i], np.arange(3) * i)
        np.testing.assert_array_equal(columns["seg.png"][i], png(i))  # lossless: the very pixels
        image = columns["jpg"][i]
        assert image.dtype == np.uint8 and image.shape == (12, 16, 3)
        np.testing.assert_array_equal(image, decode_image(jpeg(i)))


def test_iter_file_streams_pieces_that_join_to_read_file_and_count_decodes_nothing(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "shard.tar", numbered(range(7)))
    decoded: List[bytes] = []
    reader = TarReader(piece_size=3, decode={"bin": lambda b: decoded.append(b) or b[0]})
    pieces = list(reader.iter_file(path))
    assert [len(p["__key__"]) for p in pieces] == [3, 3, 1]
    columns, n = reader.read_file(path)
    assert n == 7 and concat(pieces)["bin"] == columns["bin"] == list(range(7))
    decoded.clear()
    assert reader.count(path) == 7 and decoded == []


def test_keep_reads_only_those_extensions_and_decode_false_gives_bytes(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "shard.tar", numbered(range(3)))
    columns, _ = TarReader(keep=["cls", "jpg"], decode=False).read_file(path)
    assert list(columns) == ["__key__", "cls", "jpg"]
    assert columns["cls"] == [b"0", b"1", b"2"] and columns["jpg"] == [jpeg(i) for i in range(3)]
    columns, _ = TarReader(keep=["jpg"], decode={"jpg": None}).read_file(path)
    assert columns["jpg"] == [jpeg(i) for i in range(3)]
    gray, _ = TarReader(keep=["jpg"], image_mode="L").read_file(path)
    assert gray["jpg"][0].shape == (12, 16)


@pytest.mark.parametrize("name, mode", [("shard.tar.gz", "w:gz"), ("shard.tgz", "w:gz"), ("shard.tar.bz2", "w:bz2")])
def test_a_compressed_shard_reads_like_a_plain_one(tmp_path: Path, name: str, mode: str) -> None:
    plain = TarReader(keep=["cls", "txt"]).read_file(write_shard(tmp_path / "plain.tar", numbered(range(4))))
    assert TarReader(keep=["cls", "txt"]).read_file(write_shard(tmp_path / name, numbered(range(4)), mode)) == plain


def test_a_remote_shard_reads_through_open_file(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec", reason="fsspec is the remote extra's")
    local = write_shard(tmp_path / "shard.tar", numbered(range(3)))
    url = f"memory://pyloader-tests/{uuid.uuid4().hex}/shard.tar"
    fsspec.filesystem("memory").pipe(url, Path(local).read_bytes())
    reader = TarReader(keep=["cls", "json"])
    assert reader.read_file(url) == reader.read_file(local) and reader.count(url) == 3


def test_a_sample_missing_a_member_names_the_shard_and_the_member(tmp_path: Path) -> None:
    samples = numbered(range(3))
    del samples[1][1]["cls"]
    path = write_shard(tmp_path / "shard.tar", samples)
    with pytest.raises(FileFormatError, match=r"shard .*shard\.tar.*sample '000001' has no member '000001\.cls'"):
        TarReader().read_file(path)
    with pytest.raises(FileFormatError, match=r"'000001' has no member '000001\.cls'"):
        TarReader().count(path)
    with pytest.raises(FileFormatError, match=r"no member '000001\.cls'"):
        TarReader(keep=["cls"]).read_file(path)
    assert TarReader(keep=["txt"]).count(path) == 3  # what is not kept may be missing


def test_a_sample_with_an_extension_the_first_has_not_names_the_member(tmp_path: Path) -> None:
    samples = numbered(range(2))
    samples[1][1]["extra"] = b"x"
    with pytest.raises(FileFormatError, match=r"member '000001\.extra': sample '000001' has extension 'extra'"):
        TarReader().read_file(write_shard(tmp_path / "shard.tar", samples))


def test_a_key_that_comes_again_and_a_member_without_extension_are_errors(tmp_path: Path) -> None:
    again = write_shard(tmp_path / "again.tar", [("a", {"cls": b"1"}), ("b", {"cls": b"2"}), ("a", {"txt": b"x"})])
    with pytest.raises(FileFormatError, match=r"again\.tar.*member 'a\.txt': key 'a' comes again"):
        TarReader().read_file(again)
    bare = write_shard(tmp_path / "bare.tar", [("a", {"cls": b"1"})])
    with tarfile.open(bare, "a") as tar:
        info = tarfile.TarInfo("README")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(FileFormatError, match=r"member 'README' has no extension"):
        TarReader().read_file(bare)


def test_a_truncated_shard_delivers_the_pieces_before_the_damage_then_names_the_shard(tmp_path: Path) -> None:
    path = tmp_path / "shard.tar"
    write_shard(path, numbered(range(6)))
    data = path.read_bytes()
    path.write_bytes(data[:len(data) * 2 // 3])
    pieces = []
    damage = r"shard .*shard\.tar.*corrupt or truncated after member '0000\d\d\."
    with pytest.raises(FileFormatError, match=damage) as e:
        for piece in TarReader(piece_size=1).iter_file(str(path)):
            pieces.append(piece)
    assert 2 <= len(pieces) < 6  # streamed: the samples before the damage came first
    assert isinstance(e.value.__cause__, (tarfile.TarError, EOFError))
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(b"not gzip at all")
    with pytest.raises(FileFormatError, match=r"garbage\.tar\.gz.*corrupt or truncated at its start"):
        TarReader().read_file(str(garbage))


def test_a_member_that_does_not_decode_names_the_shard_and_member(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "shard.tar", [("a", {"jpg": b"not a jpeg", "cls": b"1"})])
    with pytest.raises(FileFormatError, match=r"shard\.tar.*member 'a\.jpg': cannot decode 'jpg'") as e:
        TarReader().read_file(path)
    assert e.value.__cause__ is not None


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="keep"):
        TarReader(keep="jpg")
    with pytest.raises(ValueError, match="decode"):
        TarReader(decode={"jpg": 3})
    with pytest.raises(ValueError, match="piece_size"):
        TarReader(piece_size=0)


def test_a_shard_webdataset_shardwriter_wrote_reads_sample_for_sample(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset", reason="webdataset is the bench extra's: pip install pyloader-ml[bench]")
    pattern = str(tmp_path / "wds-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=4, verbose=0) as sink:
        for i in range(10):
            sink.write({"__key__": f"s{i:04d}", "jpg": jpeg(i), "cls": i % 3, "json": {"id": i}, "txt": f"t{i}"})
    shards = sorted(str(p) for p in tmp_path.glob("wds-*.tar"))
    assert len(shards) == 3
    reader = TarReader()
    rows = [reader.read_file(s)[0] for s in shards]
    got = concat(rows)
    assert got["__key__"] == [f"s{i:04d}" for i in range(10)]
    assert got["cls"] == [i % 3 for i in range(10)] and got["json"] == [{"id": i} for i in range(10)]
    assert got["txt"] == [f"t{i}" for i in range(10)]
    for i in range(10):
        np.testing.assert_array_equal(got["jpg"][i], decode_image(jpeg(i)))
    assert [reader.count(s) for s in shards] == [4, 4, 2]


class _KeysOnly(pl.Dataset):
    def batch_encode(self, batch_data: Dict[str, Any]) -> Dict[str, Any]:
        return {"key": list(batch_data["__key__"]), "cls": list(batch_data["cls"])}


def _shards(tmp_path: Path) -> Path:
    folder = tmp_path / "shards"
    start = 0
    for k, size in enumerate([5, 3, 6, 2]):
        write_shard(folder / f"shard-{k:03d}.tar", numbered(range(start, start + size)))
        start += size
    return folder


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_over_shards_gives_every_sample_once_with_workers_and_ranks(tmp_path: Path, num_workers: int) -> None:
    folder = _shards(tmp_path)

    def keys(**kwargs: Any) -> List[str]:
        loader = pl.DataLoader(TarReader(3, keep=["cls"], piece_size=2), _KeysOnly(), NumpyCollator(), str(folder),
                               num_workers=num_workers, **kwargs)
        try:
            return [k for batch in loader for k in batch["key"]]
        finally:
            loader.close()

    assert keys() == [f"{i:06d}" for i in range(16)]
    assert sorted(keys(shuffle=True)) == [f"{i:06d}" for i in range(16)]
    ranked = [keys(ranks=pl.Ranks(rank=r, world_size=2, even_batches="drop")) for r in range(2)]
    assert not set(ranked[0]) & set(ranked[1]) and len(ranked[0]) == len(ranked[1])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_over_shards_resumes_exactly(tmp_path: Path, num_workers: int) -> None:
    folder = _shards(tmp_path)
    check_resume(lambda: pl.DataLoader(TarReader(3, keep=["cls", "jpg"], piece_size=2), _KeysOnly(), NumpyCollator(),
                                       str(folder), num_epoch=2, shuffle=True, shuffle_buffer=4,
                                       num_workers=num_workers), few_positions if num_workers else spread_positions)


def test_gzip_module_shards_read(tmp_path: Path) -> None:
    raw = tmp_path / "raw.tar"
    write_shard(raw, numbered(range(2)))
    gz = tmp_path / "shard.tar.gz"
    gz.write_bytes(gzip.compress(raw.read_bytes()))
    assert TarReader(keep=["cls"]).read_file(str(gz))[0]["cls"] == [0, 1]


def _cut_shards(tmp_path: Path) -> Dict[str, tuple]:
    """Shards of 4 samples cut where ``tarfile`` in stream mode would take the cut for the end: each
    with the samples before the cut (a sample whose next member is cut off may have more members)."""
    path = write_shard(tmp_path / "whole.tar", [(f"{i:06d}", {"cls": b"1", "txt": b"t"}) for i in range(4)])
    data = Path(path).read_bytes()
    third = 2 * 2 * 2 * 512  # the first header of the third sample: 2 samples of 2 members, a header and a block each
    end = 4 * 2 * 2 * 512  # the first of the two zero blocks that end the archive
    header = bytearray(data[:third + 512])
    header[third] ^= 0xFF  # a damaged header: its checksum fails
    cases = {"at a header": (data[:third], 1), "inside a header": (data[:third + 100], 1),
             "at the end blocks": (data[:end], 3), "after one end block": (data[:end + 512], 3),
             "a damaged header": (bytes(header), 1)}
    return {name: (str(_written(tmp_path / f"cut-{k}.tar", cut)), before)
            for k, (name, (cut, before)) in enumerate(cases.items())}


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", ["at a header", "inside a header", "at the end blocks", "after one end block",
                                  "a damaged header"])
def test_a_shard_cut_at_or_inside_a_header_is_an_error_naming_it_and_count_does_not_agree(
        tmp_path: Path, case: str) -> None:
    path, before = _cut_shards(tmp_path)[case]
    damage = rf"shard {re.escape(repr(path))}: corrupt or truncated after member .*no end of archive"
    with pytest.raises(FileFormatError, match=damage) as e:
        TarReader().count(path)
    assert isinstance(e.value.__cause__, tarfile.TarError)
    with pytest.raises(FileFormatError, match=damage):
        TarReader().read_file(path)
    pieces: List[Dict[str, list]] = []
    with pytest.raises(FileFormatError, match=damage):
        pieces.extend(TarReader().iter_file(path))  # type: ignore[arg-type]
    assert [k for p in pieces for k in p["__key__"]] == [f"{i:06d}" for i in range(before)]
    compressed = tmp_path / "cut.tar.gz"
    compressed.write_bytes(gzip.compress(Path(path).read_bytes()))
    with pytest.raises(FileFormatError, match=r"cut\.tar\.gz.*no end of archive"):
        TarReader().count(str(compressed))


def test_complete_shards_end_as_tar_archives_do(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "shard.tar", numbered(range(2)))
    data = Path(path).read_bytes()
    end = data.rstrip(b"\0")
    ends = len(end) + (-len(end)) % 512  # where the end blocks begin
    bare = _written(tmp_path / "bare.tar", data[:ends + 1024])  # two zero blocks, no padding to a record
    assert TarReader(keep=["cls"]).count(str(bare)) == 2
    empty = write_shard(tmp_path / "empty.tar", [])
    assert TarReader().count(empty) == 0 and TarReader().read_file(empty) == ({}, 0)


@pytest.mark.parametrize("damage", ["an undecodable member", "a missing member", "a cut member"])
def test_iter_file_delivers_every_sample_before_a_damaged_member(tmp_path: Path, damage: str) -> None:
    samples = [(f"{i:06d}", {"cls": str(i).encode(), "json": json.dumps({"id": i}).encode()}) for i in range(5)]
    if damage == "an undecodable member":
        samples[3][1]["json"] = b"{not json"
    elif damage == "a missing member":
        del samples[3][1]["json"]
    path = write_shard(tmp_path / "shard.tar", samples)
    if damage == "a cut member":
        data = Path(path).read_bytes()
        Path(path).write_bytes(data[:(3 * 4 + 1) * 512 + 2])  # inside the data of sample 3's first member
    pieces = []
    with pytest.raises(FileFormatError, match=r"shard\.tar.*'000003"):
        for piece in TarReader().iter_file(path):  # piece_size 256: the samples before it in a shorter piece
            pieces.append(piece)
    assert pieces == [{"__key__": [f"{i:06d}" for i in range(3)], "cls": [0, 1, 2],
                       "json": [{"id": i} for i in range(3)]}]


class _Ids(pl.Dataset):
    def batch_encode(self, batch_data: Dict[str, Any]) -> Dict[str, Any]:
        return {"id": list(batch_data["cls"])}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_skipping_a_damaged_shard_delivers_its_samples_before_the_damage(
        tmp_path: Path, num_workers: int, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "shards"
    bad = [(f"a{i:04d}", {"cls": str(i).encode(), "jpg": jpeg(i)}) for i in range(6)]
    bad[4][1]["jpg"] = b"not a jpeg"
    write_shard(folder / "a.tar", bad)
    write_shard(folder / "b.tar", [(f"b{i:04d}", {"cls": str(i).encode(), "jpg": jpeg(i)}) for i in range(10, 13)])
    with pl.DataLoader(TarReader(2), _Ids(), NumpyCollator(), str(folder), on_error="skip",
                       num_workers=num_workers) as loader:
        got = sorted(int(i) for batch in loader for i in batch["id"])
        assert loader.stats["skipped_files"] == 1
    assert got == [0, 1, 2, 3, 10, 11, 12]
    assert "member 'a0004.jpg': cannot decode 'jpg'" in caplog.text


@pytest.mark.parametrize("format", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT],
                         ids=["ustar", "gnu", "pax"])
def test_an_uncompressed_shard_read_by_hand_gives_what_tarfile_reads_of_the_same_archive(
        tmp_path: Path, format: int) -> None:
    deep = "d" * 60 + "/" + "e" * 60  # a name over 100 bytes: a ustar prefix, a GNU long name or a PAX path
    members = [(f"{deep}/{i:03d}", {"cls": str(i).encode(), "txt": b"x" * (i * 300)}) for i in range(5)]
    if format != tarfile.USTAR_FORMAT:
        members.append(("caf\u00e9/" + "n" * 120, {"cls": b"9", "txt": b"long and not ASCII"}))
    raw = tmp_path / "shard.tar"
    with tarfile.open(raw, "w", format=format) as tar:
        folder = tarfile.TarInfo("a-folder")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for key, fields in members:
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            link = tarfile.TarInfo(f"{key}.lnk")
            link.type, link.linkname = tarfile.SYMTYPE, "elsewhere"
            tar.addfile(link)
    compressed = tmp_path / "shard.tar.gz"  # the same archive, read by tarfile
    compressed.write_bytes(gzip.compress(raw.read_bytes()))
    by_hand, counted = TarReader(decode=False).read_file(str(raw)), TarReader().count(str(raw))
    assert by_hand == TarReader(decode=False).read_file(str(compressed))
    assert by_hand[0]["__key__"] == [key for key, _ in members] and counted == len(members)
    assert by_hand[0]["txt"][3] == b"x" * 900
