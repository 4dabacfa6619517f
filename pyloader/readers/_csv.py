"""CSV (or any delimiter-separated) files: one sample per row."""
from __future__ import annotations

import csv
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ._base import LineReader, Row, check_fields, file_error, iter_lines

__all__ = ["CSVReader"]


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
    Values are strings unless converted. An empty file gives no samples.
    """

    thread_safe = True  # holds no per-call state on self

    def __init__(self, batch_size: int = 16, shuffle: bool = False, random_seed: int = 42,
                 fields: Optional[Sequence[str]] = None, delimiter: str = ",", header: bool = True,
                 converters: Optional[Dict[str, Callable[[str], Any]]] = None,
                 piece_size: int = 4096) -> None:
        super().__init__(batch_size, shuffle, random_seed, piece_size)
        self.fields = check_fields(fields)
        self.header = bool(header)
        if not self.header and self.fields is None:
            raise ValueError("CSVReader(header=False) needs fields= to name the columns")
        if not isinstance(delimiter, str) or len(delimiter) != 1:
            raise ValueError(f"delimiter must be a single character, got {delimiter!r}")
        self.delimiter = delimiter
        self.converters = dict(converters or {})
        for field, conv in self.converters.items():
            if not callable(conv):
                raise ValueError(f"converter for {field!r} is not callable: {conv!r}")
            if self.fields is not None and field not in self.fields:
                raise ValueError(f"converter given for {field!r}, which is not in fields {self.fields}")

    def rows(self, path: str) -> Tuple[List[str], Iterator[Row]]:
        lines = _Lines(iter_lines(path, "utf-8-sig"))
        reader = csv.reader(lines, delimiter=self.delimiter, strict=True)
        records = self._records(path, reader, lines)
        if not self.header:
            fields: List[str] = self.fields  # type: ignore[assignment]
            return fields, self._convert(path, reader, records, fields, list(range(len(fields))), len(fields))
        first = next(records, None)
        if first is None:
            return list(self.fields or []), iter(())
        names = first
        if len(set(names)) != len(names):
            raise file_error(path, f"header has duplicate column names: {names}", reader.line_num)
        fields = self.fields or names
        missing = [f for f in fields if f not in names] + [f for f in self.converters if f not in fields]
        if missing:
            raise file_error(path, f"fields {missing} are not in the header {names}", reader.line_num)
        index = [names.index(f) for f in fields]
        return fields, self._convert(path, reader, records, fields, index, len(names))

    @staticmethod
    def _records(path: str, reader: Any, lines: "_Lines") -> Iterator[List[str]]:
        """Non-empty rows of ``reader``; ``csv.Error`` becomes a ``ValueError`` naming the line
        (for a quote never closed, the line where its record starts)."""
        while True:
            start = reader.line_num + 1
            try:
                record = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                if lines.done:
                    raise file_error(path, f"malformed CSV: unterminated quoted field: the file ends "
                                     f"inside the record starting on line {start} ({e})", start) from e
                where = f" (in the record starting on line {start})" if start < reader.line_num else ""
                raise file_error(path, f"malformed CSV: {e}{where}", reader.line_num) from e
            if record:
                yield record

    def _convert(self, path: str, reader: Any, records: Iterator[List[str]], fields: List[str],
                 index: List[int], width: int) -> Iterator[Row]:
        convs = [(i, self.converters.get(f)) for f, i in zip(fields, index)]
        plain = index == list(range(width)) and not any(conv for _, conv in convs)
        for record in records:
            if len(record) != width:
                raise file_error(path, f"expected {width} cells, got {len(record)}", reader.line_num)
            if plain:
                yield tuple(record)
                continue
            row = []
            for (i, conv), field in zip(convs, fields):
                value = record[i]
                if conv is not None:
                    try:
                        value = conv(value)
                    except Exception as e:
                        raise file_error(path, f"converter for {field!r} rejected {value!r}: {e}",
                                         reader.line_num) from e
                row.append(value)
            yield tuple(row)


class _Lines:
    """The text lines of a file for ``csv.reader``, telling whether they have run out: a
    ``csv.Error`` then means the file ended inside a quoted field."""

    def __init__(self, numbered: Iterator[Tuple[int, str]]) -> None:
        self._numbered = numbered
        self.done = False

    def __iter__(self) -> "_Lines":
        return self

    def __next__(self) -> str:
        try:
            return next(self._numbered)[1]
        except StopIteration:
            self.done = True
            raise
