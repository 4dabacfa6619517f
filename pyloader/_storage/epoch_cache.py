"""The disk cache of encoded epochs (``DataLoader(cache_encoded=...)``): its settings and its files.

Contracts:

- Epochs come in blocks of ``update_every``: block ``b`` is epochs ``b .. b+K-1``
  (``update_every=None``: one block, epoch 0 on). The epoch that starts a block, or the
  first of a block that finds no complete cache, writes its encoded batches; the other
  epochs of the block read them (``_stages.cached_epochs``).
- A loader's share lives in a folder of its own under ``dir``, named after its rank,
  its world size and a key: a digest of the data files (names, sizes and, for local
  files, modification times), every setting that changes the batches
  (``DataLoader._fingerprint``), ``update_every`` and the reader's and dataset's
  classes. Ranks, world sizes, settings and data never share a folder; only the loader
  whose folder it is writes or removes anything in it.
- A block's cache is ``block-<b>.json`` (the manifest: each batch's file, size,
  SHA-256, rows, source files and padding rows) and a folder of one ``.npz`` file per
  batch (``_storage.codec``; loaded with ``allow_pickle=False``). Batches are written into a
  staging folder; the folder is renamed into place and the manifest written under a
  temporary name and renamed last, so a writer that dies leaves no manifest and
  nothing is ever read as complete that was not. Starting a write removes everything
  else in the loader's folder (older blocks, a dead writer's staging folder).
- ``limit`` bounds the bytes of one block's batch files: the write that would go past
  it is abandoned (its files removed) and the epochs of that block are encoded from the
  files; the next block tries again.
- A manifest is checked (format, key, block, every file's size) before an epoch reads
  it, and each batch file's SHA-256 as it is loaded.

Every method here blocks on the disk: the pipeline calls them off the event loop (the
batch writes and loads run as steps, in the lane's threads).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union, cast

import numpy as np

from .._checks import is_integer
from .._columns import Columns
from .._npy import HEADER_PARSE
from .._paths import local_path
from .codec import pack, unpack
from .files import is_url

logger = logging.getLogger("pyloader")

FORMAT = 1
COUNTERS = ("epochs_read", "batches_read", "files_not_read", "epochs_written", "batches_written", "bytes_written",
            "writes_abandoned")


@dataclass(frozen=True)
class CacheEncoded:
    """``DataLoader(cache_encoded=CacheEncoded(dir, update_every, limit=None))``, or the same as a dict.

    ``dir``: the folder (made if missing); ``update_every``: epochs per cache (an integer
    >= 2: the cache is rewritten every ``update_every`` epochs, or ``None``: written once,
    then only read); ``limit``: the most bytes one epoch's cache of one rank may take.

    Example:
        ```python
        loader = DataLoader(reader, dataset, collator, "data/", num_epoch=20,
                            cache_encoded=CacheEncoded("encoded/", update_every=4))   # a fast local disk
        ```
    """

    dir: Union[str, "os.PathLike[str]"]
    update_every: Optional[int]
    limit: Optional[int] = None


def check_cache_encoded(name: str, value: object) -> None:
    """The option ``cache_encoded`` (``None``, a dict or a ``CacheEncoded``), checked alone."""
    checked = as_cache_encoded(value)
    if checked is not None:
        _check_values(checked)


def as_cache_encoded(value: object) -> Optional[CacheEncoded]:
    """``cache_encoded`` as a ``CacheEncoded`` (a dict's keys checked)."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        _check_keys(value)
        value = CacheEncoded(**value)
    if not isinstance(value, CacheEncoded):
        raise TypeError(f"cache_encoded must be a dict or a pyloader.CacheEncoded, got {type(value).__name__}")
    return value


def _check_keys(value: Mapping[str, object]) -> None:
    """The keys of ``cache_encoded`` given as a dict: ``CacheEncoded``'s fields (``dir`` and
    ``update_every`` required)."""
    names = [f.name for f in dataclasses.fields(CacheEncoded)]
    unknown, missing = sorted(set(value) - set(names)), sorted({"dir", "update_every"} - set(value))
    wrong = [f"{what} {keys}" for what, keys in (("unknown", unknown), ("missing", missing)) if keys]
    if wrong:
        raise ValueError(f"cache_encoded takes the keys {names} (dir and update_every required): "
                         f"{'; '.join(wrong)}")


def resume_key(value: Optional[CacheEncoded]) -> Optional[Dict[str, Optional[int]]]:
    """What a state records of ``cache_encoded``: ``update_every`` (the folder and limit may change)."""
    return None if value is None else {"update_every": value.update_every}


def _check_values(c: CacheEncoded) -> None:
    if not isinstance(c.dir, (str, os.PathLike)) or not os.fspath(c.dir):
        raise TypeError(f"cache_encoded's dir must be a folder's path, got {c.dir!r}")
    if os.path.exists(c.dir) and not os.path.isdir(c.dir):
        raise ValueError(f"cache_encoded's dir {os.fspath(c.dir)!r} is not a folder")
    k = c.update_every
    if k is not None and not is_integer(k, least=2):
        raise ValueError(f"cache_encoded's update_every must be an integer >= 2 (the epochs one cache serves; "
                         f"1 would rewrite it every epoch and never read it) or None (written once), got {k!r}")
    if c.limit is not None and not is_integer(c.limit, least=1):
        raise ValueError(f"cache_encoded's limit must be an integer >= 1 (bytes) or None, got {c.limit!r}")


def data_stamp(files: Sequence[str]) -> str:
    """The modification times of the local files (a file rewritten in place changes the key)."""
    stamps = []
    for path in files:
        if is_url(path):
            stamps.append("")
            continue
        with contextlib.suppress(OSError):
            stamps.append(str(os.stat(local_path(path)).st_mtime_ns))
    return hashlib.sha1("\n".join(stamps).encode()).hexdigest()


@dataclass
class BatchEntry:
    """One cached batch: its file in the block's folder, and what the pipeline needs besides its data."""

    name: str
    rows: int
    paths: Tuple[str, ...]
    padding: List[List[int]]  # [start, end) runs of rows that only even out the ranks' steps
    size: int = 0
    sha256: str = ""

    def as_json(self, files: Mapping[str, int]) -> List[object]:
        return [self.name, self.rows, [files[p] for p in self.paths], self.padding, self.size, self.sha256]


@dataclass
class Manifest:
    """A complete cache of one block: its batches in the order their epoch gave them."""

    block: int
    source_epoch: int  # the epoch that wrote it
    folder: str
    batches: List[BatchEntry]
    flags: bool  # whether the batches carry padding flags (under ranks)


class EpochStore:
    """One loader's share of the cache: its folder, the blocks whose write went past the limit."""

    def __init__(self, config: CacheEncoded, name: str, key: str, oversized: Set[Tuple[str, int]]) -> None:
        self.config = config
        self.key = key
        self.folder = os.path.join(os.path.abspath(os.fspath(config.dir)), name)
        self.oversized = oversized  # (key, block): kept by the loader across its iterations

    def block(self, epoch: int) -> int:
        k = self.config.update_every
        return 0 if k is None else epoch - epoch % k

    def _manifest_path(self, block: int) -> str:
        return os.path.join(self.folder, f"block-{block}.json")

    def manifest(self, block: int) -> Optional[Manifest]:
        """Block ``block``'s complete cache, if there is one whose files are all there."""
        try:
            with open(self._manifest_path(block), "rb") as f:
                text = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            logger.warning("pyloader cache_encoded: cannot read the manifest of epochs from %d in %r: %s",
                           block, self.folder, exc)
            return None
        try:
            return self._checked(json.loads(text), block)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            logger.warning("pyloader cache_encoded: not reading the cache of epochs from %d in %r: %s",
                           block, self.folder, exc)
            return None

    def _checked(self, meta: object, block: int) -> Manifest:
        if not isinstance(meta, dict) or (meta.get("format"), meta.get("key"), meta.get("block")) != \
                (FORMAT, self.key, block):
            raise ValueError("the manifest is of another format, key or block")
        folder = os.path.join(self.folder, os.path.basename(meta["folder"]))
        files = meta["files"]
        batches = [BatchEntry(name, rows, tuple(files[i] for i in paths), padding, size, sha)
                   for name, rows, paths, padding, size, sha in meta["batches"]]
        _check_sizes(folder, batches)
        return Manifest(block, int(meta["source_epoch"]), folder, batches, bool(meta["flags"]))

    def writer(self, epoch: int) -> "EpochWriter":
        """A new cache of ``epoch``'s block, written by ``epoch``: everything else in the folder goes first."""
        os.makedirs(self.folder, exist_ok=True)
        self._clear()
        staging = tempfile.mkdtemp(dir=self.folder, prefix=".staging-")
        return EpochWriter(self, self.block(epoch), epoch, staging)

    def _clear(self) -> None:
        """Remove every block and staging folder of this share (manifests first: nothing half-removed is read)."""
        names = sorted(os.listdir(self.folder), key=lambda n: not n.endswith(".json"))
        for name in names:
            path = os.path.join(self.folder, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


def _check_sizes(folder: str, batches: List[BatchEntry]) -> None:
    """``ValueError`` unless each batch's file in ``folder`` has the size its entry says."""
    for entry in batches:
        found = os.stat(os.path.join(folder, entry.name)).st_size
        if found != entry.size:
            raise ValueError(f"{entry.name} holds {found} bytes, not {entry.size}")


@dataclass
class ToWrite:
    """An encoded batch on its way to the cache (``EpochWriter.write``), then to ``collate_batch``."""

    data: Columns
    name: str


@dataclass
class CachedRef:
    """A cached batch to load (``load``)."""

    path: str
    size: int
    sha256: str


class EpochWriter:
    """Writes one block's batches (``write``, a step run in the lane's threads, several at once);
    ``commit`` makes them the block's cache, ``abort`` removes them."""

    def __init__(self, store: EpochStore, block: int, epoch: int, staging: str) -> None:
        self.store = store
        self.block, self.epoch = block, epoch
        self.staging = staging
        self.entries: List[BatchEntry] = []  # in the epoch's order, as the batches were encoded
        self.bytes = 0
        self.failed: Optional[str] = None  # why the write was given up
        self.over_limit = False
        self._written: Dict[str, Tuple[int, str]] = {}  # name: (size, sha256)
        self._lock = threading.Lock()

    def expect(self, entry: BatchEntry) -> None:
        self.entries.append(entry)

    def write(self, item: ToWrite) -> Columns:
        """Store one encoded batch (``NotCacheable`` for a column that cannot be); hand it on unchanged."""
        if self.failed is not None:
            return item.data
        buffer = io.BytesIO()
        np.savez(buffer, **cast(Dict[str, Any], pack(item.data)))  # names of ours: never a savez keyword
        data = buffer.getvalue()
        if not self._counted(len(data)):
            return item.data
        try:
            with open(os.path.join(self.staging, item.name), "wb") as f:
                f.write(data)
        except OSError as exc:
            with self._lock:
                self.failed = self.failed or f"writing it failed: {exc}"
            return item.data
        with self._lock:
            self._written[item.name] = (len(data), hashlib.sha256(data).hexdigest())
        return item.data

    def _counted(self, size: int) -> bool:
        """Count a batch of ``size`` bytes in the cache; ``False`` where the cache failed already, or fails
        now, as it would go over the limit."""
        limit = self.store.config.limit
        with self._lock:
            if self.failed is not None:
                return False
            if limit is not None and self.bytes + size > limit:
                self.failed, self.over_limit = f"its batches take more than limit={limit} bytes", True
                return False
            self.bytes += size
        return True

    def complete(self) -> bool:
        return self.failed is None and all(e.name in self._written for e in self.entries)

    def commit(self, flags: bool) -> None:
        """Make the batches the block's cache: the folder renamed into place, the manifest renamed last."""
        files: Dict[str, int] = {}
        for entry in self.entries:
            entry.size, entry.sha256 = self._written[entry.name]
            for path in entry.paths:
                files.setdefault(path, len(files))
        folder = os.path.join(self.store.folder, f"epochs-{self.block}-{os.path.basename(self.staging)[9:]}")
        meta = {"format": FORMAT, "key": self.store.key, "block": self.block, "source_epoch": self.epoch,
                "folder": os.path.basename(folder), "flags": flags, "files": list(files),
                "batches": [entry.as_json(files) for entry in self.entries], "written_at": time.time()}
        fd, tmp = tempfile.mkstemp(dir=self.store.folder, prefix=".manifest-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(meta, f)
        os.rename(self.staging, folder)
        os.replace(tmp, self.store._manifest_path(self.block))

    def abort(self) -> None:
        """Give the write up, leaving nothing (a step still running finds its folder gone)."""
        with self._lock:
            self.failed = self.failed or "the epoch did not finish"
        shutil.rmtree(self.staging, ignore_errors=True)


def load(ref: CachedRef) -> Columns:
    """A cached batch, checked against its manifest entry (a step run in the lane's threads)."""
    with open(ref.path, "rb") as f:
        data = f.read()
    if (len(data), hashlib.sha256(data).hexdigest()) != (ref.size, ref.sha256):
        raise ValueError(f"the cached batch {ref.path!r} was changed or damaged since it was written "
                         f"(size or SHA-256 differs)")
    with HEADER_PARSE, np.load(io.BytesIO(data), allow_pickle=False) as arrays:  # each member's header
        columns = {name: arrays[name] for name in arrays.files}
    return unpack(columns)
