"""What the built-in readers share: error messages, argument checks, and, for the
line-based readers, decoding a file a block at a time with numbered lines, and cutting
what they parse into pieces of ``piece_size`` rows.

The contract of the line readers' fast paths: a block is parsed in one go only where that
gives exactly what parsing it a line at a time gives; anything else, and every block with
an error, goes a line at a time, so values, errors and messages (file, line) are those the
readers always gave, and the rows before an error complete the pieces they complete."""
from __future__ import annotations

import abc
import codecs
import io
from typing import IO, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, cast

from .._abc import DataReader
from .._checks import is_integer
from .._columns import Columns, n_rows
from .._sample_index import Extent, LineTable
from .._storage.compression import DecompressionError
from .._storage.files import open_file, read_bytes

Row = Tuple


class FileFormatError(ValueError):
    """A file's content is not what its reader expects; the message names the file."""


def file_error(path: str, what: str, line: Optional[int] = None) -> FileFormatError:
    where = f"file {path!r}" if line is None else f"file {path!r}, line {line}"
    return FileFormatError(f"{where}: {what}")


def check_piece_size(piece_size: int) -> int:
    if not is_integer(piece_size, least=1):
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


BLOCK_BYTES = 1 << 20  # raw bytes decoded at a time (more when a line is longer)


def iter_text_blocks(path: str, encoding: str = "utf-8", blocks_of: int = 1,
                     source: Optional[IO[bytes]] = None) -> Iterator[Tuple[int, str]]:
    """Yield ``(lines_before, text)``: the text of ``path`` a block of about ``blocks_of`` times
    ``BLOCK_BYTES`` at a time, each block whole lines that end in ``"\\n"`` (the file's last line may lack it);
    ``lines_before`` is the number of lines before the block (1-based: its first line is
    ``lines_before + 1``).

    A line ends at ``"\\n"`` alone (``"\\r\\n"`` keeps its ``"\\r"``). Bytes that do not
    decode, or compressed data that is corrupt or truncated: ``ValueError`` naming the file
    and the line, raised after the text of every line before it was yielded. A block that
    fails to decode is decoded again a line at a time, as the readers always decoded, so
    the message is the one they always gave (the codec's error for that line alone).
    ``source``: the bytes to read instead of the file's (a range of it, ``_ranges``).
    """
    decoder = codecs.getincrementaldecoder(encoding)()
    shown = encoding.removesuffix("-sig")
    number, pending = 0, ""
    with open_file(path, "rb") if source is None else source as f:
        try:
            for raw in _raw_blocks(f, blocks_of * BLOCK_BYTES):
                text, error = _decoded(decoder, raw)
                block, pending = _whole_lines(pending, text)
                if block:
                    yield number, block
                    number += block.count("\n")
                if error is not None:
                    raise file_error(path, f"not valid {shown}: {error}", number + 1) from error
        except DecompressionError as e:
            raise file_error(path, e.what, number + 1) from e.__cause__
        try:
            pending += decoder.decode(b"", final=True)
        except UnicodeDecodeError as e:
            raise file_error(path, f"not valid {shown}: {e}", number + 1) from e
    if pending:
        yield number, pending


def _decoded(decoder: codecs.IncrementalDecoder, raw: bytes) -> Tuple[str, Optional[UnicodeDecodeError]]:
    """``raw`` decoded, or (when it fails to) decoded a line at a time up to the line at fault, and the error."""
    state = decoder.getstate()
    try:
        return decoder.decode(raw), None
    except UnicodeDecodeError:
        decoder.setstate(state)
        return _decode_by_line(decoder, raw)


def _whole_lines(pending: str, text: str) -> Tuple[str, str]:
    """The whole lines of ``pending + text``, and what follows the last of them (no copy of a block
    of whole lines: CPython's ``"" + text`` and ``text[:len(text)]`` are ``text``)."""
    pending += text
    cut = pending.rfind("\n") + 1
    return pending[:cut], pending[cut:]


def _raw_blocks(f: IO[bytes], size: int) -> Iterator[bytes]:
    """The bytes of ``f`` in blocks of whole lines (split after ``b"\\n"``, as iterating a binary
    file splits them), about ``size`` each; the last may end without ``b"\\n"``. When reading
    fails, the whole lines read before are yielded first (a buffered ``read(size)`` would drop
    them with the error: the stream is read with ``read1``, a call at a time)."""
    read = getattr(f, "read1", f.read)
    carry: List[bytes] = []  # the start of a line not ended yet
    while True:
        got: List[bytes] = []
        try:
            _fill(read, size, got)
        except Exception:
            yield from _complete_lines(carry + got)
            raise
        chunk = b"".join(got)
        if not chunk:
            if carry:
                yield b"".join(carry)
            return
        cut = chunk.rfind(b"\n") + 1
        if not cut:
            carry.append(chunk)
            continue
        yield b"".join(carry + [chunk[:cut]])  # no copy of a block alone: join and slice return it
        carry = [chunk[cut:]] if cut < len(chunk) else []


