"""JSON Lines: one JSON object per line."""
from __future__ import annotations

import itertools
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from ._base import LineReader, Row, check_fields, count_lines, file_error, is_blank, iter_lines

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
    when it is installed, else ``json``. An empty file gives no samples.
    """

    thread_safe = True  # holds no per-call state on self

    def __init__(self, batch_size: int = 16, shuffle: bool = False, random_seed: int = 42,
                 fields: Optional[Sequence[str]] = None, piece_size: int = 4096) -> None:
        super().__init__(batch_size, shuffle, random_seed, piece_size)
        self.fields = check_fields(fields)

    def rows(self, path: str) -> Tuple[List[str], Iterator[Row]]:
        objects = self._objects(path)
        if self.fields is not None:
            return self.fields, (self._row(path, line, obj, self.fields, False) for line, obj in objects)
        first = next(objects, None)
        if first is None:
            return [], iter(())
        fields = list(first[1])
        return fields, (self._row(path, line, obj, fields, True)
                        for line, obj in itertools.chain([first], objects))

    def count(self, path: str) -> int:
        """The samples of ``path``: its non-blank lines, counted without parsing (ranks need it).
        A line that is not a valid object still fails when the file is read."""
        n = count_lines(path, "utf-8-sig", skip_blank=True)
        assert n is not None
        return n

    @staticmethod
    def _objects(path: str) -> Iterator[Tuple[int, dict]]:
        for number, line in iter_lines(path, "utf-8-sig"):
            if is_blank(line):
                continue
            try:
                obj: Any = _loads(line)
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
