"""Stream mode, rows: each of the ``B`` rows reads one file at a time, and takes the next when it ends.

A ``Row`` is a cursor over one file's pieces; ``Rows`` holds an epoch's rows and
gives them files: at each step a row whose file has ended takes the next unread
file that has samples (lower rows first; empty files are skipped); once no unread
file is left, ``padding_mode="data"`` replays the files delivered so far, in turn.
Under ranks a rank with no file of its own in an epoch replays one of the epoch's
first, so that padding has the fields' layout. ``_stages.stream_plan.Schedule`` follows
the same rules from the counts alone, without reading a sample.

Under ranks every rank plans its steps from ``DataReader.count``, so a file read
whole is checked against its count (``Counted``); a file read from a row on
(``FileTask.end`` set) is checked by ``_execution.reading.file_pieces`` where it ends.
"""
from __future__ import annotations

import contextlib
from typing import AsyncGenerator, AsyncIterator, Callable, List, Optional, Sequence, Tuple

import numpy as np

from .._columns import Columns, concat, n_rows, slice_rows
from .read import FileStream, OpenFile, Piece, PiecesOf
from .source import FileTask, seek
from .stream_plan import Held, RowsAt


class Counted:
    """A file's pieces (a ``FileStream``'s), checked against its ``DataReader.count``.

    Under ranks every rank plans its steps from the counts: a file holding more
    samples would be cut off at the planned step, one holding fewer would shift
    the plan. Either fails like a read error (through the error policy), naming
    the file, as soon as the pieces show it.
    """

    def __init__(self, stream: FileStream, count: int) -> None:
        self.task = stream.task
        self._stream = stream
        self._count = count  # the file's ``DataReader.count``

    async def pieces(self) -> AsyncGenerator[Piece, None]:
        count, seen = self._count, 0
        async with contextlib.aclosing(self._stream.pieces()) as pieces:
            async for piece in pieces:
                seen += piece.n
                if seen > count:
                    raise ValueError(f"file {self.task.path!r} has more samples than the {count} DataReader.count "
                                     f"said: the ranks' steps, planned from the counts, would cut it short")
                yield piece
        if seen < count:
            raise ValueError(f"file {self.task.path!r} has {seen} samples but DataReader.count said {count}: "
                             f"ranks would take different numbers of steps")


def row_pieces(pieces: PiecesOf, stream: FileStream) -> AsyncGenerator[Piece, None]:
    """The pieces a row takes from ``stream``: a whole file with a count is checked against it."""
    count = stream.task.count
    if count is None or stream.task.end is not None:
        return pieces(stream)
    return pieces(Counted(stream, count))  # type: ignore[arg-type]


class Row:
    """A cursor over one file's samples; knows ahead of time whether the file has ended."""

    def __init__(self, pieces: AsyncGenerator[Piece, None], task: FileTask, replay: bool) -> None:
        self._pieces = pieces
        self.task = task
        self.replay = replay
        self.position = task.start  # the file's row the next sample is (a slice starts past 0)
        self._piece: Optional[Columns] = None
        self._size = 0  # samples in the current piece
        self._offset = 0
        self.exhausted = False
        # the current piece's field names, when every field is an array (else None): rows whose
        # pieces agree on this can be cut many steps at once
        self.array_keys: Optional[Tuple[str, ...]] = None

    async def prime(self) -> None:
        """Make sure a sample is at hand, or mark the file as ended."""
        while self._offset >= self._size:  # no piece (size 0), or its samples all taken
            piece = await anext(self._pieces, None)
            if piece is None:
                self.exhausted, self._piece, self._size, self._offset, self.array_keys = True, None, 0, 0, None
                return
            columns = piece.columns
            assert columns is not None, "stream rows are held here"
            self._piece, self._size, self._offset = columns, n_rows(columns), 0
            arrays = all(isinstance(col, np.ndarray) for col in columns.values())
            self.array_keys = tuple(columns) if arrays else None

    def ahead(self) -> int:
        """Samples at hand in the current piece (0 once the file has ended)."""
        return self._size - self._offset

    def cut(self, count: int) -> Tuple[Columns, int]:
        """The current piece and the offset of the next ``count`` samples, taken without
        reaching the piece's end (``count < ahead()``)."""
        offset = self._offset
        self._offset += count
        self.position += count
        assert self._piece is not None, "cut only what is at hand"
        return self._piece, offset

    async def take(self, count: int) -> Tuple[List[Columns], int]:
        parts, got = [], 0
        while got < count and not self.exhausted:
            k = min(count - got, self._size - self._offset)
            assert self._piece is not None, "a file not exhausted has a piece at hand"
            parts.append(slice_rows(self._piece, self._offset, self._offset + k))
            self._offset += k
            got += k
            await self.prime()
        self.position += got
        return parts, got

    async def close(self) -> None:
        await self._pieces.aclose()


