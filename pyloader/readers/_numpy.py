"""NumPy ``.npy`` and ``.npz`` files, read as array columns."""
from __future__ import annotations

import contextlib
import math
import os
import zipfile
import zlib
from typing import IO, Any, Dict, Iterator, Optional, Tuple, cast

import numpy as np
from numpy.lib import format as npformat

from .._abc import DataReader
from .._columns import Columns
from .._npy import HEADER_PARSE, populate, register_mapped
from .._paths import local_path
from .._storage.compression import DecompressionError, codec_for
from .._storage.files import is_url, open_file
from ._base import FileFormatError, check_piece_size, file_error

__all__ = ["NumpyReader"]

_UNREADABLE = (ValueError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError)
# the header readers of the format versions read a row at a time (NumPy alone reads 3.0, whole)
_READ_HEADER = {(1, 0): npformat.read_array_header_1_0, (2, 0): npformat.read_array_header_2_0}


class NumpyReader(DataReader):
    """Reads ``.npy`` / ``.npz`` files into NumPy array columns (rows = first axis).

    A ``.npy`` file gives one column, ``key``; a ``.npz`` archive gives one column
    per array, named as in the archive, all of one first-axis length. The format
    is told by the file's first bytes, not its name. With ``mmap=True`` a local
    ``.npy`` is memory-mapped copy-on-write (writing to the arrays never changes
    the file; the file must not change while it is read): ``read_file`` returns an
    ``np.memmap`` and ``iter_file`` hands out views of it, ``piece_size`` rows at a
    time, with no copy at all (the pages of each piece of up to 64 MiB are mapped in as it is read
    ahead, where the kernel can (Linux 5.14), so that the consumer takes no page fault on them; they
    are let go with the last batch using them); a batch that is such a
    view crosses from a worker process as (file, offset, shape, dtype) and is mapped
    again in the loader's process (``_execution.ipc``); other files are read
    through ``open_file`` (``iter_file`` reads them ``piece_size`` rows at a time,
    except Fortran-ordered arrays, which are read whole). An empty, corrupt or
    truncated file (the header is checked against the file's size before any row is
    read, and by ``count`` too), a header with a negative or non-integer shape, a
    0-d array, or unequal lengths raise ``ValueError`` naming the file (and the key).

    Example:
        ```python
        reader = NumpyReader(batch_size=16)            # a .npy gives the column "x"; a .npz one per array
        loader = DataLoader(reader, IdentityDataset(), TorchCollator(), "tokens/")
        ```
    """

    thread_safe = True  # holds no per-call state on self
    releases_gil = True  # NumPy/pyarrow work: num_workers="auto" keeps it in this process

    def __init__(self, batch_size: int = 16, shuffle: bool = False, random_seed: int = 42,
                 key: str = "x", mmap: bool = True, piece_size: int = 65536) -> None:
        super().__init__(batch_size=batch_size, shuffle=shuffle, random_seed=random_seed)
        if not isinstance(key, str):
            raise ValueError(f"key must be a string, got {key!r}")
        self.key = key
        self.mmap = bool(mmap)
        self.piece_size = check_piece_size(piece_size)

    def _maps_itself(self, path: str) -> bool:
        """Whether ``path`` is mapped rather than read (a local ``.npy`` with ``mmap``): the loader does
        not read it ahead (``_storage.bytes``)."""
        return self.mmap and not path.endswith(".npz")

    def read_file(self, path: str) -> Tuple[Dict[str, np.ndarray], int]:
        with _readable(path), contextlib.ExitStack() as stack:
            arrays = self._open(path, stack)
            n_sample = _length(path, arrays)
            return {key: rows.read(n_sample) for key, rows in arrays.items()}, n_sample

    def iter_file(self, path: str) -> Iterator[Columns]:
        with _readable(path), contextlib.ExitStack() as stack:
            arrays = self._open(path, stack)
            n_sample = _length(path, arrays)
            for _ in range(0, n_sample, self.piece_size):
                piece = {key: np.asarray(rows.read(self.piece_size)) for key, rows in arrays.items()}
                yield self.checked(path, piece)

    def count(self, path: str) -> int:
        """The rows of the file, from its headers alone."""
        with _readable(path), contextlib.ExitStack() as stack:
            return _length(path, self._open(path, stack))

    def _open(self, path: str, stack: contextlib.ExitStack) -> Dict[str, "_Rows"]:
        f = stack.enter_context(open_file(path, "rb"))
        if codec_for(path) is not None:  # a stream read once, from the start, size unknown
            if _is_archive(path, f.peek(6)[:6]):  # type: ignore[attr-defined]  # a BufferedReader
                raise file_error(path, "a compressed .npz archive is not supported (an .npz is a zip "
                                 "archive already: np.savez_compressed)")
            return {self.key: _Rows.from_stream(f, None)}
        if _is_archive(path, f.read(6)):
            f.seek(0)
            return _archive_rows(path, f, stack)
        size = f.seek(0, 2)
        f.seek(0)
        if self.mmap and not is_url(path):
            _header(f, size)  # the streamed path's checks and messages; NumPy's differ
            f.close()
            return {self.key: _mapped_rows(path)}
        return {self.key: _Rows.from_stream(f, size)}


