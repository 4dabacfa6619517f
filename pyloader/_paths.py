"""What a path names: a file behind an fsspec URL (a protocol, or a chain such as
``simplecache::s3://…``), or a local file (a plain path, or a ``file://`` URL).

A shared basic: the loader's state (``_state``) tells local files by it as the storage
layer (``_storage.files``) does, so neither imports the other.
"""
from __future__ import annotations

import re

_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*(://|::)")  # a protocol, or the first link of an fsspec chain


def is_url(path: str) -> bool:
    return bool(_URL.match(path)) and not path.startswith("file://")


def local_path(path: str) -> str:
    """A local file's path as ``open`` takes it (a ``file://`` URL without its scheme)."""
    return path.removeprefix("file://")
