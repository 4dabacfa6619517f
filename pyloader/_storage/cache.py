"""A local disk cache of remote files' raw bytes (``DataLoader(storage=Storage(cache_dir=..., cache_limit=...))``).

Contracts:

- An entry is two files named after a hash of the URL: ``<key>.data``, the file's bytes
  exactly as fetched, and ``<key>.json``, what they are (URL, size, version, and a SHA-256
  of every block). Nothing in the cache is ever unpickled.
- Writes are atomic: each file is written under a temporary name and renamed into place,
  so two loaders (or ranks) sharing a folder never see a torn file. A partial, corrupt or
  mismatched entry (a crash between the two renames, two writers racing, a flipped bit)
  fails its size or block checks and is fetched again.
- An entry is served only while the remote file has the size and version it was cached
  with (``_storage.remote.version``).
- ``limit`` bounds the bytes of the entries: before an entry is written, the least
  recently used ones (by the time their ``.json`` was last served) are removed until it
  fits, and again once it is written (entries written meanwhile by other writers count
  then): the limit holds whenever no entry is being written. A file larger than ``limit``
  is not cached.
- Temporary files carry their writer's tag (``_storage.writers``): those of a writer that died
  (a process killed while writing) are removed by the next ``DiskCache`` on the folder, and
  whenever an entry is written; a temporary file whose writer cannot be told (another machine)
  is removed once it is an hour old. An entry whose files are folders is removed as well.

Every method here blocks on the disk: the loader calls them off the event loop.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from typing import BinaryIO, Dict, List, Optional, Tuple

from .._checks import is_integer
from . import writers

logger = logging.getLogger("pyloader")

FORMAT = 1
_STALE_TMP_S = 3600.0


def digest(block: bytes) -> str:
    return hashlib.sha256(block).hexdigest()


@dataclass
class Entry:
    """A cached file: where its bytes are and how to check them."""

    url: str
    data_path: str
    meta_path: str
    size: int
    block_size: int
    blocks: List[str]  # SHA-256 of each block_size block, in order

    def check(self, index: int, block: bytes) -> bool:
        """Whether ``block`` is the entry's block ``index`` as it was written."""
        expected = min(self.block_size, self.size - index * self.block_size)
        return index < len(self.blocks) and len(block) == expected and digest(block) == self.blocks[index]


