"""CSV (or any delimiter-separated) files: one sample per row."""
from __future__ import annotations

import csv
import itertools
from typing import IO, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .._columns import Columns
from ._base import FileFormatError, LineReader, Row, check_fields, file_error, iter_text_blocks, row_chunks

__all__ = ["CSVReader"]

_MAX_PENDING = 64 * 2**20  # text of records not yet whole (a quoted field over many blocks) before giving up
Layout = Tuple[List[str], List[int], int]  # the fields, their cell indexes, the cells per record
_ARROW_DELIMITERS = frozenset(map(chr, range(128))) - set('"\r\n')  # those pyarrow's parser splits as csv does


class CSVReader(LineReader):
    """Reads delimited text files (UTF-8) into one column per field, one sample per row.

    With ``header=True`` the first row names the columns and ``fields``, if given,
    selects some of them; with ``header=False`` ``fields`` names the columns and is
    required. ``converters`` maps a field to a callable applied to each of its
    values (e.g. ``int``). Blank lines are skipped. A row with the wrong number of
    cells, a value its converter rejects, malformed CSV or bytes that are not
    UTF-8 raise ``ValueError`` naming the file and the 1-based line number. Malformed
    means what ``csv``'s ``strict`` mode rejects: a quote left open at the end of the
    file (the line named is where its record starts), or text after a closing quote.
    Values are strings unless converted. An empty file gives no samples. Compressed
    files (``.gz``, ``.bz2``, ``.xz``, ``.zst``) are decompressed as they are read.

    Without ``converters``, and with pyarrow installed, the rows after the header are
    parsed by pyarrow's CSV parser a block of about a megabyte at a time, where that gives
    what ``csv`` gives: a block is handed to it only when its quotes all open and close
    fields (no quote inside an unquoted field, no text after a closing quote, no quote
    left open), its ``"\r"`` all end lines, it holds no NUL, its rows all have the header's
    cells and no value is over ``csv.field_size_limit()``. The rest of the file from a
    block that is not is read by ``csv``, which reports what is wrong as above.

    Example:
        ```python
        reader = CSVReader(batch_size=64, converters={"label": int})   # other columns stay str
        loader = DataLoader(reader, IdentityDataset(), NumpyCollator(), "tables/")
        ```
    """

    thread_safe = True  # holds no per-call state on self

    def __init__(self, batch_size: int = 16, shuffle: bool = False, random_seed: int = 42,
                 fields: Optional[Sequence[str]] = None, delimiter: str = ",", header: bool = True,
                 converters: Optional[Dict[str, Callable[[str], object]]] = None,
                 piece_size: int = 4096) -> None:
        super().__init__(batch_size, shuffle, random_seed, piece_size)
        self.fields = check_fields(fields)
        self.header = bool(header)
        if not self.header and self.fields is None:
            raise ValueError("CSVReader(header=False) needs fields= to name the columns")
        if not isinstance(delimiter, str) or len(delimiter) != 1:
            raise ValueError(f"delimiter must be a single character, got {delimiter!r}")
        self.delimiter = delimiter
        self.converters = _checked_converters(converters, self.fields)

    def chunks(self, path: str, source: Optional[IO[bytes]] = None) -> Tuple[List[str], Iterator[Columns]]:
        lines = _Lines(iter_text_blocks(path, "utf-8-sig", source=source))
        reader = csv.reader(lines, delimiter=self.delimiter, strict=True)
        names = next(self._records(path, reader, lines, 0), None) if self.header else self.fields
        if names is None:  # an empty file
            return list(self.fields or []), iter(())
        layout = self._layout(path, names, reader.line_num)
        number, text = lines.rest()  # the records after the header are read from here on
        blocks = itertools.chain([(number, text)], lines.blocks)
        fast = None if self.converters else _ArrowBlocks.make(self.delimiter, layout)
        if fast is None:
            return layout[0], self._slow(path, blocks, layout, number)
        return layout[0], self._fast(path, fast, blocks, layout, number)

    def _layout(self, path: str, names: List[str], line: int) -> Layout:
        """The fields, their cell indexes and the record width, from the header ``names`` (without a
        header: ``fields``, which names each cell)."""
        if len(set(names)) != len(names):
            raise file_error(path, f"header has duplicate column names: {names}", line)
        fields = self.fields or names
        # the converters' fields are among ``fields`` when it is given (``__init__`` checks)
        missing = [f for f in dict.fromkeys([*fields, *self.converters]) if f not in names]
        if missing:
            raise file_error(path, f"fields {missing} are not in the header {names}", line)
        return fields, list(map(names.index, fields)), len(names)

    def _fast(self, path: str, fast: "_ArrowBlocks", blocks: Iterator[Tuple[int, str]],
              layout: Layout, start: int) -> Iterator[Columns]:
        """The columns of the records in ``blocks`` (which start at a record's start, after ``start``
        lines of the file), parsed by pyarrow where that gives what ``csv`` gives, else by ``csv``
        from there on."""
        pending = ""
        for _, block in blocks:  # blocks of whole lines, one after the other
            text = pending + block
            cut, columns = fast.take(text)
            if cut < 0 or len(text) - cut > _MAX_PENDING:
                yield from self._slow(path, itertools.chain([(start, text)], blocks), layout, start)
                return
            if columns is not None:
                yield columns
            pending = text[cut:]
            start += text.count("\n", 0, cut)  # the lines before pending
        if pending:  # a record the file ends inside: csv says what is wrong with it
            yield from self._slow(path, iter([(start, pending)]), layout, start)

    def _slow(self, path: str, blocks: Iterator[Tuple[int, str]], layout: Layout, offset: int) -> Iterator[Columns]:
        lines = _Lines(blocks)
        reader = csv.reader(lines, delimiter=self.delimiter, strict=True)
        rows = self._convert(path, reader, self._records(path, reader, lines, offset), layout, offset)
        return row_chunks(layout[0], rows, self.piece_size)

    @staticmethod
    def _records(path: str, reader: Any, lines: "_Lines", offset: int) -> Iterator[List[str]]:
        """Non-empty rows of ``reader``; ``csv.Error`` becomes a ``ValueError`` naming the line
        (for a quote never closed, the line where its record starts). ``offset``: the lines of
        the file before the first one ``reader`` reads."""
        start = offset + 1
        try:
            for record in reader:
                if record:
                    yield record
                start = offset + reader.line_num + 1
        except csv.Error as e:
            raise _malformed(path, e, lines.done, start, offset + reader.line_num) from e

    def _convert(self, path: str, reader: Any, records: Iterator[List[str]], layout: Layout,
                 offset: int) -> Iterator[Row]:
        fields, index, width = layout
        convs = list(zip(index, map(self.converters.get, fields)))  # (cell index, converter or None)
        plain = not self.converters and index == list(range(width))
        for record in records:
            if len(record) != width:
                raise file_error(path, f"expected {width} cells, got {len(record)}", offset + reader.line_num)
            yield tuple(record) if plain else _converted(path, record, convs, fields, offset + reader.line_num)


