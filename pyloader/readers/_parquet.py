"""Parquet and Arrow IPC (Feather v2) files, read with pyarrow a row group (a record batch) at a time."""
from __future__ import annotations

import contextlib
import os
from types import ModuleType
from typing import IO, TYPE_CHECKING, Dict, Iterator, List, Optional, Protocol, Sequence, Tuple, Union

import numpy as np

from .._abc import DataReader
from .._columns import Column, Columns
from .._npy import register_mapped
from .._paths import local_path
from .._storage.files import is_url, open_file
from ._base import check_fields, file_error

if TYPE_CHECKING:  # pyarrow is optional and untyped: these names document what a value is
    import pyarrow
    import pyarrow.ipc
    import pyarrow.parquet

__all__ = ["ParquetReader"]

_IPC_MAGIC = b"ARROW1"


class ParquetReader(DataReader):
    """Reads Parquet files (and Arrow IPC files: Feather v2, ``.arrow``) into one column per field.

    - ``iter_file`` yields one piece per row group (per record batch of an Arrow file),
      so memory is bounded by a row group, not by the file; ``read_file`` (used when the
      reader shuffles) reads the whole file.
    - ``count`` reads the row count from the file's footer, no data.
    - ``columns`` selects columns (all of them by default); a column the file lacks is a
      ``ValueError`` naming the file.
    - A column of numbers, booleans, dates, timestamps or durations without nulls arrives as
      a NumPy array, without a copy where Arrow's layout allows (read-only then: torch warns
      once when it wraps one); a fixed-size list of such values without nulls as a 2-D array.
      Everything else (strings, nested lists, structs, and any column with nulls, which
      become ``None``) arrives as a Python list.
    - A local file is opened by pyarrow itself (an Arrow file is memory-mapped: a column read
      without a copy crosses from a worker process as (file, offset, shape, dtype) while the
      file is open there, see ``NumpyReader``); a URL goes
      through ``open_file``, reading only the byte ranges pyarrow asks for (the footer, then
      the chunks of the selected columns) unless the loader fetched the file already.
    - A file that is neither format, or corrupt, raises ``ValueError`` naming the file,
      with pyarrow's error as ``__cause__``; an I/O error keeps its type and names the file.

    Needs pyarrow (``pip install 'pyloader-ml[parquet]'``); without it the reader cannot be made.
    pyarrow's own threads are not used: the loader reads several files at once already, and
    forked worker processes must not inherit a busy thread pool.

    Example:
        <!-- example: s3 -->
        ```python
        reader = ParquetReader(batch_size=16, columns=["input_ids", "label"])
        loader = DataLoader(reader, IdentityDataset(), TorchCollator(), "s3://bucket/train/")
        for batch in loader:
            ...                                         # batch["input_ids"]: padded, with batch["input_ids_mask"]
        ```
    """

    thread_safe = True  # holds no per-call state on self
    releases_gil = True  # NumPy/pyarrow work: num_workers="auto" keeps it in this process

    def __init__(self, batch_size: int = 16, shuffle: bool = False, random_seed: int = 42,
                 columns: Optional[Sequence[str]] = None) -> None:
        super().__init__(batch_size=batch_size, shuffle=shuffle, random_seed=random_seed)
        self.columns = check_fields(columns, "columns")
        _pyarrow()  # fail here, not in the middle of a run

    def read_file(self, path: str) -> Tuple[Dict[str, Sequence], int]:
        with _opened(path) as source:
            names = self._names(path, source)
            table = source.read_all(names)
            return _columns(table, names, source.mapped), table.num_rows

    def iter_file(self, path: str) -> Iterator[Columns]:
        with _opened(path) as source:
            names = self._names(path, source)
            for i in range(source.n_pieces):
                piece = source.piece(i, names)
                if piece.num_rows:
                    yield self.checked(path, _columns(piece, names, source.mapped))

    def count(self, path: str) -> int:
        """The rows of ``path``, from its footer."""
        with _opened(path) as source:
            return source.n_rows

    def _reads_ranges(self, path: str) -> bool:
        """Asked by the loader's read-ahead: a remote file larger than ``readahead_bytes`` is best read by the
        byte ranges pyarrow asks for (or from the disk cache), not streamed whole in order."""
        return True

    def _names(self, path: str, source: "_Source") -> List[str]:
        """The columns to read: ``columns``, or all of the file's."""
        names = source.names
        wanted = list(self.columns or names)
        missing = [c for c in wanted if c not in names]
        if missing:
            raise file_error(path, f"columns {missing} are not in the file (its columns: {names})")
        doubled = sorted({c for c in wanted if names.count(c) > 1})
        if doubled:
            raise file_error(path, f"the file has more than one column named {doubled}")
        return wanted


