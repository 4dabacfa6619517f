"""What the built-in readers share: error messages, argument checks, and, for the
line-based readers, numbered decoding of a file and grouping of rows into pieces."""
from __future__ import annotations

import abc
import codecs
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from .._abc import DataReader
from .._columns import Columns
from .._files import open_file

Row = Tuple


class FileFormatError(ValueError):
    """A file's content is not what its reader expects; the message names the file."""


def file_error(path: str, what: str, line: Optional[int] = None) -> FileFormatError:
    where = f"file {path!r}" if line is None else f"file {path!r}, line {line}"
    return FileFormatError(f"{where}: {what}")


def check_piece_size(piece_size: int) -> int:
    if not isinstance(piece_size, int) or isinstance(piece_size, bool) or piece_size < 1:
        raise ValueError(f"piece_size must be an integer >= 1, got {piece_size!r}")
    return piece_size


def check_fields(fields: Optional[Sequence[str]], name: str = "fields") -> Optional[List[str]]:
    """``None``, or a non-empty list of distinct strings."""
    if fields is None:
        return None
    if isinstance(fields, str):
        raise ValueError(f"{name} must be a list of strings, not a string: {fields!r}")
    out = list(fields)
    if not out or not all(isinstance(f, str) for f in out) or len(set(out)) != len(out):
        raise ValueError(f"{name} must be a non-empty list of distinct strings, got {fields!r}")
    return out


def check_encoding(encoding: str) -> str:
    try:
        return codecs.lookup(encoding).name
    except (LookupError, TypeError) as e:
        raise ValueError(f"unknown encoding {encoding!r}") from e


def iter_lines(path: str, encoding: str = "utf-8") -> Iterator[Tuple[int, str]]:
    """Yield ``(line_number, line)`` for each line of ``path``, 1-based, reading incrementally.

    A line ends at ``"\\n"`` and keeps it (the last line may lack it); ``"\\r\\n"``
    keeps its ``"\\r"`` too. Bytes that do not decode: ``ValueError`` naming the
    file and the line.
    """
    decoder = codecs.getincrementaldecoder(encoding)()
    shown = encoding[:-4] if encoding.endswith("-sig") else encoding
    number, pending = 0, ""
    with open_file(path, "rb") as f:
        for raw in f:
            try:
                text = decoder.decode(raw)
            except UnicodeDecodeError as e:
                raise file_error(path, f"not valid {shown}: {e}", number + 1) from e
            pending += text
            if "\n" not in pending:
                continue
            *done, pending = pending.split("\n")
            for line in done:
                number += 1
                yield number, line + "\n"
        try:
            pending += decoder.decode(b"", final=True)
        except UnicodeDecodeError as e:
            raise file_error(path, f"not valid {shown}: {e}", number + 1) from e
    if pending:
        yield number + 1, pending


def is_blank(line: str) -> bool:
    """Whether ``line`` holds only whitespace, as ``str.isspace`` defines it (``"\\x1c"``,
    ``"\\x85"`` and ``"\\u2028"`` included): the one definition reading and counting share."""
    return not line.strip()


# the ASCII bytes ``is_blank`` strips: a line of them and these alone is blank, without decoding
_ASCII_SPACE = bytes(c for c in range(128) if chr(c).isspace())
# every ASCII byte (the backslash doubled: a valid escape), then escapes and shifts of codecs
# with state (unicode_escape, ISO-2022, HZ, UTF-7)
_PROBE = bytes(range(128)).replace(b"\\", b"\\\\") + b" \\u2028 \\x20 \x1b$B!!\x1b(B ~{!!~} +AAA-"


def _bytes_tell_lines(codec: str) -> bool:
    """Whether ``codec`` decodes ASCII bytes to themselves whatever surrounds them (not UTF-16
    or -32, EBCDIC, nor a codec with escapes or shifts): then ``b"\\n"`` ends a line, ASCII
    whitespace bytes are whitespace, and a line decodes alone as it does within its file."""
    try:
        return _PROBE.decode(codec) == _PROBE.decode("ascii")
    except (UnicodeError, LookupError):
        return False


def count_lines(path: str, encoding: str, skip_blank: bool) -> Optional[int]:
    """The lines of ``path`` as ``iter_lines`` gives them (minus the blank ones with
    ``skip_blank``), counted on the raw bytes, or ``None`` when the bytes alone cannot tell
    (``_bytes_tell_lines``); then only decoding can. A line ends at ``"\\n"`` alone, in
    counting and reading alike; a last line without one counts when it holds text (a lone
    byte order mark, which the ``-sig`` codec drops, does not)."""
    codec = encoding.replace("-sig", "")  # the BOM is dealt with here, on the first line only
    if not _bytes_tell_lines(codec):
        return None
    n = 0
    with open_file(path, "rb") as f:
        for number, raw in enumerate(f):
            if number == 0 and raw.startswith(codecs.BOM_UTF8) and encoding.endswith("-sig"):
                raw = raw[len(codecs.BOM_UTF8):]
            n += not _blank_bytes(raw, codec) if skip_blank else bool(raw)
    return n


def _blank_bytes(raw: bytes, codec: str) -> bool:
    """``is_blank`` of ``raw`` decoded, decoding only a line with bytes beyond ASCII."""
    stripped = raw.strip(_ASCII_SPACE)
    return not stripped if stripped.isascii() else is_blank(stripped.decode(codec, errors="replace"))


def strip_newline(line: str) -> str:
    """``line`` without its trailing ``"\\n"`` or ``"\\r\\n"``."""
    if line.endswith("\n"):
        line = line[:-2] if line.endswith("\r\n") else line[:-1]
    return line


def pieces(fields: Sequence[str], rows: Iterable[Row], piece_size: int) -> Iterator[Columns]:
    """Group ``rows`` (tuples aligned with ``fields``) into dict-of-lists of at most ``piece_size`` rows."""
    buf: List[Row] = []
    for row in rows:
        buf.append(row)
        if len(buf) == piece_size:
            yield _transpose(fields, buf)
            buf = []
    if buf:
        yield _transpose(fields, buf)


def _transpose(fields: Sequence[str], rows: List[Row]) -> Columns:
    return {field: list(col) for field, col in zip(fields, zip(*rows))}


class LineReader(DataReader):
    """A reader whose file is a sequence of text rows; subclasses implement ``rows``.

    ``read_file`` and ``iter_file`` both consume ``rows``, so they give the same
    samples in the same order; ``iter_file`` holds at most ``piece_size`` rows.
    """

    def __init__(self, batch_size: int, shuffle: bool, random_seed: int, piece_size: int) -> None:
        super().__init__(batch_size=batch_size, shuffle=shuffle, random_seed=random_seed)
        self.piece_size = check_piece_size(piece_size)

    @abc.abstractmethod
    def rows(self, path: str) -> Tuple[List[str], Iterator[Row]]:
        """``(fields, rows)``: the column names and a lazy iterator of row tuples."""

    def read_file(self, path: str) -> Tuple[Dict[str, list], int]:
        fields, rows = self.rows(path)
        columns: Dict[str, list] = {field: [] for field in fields}
        for piece in pieces(fields, rows, self.piece_size):
            for field, col in piece.items():
                columns[field].extend(col)
        n_sample = len(columns[fields[0]]) if fields else 0
        return columns, n_sample

    def iter_file(self, path: str) -> Iterator[Columns]:
        fields, rows = self.rows(path)
        for piece in pieces(fields, rows, self.piece_size):
            yield self.checked(path, piece)
