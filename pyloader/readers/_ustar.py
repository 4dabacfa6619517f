"""An uncompressed tar stream read by hand: the members ``TarReader`` meets in a shard, without ``tarfile``.

``tarfile`` builds a ``TarInfo`` of every header (and checks its checksum twice), about a sixth of the
reading of a shard of small images. Contracts:

- ``Members(f, first)`` reads the stream ``f`` whose first 512-byte block is ``first`` (``is_ustar(first)``
  must hold: a ustar or GNU header, which is how an uncompressed archive begins).
- Iterating gives each member as ``(name, is_file)``; ``read()`` gives the data of the member just met,
  else it is skipped (by a seek where the stream can, unread). Names are as ``tarfile`` gives them: the
  ustar prefix joined, a PAX ``path`` or a GNU long name applied; a PAX ``size`` too.
- The archive must end with two zero blocks. Anything else raises ``tarfile.ReadError`` (a ``TarError``):
  a header whose checksum fails, one cut short, data cut short, the end missing; the message says
  where, in the words of ``TarReader``'s own check of the end.
"""
from __future__ import annotations

import tarfile
from typing import IO, Dict, Iterator, Optional, Tuple

BLOCK = tarfile.BLOCKSIZE
_ZERO = bytes(BLOCK)
_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
_SPACES = 8 * ord(" ")


# why an archive has no proper end, by the name of the ``tarfile`` error that met it (its classes are not public)
ENDS = {"EmptyHeaderError": "the data stops where a member's header should begin",
        "TruncatedHeaderError": "the data stops inside a member's header",
        "InvalidHeaderError": "a member's header is damaged (its checksum fails)",
        "EOFHeaderError": "it has one zero block where a complete archive ends with two"}


def no_end(at: int, why: str) -> tarfile.ReadError:
    """The error of an archive that does not end as a complete one does, at byte ``at``."""
    return tarfile.ReadError(f"no end of archive at byte {at}: {why} (cut short?)")


def is_ustar(block: bytes) -> bool:
    """Whether ``block`` is a whole ustar or GNU header: an uncompressed archive begins with one."""
    return len(block) == BLOCK and block[257:262] == b"ustar"


def _octal(field: bytes) -> int:
    """A number field: octal digits (NUL or space ended), or GNU's base-256 (the first byte's top bit set)."""
    if field[0] & 0x80:
        return int.from_bytes(field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip()
    try:
        return int(digits or b"0", 8)
    except ValueError:
        raise tarfile.ReadError(f"a header's number field is not octal: {field!r}") from None


def _checksum_holds(header: bytes) -> bool:
    """The stored checksum against the header's bytes summed with its own field as spaces (unsigned, or
    signed as some old writers summed)."""
    stored = _octal(header[148:156])
    unsigned = sum(header) - sum(header[148:156]) + _SPACES
    if stored == unsigned:
        return True
    signed = sum(b - 256 if b > 127 else b for b in header[:148] + header[156:]) + _SPACES
    return stored == signed


def _name(header: bytes) -> str:
    name = header[0:100].split(b"\0", 1)[0]
    prefix = header[345:500].split(b"\0", 1)[0] if header[257:265] == tarfile.POSIX_MAGIC else b""
    raw = prefix + b"/" + name if prefix else name
    return raw.decode("utf-8", "surrogateescape")


def _pax_records(data: bytes) -> Dict[str, str]:
    """The ``length key=value\\n`` records of a PAX extended header."""
    records: Dict[str, str] = {}
    at = 0
    while at < len(data) and data[at:at + 1] not in (b"", b"\0"):
        length = int(data[at:data.index(b" ", at)])
        record = data[data.index(b" ", at) + 1:at + length - 1]
        key, _, value = record.partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        at += length
    return records


class Members:
    """The members of the stream (see the module)."""

    def __init__(self, f: IO[bytes], first: bytes) -> None:
        self.f, self.first = f, first
        self.offset = 0  # of the next header
        self._unread = 0  # bytes of the member just met not read yet, padding included
        self._size = 0
        self._seekable = _seekable(f)

    def read(self) -> bytes:
        data = self._exactly(self._size)
        self._unread -= self._size
        return data

    def __iter__(self) -> Iterator[Tuple[str, bool]]:
        extended: Dict[str, str] = {}
        while True:
            header = self._header()
            if header is None:
                return
            kind = header[156:157]
            self._size = _octal(header[124:136])
            if kind in (tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME):
                extended.update(self._extended(kind))
                continue
            if "size" in extended:
                self._size = int(extended["size"])
            name = extended.get("path") or _name(header)
            extended = {}
            self._unread = self._size + -self._size % BLOCK
            yield name, kind in _FILE_TYPES
            self._skip()

    def _extended(self, kind: bytes) -> Dict[str, str]:
        """A PAX extended header's records, or a GNU long name as ``path``; either applies to the next member."""
        self._unread = self._size + -self._size % BLOCK
        data = self.read()
        self._skip()
        if kind == tarfile.GNUTYPE_LONGNAME:
            return {"path": data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")}
        return _pax_records(data)

    def _header(self) -> Optional[bytes]:
        """The next member's header, or ``None`` at the archive's end (two zero blocks)."""
        header, self.first = (self.first, b"") if self.first else (self.f.read(BLOCK), b"")
        at = self.offset
        self.offset += len(header)
        if len(header) < BLOCK:
            raise no_end(at, ENDS["TruncatedHeaderError" if header else "EmptyHeaderError"])
        if header == _ZERO:
            if self.f.read(BLOCK) != _ZERO:
                raise no_end(at, ENDS["EOFHeaderError"])
            return None
        if not _checksum_holds(header):
            raise no_end(at, ENDS["InvalidHeaderError"])
        return header

    def _skip(self) -> None:
        """Past what is left of the member just met (its data unread, its padding)."""
        if self._unread and self._seekable:
            self.f.seek(self._unread, 1)
        elif self._unread:
            self._exactly(self._unread)
        self.offset += self._unread
        self._unread = 0

    def _exactly(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) < n:
            raise tarfile.ReadError("unexpected end of data")
        return data


def _seekable(f: IO[bytes]) -> bool:
    try:
        return f.seekable()
    except (AttributeError, OSError, ValueError):
        return False
