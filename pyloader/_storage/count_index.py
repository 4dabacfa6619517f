"""An index of sample counts: per file, its name, size, version and ``DataReader.count``, in one JSON file.

Contracts:

- The index is JSON, never pickled: ``{"format": 1, "key": {"reader": ..., "settings": {...}},
  "files": {name: {"size": int, "version": str, "count": int}}}``. ``key`` is the reader's class
  (module and qualified name) and the settings that can change what it counts (``count_key``); an
  index made under another key is not used.
- A file's entry is used only while the file has the size and version it had when it was
  counted (``stamps``: a local file's ``st_mtime_ns``, a remote file's ETag, generation or
  modification time, ``_storage.remote.version``); a file that no longer matches is counted again
  and named (``Lookup.stale``). A file that is gone has no entry used: its count, asked of the
  reader, fails naming it.
- Next to the data (``INDEX_NAME`` in the folder ``index_folder`` finds) names are relative to that
  folder, so the index moves with the data; in ``cache_dir`` they are the paths or URLs as listed.
- It is read in one request. It is written whole under a temporary name, then renamed into place
  (a remote object is replaced by one put): several ranks and runs writing at once leave one valid
  index, the last writer's, which holds the entries it found on disk as well as its own. Each write's
  temporary name is its own and carries its writer's tag (``_storage.writers``): one left by a
  writer killed before its rename goes with the next ``DiskCache`` on the folder.

Every function here blocks on the disk or the network: the loader calls them off the event loop.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import posixpath
import re
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple, TypedDict

from .._checks import is_integer
from .._paths import is_url, local_path
from . import writers
from .files import is_glob
from .remote import Info, filesystem, version
from .remote import _with_path as with_path

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

logger = logging.getLogger("pyloader")

FORMAT = 1
INDEX_NAME = "_pyloader_counts.json"  # starts with "_": folder walks and globs of the data skip it
# the DataReader settings that change how a file is cut, ordered or batched, never what it holds
_NOT_COUNTING = frozenset({"batch_size", "shuffle", "random_seed", "piece_size"})

Stamp = Tuple[int, str]  # (size in bytes, version)
IndexKey = Dict[str, object]  # what an index is made for (``count_key``), as JSON


class Entry(TypedDict, total=False):
    """What an index holds for one file: its size, version and count, and for a line file where its
    samples start (``runs``: ``_sample_index``)."""

    size: int
    version: str
    count: int
    runs: Dict[str, object]


Entries = Dict[str, Entry]  # by the file's name


def _filesystem(url: str) -> Tuple[AbstractFileSystem, str]:
    """``url``'s filesystem, its calls retried by s3fs (none of them is retried here)."""
    return filesystem(url, retried_here=False)


_JSON_SCALARS = (type(None), bool, int, float, str)


def _plain(value: object) -> object:
    """``value`` as JSON keeps it, or its type's name when it is no plain value (a tokenizer, a function)."""
    if isinstance(value, _JSON_SCALARS):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain(v) for k, v in sorted(value.items())}
    cls = type(value)
    return f"<{cls.__module__}.{cls.__qualname__}>"


def count_key(reader: object) -> IndexKey:
    """What an index is made for: the reader's class and its public settings, less those that
    never change a count (``batch_size``, ``shuffle``, ``random_seed``, ``piece_size``)."""
    cls = type(reader)
    settings = {name: _plain(value) for name, value in sorted(getattr(reader, "__dict__", {}).items())
                if not name.startswith("_") and name not in _NOT_COUNTING}
    return {"reader": f"{cls.__module__}.{cls.__qualname__}", "settings": settings}


def _join(folder: str, name: str) -> str:
    return posixpath.join(folder, name) if is_url(folder) else os.path.join(folder, name)


def _parent(path: str) -> str:
    return posixpath.dirname(path) if is_url(path) else os.path.dirname(path)


def index_folder(data_dir: object, files: Sequence[str]) -> str:
    """Where the index of ``data_dir``'s ``files`` lives: the folder ``data_dir`` names, the folder
    of a glob before its first wildcard, or the folder holding every file of a list (or the file)."""
    if isinstance(data_dir, (str, os.PathLike)):
        spec = os.fspath(data_dir)
        if is_glob(spec):
            return _as_listed(_glob_root(spec))
        return _parent(spec) if list(files) == [spec] else _as_listed(spec.rstrip("/") or "/")
    return _common_folder(files)


