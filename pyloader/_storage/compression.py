"""Transparent decompression of ``.gz``, ``.bz2``, ``.xz``/``.lzma`` and ``.zst``/``.zstd`` files.

``open_file`` wraps the byte stream of a file whose name ends with one of these
suffixes (or any stream, given ``compression=``) in ``decompressed``, so every
reader built on ``open_file`` reads the decompressed bytes, local and remote
files alike. The contract:

- Decompression streams: at most about ``_OUT_BYTES`` of decompressed data (plus
  what ``_SMALL_FEED`` bytes of compressed data yield, for zstd) is held beyond
  what the caller asked for; a file is never decompressed whole.
- Concatenated members (``cat a.gz b.gz``, multi-stream bz2/xz, multi-frame zstd)
  read as one stream, as ``gzip``, ``bz2`` and ``lzma`` read them.
- Corrupt data, and data that ends before its compressed stream does (a
  truncated file), raise ``DecompressionError`` (a ``ValueError``) naming the file,
  with the codec's own exception as ``__cause__`` (for a truncated file an
  ``EOFError``, as the standard library raises). An error reading the underlying
  file (``OSError``) is raised as it is. An empty file reads as empty.
- Every byte decompressed before the damage is returned before the error is raised (a
  read returns those bytes, the next read raises; the error is raised again by any read
  after it): for gzip up to the first byte of compressed data that does not decode; for
  the codecs that check a block before giving it (bz2, and zstd, xz, whose decoders give
  no output of the input fed in a call that fails) up to the damaged block, or the last
  ``_SMALL_FEED`` bytes of input fed before it.
- zstd needs the ``zstandard`` package (``pip install pyloader-ml[compression]``);
  it is imported when a zstd file is first opened, and a missing package raises
  ``ImportError`` naming the extra.
"""
from __future__ import annotations

import bz2
import io
import lzma
import zlib
from typing import IO, Any, Callable, Dict, List, Optional, Tuple, Type
from urllib.parse import urlsplit

__all__ = ["CODECS", "DecompressionError", "codec_for", "decompressed"]

# name suffix -> codec; the codec names are fsspec's
SUFFIXES = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".lzma": "xz", ".zst": "zstd", ".zstd": "zstd"}
CODECS = frozenset(SUFFIXES.values())

_IN_BYTES = 64 * 1024  # compressed bytes read from the file at a time (and fed at a time)
_OUT_BYTES = 1024 * 1024  # decompressed bytes made at a time (gzip, bz2, xz)
_SMALL_FEED = 16 * 1024  # zstd makes all the output of what it is fed, and zstd and xz give none of a feed that
# fails: feed them little at a time


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
    dot = name.rfind(".")
    return SUFFIXES.get(name[dot:].lower()) if dot >= 0 else None


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
    """The codec failed on its input; ``made`` is what it decompressed before the damage."""

    def __init__(self, cause: BaseException, made: bytes) -> None:
        super().__init__(str(cause))
        self.cause, self.made = cause, made


class _Member:
    """One compressed member (gzip member, bz2/xz stream, zstd frame), behind one interface."""

    def __init__(self, codec: str) -> None:
        self.codec = codec
        self.fed = False  # data was given to it: its end is due before the file's
        self._tail = b""  # gzip: input held back by the output limit
        self._d: Any = _new_decompressor(codec)

    @property
    def eof(self) -> bool:
        return bool(self._d.eof)

    @property
    def unused(self) -> bytes:
        """Input that followed the member's end (the next member's start)."""
        return bytes(self._d.unused_data) + self._tail

    def wants_input(self) -> bool:
        if self.codec == "gzip":
            return not self._tail
        if self.codec == "zstd":
            return True
        return bool(self._d.needs_input)

    def take(self, data: bytes) -> bytes:
        """Decompressed bytes from ``data`` (and any input held back)."""
        self.fed = self.fed or bool(data)
        if self.codec == "gzip":
            before, data = self._d.copy(), self._tail + data
            try:
                out = self._d.decompress(data, _OUT_BYTES)
            except zlib.error:
                self._d = before
                return self._salvage(data)
            self._tail = self._d.unconsumed_tail
            return out
        if self.codec == "zstd":
            return self._d.decompress(data)
        return self._d.decompress(data, _OUT_BYTES)


    def _salvage(self, data: bytes) -> bytes:
        """gzip: what ``data`` decompresses to before its first byte that does not decode, fed a
        byte at a time from the state before it; ``_Damaged`` with it at that byte. Stops early
        (the rest of ``data`` held back in ``_tail``) at ``_OUT_BYTES`` or at the member's end."""
        made: List[bytes] = []
        size = 0
        for k in range(len(data)):
            try:
                out = self._d.decompress(data[k:k + 1])
            except zlib.error as e:
                raise _Damaged(e, b"".join(made)) from e
            made.append(out)
            size += len(out)
            if size >= _OUT_BYTES or self._d.eof:
                self._tail = data[k + 1:]
                break
        else:
            self._tail = b""
        return b"".join(made)


