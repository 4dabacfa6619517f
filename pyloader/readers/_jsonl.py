"""JSON Lines: one JSON object per line."""
from __future__ import annotations

import itertools
from operator import itemgetter
from typing import IO, Any, Callable, Iterator, List, Optional, Sequence, Tuple, Union

from .._columns import Columns
from ._base import (
    LineReader,
    Row,
    check_fields,
    count_lines,
    file_error,
    is_blank,
    iter_text_blocks,
    numbered_lines,
    row_chunks,
)

_loads: Callable[[Union[str, bytes]], Any]
try:
    from orjson import loads as _loads
except ImportError:  # orjson is optional
    from json import loads as _loads

__all__ = ["JsonLinesReader"]


class JsonLinesReader(LineReader):
    """Reads ``.jsonl`` files: each non-blank line is a JSON object, one sample.

    The columns are ``fields`` if given (other keys are ignored), else the keys of
    the file's first object, which every other object must then have exactly.
    A line that is not valid UTF-8 or JSON, not an object, or lacks a key raises
    ``ValueError`` naming the file and the 1-based line number. Uses ``orjson``
    when it is installed, else ``json``. An empty file gives no samples. Compressed
    files (``.gz``, ``.bz2``, ``.xz``, ``.zst``) are decompressed as they are read.

    The file is parsed a block of about a megabyte at a time: the block's lines are
    parsed in one pass and checked together; a block where anything is wrong is parsed
    again a line at a time, which finds the first bad line and reports it as it always has.

    Example:
        ```python
        reader = JsonLinesReader(batch_size=64, fields=["text", "label"])   # other keys are ignored
        loader = DataLoader(reader, IdentityDataset(), NumpyCollator(), "data/*.jsonl")
        ```
    """

    thread_safe = True  # holds no per-call state on self

    def __init__(self, batch_size: int = 16, shuffle: bool = False, random_seed: int = 42,
                 fields: Optional[Sequence[str]] = None, piece_size: int = 4096) -> None:
        super().__init__(batch_size, shuffle, random_seed, piece_size)
        self.fields = check_fields(fields)

    def chunks(self, path: str, source: Optional[IO[bytes]] = None) -> Tuple[List[str], Iterator[Columns]]:
        blocks = iter_text_blocks(path, "utf-8-sig", source=source)
        if self.fields is not None:
            return self.fields, self._chunks(path, blocks, self.fields, False)
        for number, text in blocks:  # the first object names the columns
            objects = _parse(text)
            fields = self._first_keys(path, number, text, objects)
            if fields is not None:
                head = self._block(path, number, text, fields, True, objects)
                return fields, itertools.chain(head, self._chunks(path, blocks, fields, True))
        return [], iter(())

    def _first_keys(self, path: str, number: int, text: str, objects: Optional[list]) -> Optional[List[str]]:
        """The keys of the first object of a block (``objects``: its values parsed), or ``None`` for a
        block of blank lines; a bad line, maybe before the first object, raises (the line-by-line path)."""
        if objects and type(objects[0]) is dict:
            return list(objects[0])
        found = next(self._objects(path, numbered_lines(number, text)), None)
        return None if found is None else list(found[1])

    def lines(self) -> Optional[Tuple[str, bool]]:
        return "utf-8-sig", True

    def count(self, path: str) -> int:
        """The samples of ``path``: its non-blank lines, counted without parsing (ranks need it).
        A line that is not a valid object still fails when the file is read."""
        table = self._table(path)  # the table ranges are read by, made once: the same count
        n = count_lines(path, "utf-8-sig", skip_blank=True) if table is None else table.samples
        assert n is not None
        return n

    def _chunks(self, path: str, blocks: Iterator[Tuple[int, str]], fields: List[str],
                exact: bool) -> Iterator[Columns]:
        for number, text in blocks:
            yield from self._block(path, number, text, fields, exact, _parse(text))

    def _block(self, path: str, number: int, text: str, fields: List[str], exact: bool,
               objects: Optional[list]) -> Iterator[Columns]:
        """The columns of a block from its parsed ``objects``; when something is wrong in it
        (``objects`` is ``None``, or they fail the checks), its rows parsed a line at a time, up
        to its first bad line, which raises."""
        chunk = None if objects is None else _columns(objects, fields, exact)
        if chunk is not None:
            return iter([chunk])
        rows = self._rows(path, self._objects(path, numbered_lines(number, text)), fields, exact)
        return row_chunks(fields, rows, self.piece_size)

    def _rows(self, path: str, objects: Iterator[Tuple[int, dict]], fields: List[str],
              exact: bool) -> Iterator[Row]:
        return (self._row(path, number, obj, fields, exact) for number, obj in objects)

    @staticmethod
    def _objects(path: str, lines: Iterator[Tuple[int, str]]) -> Iterator[Tuple[int, dict]]:
        for number, line in lines:
            if is_blank(line):
                continue
            try:
                obj: object = _loads(line)
            except ValueError as e:
                raise file_error(path, f"invalid JSON: {e}", number) from e
            if not isinstance(obj, dict):
                raise file_error(path, f"expected a JSON object, got {type(obj).__name__}", number)
            yield number, obj

    @staticmethod
    def _row(path: str, number: int, obj: dict, fields: List[str], exact: bool) -> Row:
        try:
            row = tuple([obj[field] for field in fields])
        except KeyError as e:
            raise file_error(path, f"missing key {e.args[0]!r} (expected keys {fields})", number) from None
        if exact and len(obj) != len(fields):
            extra = sorted(set(obj) - set(fields))
            raise file_error(path, f"unexpected keys {extra}: the first object has keys {fields}; "
                             "pass fields= to select columns", number)
        return row


def _parse(text: str) -> Optional[list]:
    """The values of a block's non-blank lines, parsed in one pass; ``None`` when one is not JSON."""
    lines = text.split("\n")
    try:
        return list(map(_loads, filter(None, lines)))  # no allocation per line
    except ValueError:
        pass
    try:  # a line of whitespace, maybe: skip the blank ones as is_blank says
        return list(map(_loads, filter(str.strip, lines)))
    except ValueError:
        return None


def _columns(objects: list, fields: List[str], exact: bool) -> Optional[Columns]:
    """The columns of a block's values, checked in one pass each; ``None`` when any is not an
    object with the keys wanted (the line-by-line path then names it)."""
    if set(map(type, objects)) - {dict} or (exact and set(map(len, objects)) - {len(fields)}):
        return None
    try:
        return {field: list(map(itemgetter(field), objects)) for field in fields}
    except KeyError:
        return None
