"""Listing files behind an fsspec URL (s3://, gs://, http(s)://, memory://)."""
from __future__ import annotations

from typing import List, Optional


def list_remote(url: str) -> List[str]:
    import fsspec

    fs, _, paths = fsspec.get_fs_token_paths(url)
    protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
    found: List[str] = []
    for path in paths:
        if fs.isdir(path):
            found.extend(p for p in fs.find(path) if not any(part.startswith((".", "_")) for part in p[len(path):].split("/") if part))
        elif fs.exists(path):
            found.append(path)
        else:
            raise FileNotFoundError(f"data_dir {url!r} does not exist")
    return sorted(f if "://" in f else f"{protocol}://{f}" for f in found)


def fetch_bytes(url: str, max_bytes: int) -> Optional[bytes]:
    """The whole file behind ``url``, or ``None`` when it is larger than ``max_bytes``
    (then the reader streams it itself). A missing file raises ``FileNotFoundError``."""
    import fsspec

    fs, _, (path,) = fsspec.get_fs_token_paths(url)
    size = fs.size(path)
    if size is not None and size > max_bytes:
        return None
    return fs.cat_file(path)