class _Lines:
    """The lines of ``iter_text_blocks``' blocks, one at a time for ``csv.reader``, telling
    whether they have run out (a ``csv.Error`` then means the file ended inside a quoted
    field) and handing back the unread rest of the current block (``rest``)."""

    def __init__(self, blocks: Iterator[Tuple[int, str]]) -> None:
        self.blocks = blocks
        self.done = False
        self._text, self._pos, self._number = "", 0, 0  # the block, the read position, lines read

    def __iter__(self) -> "_Lines":
        return self

    def __next__(self) -> str:
        while self._pos >= len(self._text):
            block = next(self.blocks, None)
            if block is None:
                self.done = True
                raise StopIteration
            self._number, self._text = block
            self._pos = 0
        end = self._text.find("\n", self._pos) + 1 or len(self._text)
        line = self._text[self._pos:end]
        self._pos = end
        self._number += 1
        return line

    def rest(self) -> Tuple[int, str]:
        """``(lines_before, text)``: the unread lines of the current block."""
        return self._number, self._text[self._pos:]


class _ArrowBlocks:
    """pyarrow's CSV parser on blocks of whole records, where it gives what ``csv`` gives."""

    def __init__(self, pa: Any, pacsv: Any, delimiter: str, layout: Layout) -> None:
        fields, index, width = layout
        names = [f"c{i}" for i in range(width)]
        self._pa, self._pacsv, self._fields = pa, pacsv, fields
        self._delimiter = ord(delimiter)
        self._read = pacsv.ReadOptions(column_names=names, use_threads=False)  # blocks of a megabyte
        self._convert = pacsv.ConvertOptions(
            column_types=dict.fromkeys(names, pa.string()), include_columns=[names[i] for i in index],
            strings_can_be_null=False, quoted_strings_can_be_null=False, null_values=[])
        self._plain = pacsv.ParseOptions(delimiter=delimiter, ignore_empty_lines=True)
        self._quoted = pacsv.ParseOptions(delimiter=delimiter, ignore_empty_lines=True, newlines_in_values=True)

    @classmethod
    def make(cls, delimiter: str, layout: Layout) -> Optional["_ArrowBlocks"]:
        """One for ``layout``, or ``None`` without pyarrow or for a delimiter it cannot take alike."""
        if delimiter not in _ARROW_DELIMITERS:
            return None
        try:
            import pyarrow as pa
            import pyarrow.csv as pacsv
        except ImportError:
            return None
        return cls(pa, pacsv, delimiter, layout)

    def take(self, text: str) -> Tuple[int, Optional[Columns]]:
        """``(cut, columns)``: the columns of ``text[:cut]``, the records of ``text`` (whole lines
        from a record's start) up to the last one that ends in it (``cut`` 0: none does, and
        ``columns`` is ``None``); ``cut`` -1 when something in ``text`` needs ``csv``."""
        if _needs_csv(text):
            return -1, None
        quotes = text.count('"')
        cut = _records_end(text, quotes)
        if not cut:
            return 0, None
        data = text[:cut].encode()
        if quotes and not _quotes_close_fields(np.frombuffer(data, dtype=np.uint8), self._delimiter):
            return -1, None
        columns = self._parse(data, bool(quotes))
        return (-1, None) if columns is None else (cut, columns)

    def _parse(self, data: bytes, quoted: bool) -> Optional[Columns]:
        """The columns of ``data``'s records, or ``None`` when pyarrow rejects them (a row of
        another width) or a value is too long for ``csv``."""
        pa, pacsv = self._pa, self._pacsv
        try:
            table = pacsv.read_csv(pa.BufferReader(data), read_options=self._read,
                                   parse_options=self._quoted if quoted else self._plain,
                                   convert_options=self._convert)
        except pa.ArrowInvalid:
            return None
        limit = csv.field_size_limit()
        if len(data) > limit and max(map(_longest, table.columns), default=0) > limit:
            return None
        return dict(zip(self._fields, table.to_pydict().values()))


