"""Finding chunk files and opening them, on local disk or behind an fsspec URL (or chain of them,
``simplecache::s3://…``).

``open_file`` serves what the loader read ahead for a path (``prefetched``): bytes, or a
stream of blocks still being read; otherwise it opens the file itself.
"""
from __future__ import annotations

import contextlib
import fnmatch
import glob
import io
import logging
import os
import stat
import threading
from operator import attrgetter
from typing import IO, Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union, cast

from .._paths import is_url, local_path
from .compression import codec_for, decompressed
from .remote import serialized, storage_options

DataDir = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]

_GLOB_CHARS = set("*?[")


def is_glob(text: str) -> bool:
    """Whether ``text`` (a path, or a part of one) holds a glob wildcard."""
    return any(c in text for c in _GLOB_CHARS)

logger = logging.getLogger("pyloader")


class SeekableRaw(io.RawIOBase):
    """A readable raw file of ``size`` bytes whose position is ``_pos``: reading is the subclass's."""

    size: int
    _pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos


class Served:
    """What the loader read ahead for one path, for ``open_file`` to serve to the reader."""

    claimed = False  # the reader opened it

    def open(self) -> Optional[IO[bytes]]:
        """A binary file over the bytes, or ``None`` when they cannot be served (again)."""
        raise NotImplementedError

    def release(self) -> None:
        """The file's read is over (or abandoned): let go of what is held. Idempotent."""


class ServedBytes(Served):
    """A whole file's bytes, served any number of times; ``on_done`` runs once, at the first
    ``open`` or at ``release``, whichever comes first (the bytes are the parser's from then on)."""

    def __init__(self, data: bytes, on_done: Optional[Callable[[], None]] = None) -> None:
        self.data = data
        self._on_done = on_done
        self._lock = threading.Lock()

    def _done(self) -> None:
        with self._lock:
            on_done, self._on_done = self._on_done, None
        if on_done is not None:
            on_done()

    def open(self) -> IO[bytes]:
        self.claimed = True
        self._done()
        return io.BytesIO(self.data)

    def release(self) -> None:
        self._done()


_served: Dict[str, List[Served]] = {}  # path -> what the loader read ahead for it
_served_lock = threading.Lock()


@contextlib.contextmanager
def prefetched(path: str, data: Union[None, bytes, Served]) -> Iterator[None]:
    """While inside, ``open_file(path)`` serves ``data`` (read ahead by the loader) from memory."""
    if data is None:
        yield
        return
    served = data if isinstance(data, Served) else ServedBytes(data)
    with _served_lock:
        _served.setdefault(path, []).append(served)
    try:
        yield
    finally:
        with _served_lock:
            entries = _served[path]
            entries.remove(served)
            if not entries:
                del _served[path]
        served.release()


def _open_served(path: str) -> Optional[IO[bytes]]:
    with _served_lock:
        entries = list(_served.get(path, ()))
    for served in entries:
        f = served.open()
        if f is not None:
            return f
    return None


def direct_open(path: str) -> IO[bytes]:
    """``path`` opened for binary reading, local or through fsspec, without the read-ahead."""
    if is_url(path):
        import fsspec  # optional: only remote data needs it

        return fsspec.open(path, "rb", **storage_options(path, retried_here=False)).open()
    return open(local_path(path), "rb")


def open_file(path: str, mode: str = "rb", *, compression: Optional[str] = "infer", **kwargs: Any) -> IO:
    """Open ``path`` for reading, whether it is a local path or an fsspec URL.

    Readers should open their files through this so that the same reader works
    on local disk, ``file://``, ``s3://``, ``gs://``, ``http(s)://``, ``memory://`` and
    fsspec chains (``simplecache::s3://…``). Text modes take ``encoding``/``errors``/
    ``newline`` like ``open``. A file the loader has read ahead is served from memory.
    A name ending in ``.gz``, ``.bz2``, ``.xz``/``.lzma`` or ``.zst``/``.zstd`` is
    decompressed as it is read (``compression=None``: never; a codec name: always;
    see ``_storage.compression``).

    Example:
        <!-- example: s3 -->
        ```python
        with open_file("s3://bucket/data/part-0.jsonl", "rt") as f:   # a .gz, .zst ... is decompressed as it is read
            first_line = f.readline()
        ```
    """
    codec = codec_for(path, mode, compression)
    if codec is not None:
        return decompressed(open_file(path, "rb", compression=None), path, codec, mode, **kwargs)
    raw = _open_served(path) if "r" in mode else None
    if raw is not None:
        return raw if "b" in mode else io.TextIOWrapper(raw, **kwargs)
    if is_url(path):
        import fsspec  # optional: only remote data needs it

        opened = fsspec.open(path, mode, **kwargs, **storage_options(path, retried_here=False))
        with serialized(opened.fs):  # a caching filesystem downloads the file here
            return opened.open()
    return open(local_path(path), mode, **kwargs)


_READ_MOST = 0x7FFFF000  # the most one read(2) gives on Linux