def _glob_root(spec: str) -> str:
    """The folder of a glob before its first wildcard (``.`` when the first part has one)."""
    parts = spec.split("/")
    static = next(k for k, part in enumerate(parts) if is_glob(part))
    return "/".join(parts[:static]) or "."


def _common_folder(files: Sequence[str]) -> str:
    parents = {_parent(f) for f in files}
    if len(parents) == 1:
        return parents.pop()
    if any(is_url(p) for p in parents):
        common = os.path.commonprefix(sorted(parents))
        return common[:common.rfind("/")] if "/" in common else common
    return os.path.commonpath([os.path.abspath(local_path(p)) for p in parents])


def _as_listed(folder: str) -> str:
    """A URL spelled as the listing spells its files (``memory://d`` lists ``memory:///d/x``)."""
    return with_path(folder, _filesystem(folder)[1]).rstrip("/") if is_url(folder) else folder


_NOT_NORMAL = re.compile(r"/\.{0,2}(?:/|$)")  # after a "/": an empty, ``.`` or ``..`` part (normpath would change it)


def names_in(folder: str, paths: Sequence[str]) -> List[str]:
    """Each of ``paths`` relative to ``folder`` (``/`` separated), or the path itself where it is not
    below it."""
    prefix = folder.rstrip("/") + "/"
    if is_url(folder):
        return [path.removeprefix(prefix) for path in paths]
    below, start = _below(prefix), len(prefix)
    return [path[start:] if below(path) else _relative(folder, path) for path in paths]


def _below(prefix: str) -> Callable[[str], bool]:
    """Whether a path is ``prefix`` (a local folder's, ending in ``/``) and a relative path that
    ``os.path.normpath`` leaves as it is: its name below the folder, told without a system call."""
    if prefix == "/":
        return lambda path: False
    abnormal, start = _NOT_NORMAL.search, len(prefix) - 1
    if ":" in prefix:  # else no path that starts with it is a URL (a scheme ends at its first ":")
        return lambda path: path.startswith(prefix) and not abnormal(path, start) and not is_url(path)
    return lambda path: path.startswith(prefix) and not abnormal(path, start)


def _relative(folder: str, path: str) -> str:
    if is_url(path):
        return path.removeprefix(folder.rstrip("/") + "/")
    relative = os.path.relpath(os.path.abspath(local_path(path)), os.path.abspath(local_path(folder)))
    return path if relative.startswith("..") else relative.replace(os.sep, "/")


def name_in(folder: str, path: str) -> str:
    """``path`` relative to ``folder``, as ``names_in`` names it."""
    return names_in(folder, [path])[0]


def cache_index_path(cache_folder: str, key: IndexKey, folder: str) -> str:
    """The index the loader keeps in ``cache_dir`` for the data of ``folder`` and ``key``."""
    digest = hashlib.sha256(json.dumps([key, folder], sort_keys=True).encode()).hexdigest()[:32]
    return os.path.join(cache_folder, f"counts-{digest}.json")


# -- the files as they are now ------------------------------------------------------------
def _local_stamp(path: str) -> Optional[Stamp]:
    try:
        st = os.stat(local_path(path))
    except FileNotFoundError:
        return None
    return st.st_size, f"mtime_ns={st.st_mtime_ns}"


def _remote_stamps(paths: Sequence[str], folder: str) -> List[Optional[Stamp]]:
    """One listing of ``folder`` with details (one request per page of names), then ``info`` for any
    file the listing did not give."""
    fs, root = _filesystem(folder)
    listed: Dict[str, Info] = {}
    with contextlib.suppress(Exception):  # a folder that cannot be listed: each file is asked for itself
        listed = {fs._strip_protocol(name): info for name, info in fs.find(root, detail=True).items()}
    out: List[Optional[Stamp]] = []
    below = folder.rstrip("/") + "/"
    for path in paths:  # a file below the folder is named from the folder's path on fs: no fsspec look-up per file
        one = root.rstrip("/") + "/" + path[len(below):] if path.startswith(below) else _filesystem(path)[1]
        info = listed.get(fs._strip_protocol(one))
        if info is None:
            try:
                info = fs.info(one)
            except FileNotFoundError:
                out.append(None)
                continue
        out.append((int(info.get("size") or 0), version(info)))
    return out