def _pyarrow() -> ModuleType:
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError as e:
        raise ImportError("ParquetReader needs pyarrow: pip install 'pyloader-ml[parquet]'") from e
    return pyarrow


class _Source(Protocol):
    """One open Parquet or Arrow IPC file: its columns, its pieces, its row count."""

    names: List[str]
    mapped: Optional[pyarrow.Buffer]  # the whole file, memory-mapped, or None

    @property
    def n_pieces(self) -> int: ...

    @property
    def n_rows(self) -> int: ...

    def piece(self, i: int, names: List[str]) -> Union[pyarrow.Table, pyarrow.RecordBatch]: ...

    def read_all(self, names: List[str]) -> pyarrow.Table: ...


class _ParquetSource:
    """A Parquet file, a row group a piece."""

    def __init__(self, parquet: pyarrow.parquet.ParquetFile) -> None:
        self._parquet = parquet
        self.names: List[str] = list(parquet.schema_arrow.names)
        self.mapped: Optional[pyarrow.Buffer] = None

    @property
    def n_pieces(self) -> int:
        return self._parquet.num_row_groups

    @property
    def n_rows(self) -> int:
        return self._parquet.metadata.num_rows

    def piece(self, i: int, names: List[str]) -> pyarrow.Table:
        return self._parquet.read_row_group(i, columns=names, use_threads=False)

    def read_all(self, names: List[str]) -> pyarrow.Table:
        return self._parquet.read(columns=names, use_threads=False)


class _IpcSource:
    """An Arrow IPC file, a record batch a piece."""

    def __init__(self, ipc: pyarrow.ipc.RecordBatchFileReader, mapped: Optional[pyarrow.Buffer] = None) -> None:
        self._ipc = ipc
        self.mapped = mapped  # the whole of a mapped file: registered while it or a column viewed from it lives
        self.names: List[str] = list(ipc.schema.names)

    @property
    def n_pieces(self) -> int:
        return self._ipc.num_record_batches

    @property
    def n_rows(self) -> int:
        return self._ipc.count_rows()

    def piece(self, i: int, names: List[str]) -> pyarrow.RecordBatch:
        return self._ipc.get_batch(i).select(names)

    def read_all(self, names: List[str]) -> pyarrow.Table:
        return self._ipc.read_all().select(names)


@contextlib.contextmanager
def _opened(path: str) -> Iterator[_Source]:
    """``path`` open as a ``_Source``; pyarrow's errors name the file."""
    pa = _pyarrow()
    with contextlib.ExitStack() as stack:
        try:
            yield _open(pa, path, stack)
        except pa.ArrowException as e:  # pyarrow's errors (a FileFormatError of _open passes as it is)
            if isinstance(e, OSError):
                raise type(e)(f"file {path!r}: {e}") from e
            raise file_error(path, f"cannot read as Parquet or Arrow IPC (corrupt or truncated?): {e}") from e


def _open(pa: ModuleType, path: str, stack: contextlib.ExitStack) -> _Source:
    f: Union[str, IO[bytes]] = local_path(path)
    if is_url(path):
        f = stack.enter_context(open_file(path, "rb"))
        _read_exactly(f)
    try:
        parquet = pa.parquet.ParquetFile(f, memory_map=False)
    except pa.ArrowInvalid:
        if not _starts_with(f, _IPC_MAGIC):
            raise  # not an Arrow IPC file either: ``_opened`` names the file
        return _ipc_source(pa, f, stack)
    stack.callback(parquet.close)
    return _ParquetSource(parquet)