def read_whole(path: str) -> bytes:
    """The bytes of ``path`` as stored (never decompressed). A local file is read by ``os.read`` on its
    descriptor: a small one in one call, without the buffered file object ``open`` builds (which costs as
    much as the read on a folder of small files); a URL, or a file served from memory, through ``open_file``."""
    if is_url(path) or path in _served:
        with open_file(path, "rb", compression=None) as f:
            return f.read()
    fd = os.open(local_path(path), os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        chunks = [os.read(fd, min(size + 1, _READ_MOST))]  # one byte more than its size: a short read is its end
        if len(chunks[0]) <= size < _READ_MOST:
            return chunks[0]
        while chunks[-1]:
            chunks.append(os.read(fd, _READ_MOST))
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_bytes(path: str, ranges: Sequence[Tuple[int, int]]) -> List[bytes]:
    """Bytes ``lo:hi`` of ``path`` as stored (never decompressed), for each ``(lo, hi)`` of ``ranges``: for a
    URL, one ranged request each, made at once where the filesystem can (``cat_ranges``), without a look-up
    of the object first; for a local file, a seek and a read each."""
    if is_url(path):
        import fsspec

        opened = fsspec.open(path, "rb", **storage_options(path, retried_here=False))
        return list(opened.fs.cat_ranges([opened.path] * len(ranges), [lo for lo, _ in ranges],
                                         [hi for _, hi in ranges]))
    out = []
    with open(local_path(path), "rb") as f:
        for lo, hi in ranges:
            f.seek(lo)
            out.append(f.read(hi - lo))
    return out


def _hidden(name: str) -> bool:
    return name.startswith((".", "_"))


_SPECIAL = ("named pipe", "socket", "device", "special file")
# what a mode is, tested in this order (a mode none of them names: "special file")
_KINDS = ((stat.S_ISREG, "file"), (stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "named pipe"), (stat.S_ISSOCK, "socket"),
          (stat.S_ISCHR, "device"), (stat.S_ISBLK, "device"))


def _kind(path: str) -> str:
    """What ``path`` is, following symbolic links: ``"file"`` (regular), ``"folder"``,
    ``"missing"`` (nothing there, or a link to nothing), ``"unreachable"`` (``os.stat``
    fails otherwise: a link loop, a folder on the way that may not be searched), or one
    of ``_SPECIAL``."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError:
        return "unreachable"
    return next((kind for test, kind in _KINDS if test(mode)), "special file")


def _refused(described: str, path: str, kind: str) -> FileNotFoundError:
    """The error for a path named outright that is not a file to load; ``described`` leads
    the sentence: ``"data_dir 'x'"`` or ``"data_dir lists 'x', which"``."""
    if kind == "missing":
        return FileNotFoundError(f"{described} does not exist")
    if kind == "unreachable":
        try:
            os.stat(path)
        except OSError as e:
            return FileNotFoundError(f"{described} cannot be examined: {e}")
    return FileNotFoundError(f"{described} is a {kind}, not a regular file")


def _readable_entries(paths: Iterable[str], kind_of: Callable[[str], str] = _kind) -> List[str]:
    """``paths`` less folders and special files: opening a named pipe or a device could block
    forever. Special files are named in a warning; a link to nothing, or a path ``os.stat``
    fails on, is kept, so that the reading reports it rather than it being lost silently."""
    kept, special = [], []
    for path in paths:
        kind = kind_of(path)
        if kind in _SPECIAL:
            special.append(f"{path!r} ({kind})")
        elif kind != "folder":
            kept.append(path)
    if special:
        shown = ", ".join(special[:5]) + (f" and {len(special) - 5} more" if len(special) > 5 else "")
        logger.warning("data_dir: skipping %d entries that are not regular files: %s", len(special), shown)
    return kept


def _entries(folder: str) -> List[os.DirEntry]:
    """The entries of ``folder`` not hidden, by name; none where it cannot be listed (as ``os.walk``)."""
    try:
        with os.scandir(folder) as listing:
            return sorted((e for e in listing if not _hidden(e.name)), key=attrgetter("name"))
    except OSError:
        return []


def _is(test: Callable[[], bool]) -> bool:
    """A ``DirEntry`` test, false where it fails (a link loop), as ``os.walk`` takes it."""
    try:
        return test()
    except OSError:
        return False


def _walk(root: str) -> List[str]:
    """Files under ``root``, following symlinked folders once each (a link loop ends there). A regular
    file is told by its directory entry, without a ``stat`` of its own (a folder of many small files)."""
    found: List[str] = []
    other = set()  # neither a regular file nor a folder by its entry: told by ``_readable_entries``
    visited = {os.path.realpath(root)}
    pending = [root]
    while pending:
        folders = []
        for entry in _entries(pending.pop()):
            if _is(entry.is_file):
                found.append(entry.path)
            elif _is(entry.is_dir):
                folders.append(entry.path)
            else:
                found.append(entry.path)
                other.add(entry.path)
        pending.extend(reversed(_unvisited(folders, visited)))
    if not other:
        return found
    return _readable_entries(found, lambda path: _kind(path) if path in other else "file")


def _unvisited(folders: List[str], visited: set) -> List[str]:
    """The ``folders`` not walked yet (a folder reached by several links once), marked as walked."""
    kept = []
    for folder in folders:
        real = os.path.realpath(folder)
        if real not in visited:
            visited.add(real)
            kept.append(folder)
    return kept


def _parts(path: str) -> List[str]:
    return [part for part in path.split("/") if part]


def _glob_aligns(pattern: Sequence[str], names: Sequence[str], strict: bool) -> bool:
    """Whether the path ``names`` matches the glob ``pattern`` (both split at ``/``) with,
    when ``strict``, every name starting with ``.`` or ``_`` matched by a pattern part that
    starts with the same character: wildcards and ``**`` do not match such names."""
    if not pattern:
        return not names
    part, rest = pattern[0], pattern[1:]
    if part == "**":
        return _globstar_aligns(rest, names, strict)
    if not names or not fnmatch.fnmatch(names[0], part):
        return False
    if strict and _hidden(names[0]) and part[0] != names[0][0]:
        return False
    return _glob_aligns(rest, names[1:], strict)


def _globstar_aligns(rest: Sequence[str], names: Sequence[str], strict: bool) -> bool:
    """``_glob_aligns`` for a pattern that starts with ``**`` (then ``rest``): it takes any number of
    names, none of them hidden when ``strict``."""
    for k, name in enumerate(names):
        if _glob_aligns(rest, names[k:], strict):
            return True
        if strict and _hidden(name):
            return False
    return _glob_aligns(rest, names[len(names):], strict)  # it takes every name


def _glob_keeps(spec: str, path: str) -> bool:
    """False for a match of the glob ``spec`` that only a wildcard's match of a ``.``/``_``
    name explains. A match that cannot be aligned with ``spec`` at all (a backend that
    rewrites its paths) is kept."""
    pattern, names = _parts(spec), _parts(path)
    return _glob_aligns(pattern, names, strict=True) or not _glob_aligns(pattern, names, strict=False)


def _listed(paths: List[str]) -> List[str]:
    """An explicit list of paths, taken as given: each must be a regular file (or a URL)."""
    if not paths:
        raise FileNotFoundError("data_dir is an empty list: no files to load")
    for p in paths:
        kind = "file" if is_url(p) else _kind(local_path(p))
        if kind != "file":
            raise _refused(f"data_dir lists {p!r}, which", local_path(p), kind)
    return paths


def list_files(data_dir: DataDir, retries: int = 0) -> List[str]:
    """The chunk files named by ``data_dir``, in a fixed (sorted) order.

    ``data_dir`` is one of:

    - a folder, walked recursively: files and folders whose names start with ``.`` or
      ``_`` (``.git``, Spark's ``_SUCCESS``, Parquet's ``_metadata``) are skipped, and so
      are entries that are not regular files (named pipes, sockets, devices: opening one
      could block forever), with a warning; a symbolic link counts as what it points to,
      and a link to nothing is kept, to fail when it is read;
    - a glob pattern (``**`` recursive), with the same rules: a name starting with ``.``
      or ``_`` is matched only by a pattern part starting with the same character
      (``data/*`` skips ``data/_SUCCESS``, ``data/_*`` lists it);
    - a list of paths, taken as given (nothing skipped, order kept): each must be a
      regular file, else ``FileNotFoundError`` saying what it is;
    - an fsspec URL (or chain, ``simplecache::s3://…``) of a folder, a glob or a file, with
      the same rules; transient remote errors are retried ``retries`` times.

    Nothing found: ``FileNotFoundError`` saying what was searched.

    Example:
        ```python
        list_files("data/")             # every file under data/, in a fixed order
        list_files("data/*.jsonl")      # the top folder's only; "data/**/*.jsonl" recursively
        ```
    """
    if isinstance(data_dir, (list, tuple)):
        return _listed([os.fspath(p) for p in data_dir])
    spec = os.fspath(cast(Union[str, os.PathLike], data_dir))
    files = _found(spec, retries)
    if not files:
        raise FileNotFoundError(f"no files found under data_dir {spec!r} (names starting with "
                                "'.' or '_' and special files are skipped)")
    return files


def _found(spec: str, retries: int) -> List[str]:
    """The files of ``spec``: a URL (remote folder, glob or file), a local glob, or a local folder or file."""
    globbed = is_glob(spec)
    if is_url(spec):
        from .remote import list_remote

        files = list_remote(spec, retries)
        return [f for f in files if _glob_keeps(spec, f)] if globbed else files
    if globbed:
        matches = sorted(glob.glob(local_path(spec), recursive=True))
        return _readable_entries(p for p in matches if _glob_keeps(local_path(spec), p))
    return _one(spec)


def _one(spec: str) -> List[str]:
    """The files of a local path that is not a glob: a folder's walk, or the file itself."""
    kind = _kind(local_path(spec))
    if kind == "folder":
        return _walk(local_path(spec))
    if kind == "file":
        return [spec]
    raise _refused(f"data_dir {spec!r}", local_path(spec), kind)