def stamps(paths: Sequence[str], folder: str) -> List[Optional[Stamp]]:
    """The size and version of each file now; ``None`` for a file that is gone (its count, asked of
    the reader, then fails naming it)."""
    remote = [p for p in paths if is_url(p)]
    found = dict(zip(remote, _remote_stamps(remote, folder))) if remote else {}
    return [found[p] if p in found else _local_stamp(p) for p in paths]


# -- reading and writing ------------------------------------------------------------------
def _read_bytes(path: str) -> bytes:
    if is_url(path):
        fs, one = _filesystem(path)
        return fs.cat_file(one)
    with open(local_path(path), "rb") as f:
        return f.read()


def _valid(found: object) -> bool:
    if not isinstance(found, dict) or found.get("format") != FORMAT or not isinstance(found.get("files"), dict):
        return False
    return all(_is_entry(e) for e in found["files"].values())


def _is_entry(e: object) -> bool:
    """Whether ``e`` is an ``Entry``: an integer size, a version string and a count (an integer >= 0)."""
    return isinstance(e, dict) and isinstance(e.get("size"), int) and isinstance(e.get("version"), str) \
        and is_integer(e.get("count"))


def read_index(path: str, key: IndexKey) -> Optional[Entries]:
    """The entries of the index at ``path`` (one read), or ``None``: there is none, it cannot be
    read or parsed (logged), or it was made for another reader or other settings (logged)."""
    try:
        found = json.loads(_read_bytes(path))
    except FileNotFoundError:
        return None
    except Exception as exc:  # OSError, ValueError, a remote store's own (botocore's are not OSErrors)
        logger.warning("pyloader: the count index %r cannot be read, not used: %s", path, exc)
        return None
    if not _valid(found):
        logger.warning("pyloader: %r is not a count index of this version of pyloader, not used", path)
        return None
    if found.get("key") != key:
        logger.info("pyloader: the count index %r was made for %s, not %s: not used", path,
                    json.dumps(found.get("key"), sort_keys=True), json.dumps(key, sort_keys=True))
        return None
    return found["files"]


def _write_local(path: str, data: bytes) -> None:
    """``data`` as the file ``path``, replaced at once; the file gets the permissions of any new file (0666
    less the umask: readable by the other users of a shared dataset), not ``mkstemp``'s 0600."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".counts-{writers.tag()}-{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to open()
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_index(path: str, key: IndexKey, entries: Entries, keep_found: bool = True) -> None:
    """Write ``entries`` as the index at ``path``, atomically; with ``keep_found``, the entries of the
    index found there (same key) that ``entries`` does not hold are kept."""
    merged = dict(read_index(path, key) or {}) if keep_found else {}
    merged.update(entries)
    data = json.dumps({"format": FORMAT, "key": key, "files": dict(sorted(merged.items()))},
                      separators=(",", ":")).encode()
    if is_url(path):
        fs, one = _filesystem(path)
        fs.pipe_file(one, data)  # an object store replaces the whole object, or nothing
    else:
        _write_local(path, data)


def entry(stamp: Stamp, count: int, runs: Optional[Dict[str, object]] = None) -> Entry:
    out: Entry = {"size": stamp[0], "version": stamp[1], "count": count}
    if runs is not None:
        out["runs"] = runs
    return out


@dataclass
class Lookup:
    """What the indexes give for some files: a count, or ``None`` where the file must be counted."""

    counts: List[Optional[int]]
    stale: List[str] = field(default_factory=list)  # in an index, but changed since
    runs: List[Optional[Dict[str, object]]] = field(default_factory=list)  # where samples start, where held


def lookup(files: Sequence[str], names: Sequence[str], stamps_now: Sequence[Optional[Stamp]],
           indexes: Sequence[Entries]) -> Lookup:
    """The count of each file from the first index whose entry of its name still matches it."""
    out = Lookup([])
    for path, name, stamp in zip(files, names, stamps_now):
        entries = [found[name] for found in indexes if name in found]
        match = _matching(entries, stamp)
        out.counts.append(None if match is None else match["count"])
        out.runs.append(None if match is None else match.get("runs"))
        if match is None and entries and stamp is not None:
            out.stale.append(path)
    return out


def _matching(entries: List[Entry], stamp: Optional[Stamp]) -> Optional[Entry]:
    """The first entry made for the file as it is now (its ``stamp``), if one was."""
    return next((e for e in entries if (e["size"], e["version"]) == stamp), None)
