"""Where ``write`` puts chunks: a local folder or any fsspec URL, written atomically.

Contracts:

- A task writes each chunk whole under a temporary name, ``.tmp-<tag>-<task>-<n><suffix>``: hidden
  from ``list_files`` (a leading ``.``), and carrying the writing run's tag (``_storage.writers``).
  The run renames it to its chunk name (``<prefix>-<number>``, numbers of 6 digits or more, in input
  order) only once it is complete, so a killed writer leaves no visible partial chunk; a local
  rename is ``os.replace``, a remote one fsspec's ``mv`` (on an object store a copy that appears
  whole, then a delete).
- ``clean()``, at the start of every run, removes the temporary files of runs whose process is gone
  (on this machine and pid namespace); those of a live run, or of another machine, are left alone.
- Every call blocks on the disk or the network.
"""
from __future__ import annotations

import contextlib
import os
import posixpath
import re
from typing import TYPE_CHECKING, List, Optional, Tuple

from .._paths import is_url, local_path
from .._storage import writers
from .._storage.remote import filesystem

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

TEMP = ".tmp-"


class Output:
    """A folder of chunks; picklable (a task makes its own filesystem instance)."""

    def __init__(self, url: str, prefix: str = "shard") -> None:
        self.url = url.rstrip("/") if is_url(url) else local_path(os.fspath(url))
        self.remote = is_url(self.url)
        self.prefix = prefix
        self._chunk = re.compile(rf"^{re.escape(prefix)}-([0-9]{{6,}})\.")
        self._fs: Optional[Tuple[AbstractFileSystem, str]] = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fs": None}

    def _remote(self) -> Tuple[AbstractFileSystem, str]:
        if self._fs is None:
            self._fs = filesystem(self.url, retried_here=False)
        return self._fs

    def path(self, name: str) -> str:
        """A name's path on the filesystem (for a URL, the path fsspec takes)."""
        if self.remote:
            return posixpath.join(self._remote()[1], name)
        return os.path.join(self.url, name)

    def url_of(self, name: str) -> str:
        """A name as the user and the readers spell it."""
        return f"{self.url}/{name}" if self.remote else os.path.join(self.url, name)

    def make(self) -> None:
        if self.remote:
            fs, root = self._remote()
            with contextlib.suppress(FileExistsError):  # an object store has no folders
                fs.makedirs(root, exist_ok=True)
        else:
            os.makedirs(self.url, exist_ok=True)

    def names(self) -> List[str]:
        """The names in the folder (its top level), sorted; none when it does not exist."""
        if self.remote:
            fs, root = self._remote()
            fs.invalidate_cache()
            try:
                return sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False))
            except FileNotFoundError:
                return []
        try:
            return sorted(os.listdir(self.url))
        except FileNotFoundError:
            return []

    def chunk_number(self, name: str) -> Optional[int]:
        found = self._chunk.match(name)
        return int(found[1]) if found else None

    def temp_name(self, tag: str, task: int, n: int, suffix: str) -> str:
        return f"{TEMP}{tag}-{task:06d}-{n:04d}{suffix}"

    def put(self, name: str, data: bytes) -> None:
        """Write ``data`` as the file ``name``, whole (the caller names a temporary file)."""
        if self.remote:
            self._remote()[0].pipe_file(self.path(name), data)
            return
        with open(self.path(name), "wb") as f:
            f.write(data)

    def rename(self, name: str, new: str) -> None:
        if self.remote:
            self._remote()[0].mv(self.path(name), self.path(new))
        else:
            os.replace(self.path(name), self.path(new))

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            if self.remote:
                self._remote()[0].rm(self.path(name))
            else:
                os.unlink(self.path(name))

    def clean(self) -> List[str]:
        """Remove the temporary files of writers that are gone; the names removed."""
        stale = [n for n in self.names() if n.startswith(TEMP) and writers.dead(n)]
        for name in stale:
            self.remove(name)
        return stale