class DiskCache:
    def __init__(self, folder: str, limit: Optional[int]) -> None:
        self.folder = os.path.abspath(os.fspath(folder))
        self.limit = limit
        os.makedirs(self.folder, exist_ok=True)
        self._make_room(0)  # and what writers that died left behind

    def fits(self, size: int) -> bool:
        return self.limit is None or size <= self.limit

    def _paths(self, url: str) -> Tuple[str, str]:
        key = hashlib.sha256(url.encode()).hexdigest()[:40]
        base = os.path.join(self.folder, key)
        return base + ".data", base + ".json"

    def lookup(self, url: str, size: int, version: str) -> Optional[Entry]:
        """The entry of ``url`` if it holds this size and version of it (its blocks are checked as
        they are read); a stale, unreadable or malformed one (a description that is not what
        ``commit`` writes, a ``.data`` that is not a regular file) is removed: a miss. Being
        looked up counts as a use."""
        data_path, meta_path = self._paths(url)
        try:
            with open(meta_path, "rb") as f:
                meta = json.loads(f.read())
            found = os.stat(data_path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deep
            logger.info("pyloader cache: dropping unreadable entry of %r: %s", url, exc)
            self.drop_paths(data_path, meta_path)
            return None
        blocks = _blocks(meta, url, size, version)
        if blocks is None or not stat.S_ISREG(found.st_mode) or found.st_size != size:
            self.drop_paths(data_path, meta_path)
            return None
        with contextlib.suppress(OSError):
            os.utime(meta_path)
        return Entry(url, data_path, meta_path, size, meta["block_size"], blocks)

    def drop(self, entry: Entry, why: str) -> None:
        logger.info("pyloader cache: %s in the entry of %r: fetching it again", why, entry.url)
        self.drop_paths(entry.data_path, entry.meta_path)

    @staticmethod
    def drop_paths(*paths: str) -> None:
        """Remove ``paths``, files or (left in the cache's place by someone else) folders."""
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    raise

    def writer(self, url: str, size: int, version: str, block_size: int) -> "EntryWriter":
        """A new entry for ``url``, written block by block; nothing is visible until ``commit``."""
        self._make_room(size)
        return EntryWriter(self, url, size, version, block_size)

    def _make_room(self, incoming: int) -> None:
        """Remove least recently used entries until ``incoming`` more bytes fit the limit; and
        temporary files that a writer which died left behind."""
        entries = self._entries()
        used = sum(size for _, size, _, _ in entries)
        if self.limit is None:
            return
        for _, size, data_path, meta_path in sorted(entries):
            if used + incoming <= self.limit:
                break
            self.drop_paths(meta_path, data_path)
            used -= size


    def _entries(self) -> List[Tuple[float, int, str, str]]:
        """Each entry as ``(last use, size, data path, description path)``; temporary files that a
        writer which died (or went quiet) left behind are removed on the way."""
        entries = []
        now = time.time()
        with os.scandir(self.folder) as it:
            for item in it:
                with contextlib.suppress(FileNotFoundError):
                    if item.name.endswith(".tmp"):
                        if writers.dead(item.name) or now - item.stat().st_mtime > _STALE_TMP_S:
                            self.drop_paths(item.path)
                    elif item.name.endswith(".data"):
                        meta = item.path[:-len(".data")] + ".json"
                        entries.append((_mtime(meta), item.stat().st_size, item.path, meta))
        return entries


def _blocks(meta: object, url: str, size: int, version: str) -> Optional[List[str]]:
    """The block digests of a description of ``url`` at this size and version, as ``commit``
    writes it; ``None`` for anything else (another file or version, a field of the wrong
    type, block digests that do not cover ``size`` bytes)."""
    if not isinstance(meta, dict) or not _describes(meta, url, size, version):
        return None
    block_size, blocks = meta.get("block_size"), meta.get("blocks")
    if not is_integer(block_size, least=1) or type(blocks) is not list \
            or len(blocks) != -(-size // block_size) or not all(type(b) is str for b in blocks):
        return None
    return blocks


def _describes(meta: Dict[str, object], url: str, size: int, version: str) -> bool:
    """Whether ``meta`` is of this format and describes ``url`` at this size and version."""
    described = meta.get("format"), meta.get("url"), type(meta.get("size")), meta.get("size"), meta.get("version")
    return described == (FORMAT, url, int, size, version)  # the size's type too: True == 1


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return 0.0  # no description: the first to go


def _replace(tmp: str, path: str) -> None:
    """``os.replace``, after removing a folder found in the way."""
    try:
        os.replace(tmp, path)
    except OSError:
        if not os.path.isdir(path):
            raise
        DiskCache.drop_paths(path)
        os.replace(tmp, path)


class EntryWriter:
    """Writes one entry: blocks appended in order to a temporary file, renamed into place
    by ``commit``; ``abort`` leaves nothing behind."""

    def __init__(self, cache: DiskCache, url: str, size: int, version: str, block_size: int) -> None:
        self.cache = cache
        self.url, self.size, self.version, self.block_size = url, size, version, block_size
        self.data_path, self.meta_path = cache._paths(url)
        fd, self._tmp = tempfile.mkstemp(dir=cache.folder, prefix=f".{writers.tag()}-", suffix=".tmp")
        self._file: Optional[BinaryIO] = os.fdopen(fd, "wb")
        self._blocks: List[str] = []
        self._written = 0

    def add(self, data: bytes) -> None:
        """Append the next bytes; they are cut into ``block_size`` blocks for their checks."""
        assert self._file is not None
        if self._written % self.block_size:
            raise ValueError("blocks must be whole block_size blocks, except the last")
        self._file.write(data)
        for start in range(0, len(data), self.block_size):
            self._blocks.append(digest(data[start:start + self.block_size]))
        self._written += len(data)

    def commit(self) -> None:
        """Make the entry visible, if every byte came (otherwise it is dropped)."""
        assert self._file is not None
        self._file.close()
        self._file = None
        if self._written != self.size:
            self.abort()
            return
        meta = {"format": FORMAT, "url": self.url, "size": self.size, "version": self.version,
                "block_size": self.block_size, "blocks": self._blocks}
        fd, meta_tmp = tempfile.mkstemp(dir=self.cache.folder, prefix=f".{writers.tag()}-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(meta, f)
        # data first: a reader that finds the new description with the old bytes fails their checks
        _replace(self._tmp, self.data_path)
        _replace(meta_tmp, self.meta_path)
        self.cache._make_room(0)  # entries written meanwhile by other writers count now: trim to the limit

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        DiskCache.drop_paths(self._tmp)
