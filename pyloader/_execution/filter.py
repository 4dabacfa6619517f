"""``filter_fn``: samples dropped before batching, where files are read (in the workers when there are workers).

The filter sees each sample of a file as a dict ``{field: value}``, after the
in-file shuffle and after a rank's share of the file was cut, and keeps it when
it returns ``True`` (``False`` drops it; anything else is an error, so a filter
that forgets to return loses nothing silently). Batches are cut from the kept
samples, so they stay full. It must be a pure function of the sample: the
batches, and so resuming, depend on what it keeps.

A filter that raises or returns a non-bool is an error of the file: a
``PipelineError`` of stage ``filter_fn (sample i)`` naming the file and the
sample's position in it, with the original exception's type; ``on_error`` then
handles it like a read error (skipping drops the rest of the file).

The reader and the filter travel together (``Filtered``) to where files are
read, so worker processes get the filter as they get the reader. That is why this
module sits with execution: the filter runs where files are cut into pieces
(``_execution.reading``), and execution imports nothing from the stages.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Tuple

import numpy as np

from .._abc import DataReader
from .._columns import Columns, n_rows, take
from .._errors import PipelineError

Keep = Callable[[dict], bool]


class SampleFilter:
    """``fn`` applied to every sample of a piece."""

    def __init__(self, fn: Keep) -> None:
        self.fn = fn

    def apply(self, columns: Columns, path: str, first: int) -> Tuple[Columns, int]:
        """The rows of ``columns`` that ``fn`` keeps (``columns`` itself when it keeps all), and
        how many it dropped; ``first`` is the position of the piece's first row in its file."""
        fields = list(columns.items())
        kept = [i for i in range(n_rows(columns))
                if self._keeps({key: column[i] for key, column in fields}, path, first + i)]
        dropped = n_rows(columns) - len(kept)
        return (columns, 0) if not dropped else (take(columns, kept), dropped)

    def _keeps(self, sample: dict, path: str, position: int) -> bool:
        """What ``fn`` says of the sample at ``position`` in file ``path``: a failure, or an answer that
        is not a bool, is a ``PipelineError`` naming them."""
        try:
            keep = self.fn(sample)
        except Exception as exc:
            raise PipelineError(f"filter_fn (sample {position})", [path], exc) from exc
        if not isinstance(keep, (bool, np.bool_)):
            raise PipelineError(f"filter_fn (sample {position})", [path], TypeError(
                f"filter_fn must return a bool, got {type(keep).__name__} ({keep!r:.60})"))
        return bool(keep)

    def pieces(self, pieces: Iterator[Columns], path: str, start: int) -> Iterator[Tuple[Columns, int]]:
        """``(kept rows, dropped count)`` for each piece of a file whose first piece starts at row ``start``."""
        with contextlib.closing(pieces):  # type: ignore[type-var]  # a generator: closing it closes the reader's
            offset = start
            for piece in pieces:
                yield self.apply(piece, path, offset)
                offset += n_rows(piece)


@dataclass(frozen=True)
class Filtered:
    """The user's reader with the loader's filter, handed to the runners and worker processes in its place."""

    reader: DataReader
    keep: SampleFilter


def unbundle(reader: Any) -> Tuple[DataReader, Optional[SampleFilter]]:
    """The reader, and the filter it travels with (``None`` without ``filter_fn``)."""
    return (reader.reader, reader.keep) if isinstance(reader, Filtered) else (reader, None)


def with_filter(reader: DataReader, fn: Optional[Keep]) -> object:
    """What reads files: the reader itself, or the reader bundled with ``filter_fn``."""
    return reader if fn is None else Filtered(reader, SampleFilter(fn))


def check_filter(fn: object, stream: bool) -> None:
    if fn is None:
        return
    if not callable(fn):
        raise TypeError(f"filter_fn must be a callable taking a sample (a dict) and returning a bool, got {fn!r}")
    if stream:
        raise ValueError("filter_fn applies outside stream mode: a stream row delivers its file's samples "
                         "in order, every one of them (filter the files, or mask samples in the model)")