class _Rows:
    """One array's rows, handed out in order: from an array in hand or read from a stream."""

    def __init__(self, whole: Optional[np.ndarray] = None, stream: Optional[IO[bytes]] = None,
                 shape: Tuple[int, ...] = (), dtype: Optional[np.dtype] = None) -> None:
        if whole is not None:
            shape, dtype = whole.shape, whole.dtype
        self.whole, self.stream = whole, stream
        self.shape, self.dtype = shape, dtype
        self.pos = 0

    @classmethod
    def from_stream(cls, fp: IO[bytes], size: Optional[int]) -> "_Rows":
        """The rows of the ``.npy`` data at ``fp``'s position, ``size`` bytes in all (``None``:
        unknown, for a stream that cannot seek, which is then read once, in order)."""
        start = None if size is None else fp.tell()
        header = _header(fp, size)
        if header is None:
            return cls(whole=_newer_format(fp, start))
        shape, fortran_order, dtype = header
        if not fortran_order or len(shape) < 2:
            return cls(stream=fp, shape=shape, dtype=dtype)
        whole = np.empty(shape, dtype=dtype, order="F")  # Fortran order: read it whole
        _fill(fp, whole.T)
        return cls(whole=whole)

    def read(self, k: int) -> np.ndarray:
        """The next ``k`` rows (fewer at the end): a view of an array in hand, or read from
        the stream into a new array; a stream that ends early raises ``ValueError``."""
        k = min(k, self.shape[0] - self.pos)
        if self.whole is not None:
            out = self.whole[self.pos:self.pos + k]
            if isinstance(out, np.memmap):
                populate(out)
        else:
            out = np.empty((k,) + tuple(self.shape[1:]), dtype=self.dtype)
            assert self.stream is not None, "rows not mapped are read from the stream"
            _fill(self.stream, out)
        self.pos += k
        return out


def _newer_format(fp: IO[bytes], start: Optional[int]) -> np.ndarray:
    """The array of ``.npy`` data at ``start`` in ``fp`` (``None``: a stream read once) in a format version
    NumPy alone reads, which it reads whole."""
    if start is None:
        raise ValueError("a .npy format version NumPy alone reads (3.0) cannot be read from a "
                         "compressed file")
    fp.seek(start)
    with HEADER_PARSE:
        return npformat.read_array(fp, allow_pickle=False)


def _is_archive(path: str, head: bytes) -> bool:
    """Whether the file starting with ``head`` is an ``.npz`` archive, not ``.npy`` data; an empty one is an error."""
    if not head:
        raise file_error(path, "empty file, expected .npy or .npz data")
    return head.startswith(b"PK")


