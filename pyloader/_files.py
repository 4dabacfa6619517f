"""Finding chunk files and opening them, on local disk or behind an fsspec URL."""
from __future__ import annotations

import contextlib
import glob
import io
import os
import re
import threading
from typing import IO, Dict, Iterator, List, Optional, Sequence, Union

DataDir = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]

_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_GLOB_CHARS = set("*?[")


def is_url(path: str) -> bool:
    return bool(_URL.match(path)) and not path.startswith("file://")


def _local(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


_prefetched: Dict[str, List] = {}  # url -> [bytes, users]
_prefetched_lock = threading.Lock()


@contextlib.contextmanager
def prefetched(path: str, data: Optional[bytes]) -> Iterator[None]:
    """While inside, ``open_file(path)`` serves ``data`` (fetched ahead by the loader) from memory."""
    if data is None:
        yield
        return
    with _prefetched_lock:
        entry = _prefetched.setdefault(path, [data, 0])
        entry[1] += 1
    try:
        yield
    finally:
        with _prefetched_lock:
            entry[1] -= 1
            if not entry[1]:
                del _prefetched[path]


def open_file(path: str, mode: str = "rb", **kwargs) -> IO:
    """Open ``path`` for reading, whether it is a local path or an fsspec URL.

    Readers should open their files through this so that the same reader works
    on local disk, ``file://``, ``s3://``, ``gs://``, ``http(s)://`` and ``memory://``.
    Text modes take ``encoding``/``errors``/``newline`` like ``open``. A remote
    file the loader has already fetched is served from memory.
    """
    entry = _prefetched.get(path)
    if entry is not None and "r" in mode:
        raw = io.BytesIO(entry[0])
        return raw if "b" in mode else io.TextIOWrapper(raw, **kwargs)
    if is_url(path):
        import fsspec  # optional: only remote data needs it

        return fsspec.open(path, mode, **kwargs).open()
    return open(_local(path), mode, **kwargs)


def _hidden(name: str) -> bool:
    return name.startswith(".") or name.startswith("_")


def _walk(root: str) -> List[str]:
    """Files under ``root``, following symlinked folders once each (a link loop ends there)."""
    found = []
    visited = {os.path.realpath(root)}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        keep = []
        for d in sorted(dirnames):
            real = os.path.realpath(os.path.join(dirpath, d))
            if not _hidden(d) and real not in visited:
                visited.add(real)
                keep.append(d)
        dirnames[:] = keep
        found.extend(os.path.join(dirpath, f) for f in sorted(filenames) if not _hidden(f))
    return found


def list_files(data_dir: DataDir) -> List[str]:
    """The chunk files named by ``data_dir``, in a fixed (sorted) order.

    ``data_dir`` is a folder (walked recursively, hidden entries skipped), a glob
    pattern, a list of paths, or an fsspec URL of any of these. Nothing found:
    ``FileNotFoundError`` saying what was searched.
    """
    if isinstance(data_dir, (list, tuple)):
        paths = [os.fspath(p) for p in data_dir]
        if not paths:
            raise FileNotFoundError("data_dir is an empty list: no files to load")
        for p in paths:
            if not is_url(p) and not os.path.isfile(_local(p)):
                raise FileNotFoundError(f"data_dir lists {p!r}, which is not a file")
        return paths
    spec = os.fspath(data_dir)
    if is_url(spec):
        from ._remote import list_remote

        files = list_remote(spec)
    elif any(c in spec for c in _GLOB_CHARS):
        files = sorted(p for p in glob.glob(_local(spec), recursive=True) if os.path.isfile(p))
    elif os.path.isdir(_local(spec)):
        files = _walk(_local(spec))
    elif os.path.isfile(_local(spec)):
        files = [spec]
    else:
        raise FileNotFoundError(f"data_dir {spec!r} does not exist")
    if not files:
        raise FileNotFoundError(f"no files found under data_dir {spec!r} (hidden files are skipped)")
    return files