def _complete_lines(parts: List[bytes]) -> Iterator[bytes]:
    """The whole lines of the bytes ``parts``, joined, if there are any."""
    whole = b"".join(parts)
    cut = whole.rfind(b"\n") + 1
    if cut:
        yield whole[:cut]


def _fill(read: Callable[[int], bytes], size: int, got: List[bytes]) -> None:
    """Append to ``got`` what ``read`` gives until ``size`` bytes or the end of the file."""
    n = 0
    while n < size:
        part = read(size - n)
        if not part:
            return
        got.append(part)
        n += len(part)


def _decode_by_line(decoder: codecs.IncrementalDecoder, raw: bytes) -> Tuple[str, Optional[UnicodeDecodeError]]:
    """``raw`` decoded a line at a time, as a binary file's lines: the text before the first line
    that fails, and that line's error (its message as the readers have always given it)."""
    parts = []
    for line in io.BytesIO(raw):
        try:
            parts.append(decoder.decode(line))
        except UnicodeDecodeError as e:
            return "".join(parts), e
    return "".join(parts), None


def numbered_lines(lines_before: int, text: str) -> Iterator[Tuple[int, str]]:
    """The lines of a block of ``iter_text_blocks``, numbered, each keeping its ``"\\n"``."""
    return enumerate(io.StringIO(text, newline="\n"), lines_before + 1)  # lines end at "\n" alone


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
    """The lines of ``path`` as ``iter_text_blocks`` gives them (minus the blank ones with
    ``skip_blank``), counted on the raw bytes, or ``None`` when the bytes alone cannot tell
    (``_bytes_tell_lines``); then only decoding can. A line ends at ``"\\n"`` alone, in
    counting and reading alike; a last line without one counts when it holds text (a lone
    byte order mark, which the ``-sig`` codec drops, does not)."""
    codec = encoding.replace("-sig", "")  # the BOM is dealt with here, on the first line only
    if not _bytes_tell_lines(codec):
        return None
    bom = codecs.BOM_UTF8 if encoding.endswith("-sig") else b""
    n = seen = 0
    with open_file(path, "rb") as f:
        try:
            for raw in f:
                if not seen:
                    raw = raw.removeprefix(bom)
                seen += 1
                n += not _blank_bytes(raw, codec) if skip_blank else bool(raw)
        except DecompressionError as e:
            raise file_error(path, e.what, seen + 1) from e.__cause__
    return n


def _blank_bytes(raw: bytes, codec: str) -> bool:
    """``is_blank`` of ``raw`` decoded, decoding only a line with bytes beyond ASCII."""
    stripped = raw.strip(_ASCII_SPACE)
    return not stripped if stripped.isascii() else is_blank(stripped.decode(codec, errors="replace"))


def row_chunks(fields: Sequence[str], rows: Iterable[Row], size: int) -> Iterator[Columns]:
    """Group ``rows`` (tuples aligned with ``fields``) into dict-of-lists of at most ``size`` rows.
    When ``rows`` raises, the rows before are yielded first, so that ``recut`` can complete the
    pieces they complete, as reading row by row always has."""
    buf: List[Row] = []
    try:
        for row in rows:
            buf.append(row)
            if len(buf) == size:
                yield _transpose(fields, buf)
                buf = []
    except Exception:
        yield from _last_chunk(fields, buf)
        raise
    yield from _last_chunk(fields, buf)


def _last_chunk(fields: Sequence[str], rows: List[Row]) -> Iterator[Columns]:
    """The rows left over, if any, as a shorter last chunk."""
    if rows:
        yield _transpose(fields, rows)


def _transpose(fields: Sequence[str], rows: List[Row]) -> Columns:
    return {field: list(col) for field, col in zip(fields, zip(*rows))}


def recut(fields: Sequence[str], chunks: Iterable[Columns], size: int) -> Iterator[Columns]:
    """``chunks`` (dicts of lists keyed by ``fields``, of any lengths) as pieces of exactly ``size``
    rows, the last one shorter. A chunk's rows are delivered before the chunks' iterator is asked
    for more, and when it raises, the rows held are delivered first (a shorter piece): an error
    comes after every row before it."""
    pieces = _Recut(fields, size)
    try:
        for chunk in chunks:
            yield from pieces.cut(chunk)
    except Exception:
        yield from pieces.rest()
        raise
    yield from pieces.rest()


class _Recut:
    """``recut``'s pieces: a chunk's whole pieces as slices of it, other rows gathered in a buffer."""

    def __init__(self, fields: Sequence[str], size: int) -> None:
        self.fields, self.size = fields, size
        self._empty()

    def _empty(self) -> None:
        self.buf: Columns = {field: [] for field in self.fields}
        self.held = 0

    def cut(self, chunk: Columns) -> Iterator[Columns]:
        """The pieces ``chunk`` completes."""
        n = len(chunk[self.fields[0]]) if self.fields else 0
        start = 0
        while start < n:
            take = min(self.size - self.held, n - start)
            if take == self.size:  # a whole piece of this chunk: no copy into the buffer
                yield {field: chunk[field][start:start + take] for field in self.fields}
            else:
                yield from self._gather(chunk, start, take)
            start += take

    def _gather(self, chunk: Columns, start: int, take: int) -> Iterator[Columns]:
        for field in self.fields:
            cast(list, self.buf[field]).extend(chunk[field][start:start + take])
        self.held += take
        if self.held == self.size:
            yield self.buf
            self._empty()

    def rest(self) -> Iterator[Columns]:
        """The rows held, as a shorter last piece."""
        if self.held:
            yield self.buf


