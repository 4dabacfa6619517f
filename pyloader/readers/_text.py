"""Plain text: one sample per line."""
from __future__ import annotations

from typing import Iterator, List, Tuple

from ._base import LineReader, Row, check_encoding, count_lines, is_blank, iter_lines, strip_newline

__all__ = ["TextLinesReader"]


class TextLinesReader(LineReader):
    """Reads text files into one column, ``field``, one sample per line.

    Lines end at ``"\\n"``; ``strip_newline`` drops the trailing ``"\\n"``/``"\\r\\n"``
    and ``skip_blank`` drops lines holding only whitespace. Bytes that do not
    decode with ``encoding`` raise ``ValueError`` naming the file and the 1-based
    line number. An empty file gives no samples.
    """

    thread_safe = True  # holds no per-call state on self

    def __init__(self, batch_size: int = 16, shuffle: bool = False, random_seed: int = 42,
                 field: str = "text", strip_newline: bool = True, skip_blank: bool = False,
                 encoding: str = "utf-8", piece_size: int = 4096) -> None:
        super().__init__(batch_size, shuffle, random_seed, piece_size)
        if not isinstance(field, str):
            raise ValueError(f"field must be a string, got {field!r}")
        self.field = field
        self.strip_newline = bool(strip_newline)
        self.skip_blank = bool(skip_blank)
        self.encoding = check_encoding(encoding)

    def rows(self, path: str) -> Tuple[List[str], Iterator[Row]]:
        return [self.field], self._rows(path)

    def count(self, path: str) -> int:
        """The samples of ``path`` from its newlines, without decoding (ranks need it)."""
        n = count_lines(path, self.encoding, self.skip_blank)
        return super().count(path) if n is None else n

    def _rows(self, path: str) -> Iterator[Row]:
        for _, line in iter_lines(path, self.encoding):
            if self.skip_blank and is_blank(line):
                continue
            yield (strip_newline(line) if self.strip_newline else line,)