def _archive_rows(path: str, f: IO[bytes], stack: contextlib.ExitStack) -> Dict[str, "_Rows"]:
    """The arrays of an ``.npz`` archive (uncompressed), by name, each streamed from its member."""
    archive = stack.enter_context(zipfile.ZipFile(f))
    arrays = {}
    for info in archive.infolist():
        if not info.filename.endswith(".npy"):
            raise file_error(path, f"archive member {info.filename!r} is not a .npy array")
        member = stack.enter_context(archive.open(info))
        arrays[info.filename[:-4]] = _Rows.from_stream(member, info.file_size)
    return arrays


def _mapped_rows(path: str) -> "_Rows":
    """A local ``.npy`` mapped copy-on-write; its batches cross processes as spans of the file."""
    with HEADER_PARSE:
        mapped = npformat.open_memmap(local_path(path), mode="c")
    start = mapped.__array_interface__["data"][0]
    register_mapped(mapped, start, mapped.nbytes, os.path.abspath(local_path(path)), int(mapped.offset))
    return _Rows(mapped)


def _header(fp: IO[bytes], size: Optional[int]) -> Optional[Tuple[Tuple[int, ...], bool, np.dtype]]:
    """``(shape, fortran_order, dtype)`` from the header of the ``.npy`` data at ``fp``'s
    position, ``size`` bytes in all, leaving ``fp`` at the data; ``None`` for a format
    version only NumPy's whole-array reader knows (3.0). ``ValueError`` unless the header
    describes an array the bytes after it can hold: a shape of integers >= 0 (NumPy takes
    ``-5`` or ``True`` as given), no pickled objects."""
    start = 0 if size is None else fp.tell()  # a stream of unknown size may not tell
    read_header = _READ_HEADER.get(npformat.read_magic(fp))
    if read_header is None:
        return None
    with HEADER_PARSE:  # reads the header's few bytes, then parses them
        shape, fortran_order, dtype = read_header(fp)
    _check_layout(shape, dtype)
    if size is None:  # a stream of unknown size: reading finds a short one
        return shape, fortran_order, dtype
    needed, held = math.prod(shape) * dtype.itemsize, size - (fp.tell() - start)
    if needed > held:
        raise ValueError(f"truncated array data: the header's shape {shape} and dtype {dtype} "
                         f"need {needed} bytes, only {max(held, 0)} follow the header")
    return shape, fortran_order, dtype


def _check_layout(shape: Tuple[int, ...], dtype: np.dtype) -> None:
    """``ValueError`` unless the header's ``shape`` is of integers >= 0 and its ``dtype`` holds no objects."""
    if not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError(f"invalid header: shape {shape!r} is not a tuple of integers >= 0")
    if dtype.hasobject:
        raise ValueError("arrays of Python objects (pickled data) are not supported")


def _fill(fp: Any, out: np.ndarray) -> None:
    view = memoryview(cast(Any, out.reshape(-1).view(np.uint8)))
    got = 0
    while got < len(view):
        n = fp.readinto(view[got:])
        if not n:
            raise ValueError(f"truncated array data: expected {len(view)} bytes, got {got}")
        got += n


def _length(path: str, arrays: Dict[str, _Rows]) -> int:
    """The first-axis length every array shares."""
    n_sample: Optional[int] = None
    for key, rows in arrays.items():
        if len(rows.shape) == 0:
            raise file_error(path, f"key {key!r} holds a 0-d array, expected one row per sample")
        if n_sample is None:
            n_sample = rows.shape[0]
        elif rows.shape[0] != n_sample:
            raise file_error(path, f"key {key!r} has {rows.shape[0]} rows, other arrays have {n_sample}")
    return n_sample or 0


@contextlib.contextmanager
def _readable(path: str) -> Iterator[None]:
    """Turn the errors of corrupt or truncated data into a ``ValueError`` naming ``path``."""
    try:
        yield
    except (FileFormatError, DecompressionError):
        raise
    except _UNREADABLE as e:
        raise file_error(path, f"cannot read as .npy/.npz (corrupt or truncated?): {e}") from e