def _new_decompressor(codec: str) -> Any:
    if codec == "gzip":
        return zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # the gzip header and trailer, CRC checked
    if codec == "bz2":
        return bz2.BZ2Decompressor()
    if codec == "xz":
        return lzma.LZMADecompressor(format=lzma.FORMAT_AUTO)  # .xz and legacy .lzma
    return _zstandard().ZstdDecompressor().decompressobj()


def _zstandard() -> Any:
    try:
        import zstandard
    except ImportError as e:
        raise ImportError("reading .zst files needs the zstandard package: "
                          "pip install 'pyloader-ml[compression]'") from e
    return zstandard


def _codec_errors(codec: str) -> Tuple[Type[BaseException], ...]:
    """What the codec's decompressor raises on bad data (never an error of the file's I/O: the
    decompressor only ever sees bytes already read)."""
    errors: Dict[str, Callable[[], Tuple[Type[BaseException], ...]]] = {
        "gzip": lambda: (zlib.error,),
        "bz2": lambda: (OSError, ValueError),
        "xz": lambda: (lzma.LZMAError,),
        "zstd": lambda: (_zstandard().ZstdError,),
    }
    return errors[codec]()


class _Decompressing(io.RawIOBase):
    """The decompressed bytes of ``source``, made as they are read."""

    def __init__(self, source: IO[bytes], path: str, codec: str) -> None:
        super().__init__()
        self._source, self._path, self._codec = source, path, codec
        self._errors = _codec_errors(codec)
        self._member = _Member(codec)
        self._input = b""  # compressed bytes read, not yet fed
        self._out = memoryview(b"")  # decompressed bytes made, not yet returned
        self._ended = False
        self._failure: Optional[DecompressionError] = None  # raised once the bytes before it are returned

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        while not self._out and not self._ended:
            self._step()
        n = min(len(view), len(self._out))
        view[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def readall(self) -> bytes:
        parts: List[bytes] = []
        while True:
            while not self._out and not self._ended:
                self._step()
            if not self._out:
                return b"".join(parts)
            parts.append(bytes(self._out))
            self._out = memoryview(b"")

    def close(self) -> None:
        if not self.closed:
            try:
                self._source.close()
            finally:
                super().close()

    def _step(self) -> None:
        """Make some output, or find the end of the data (``_ended``), or raise the failure
        found by the step before (once the bytes made before it were returned)."""
        if self._failure is not None:
            raise self._failure
        member = self._member
        if member.eof:
            self._next_member()
            return
        if member.wants_input() and not self._input:
            self._input = self._source.read(_IN_BYTES)
            if not self._input:
                if member.fed:
                    raise self._error(EOFError("compressed file ended before the end-of-stream marker "
                                               "was reached"), "truncated")
                self._ended = True
                return
        feed = _SMALL_FEED if self._codec in ("zstd", "xz") else len(self._input)
        data, self._input = self._input[:feed], self._input[feed:]
        try:
            self._out = memoryview(member.take(data))
        except _Damaged as damaged:
            self._out = memoryview(damaged.made)
            self._failure = self._error(damaged.cause, "corrupt")
        except self._errors as e:
            raise self._error(e, "corrupt") from e

    def _next_member(self) -> None:
        """After a member's end: the next member, or the end of the data. Zero bytes between
        and after gzip members are padding, as ``gzip`` takes them (a member starts with 0x1f)."""
        rest = self._member.unused + self._input
        self._input = b""
        while True:
            if self._codec == "gzip":
                rest = rest.lstrip(b"\0")
            if rest:
                break
            rest = self._source.read(_IN_BYTES)
            if not rest:
                self._ended = True
                return
        self._member = _Member(self._codec)
        self._input = rest

    def _error(self, cause: BaseException, kind: str) -> DecompressionError:
        error = DecompressionError(self._path, f"{kind} {self._codec} data: {cause}")
        error.__cause__ = cause
        return error
