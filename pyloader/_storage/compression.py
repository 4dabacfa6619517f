"""Transparent decompression of ``.gz``, ``.bz2``, ``.xz``/``.lzma`` and ``.zst``/``.zstd`` files.

``open_file`` wraps the byte stream of a file whose name ends with one of these
suffixes (or any stream, given ``compression=``) in ``decompressed``, so every
reader built on ``open_file`` reads the decompressed bytes, local and remote
files alike. It is one loop over the codecs' own incremental decompressors (the
standard library's ``zlib``, ``bz2``, ``lzma``, and ``zstandard``), the loop of the
standard library's ``bz2``/``lzma`` file objects, with these differences, which are the contract:

- Decompression streams: at most ``_OUT_BYTES`` of decompressed data (plus what
  ``_FEED`` bytes of compressed data yield, for zstd) is held beyond what the caller
  asked for; a file is never decompressed whole.
- Concatenated members (``cat a.gz b.gz``, multi-stream bz2/xz, multi-frame zstd)
  read as one stream; zero bytes between and after gzip members are padding, as
  ``gzip`` takes them. Anything else after a member is an error (``bz2`` and ``lzma``
  would drop it silently).
- Corrupt data, and data that ends before its compressed stream does (a
  truncated file), raise ``DecompressionError`` (a ``ValueError``) naming the file,
  with the codec's own exception as ``__cause__`` (for a truncated file an
  ``EOFError``, as the standard library raises). An error reading the underlying
  file (``OSError``) is raised as it is. An empty file reads as empty.
- Every byte decompressed before the damage is returned before the error is raised (a
  read returns those bytes, the next read raises, and so does any read after it): for
  gzip up to the first byte of compressed data that does not decode (the ``gzip``
  module drops what its last read made); for the others, whose decoders give no
  output of a call that fails, up to the damaged block or the last ``_FEED`` bytes of
  input fed before it.
- zstd needs the ``zstandard`` package (``pip install pyloader-ml[compression]``);
  it is imported when a zstd file is first opened, and a missing package raises
  ``ImportError`` naming the extra.
"""
from __future__ import annotations

import bz2
import contextlib
import functools
import io
import lzma
import zlib
from typing import IO, Any, Callable, Dict, List, Optional, Tuple, Type
from urllib.parse import urlsplit

__all__ = ["CODECS", "DecompressionError", "codec_for", "decompressed"]

# name suffix -> codec; the codec names are fsspec's
SUFFIXES = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".lzma": "xz", ".zst": "zstd", ".zstd": "zstd"}
CODECS = frozenset(SUFFIXES.values())

_FEED = 64 * 1024  # compressed bytes read from the file, and fed, at a time
_OUT_BYTES = 1024 * 1024  # decompressed bytes made at a time, and the buffer's size


class DecompressionError(ValueError):
    """A compressed file's data is corrupt or truncated. ``what`` is the message without the file."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"file {path!r}: {what}")
        self.path, self.what = path, what


def codec_for(path: str, mode: str = "rb", compression: Optional[str] = "infer") -> Optional[str]:
    """The codec to decompress ``path`` with when it is opened in ``mode``: ``None`` for none.

    ``compression="infer"`` goes by the name's suffix (for a URL, that of its path, without
    the query); ``None`` never decompresses; a codec name (``"gzip"``, ``"bz2"``, ``"xz"``,
    ``"zstd"``) always does. Files opened for writing are never decompressed."""
    if compression is None or any(c in mode for c in "wax+"):
        return None
    if compression != "infer":
        if compression not in CODECS:
            raise ValueError(f"unknown compression {compression!r}: expected one of {sorted(CODECS)}, "
                             "'infer' or None")
        return compression
    name = urlsplit(path).path if "://" in path else path
    return SUFFIXES.get(name[name.rfind("."):].lower())  # no dot: the last character, no suffix


def decompressed(raw: IO[bytes], path: str, codec: str, mode: str = "rb", **text_kwargs: Any) -> IO:
    """``raw`` (the compressed bytes of ``path``) read through ``codec``: a binary stream, or,
    for a text ``mode`` (no ``"b"``), a text stream taking ``encoding``/``errors``/``newline``.
    Closing it closes ``raw``."""
    try:
        stream: IO = io.BufferedReader(_Decompressing(raw, path, codec), buffer_size=_OUT_BYTES)
    except BaseException:
        raw.close()
        raise
    return stream if "b" in mode else io.TextIOWrapper(stream, **text_kwargs)


class _Damaged(Exception):
    """The codec failed on its input (``cause``); ``made`` is what it decompressed before the damage."""

    def __init__(self, cause: BaseException, made: bytes) -> None:
        super().__init__(str(cause))
        self.cause, self.made = cause, made


class _Gzip:
    """zlib's gzip decompressor (header and CRC checked) behind the interface of ``bz2``'s and
    ``lzma``'s; when it fails, ``_Damaged`` with what the input decodes to before its first bad byte."""

    def __init__(self) -> None:
        self._d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        self._tail = b""  # input held back by ``max_length``

    eof = property(lambda self: self._d.eof)
    unused_data = property(lambda self: self._d.unused_data)
    needs_input = property(lambda self: not self._tail)

    def decompress(self, data: bytes, max_length: int) -> bytes:
        data = self._tail + data
        before = self._d.copy()
        try:
            out = self._d.decompress(data, max_length)
        except zlib.error as e:
            made: List[bytes] = []  # fed again a byte at a time: zlib gives nothing of a call that fails
            with contextlib.suppress(zlib.error):
                for k in range(len(data)):
                    made.append(before.decompress(data[k:k + 1]))
            raise _Damaged(e, b"".join(made)) from e
        self._tail = self._d.unconsumed_tail
        return out