def _ipc_source(pa: ModuleType, f: Union[str, IO[bytes]], stack: contextlib.ExitStack) -> _IpcSource:
    """An Arrow IPC file, read through the open file ``f``, or memory-mapped (``f`` a local path)."""
    if not isinstance(f, str):
        f.seek(0)
        return _IpcSource(pa.ipc.open_file(f))
    mapped = stack.enter_context(pa.memory_map(f))
    whole = mapped.read_buffer()  # no copy: its columns cross processes as spans of the file
    mapped.seek(0)
    register_mapped(whole, whole.address, whole.size, os.path.abspath(f), 0)
    return _IpcSource(pa.ipc.open_file(mapped), mapped=whole)


def _read_exactly(f: IO[bytes]) -> None:
    """Make an fsspec file (not one the loader has fetched already) read the byte ranges pyarrow
    asks for and no more: its default cache reads ahead a block past each read, and pyarrow reads
    whole column chunks, which is what a ranged request should fetch."""
    from fsspec.caching import BaseCache
    from fsspec.spec import AbstractBufferedFile

    if isinstance(f, AbstractBufferedFile):
        f.cache = BaseCache(f.blocksize, f._fetch_range, f.size)


def _starts_with(f: Union[str, IO[bytes]], magic: bytes) -> bool:
    if isinstance(f, str):
        with open(f, "rb") as local:
            return local.read(len(magic)) == magic
    f.seek(0)
    return f.read(len(magic)) == magic


def _columns(data: Union[pyarrow.Table, pyarrow.RecordBatch], names: List[str],
             mapped: Optional[pyarrow.Buffer] = None) -> Columns:
    """The columns of a pyarrow ``Table`` or ``RecordBatch``, as ``ParquetReader`` hands them out
    (``mapped``: the memory-mapped file they lie in, if any)."""
    return {name: _column(data.column(i), mapped) for i, name in enumerate(names)}


def _column(column: Union[pyarrow.Array, pyarrow.ChunkedArray], mapped: Optional[pyarrow.Buffer]) -> Column:
    import pyarrow as pa

    column = _one_array(pa, column)
    kind = column.type
    if column.null_count == 0:
        if _numpy_kind(pa, kind):
            return _to_numpy(pa, column, mapped)
        if pa.types.is_fixed_size_list(kind) and _numpy_kind(pa, kind.value_type):
            values = column.flatten()
            if values.null_count == 0:
                return _to_numpy(pa, values, mapped).reshape(len(column), kind.list_size)
    return column.to_pylist()


def _one_array(pa: ModuleType, column: Union[pyarrow.Array, pyarrow.ChunkedArray]) -> pyarrow.Array:
    """``column`` as one array: a ``ChunkedArray``'s chunks combined (its only chunk as it is, no copy)."""
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column


def _to_numpy(pa: ModuleType, column: pyarrow.Array, mapped: Optional[pyarrow.Buffer] = None) -> np.ndarray:
    """A view of a column of numbers without nulls. Numbers of fixed width are viewed from their
    buffer directly: pyarrow's ``to_numpy`` imports pandas on its first call, about 0.4 s in each
    process (this one and every worker). A buffer inside ``mapped`` is viewed through it, so the
    file stays registered as mapped (``_npy.register_mapped``) for as long as the view lives, and
    the view crosses processes as a span of the file even after the file was closed."""
    kind = column.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        dtype = np.dtype(kind.to_pandas_dtype())  # a NumPy type for these, without pandas
        buffer, offset = column.buffers()[1], column.offset * dtype.itemsize
        if mapped is not None and mapped.address <= buffer.address < mapped.address + mapped.size:
            buffer, offset = mapped, offset + buffer.address - mapped.address
        view = np.frombuffer(buffer, dtype=dtype, count=len(column), offset=offset)
        view.flags.writeable = False  # Arrow's buffers are immutable (and may be a file's mapped pages)
        return view
    return column.to_numpy(zero_copy_only=False)


def _numpy_kind(pa: ModuleType, kind: pyarrow.DataType) -> bool:
    types = pa.types
    return any(is_kind(kind) for is_kind in (types.is_integer, types.is_floating, types.is_boolean,
                                              types.is_timestamp, types.is_date, types.is_duration))