def _needs_csv(text: str) -> bool:
    """Whether ``text`` holds what pyarrow reads otherwise than ``csv``: a NUL, or a ``"\r"`` that does
    not end a line."""
    return "\0" in text or text.count("\r") != text.count("\r\n")


def _records_end(text: str, quotes_before: int) -> int:
    """The end of the whole records of ``text`` (whole lines from a record's start), which holds
    ``quotes_before`` quotes: all of it when they are even; else the start of the last line before
    which an even number of quotes lie (where the quoted field ``text`` ends inside starts its
    record, if every quote opens or closes a field or is doubled; the caller checks), or 0."""
    cut = len(text)
    while cut and quotes_before % 2:
        start = text.rfind("\n", 0, cut - 1) + 1
        quotes_before -= text.count('"', start, cut)
        cut = start
    return cut


def _malformed(path: str, error: csv.Error, ended: bool, start: int, line: int) -> FileFormatError:
    """``csv``'s ``error`` at ``line``, in the record starting on line ``start`` (``ended``: the file
    ended inside it, so its quoted field was never closed)."""
    if ended:
        return file_error(path, f"malformed CSV: unterminated quoted field: the file ends "
                          f"inside the record starting on line {start} ({error})", start)
    where = f" (in the record starting on line {start})" if start < line else ""
    return file_error(path, f"malformed CSV: {error}{where}", line)


def _converted(path: str, record: List[str], convs: Sequence[Tuple[int, Optional[Callable[[str], object]]]],
               fields: Sequence[str], line: int) -> Row:
    """The record's cells of ``fields``, each through its converter (if it has one)."""
    row: List[object] = []
    for (i, conv), field in zip(convs, fields):
        value = record[i]
        if conv is None:
            row.append(value)
            continue
        try:
            row.append(conv(value))
        except Exception as e:
            raise file_error(path, f"converter for {field!r} rejected {value!r}: {e}", line) from e
    return tuple(row)


def _checked_converters(converters: Optional[Dict[str, Callable[[str], object]]],
                        fields: Optional[List[str]]) -> Dict[str, Callable[[str], object]]:
    """A copy of ``converters`` (``None``: none), each callable and, with ``fields``, one of them."""
    checked = dict(converters or {})
    for field, conv in checked.items():
        if not callable(conv):
            raise ValueError(f"converter for {field!r} is not callable: {conv!r}")
        if fields is not None and field not in fields:
            raise ValueError(f"converter given for {field!r}, which is not in fields {fields}")
    return checked


def _longest(column: Any) -> int:
    import pyarrow.compute as pc

    return int(pc.max(pc.utf8_length(column)).as_py() or 0)


def _quotes_close_fields(data: np.ndarray, delimiter: int) -> bool:
    """Whether every quote in ``data`` (UTF-8 bytes of whole records) opens a field, closes it, or
    is half of a doubled quote inside one: then a quote's parity says whether it is inside a
    field, and pyarrow and ``csv`` split the records alike. A quote inside an unquoted field
    (which ``csv`` keeps as text), text after a closing quote (which ``csv`` rejects) or a
    quote left open: ``False``."""
    quotes = np.flatnonzero(data == 34)
    if len(quotes) % 2:
        return False
    opens, closes = quotes[0::2], quotes[1::2]
    before = data[np.maximum(opens - 1, 0)]
    opens_ok = (before == delimiter) | (before == 10) | (opens == 0)
    opens_ok[1:] |= opens[1:] == closes[:-1] + 1  # the second of a doubled quote
    after = data[np.minimum(closes + 1, len(data) - 1)]
    closes_ok = (after == delimiter) | (after == 13) | (after == 10) | (closes == len(data) - 1)
    closes_ok[:-1] |= closes[:-1] + 1 == opens[1:]  # the first of a doubled quote
    return bool(opens_ok.all() and closes_ok.all())