class _Zstd:
    """zstandard's decompressor behind the interface of ``bz2``'s: it makes all the output of what it
    is fed (``_FEED`` bytes at most), handed out ``max_length`` at a time."""

    def __init__(self) -> None:
        self._d = _zstandard().ZstdDecompressor().decompressobj()
        self._out, self._at = b"", 0  # the output of the last feed, and how much of it was handed out

    eof = property(lambda self: self._d.eof and self._at == len(self._out))
    unused_data = property(lambda self: self._d.unused_data)
    needs_input = property(lambda self: self._at == len(self._out))

    def decompress(self, data: bytes, max_length: int) -> bytes:
        if data:
            self._out, self._at = self._d.decompress(data), 0
        out = self._out[self._at:self._at + max_length]  # no copy when it is all of it
        self._at += len(out)
        return out


def _zstandard() -> Any:
    try:
        import zstandard
    except ImportError as e:
        raise ImportError("reading .zst files needs the zstandard package: "
                          "pip install 'pyloader-ml[compression]'") from e
    return zstandard


_STANDARD: Dict[str, Tuple[Callable[[], Any], Tuple[Type[BaseException], ...]]] = {
    "gzip": (_Gzip, (zlib.error,)),
    "bz2": (bz2.BZ2Decompressor, (OSError, ValueError)),
    "xz": (functools.partial(lzma.LZMADecompressor, format=lzma.FORMAT_AUTO), (lzma.LZMAError,)),  # .xz, .lzma
}


def _codec(codec: str) -> Tuple[Callable[[], Any], Tuple[Type[BaseException], ...]]:
    """A new decompressor for each member, and what it raises on bad data (never an error of the
    file's I/O: it only ever sees bytes already read)."""
    if codec in _STANDARD:
        return _STANDARD[codec]
    return _Zstd, (_zstandard().ZstdError,)  # zstandard's errors: imported with it


class _Decompressing(io.RawIOBase):
    """The decompressed bytes of ``source``, made as they are read."""

    def __init__(self, source: IO[bytes], path: str, codec: str) -> None:
        super().__init__()
        self._source, self._path, self._codec = source, path, codec
        self._new, self._errors = _codec(codec)
        self._d = self._new()
        self._fed = False  # the member was given data: its end is due before the file's
        self._made = b""  # made, not returned yet
        self._failure: Optional[DecompressionError] = None  # raised once what was made is returned

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        out = self._take(len(buffer))
        buffer[:len(out)] = out
        return len(out)

    def readall(self) -> bytes:
        return b"".join(iter(lambda: self._take(_OUT_BYTES), b""))

    def _take(self, size: int) -> bytes:
        """At most ``size`` bytes made (``b""`` at the end), or the failure once all before it were taken."""
        if not self._made and size:
            if self._failure is None:
                self._made = self._decompress(size)
            if not self._made and self._failure is not None:
                raise self._failure
        out, self._made = self._made[:size], self._made[size:]
        return out

    def close(self) -> None:
        if not self.closed:
            try:
                self._source.close()
            finally:
                super().close()

    def _decompress(self, size: int) -> bytes:
        """At most ``size`` bytes, ``b""`` at the end; on damage, sets ``_failure`` and returns what
        decompressed before it (any size)."""
        while True:
            if self._d.eof:
                data = self._next_member()
                if not data:
                    return b""
            elif self._d.needs_input:
                data = self._source.read(_FEED)
                if not data:
                    if not self._fed:
                        return b""
                    self._failure = self._error(EOFError("compressed file ended before the end-of-stream "
                                                         "marker was reached"), "truncated")
                    return b""
                self._fed = True
            else:
                data = b""
            try:
                out = self._d.decompress(data, size)
            except _Damaged as damaged:
                self._failure = self._error(damaged.cause, "corrupt")
                return damaged.made
            except self._errors as e:
                self._failure = self._error(e, "corrupt")
                return b""
            if out:
                return out

    def _next_member(self) -> bytes:
        """After a member's end: the input of the next one (a fresh decompressor for it), or ``b""``."""
        rest = self._d.unused_data
        while True:
            if self._codec == "gzip":
                rest = rest.lstrip(b"\0")
            if rest:
                self._d, self._fed = self._new(), True  # fed ``rest`` next
                return rest
            rest = self._source.read(_FEED)
            if not rest:
                return b""

    def _error(self, cause: BaseException, kind: str) -> DecompressionError:
        error = DecompressionError(self._path, f"{kind} {self._codec} data: {cause}")
        error.__cause__ = cause
        return error
