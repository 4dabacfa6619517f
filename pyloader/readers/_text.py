"""Plain text: one sample per line."""
from __future__ import annotations

from typing import IO, Iterator, List, Optional, Tuple

from .._columns import Columns
from ._base import LineReader, check_encoding, count_lines, iter_text_blocks

__all__ = ["TextLinesReader"]


class TextLinesReader(LineReader):
    """Reads text files into one column, ``field``, one sample per line.

    Lines end at ``"\\n"``; ``strip_newline`` drops the trailing ``"\\n"``/``"\\r\\n"``
    and ``skip_blank`` drops lines holding only whitespace. Bytes that do not
    decode with ``encoding`` raise ``ValueError`` naming the file and the 1-based
    line number. An empty file gives no samples. Compressed files (``.gz``, ``.bz2``,
    ``.xz``, ``.zst``) are decompressed as they are read. The file is decoded and split
    a block of about a megabyte at a time.

    Example:
        ```python
        reader = TextLinesReader(batch_size=16, skip_blank=True)    # batch["text"]: a list of 16 str
        loader = DataLoader(reader, IdentityDataset(), NumpyCollator(), "texts/*.tsv")   # or "*.txt.gz"...
        ```
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

    def chunks(self, path: str, source: Optional[IO[bytes]] = None) -> Tuple[List[str], Iterator[Columns]]:
        blocks = iter_text_blocks(path, self.encoding, source=source)
        return [self.field], ({self.field: self._lines(text)} for _, text in blocks)

    def lines(self) -> Optional[Tuple[str, bool]]:
        return self.encoding, self.skip_blank

    def count(self, path: str) -> int:
        """The samples of ``path`` from its newlines, without decoding (ranks need it)."""
        table = self._table(path)  # the table ranges are read by, made once: the same count
        if table is not None:
            return table.samples
        n = count_lines(path, self.encoding, self.skip_blank)
        return super().count(path) if n is None else n

    def _lines(self, text: str) -> List[str]:
        """The samples of a block of whole lines (the last may lack its ``"\\n"``)."""
        lines = text.split("\n")
        last = lines.pop()  # "" after a final "\n", else the file's last line, kept as it is
        lines = self._line_ends(lines, text)
        if last:
            lines.append(last)
        return list(filter(str.strip, lines)) if self.skip_blank else lines

    def _line_ends(self, lines: List[str], text: str) -> List[str]:
        """The ``lines`` split from ``text`` with their ending as ``strip_newline`` asks: ``"\\n"`` put
        back, or a ``"\\r"`` before it taken off too."""
        if not self.strip_newline:
            return [line + "\n" for line in lines]
        if "\r" in text:
            return [line.removesuffix("\r") for line in lines]
        return lines