def _joined(pieces: List[Columns]) -> Tuple[Dict[str, Sequence], int]:
    """Pieces of one file as one ``read_file`` result."""
    if not pieces:
        return {}, 0
    columns: Dict[str, list] = {field: [] for field in pieces[0]}
    for piece in pieces:
        for field, col in piece.items():
            columns[field].extend(col)
    return cast(Dict[str, Sequence], columns), sum(n_rows(p) for p in pieces)


class LineReader(DataReader):
    """A reader whose file is a sequence of text rows; subclasses implement ``chunks``.

    ``read_file`` and ``iter_file`` both consume ``chunks``, so they give the same
    samples in the same order; ``iter_file`` holds at most ``piece_size`` rows, plus
    the block of the file being parsed (about ``BLOCK_BYTES`` of text).
    """

    def __init__(self, batch_size: int, shuffle: bool, random_seed: int, piece_size: int) -> None:
        super().__init__(batch_size=batch_size, shuffle=shuffle, random_seed=random_seed)
        self.piece_size = check_piece_size(piece_size)

    @abc.abstractmethod
    def chunks(self, path: str, source: Optional[IO[bytes]] = None) -> Tuple[List[str], Iterator[Columns]]:
        """``(fields, chunks)``: the column names and a lazy iterator of dicts of lists keyed by
        them, each of any number of rows, that the chunks of a file own (not shared); ``source``:
        bytes to parse in place of the file's (``iter_text_blocks``)."""

    def read_file(self, path: str) -> Tuple[Dict[str, Sequence], int]:
        fields, chunks = self.chunks(path)
        columns: Dict[str, list] = {field: [] for field in fields}
        for chunk in chunks:
            for field in fields:
                if columns[field]:
                    columns[field].extend(chunk[field])
                else:  # the chunk's own list (chunks are not shared): no copy
                    columns[field] = cast(list, chunk[field])
        n_sample = len(columns[fields[0]]) if fields else 0
        return cast(Dict[str, Sequence], columns), n_sample

    def iter_file(self, path: str) -> Iterator[Columns]:
        fields, chunks = self.chunks(path)
        for piece in recut(fields, chunks, self.piece_size):
            yield self.checked(path, piece)

    def lines(self) -> Optional[Tuple[str, bool]]:
        """The codec of the file's bytes and whether blank lines are skipped, where a sample is one line
        (``read_range`` then finds ranges from the bytes); ``None`` where a sample may span lines."""
        return None

    def read_range(self, path: str, start: int, stop: int) -> Tuple[Dict[str, Sequence], int]:
        """Samples ``start:stop``: read alone where a sample is a line of an uncompressed file (``_ranges``),
        else through ``iter_file`` from the file's start."""
        from . import _ranges  # it stands on this module

        table = self._table(path)
        if table is None:
            return _joined(list(_ranges.rows_of(self.iter_file(path), start, stop - start)))
        return self.read_extents(path, [table.extent(start, stop)], [stop - start])[0]

    def read_extents(self, path: str, extents: Sequence[Extent],
                     counts: Sequence[int]) -> List[Tuple[Dict[str, Sequence], int]]:
        """For each extent ``(lo, hi, skip)``, the ``counts[k]`` samples that start ``skip`` samples into bytes
        ``lo:hi`` of ``path``; the bytes of all of them fetched at once (concurrently, from remote storage)."""

        datas = read_bytes(path, [(lo, hi) for lo, hi, _ in extents])
        return [self._parsed(path, data, skip, n) for data, (_, _, skip), n in zip(datas, extents, counts)]

    def _parsed(self, path: str, data: bytes, skip: int, n: int) -> Tuple[Dict[str, Sequence], int]:
        from . import _ranges

        fields, chunks = self.chunks(path, io.BytesIO(data))
        pieces = (self.checked(path, chunk) for chunk in recut(fields, chunks, self.piece_size))
        return _joined(list(_ranges.rows_of(pieces, skip, n)))

    def sample_runs(self, path: str) -> Optional[Dict[str, object]]:
        """Where every ``RUN``-th sample of ``path`` starts, for the index (``python -m pyloader index``);
        ``None`` where ranges cannot be found from the bytes."""
        table = self._table(path)
        return None if table is None else table.as_json()

    def _table(self, path: str) -> Optional[LineTable]:
        from . import _ranges

        lines = self.lines()
        return None if lines is None else _ranges.line_table(path, *lines)