class Rows:
    """The ``B`` rows of one epoch, and the files they take (see the module docstring)."""

    def __init__(self, count: int, unread: AsyncIterator[FileStream], pieces: PiecesOf, open_file: OpenFile,
                 replay: bool) -> None:
        self.rows: List[Optional[Row]] = [None] * count
        self.unread = unread
        self.pieces = pieces  # a file's pieces, as the read stage delivers them
        self.open_file = open_file  # a file read again now, outside the plan
        self.replay = replay  # padding_mode="data": replay delivered files once no unread one is left
        self.delivered: List[FileTask] = []
        self.replays = 0
        self.fresh_left = True

    async def restore(self, at: RowsAt) -> None:
        """The rows where they are in a resumed epoch (``_stages.stream_plan.RowsAt``): the files in progress
        come first among the unread ones (``_stages.stream_resume.StreamStart.tasks``), from where their rows are."""
        for r, _ in sorted(at.in_progress(replay=False), key=lambda row: row[1].place):
            self.rows[r] = await open_row(self.pieces, await anext(self.unread), replay=False)
        for r, held in at.in_progress(replay=True):
            self.rows[r] = await open_row(self.pieces, self.open_file(last_part(held)), replay=True)
        self.delivered = [task for task, _ in at.delivered]
        self.replays, self.fresh_left = at.replays, at.fresh_left

    async def last_sample(self, held: Held) -> Columns:
        """The last sample of the file ``held`` (the file is read up to it)."""
        task = seek(held.item, held.length - 1, held.length)
        row = await open_row(self.pieces, self.open_file(task), replay=True)
        try:
            parts, _ = await row.take(1)
        finally:
            await row.close()
        return concat(parts, f"file {task.path!r}")

    async def step_files(self, padded: bool, cut_before: bool,
                         fallback: Callable[[], Sequence[FileTask]]) -> Optional[np.ndarray]:
        """Give each row whose file has ended the next one; which rows started a file at this step,
        or ``None`` when the epoch has no more steps: no row holds an unread file, and (``padded``,
        under ranks) the planned steps are not what ends it, or there is no data anywhere."""
        first = await self._take_files()
        if self.fresh_live():
            return first
        if not padded:
            return None  # every file delivered in full: no batch of padding only
        if not cut_before and not any(self.rows):  # a rank with no file yet: padding needs the fields' layout
            self.rows[0] = await self._replay(fallback())
            first[0] = self.rows[0] is not None
            if self.rows[0] is None:
                return None  # no data anywhere: nothing to pad with
        return first

    def fresh_live(self) -> bool:
        return any(row is not None and not row.replay for row in self.rows)

    async def _take_files(self) -> np.ndarray:
        first = np.zeros(len(self.rows), dtype=bool)
        for r, row in enumerate(self.rows):
            if row is not None:
                if not row.exhausted:
                    continue
                self.rows[r] = None
                await row.close()
            self.rows[r] = await self._next_file()
            first[r] = self.rows[r] is not None
        return first

    async def _next_file(self) -> Optional[Row]:
        new = await self._next_unread()  # None once no unread file is left
        if new is not None:
            self.delivered.append(new.task)
            return new
        self.fresh_left = False
        return await self._replay(self.delivered) if self.replay and self.delivered else None

    async def _next_unread(self) -> Optional[Row]:
        """The next unread file that has samples, as a row (empty files are skipped)."""
        async for stream in self.unread:
            row = await open_row(self.pieces, stream, replay=False)
            if not row.exhausted:
                return row
        return None

    async def _replay(self, tasks: Sequence[FileTask]) -> Optional[Row]:
        """The next of ``tasks`` (in turn, by the count of replays so far) that has samples, read again."""
        count = self.replays
        self.replays += 1
        for attempt in range(len(tasks)):
            task = tasks[(count + attempt) % len(tasks)]
            row = await open_row(self.pieces, self.open_file(task), replay=True)
            if not row.exhausted:
                return row
        return None

    async def close(self) -> None:
        for row in self.rows:
            if row is not None:
                await row.close()


async def open_row(pieces: PiecesOf, stream: FileStream, replay: bool) -> Row:
    """A row over ``stream``'s file, with its first sample at hand (or marked as ended)."""
    row = Row(row_pieces(pieces, stream), stream.task, replay)
    await row.prime()
    return row


def last_part(held: Held) -> FileTask:
    """The task a row in a file (``held``) reads from where it is."""
    return seek(held.item, held.offset, held.length)
