"""A remote file served to its reader from its entry in the disk cache (``_storage.cache``).

The read-ahead (``_storage.bytes``) serves a remote file larger than ``readahead_bytes`` this
way when it was cached whole first: for a worker process (it reads the entry from the disk
rather than the bytes crossing a socket) and for a reader that reads byte ranges anywhere in
its files (Parquet's footer, then its column chunks), which a stream of blocks in order
serves badly.

Contracts:

- ``ServedEntry`` is picklable (it goes to a worker process as it is) and served any number
  of times: each ``open`` is a new seekable file over the entry.
- Every block is checked against the entry's description before any byte of it is served.
  A block that fails, or an entry gone by then (another loader sharing the cache let it
  go), drops the entry and serves the rest from the remote file itself (``direct_open``):
  the reader sees the file's bytes, never a wrong one.
- At most one block of the entry is held per open file.
"""
from __future__ import annotations

import io
import logging
from typing import IO, Any, Optional, Tuple

from .cache import DiskCache, Entry
from .files import SeekableRaw, Served, direct_open

logger = logging.getLogger("pyloader")


class ServedEntry(Served):
    """The cached entry of the remote file ``entry.url``, for ``open_file`` to serve."""

    def __init__(self, entry: Entry) -> None:
        self.entry = entry

    def open(self) -> Optional[IO[bytes]]:
        try:
            raw = EntryFile(self.entry)
        except OSError as exc:  # gone since it was written: the reader opens the remote file itself
            logger.info("pyloader cache: the entry of %r cannot be opened (%s): fetching it again",
                        self.entry.url, exc)
            return None
        self.claimed = True
        return io.BufferedReader(raw, buffer_size=64 * 2**10)


class EntryFile(SeekableRaw):
    """A seekable binary file over a cache entry's bytes, each block checked before it is served
    (see the module docstring)."""

    def __init__(self, entry: Entry) -> None:
        io.RawIOBase.__init__(self)
        self._entry = entry
        self.size = entry.size
        self._file: Optional[IO[bytes]] = open(entry.data_path, "rb")
        self._held: Optional[Tuple[int, bytes]] = None  # (index, bytes) of the last block checked
        self._direct: Optional[IO[bytes]] = None
        self._pos = 0


    def readinto(self, buffer: Any) -> int:
        if self._pos >= self._entry.size:
            return 0
        block = self._block(self._pos // self._entry.block_size) if self._direct is None else None
        if block is None:
            assert self._direct is not None
            self._direct.seek(self._pos)
            n = self._direct.readinto(buffer)  # type: ignore[attr-defined]
        else:
            start = self._pos % self._entry.block_size
            n = min(len(buffer), len(block) - start)
            buffer[:n] = block[start:start + n]
        self._pos += n
        return n

    def _block(self, index: int) -> Optional[bytes]:
        """Block ``index`` of the entry, checked; ``None`` once the rest comes from the remote file."""
        if self._held is not None and self._held[0] == index:
            return self._held[1]
        entry, data = self._entry, b""
        try:
            assert self._file is not None
            self._file.seek(index * entry.block_size)
            data = self._file.read(entry.block_size)
        except OSError as exc:
            logger.info("pyloader cache: reading the entry of %r: %s", entry.url, exc)
        if entry.check(index, data):
            self._held = (index, data)
            return data
        logger.info("pyloader cache: block %d failed its check in the entry of %r: fetching it again",
                    index, entry.url)
        DiskCache.drop_paths(entry.data_path, entry.meta_path)
        self._held = None
        self._close_entry()
        self._direct = direct_open(entry.url)
        return None

    def _close_entry(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            f.close()

    def close(self) -> None:
        if not self.closed:
            self._close_entry()
            self._held = None
            if self._direct is not None:
                self._direct.close()
        io.RawIOBase.close(self)
