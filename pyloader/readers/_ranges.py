"""Ranges of a line file read alone (``DataReader.read_range`` of the line readers): where every
``RUN``-th sample line starts, found once per file and process from its raw bytes, then each range
read as the bytes from the run it starts in to the run after it ends, parsed as a file of its own.

Contracts: a sample is a line as ``count_lines`` counts it (blank lines left out where the reader
skips them), so a range's rows are the rows ``iter_file`` gives at those places. A compressed file,
or an encoding whose bytes do not tell where lines end (``_bytes_tell_lines``), has no table: its
ranges are read through ``iter_file`` from the file's start. A table is kept for the file as it was
(size and modification time, or a remote file's version); the last ``KEPT`` files' tables are kept.
"""
from __future__ import annotations

import codecs
import collections
import os
import threading
from typing import IO, Iterator, List, Optional, OrderedDict, Tuple

import numpy as np

from .._columns import Columns, n_rows, slice_rows
from .._paths import is_url, local_path
from .._sample_index import RUN, LineTable
from .._storage.compression import codec_for
from .._storage.files import open_file
from ._base import _ASCII_SPACE, _bytes_tell_lines, _raw_blocks, is_blank

KEPT = 256  # files whose tables a process keeps
TABLE_BLOCK = 8 << 20  # bytes of whole lines looked at a time

_lock = threading.Lock()
_tables: OrderedDict[Tuple[str, str, bool, str], Optional["LineTable"]] = collections.OrderedDict()


def line_table(path: str, codec: str, skip_blank: bool) -> Optional[LineTable]:
    """The table of ``path`` (made once per file as it is now, a block at a time), or ``None`` where ranges
    cannot be found from the bytes (compressed, or an encoding that hides line ends)."""
    if codec_for(path) is not None or not _bytes_tell_lines(codec.replace("-sig", "")):
        return None
    with open_file(path, "rb", compression=None) as f:
        key = (path, codec, skip_blank, _version(f, path))
        with _lock:
            if key in _tables:
                _tables.move_to_end(key)
                return _tables[key]
        table = _made(f, codec, skip_blank)
    with _lock:
        _tables[key] = table
        while len(_tables) > KEPT:
            _tables.popitem(last=False)
    return table


_VERSIONS = ("size", "ETag", "etag", "mtime", "LastModified", "generation", "last_modified")


def _version(f: IO[bytes], path: str) -> str:
    """The file as it is now: a local file's size and modification time, a remote one's details."""
    if is_url(path):
        details = getattr(f, "details", None)
        found = details if isinstance(details, dict) else {"size": getattr(f, "size", None)}
        return repr(sorted((k, str(v)) for k, v in found.items() if k in _VERSIONS))
    st = os.stat(local_path(path))
    return f"{st.st_size}:{st.st_mtime_ns}"


_SPACE = np.zeros(256, dtype=bool)
_SPACE[np.frombuffer(_ASCII_SPACE, dtype=np.uint8)] = True


def _made(f: IO[bytes], codec: str, skip_blank: bool) -> LineTable:
    """Where every ``RUN``-th sample line of ``f`` starts, found a block of whole lines at a time."""
    firsts: List[np.ndarray] = []
    at = samples = 0
    for block in _raw_blocks(f, TABLE_BLOCK):
        starts, keep = _lines(block, codec, skip_blank, at == 0)
        kept = np.flatnonzero(keep)
        firsts.append(starts[kept[(-samples) % RUN::RUN]] + at)
        samples += len(kept)
        at += len(block)
    return LineTable(np.concatenate(firsts or [np.zeros(0, np.int64)]).astype(np.int64), at, samples)


def _lines(block: bytes, codec: str, skip_blank: bool, first: bool) -> Tuple[np.ndarray, np.ndarray]:
    """Where each line of a block of whole lines starts, and which are samples (not empty; not blank);
    ``first``: the block begins the file (a ``-sig`` codec drops a byte order mark there)."""
    raw = np.frombuffer(block, dtype=np.uint8)
    ends = np.flatnonzero(raw == 10) + 1
    if len(ends) == 0 or ends[-1] != len(raw):
        ends = np.append(ends, len(raw))
    starts = np.concatenate([[0], ends[:-1]])
    keep = ends > starts
    if first and _drops_bom(codec, block):
        keep[0] = ends[0] > len(codecs.BOM_UTF8)  # the codec drops it: a line of it alone is empty
    if skip_blank:
        keep &= _not_blank(raw, block, starts, ends, codec, first)
    return starts, keep


def _drops_bom(codec: str, block: bytes) -> bool:
    """Whether a file beginning with ``block`` begins with a byte order mark its ``-sig`` codec drops."""
    return codec.endswith("-sig") and block.startswith(codecs.BOM_UTF8)


def _not_blank(raw: np.ndarray, data: bytes, starts: np.ndarray, ends: np.ndarray, codec: str,
               first: bool) -> np.ndarray:
    """Which lines hold more than whitespace, as ``is_blank`` says: on the bytes, decoding only a line
    whose only bytes besides ASCII whitespace are beyond ASCII (a byte order mark, a no-break space)."""
    space = _SPACE[raw]
    other = np.concatenate([[0], np.cumsum(~space)])
    ascii_other = np.concatenate([[0], np.cumsum(~space & (raw < 128))])
    out = other[ends] - other[starts] > 0
    unsure = np.flatnonzero(out & (ascii_other[ends] - ascii_other[starts] == 0))
    plain = codec.replace("-sig", "")
    for k in unsure:
        line = data[starts[k]:ends[k]].decode(plain, errors="replace")
        if first and k == 0 and codec != plain:
            line = line.removeprefix("\ufeff")
        out[k] = not is_blank(line)
    return out


def rows_of(pieces: Iterator[Columns], skip: int, n: int) -> Iterator[Columns]:
    """Rows ``skip : skip + n`` of ``pieces``."""
    offset = 0
    for piece in pieces:
        size = n_rows(piece)
        lo, hi = max(skip - offset, 0), min(skip + n - offset, size)
        if lo < hi:
            yield piece if (lo, hi) == (0, size) else slice_rows(piece, lo, hi)
        offset += size
        if offset >= skip + n:
            return
