"""Chunk files in the formats pyloader's readers read: JSON lines, Parquet, webdataset tar, ``.npy``/``.npz``.

Contracts:

- A ``Chunk`` takes samples (dicts) one at a time (``add`` returns the bytes the sample adds before
  compression, so a chunk is cut at ``chunk_bytes`` of uncompressed data) and ``encoded()`` is the
  file's bytes, compressed as asked. The same samples always give the same bytes: gzip's header has
  no time, a tar member no time, owner or mode of the writing machine.
- ``jsonl``: one JSON object per line (orjson when installed; NumPy values become numbers and
  lists); ``bytes`` values cannot be written (``TypeError`` naming the field). ``tar``: a sample's
  fields are its members' extensions (``__key__`` names the member, else the sample's place in the
  output, ``<task>-<n>``); ``bytes`` are written as they are, ``str`` as UTF-8, numbers as text, arrays as ``.npy``,
  lists and dicts as JSON. ``npy``: every sample has one field, an array (or number) of one shape
  and dtype, stacked. ``npz``: one array per field. ``parquet``: one column per field, pyarrow's types, in row groups of
  about ``ROW_GROUP_BYTES`` (the pieces ``ParquetReader`` reads: a loader's first batch waits for one
  row group, not for the whole chunk).
- ``compression``: for ``jsonl``, ``tar`` and ``npy``, a codec of ``_storage.compression`` (``gzip``,
  ``zstd``, ``bz2``, ``xz``) added to the name as the readers expect (``.jsonl.zst``); for
  ``parquet``, a codec of Parquet's own (``snappy``, ``zstd``, ``gzip``, ``brotli``, ``lz4``,
  ``none``); ``npz`` takes none.
"""
from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import tarfile
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

import numpy as np

Sample = Dict[str, object]
KEY = "__key__"  # TarReader's key column
_SUFFIX_OF = {"gzip": ".gz", "zstd": ".zst", "bz2": ".bz2", "xz": ".xz"}
ROW_GROUP_BYTES = 1 << 20  # of a Parquet chunk's row groups, in memory (pyarrow's own default: a million rows)
_PARQUET_CODECS = ("snappy", "zstd", "gzip", "brotli", "lz4", "none")
# the reader of each format, by the name `python -m pyloader index --reader` takes
READER_OF = {"jsonl": "jsonl", "parquet": "parquet", "tar": "tar", "npy": "npy", "npz": "npy"}
FORMATS = tuple(READER_OF)


def _zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=3).compress(data)


_COMPRESS: Dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda data: gzip.compress(data, mtime=0), "bz2": bz2.compress, "xz": lzma.compress, "zstd": _zstd}
# the compressions each format's reader reads
_ALLOWED: Dict[str, Tuple[str, ...]] = {**dict.fromkeys(("jsonl", "tar", "npy"), tuple(_SUFFIX_OF)),
                                        "parquet": _PARQUET_CODECS, "npz": ()}


def _compress(data: bytes, codec: Optional[str]) -> bytes:
    return data if codec is None else _COMPRESS[codec](data)


def check(format: str, compression: Optional[str]) -> None:
    """``ValueError`` for an unknown format, or a compression the format's reader does not read."""
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}: expected one of {list(FORMATS)}")
    allowed = _ALLOWED[format]
    if compression is not None and compression not in allowed:
        raise ValueError(f"compression {compression!r} is not one the {format} reader reads: expected "
                         f"{list(allowed) if allowed else 'none (an .npz is a zip archive)'} or None")
    if compression == "zstd" and format != "parquet":
        try:
            import zstandard  # noqa: F401
        except ImportError as exc:
            raise ImportError("compression='zstd' needs the zstandard package: "
                              "pip install 'pyloader-ml[compression]'") from exc


def suffix(format: str, compression: Optional[str]) -> str:
    """The name's ending: ``.jsonl``, ``.tar.gz``, ``.npy.zst``, ``.parquet``."""
    own = {"jsonl": ".jsonl", "parquet": ".parquet", "tar": ".tar", "npy": ".npy", "npz": ".npz"}[format]
    return own + (_SUFFIX_OF[compression] if compression and format != "parquet" else "")


# -- JSON lines -------------------------------------------------------------------------
def _plain(value: object) -> object:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"a value of type {type(value).__name__} cannot be written as JSON")


def _json_dumps() -> Callable[[Sample], bytes]:
    try:
        import orjson
    except ImportError:
        return lambda sample: json.dumps(sample, default=_plain, ensure_ascii=False).encode()
    options = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS

    def dumps(sample: Sample) -> bytes:
        try:
            return orjson.dumps(sample, default=_plain, option=options)
        except orjson.JSONEncodeError as exc:  # a TypeError: as json's own
            raise TypeError(str(exc)) from exc.__cause__

    return dumps


class Chunk:
    """One chunk file being made; subclasses encode a format."""

    def __init__(self, compression: Optional[str]) -> None:
        self.compression = compression
        self.samples = 0

    def add(self, sample: Sample) -> int:
        raise NotImplementedError

    def data(self) -> bytes:
        """The file's bytes before compression."""
        raise NotImplementedError

    def encoded(self) -> bytes:
        return _compress(self.data(), self.compression)


class JsonLinesChunk(Chunk):
    def __init__(self, compression: Optional[str]) -> None:
        super().__init__(compression)
        self._lines: List[bytes] = []
        self._dumps = _json_dumps()

    def add(self, sample: Sample) -> int:
        line = self._dumps(sample) + b"\n"
        self._lines.append(line)
        self.samples += 1
        return len(line)

    def data(self) -> bytes:
        return b"".join(self._lines)


def _member_bytes(ext: str, value: object) -> bytes:
    """A tar member's bytes for a field's value (see the module's contract)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, np.ndarray):
        out = io.BytesIO()
        np.save(out, value, allow_pickle=False)
        return out.getvalue()
    if isinstance(value, (bool, int, float, np.generic)):
        return str(value.item() if isinstance(value, np.generic) else value).encode()
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=_plain).encode()
    raise TypeError(f"field {ext!r}: a value of type {type(value).__name__} cannot be a tar member "
                    "(bytes, str, a number, an array, a list or a dict can)")


class TarChunk(Chunk):
    """A tar archive as ``tarfile`` writes one in the PAX format (mode 0644, mtime 0), each member's header
    made here where a plain ustar header holds it (``tarfile`` builds a header three times slower)."""

    def __init__(self, compression: Optional[str]) -> None:
        super().__init__(compression)
        self._parts: List[bytes] = []
        self._size = 0

    def add(self, sample: Sample) -> int:
        key = str(sample[KEY])
        before = self._size
        for ext, value in sample.items():
            if ext == KEY:
                continue
            data = _member_bytes(ext, value)
            self._parts += (_tar_header(f"{key}.{ext}", len(data)), data, _NUL * (-len(data) % _BLOCK))
            self._size += len(self._parts[-3]) + len(data) + len(self._parts[-1])
        self.samples += 1
        return self._size - before

    def data(self) -> bytes:
        end = self._size + 2 * _BLOCK  # the two zero blocks that end an archive, then a whole record
        return b"".join(self._parts) + _NUL * (2 * _BLOCK + -end % tarfile.RECORDSIZE)


_BLOCK, _NUL = tarfile.BLOCKSIZE, b"\0"


def _tar_header(name: str, size: int) -> bytes:
    """A regular file's header: ustar where the name is ASCII of at most 100 bytes and the size fits
    11 octal digits, else ``tarfile``'s own (with a PAX header before it)."""
    if len(name) > 100 or not name.isascii() or size >= 8 ** 11:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = size, 0o644, 0
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    raw, digits = name.encode("ascii"), b"%011o\0" % size
    checksum = _USTAR_SUM + sum(raw) + sum(digits)  # of the header with its own field as spaces
    return b"".join((raw, _NUL * (100 - len(raw)), _USTAR_MODES, digits, _USTAR_MTIME, b"%06o\0 " % checksum,
                     _USTAR_TAIL))


_USTAR_MODES = b"0000644\0" + b"0000000\0" * 2  # mode, uid, gid
_USTAR_MTIME = b"00000000000\0"
_USTAR_TAIL = tarfile.REGTYPE + _NUL * 100 + tarfile.POSIX_MAGIC + _NUL * (_BLOCK - 265)
_USTAR_SUM = sum(_USTAR_MODES) + sum(_USTAR_MTIME) + sum(b" " * 8) + sum(_USTAR_TAIL)


class ColumnsChunk(Chunk):
    """Samples kept as columns, encoded whole at the end (Parquet, ``.npy``, ``.npz``)."""

    def __init__(self, compression: Optional[str], format: str) -> None:
        super().__init__(compression)
        self.format = format
        self._columns: Dict[str, List[object]] = {}

    def add(self, sample: Sample) -> int:
        if self.format == "npy" and len(sample) != 1:
            raise ValueError(f"format 'npy' writes samples of one field (an .npy file is one array), "
                             f"got the fields {sorted(sample)}: use 'npz' for several")
        if self._columns and sample.keys() != self._columns.keys():
            raise ValueError(f"every sample of a chunk must have the same fields: {sorted(self._columns)}, "
                             f"then {sorted(sample)}")
        size = 0
        for name, value in sample.items():
            self._columns.setdefault(name, []).append(value)
            size += _size_of(value)
        self.samples += 1
        return size

    def data(self) -> bytes:
        out = io.BytesIO()
        {"parquet": _parquet, "npy": _npy, "npz": _npz}[self.format](out, self._columns, self.compression)
        return out.getvalue()

    def encoded(self) -> bytes:
        return self.data() if self.format != "npy" else super().encoded()


def _parquet(out: io.BytesIO, columns: Dict[str, List[object]], compression: Optional[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({name: _arrow_column(values) for name, values in columns.items()})
    rows = max(1, table.num_rows * ROW_GROUP_BYTES // max(1, table.nbytes))
    pq.write_table(table, out, compression=compression or "snappy", row_group_size=rows)


def _stacked(values: List[object]) -> np.ndarray:
    return np.stack([np.asarray(v) for v in values])


def _npy(out: io.BytesIO, columns: Dict[str, List[object]], compression: Optional[str]) -> None:
    (values,) = columns.values()
    np.save(out, _stacked(values), allow_pickle=False)


def _npz(out: io.BytesIO, columns: Dict[str, List[object]], compression: Optional[str]) -> None:
    arrays: Dict[str, Any] = {name: _stacked(values) for name, values in columns.items()}  # savez's **kwds
    np.savez(out, **arrays)


def _arrow_column(values: List[object]) -> object:
    import pyarrow as pa

    if values and isinstance(values[0], np.ndarray) and values[0].ndim == 1:
        return pa.array([cast(np.ndarray, v).tolist() for v in values])
    return pa.array(values)


def _size_of(value: object) -> int:
    """About the bytes a value takes in a columnar file, before compression."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(_size_of(v) for v in value)
    return 8


def new_chunk(format: str, compression: Optional[str]) -> Chunk:
    """An empty chunk of ``format`` (a tar sample must hold its ``__key__``)."""
    if format == "jsonl":
        return JsonLinesChunk(compression)
    if format == "tar":
        return TarChunk(compression)
    return ColumnsChunk(None if format == "npz" else compression, format)
