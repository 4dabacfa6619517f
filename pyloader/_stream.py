"""Stage 3, stream mode: batch row ``r`` continues where it stopped in the previous batch.

Each of the ``B`` rows reads one file at a time, in plan order, through
``iter_file``; a row whose file has ended takes the next unread file at the
next step (ties go to the lower row). Per row and step the batch holds one
sample, or a window of ``seq_len`` consecutive samples padded at a file's end.
Metadata travels beside the data (``Batch.meta``), never through user code.

Padding (``__valid__`` false) holds ``pad_value``, or with ``padding_mode="edge"``
the row's last real sample (of the window, else the last one the row delivered
this epoch; ``pad_value`` before it has any). With ``time_major`` the data
fields and ``__valid__`` are ``[T, B, ...]``. A row's file may be a slice of one
(``_entries``): ``__position__`` then counts rows of the file from the slice's start.

While no row reaches the end of its piece, the next steps are cut all at once:
one array copy per row and field for a whole group of steps (``_cut_steps``).
Steps where a row reaches a piece's end, and list columns, are cut one at a
time (``_step``).

Rows from different files share a batch as files share one outside stream mode:
array fields take NumPy's common dtype (an int64 file beside a float64 one gives
float64); samples of different shapes and fields only some files have are a
``ValueError``, dtypes with no common one a ``TypeError``, each naming two of the
files. Under ranks the steps
are planned from ``DataReader.count``, so each file is checked against its count
(a mismatch fails like a read error, naming the file), and every epoch pads the
same way whatever came before it (a resumed run too).
"""
from __future__ import annotations

import contextlib
import itertools
from collections import abc  # isinstance against these, not typing's aliases: several times faster
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Dict, List, Optional, Sequence, Tuple, cast

import numpy as np

from ._batch import SRC, Batch, Group, GroupSize, Stacked
from ._columns import Columns, concat, n_rows, slice_rows
from ._read import FileStream, Piece, ReadFiles, ReadItem
from ._source import EpochEnd, FileTask

FIRST, VALID, REPLAY, STREAM_ID, POSITION = "__first__", "__valid__", "__replay__", "__stream_id__", "__position__"
META_KEYS = (FIRST, VALID, REPLAY, STREAM_ID, POSITION)
PADDING_MODES = ("zeros", "data", "edge")


class _Counted:
    """A file's pieces (a ``FileStream``'s), checked against its ``DataReader.count``.

    Under ranks every rank plans its steps from the counts: a file holding more
    samples would be cut off at the planned step, one holding fewer would shift
    the plan. Either fails like a read error (through the error policy), naming
    the file, as soon as the pieces show it.
    """

    def __init__(self, stream: FileStream) -> None:
        self.task = stream.task
        self._stream = stream

    async def pieces(self) -> AsyncGenerator[Piece, None]:
        count, seen = self.task.count, 0
        assert count is not None, "a counted stream has a count"
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


def _row_pieces(read: ReadFiles, stream: FileStream) -> AsyncGenerator[Piece, None]:
    """The pieces a row takes from ``stream``: checked against the file's count when there is one."""
    return read.pieces(stream if stream.task.count is None else _Counted(stream))  # type: ignore[arg-type]


class _Row:
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
        while self._piece is None or self._offset >= self._size:
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


class StreamBatcher:
    """Cuts each epoch into stream batches of ``rows`` rows (``seq_len`` samples per row, or one).

    Groups cut from one block hold up to ``GROUP_SAMPLES`` samples (at least
    ``GroupSize.LIMIT`` batches, at most ``MAX_GROUP`` batches): stream batches are
    small, so per-group costs need more of them to be paid off, while the samples a
    group holds stay those of a group of ordinary batches.
    """

    GROUP_SAMPLES = 32768
    MAX_GROUP = 1024

    def __init__(self, files: Sequence[str], rows: int, seq_len: Optional[int], padding_mode: str,
                 pad_value: Any, target: Optional[Callable[[int], int]] = None,
                 fallback: Optional[Callable[[int], List[FileTask]]] = None, time_major: bool = False) -> None:
        self.files = files
        self.rows = rows
        self.seq_len = seq_len
        self.padding_mode = padding_mode
        self.pad_value = pad_value
        self.time_major = time_major  # [T, B, ...] rather than [B, T, ...] (with seq_len)
        # padding_mode="edge": each row's last real sample per field (reset at each epoch, like the template)
        self._edge: List[Optional[Dict[str, Any]]] = [None] * rows
        # under ranks: the step count of epoch e every rank must give, and files to replay
        # for a rank that has none of its own (padding needs the fields' shapes)
        self.target = target
        self.fallback = fallback
        # the columns last cut in this epoch: the fields' layout for a step with no live row (reset
        # at each epoch, so every epoch pads alike whatever came before, and so does a resumed run)
        self._template: Optional[Columns] = None
        step = rows * (seq_len or 1)
        self.group_limit = min(self.MAX_GROUP, max(GroupSize.LIMIT, self.GROUP_SAMPLES // step))

    def _pad(self, key: str) -> Any:
        return self.pad_value.get(key, 0) if isinstance(self.pad_value, abc.Mapping) else self.pad_value

    def _field(self, key: str, columns: List[Optional[Sequence]], paths: List[Optional[str]], like: Sequence,
               width: int) -> Any:
        """Field ``key`` of the batch from each row's window (``<= width`` samples of file
        ``paths[r]``; ``None`` for a row without a file), padded to ``width``. ``like`` is the
        field in the epoch's template, which gives the layout when no row has a file.

        When every window holds an array: an array ``[B, ...]``, ``[B, T, ...]`` or (time-major)
        ``[T, B, ...]`` of their common dtype (``_common_layout``). Otherwise a list of samples,
        of ``T``-sample lists, or (time-major) of ``T`` lists of ``B`` samples.
        """
        pad = self._pad(key)
        live = [(path, col) for path, col in zip(paths, columns) if col is not None]
        arrays = all(isinstance(col, np.ndarray) for _, col in live) if live else isinstance(like, np.ndarray)
        if not arrays:
            # samples are sequences: pad with one of their shape (the template's when no row is live)
            first = next(itertools.chain((col[0] for _, col in live), like[:1]), None)
            if first is not None and np.ndim(first):
                pad = np.full(np.shape(first), pad).tolist()
        fills = [self._fill(key, r, col, pad) for r, col in enumerate(columns)]
        if arrays:
            shaped: Any = like  # an array, as ``arrays`` says
            dtype, sample = _common_layout(key, cast(Any, live)) if live else (shaped.dtype, shaped.shape[1:])
            out = np.full((len(columns), width) + sample, pad, dtype=dtype)
            for r, col in enumerate(columns):
                n = 0 if col is None else len(col)
                if n:
                    out[r, :n] = col
                if n < width and fills[r] is not pad:
                    out[r, n:] = fills[r]
            if not self.seq_len:
                return out[:, 0]
            return np.ascontiguousarray(out.swapaxes(0, 1)) if self.time_major else out
        if not self.seq_len:
            return [fill if col is None else col[0] for col, fill in zip(columns, fills)]
        rows = [[fill] * width if col is None else list(col) + [fill] * (width - len(col))
                for col, fill in zip(columns, fills)]
        return [list(step) for step in zip(*rows)] if self.time_major else rows

    def _fill(self, key: str, r: int, window: Optional[Sequence], pad: Any) -> Any:
        """What pads row ``r`` of field ``key``: ``pad``, or with ``padding_mode="edge"`` the row's
        last real sample (of this window, else of an earlier step; ``pad`` before it has any)."""
        if self.padding_mode != "edge":
            return pad
        if window is not None and len(window):
            return window[-1]
        edge = self._edge[r]
        return pad if edge is None or key not in edge else edge[key]

    def _remember_edges(self, windows: List[Optional[Columns]]) -> None:
        """``padding_mode="edge"``: keep each row's last real sample (a copy: not the piece it came from)."""
        for r, window in enumerate(windows):
            if window is not None and n_rows(window):
                self._edge[r] = {key: _copy_sample(col[-1]) for key, col in window.items() if key != SRC}

    async def _next_row(self, unread: AsyncIterator[FileStream], read: ReadFiles) -> Optional[_Row]:
        """The next unread file that has samples, as a row cursor (empty files are skipped)."""
        async for stream in unread:
            row = _Row(_row_pieces(read, stream), stream.task, replay=False)
            await row.prime()
            if not row.exhausted:
                return row
        return None

    async def _replay_row(self, delivered: List[FileTask], count: int, read: ReadFiles) -> Optional[_Row]:
        """Padding with data: the files already delivered, replayed in plan order."""
        for attempt in range(len(delivered)):
            task = delivered[(count + attempt) % len(delivered)]
            row = _Row(_row_pieces(read, read.open(task)), task, replay=True)
            await row.prime()
            if not row.exhausted:
                return row
        return None

    async def _epoch(self, unread: AsyncIterator[FileStream], read: ReadFiles,
                     epoch: int) -> AsyncIterator[Group]:
        rows: List[Optional[_Row]] = [None] * self.rows
        delivered: List[FileTask] = []
        replays = 0
        fresh_left = True
        index = 0
        sizes = GroupSize(self.group_limit)
        target = self.target(epoch) if self.target is not None else None
        self._template = None
        self._edge = [None] * self.rows
        try:
            while target is None or index < target:
                first = np.zeros(self.rows, dtype=bool)
                for r in range(self.rows):
                    row = rows[r]
                    if row is not None and not row.exhausted:
                        continue
                    if row is not None:
                        await row.close()
                        rows[r] = None
                    new = await self._next_row(unread, read) if fresh_left else None
                    if new is None:
                        fresh_left = False
                        if self.padding_mode == "data" and delivered:
                            new = await self._replay_row(delivered, replays, read)
                            replays += 1
                    else:
                        delivered.append(new.task)
                    rows[r] = new
                    first[r] = new is not None
                if not any(row is not None and not row.replay for row in rows):
                    if target is None:
                        return  # every file delivered in full: no batch of padding only
                    if self._template is None and not any(rows):  # a rank with no file yet
                        assert self.fallback is not None, "ranks give a fallback"
                        rows[0] = await self._replay_row(self.fallback(epoch), replays, read)
                        replays += 1
                        first[0] = rows[0] is not None
                        if rows[0] is None:
                            return  # no data anywhere: nothing to pad with
                steps = self._steps_ahead(rows)
                if target is not None:
                    steps = min(steps, target - index)
                group: Group
                if steps:
                    group = self._cut_steps(rows, first, epoch, index, min(steps, sizes.take()))
                else:
                    group = [await self._step(rows, first, epoch, index)]
                index += len(group)
                yield group
        finally:
            for row in rows:
                if row is not None:
                    await row.close()

    def _steps_ahead(self, rows: List[Optional[_Row]]) -> int:
        """How many steps can be cut at once: no row reaches the end of its piece, and every
        field is an array (the same fields as the first row's)."""
        width = self.seq_len or 1
        live = [row for row in rows if row is not None]
        steps = min(((row.ahead() - 1) // width for row in live), default=0)
        if steps < 1:
            return 0
        keys = live[0].array_keys
        if keys is None or any(row.array_keys != keys for row in live):
            return 0
        return steps

    def _cut_steps(self, rows: List[Optional[_Row]], first: np.ndarray, epoch: int, index: int,
                   steps: int) -> Stacked:
        """``steps`` consecutive batches, each field filled with one copy per row for all of them."""
        width = self.seq_len or 1
        window = (steps, width) if self.seq_len else (steps,)
        cuts = [None if row is None else row.cut(steps * width) for row in rows]
        template = next(piece for piece, _ in filter(None, cuts))
        self._template = template
        files = [(row.task.path, cut[0]) for row, cut in zip(rows, cuts) if row is not None and cut is not None]
        data: Dict[str, np.ndarray] = {}
        for key in template:
            if key == SRC:
                continue
            dtype, sample = _common_layout(key, [(path, piece[key]) for path, piece in files])
            # [steps, B, (T,) ...] or [steps, T, B, ...]: each step's batch is one contiguous block
            shape = (steps, width, len(rows)) + sample if self.time_major else (steps, len(rows)) + window[1:] + sample
            out = np.empty(shape, dtype) if all(cuts) else np.full(shape, self._pad(key), dtype)
            for r, cut in enumerate(cuts):
                row_out = out[:, :, r] if self.time_major else out[:, r]
                if cut is not None:
                    piece, offset = cut
                    row_out[...] = piece[key][offset:offset + steps * width].reshape(window + sample)
                elif self.padding_mode == "edge":
                    fill = self._fill(key, r, None, None)
                    if fill is not None:
                        row_out[...] = fill
            data[key] = out
        if self.padding_mode == "edge":
            end = steps * width  # each row's last sample of the group
            self._remember_edges([None if cut is None else slice_rows(cut[0], cut[1] + end - 1, cut[1] + end)
                                  for cut in cuts])
        # metadata for the whole group at once; each batch gets row k of every array
        live = np.array([row is not None for row in rows])
        firsts = np.zeros((steps, len(rows)), dtype=bool)
        firsts[0] = first
        if self.time_major:
            valid = np.broadcast_to(live, (steps, width) + live.shape).copy()
        else:
            valid = np.broadcast_to(live[:, None] if self.seq_len else live, (steps,) + live.shape + window[1:]).copy()
        stream_id = np.array([-1 if row is None else row.task.pos for row in rows], dtype=np.int64)
        replay = np.array([row is not None and row.replay for row in rows])
        start = np.array([-1 if row is None else row.position - steps * width for row in rows], dtype=np.int64)
        position = np.where(live, start + width * np.arange(steps)[:, None], -1)
        meta = {FIRST: firsts, VALID: valid, REPLAY: np.broadcast_to(replay, firsts.shape).copy(),
                STREAM_ID: np.broadcast_to(stream_id, firsts.shape).copy(), POSITION: position}
        paths = tuple(sorted({row.task.path for row in rows if row is not None}))
        return Stacked([Batch(epoch, index + k, None, paths) for k in range(steps)], data, meta)

    async def _step(self, rows: List[Optional[_Row]], first: np.ndarray, epoch: int, index: int) -> Batch:
        width = self.seq_len or 1
        windows: List[Optional[Columns]] = []
        valid = np.zeros((self.rows, width), dtype=bool)
        stream_id = np.full(self.rows, -1, dtype=np.int64)
        position = np.full(self.rows, -1, dtype=np.int64)
        replay = np.zeros(self.rows, dtype=bool)
        paths = set()
        for r, row in enumerate(rows):
            if row is None:
                windows.append(None)
                continue
            stream_id[r], position[r], replay[r] = row.task.pos, row.position, row.replay
            parts, got = await row.take(width)
            valid[r, :got] = True
            windows.append(concat(parts, f"file {row.task.path!r}"))
            paths.add(row.task.path)
        template = next((w for w in windows if w is not None), self._template)
        assert template is not None, "a step has a window, or follows one"
        self._template = template
        files = [None if row is None else row.task.path for row in rows]
        first_path = next((path for path in files if path is not None), None)
        for path, window in zip(files, windows):
            if window is not None and window.keys() != template.keys():
                raise ValueError(f"files {first_path!r} and {path!r} have different fields ({sorted(template)} and "
                                 f"{sorted(window)}): stream rows in one batch need the same fields")
        data: Dict[str, Any] = {}
        for key, like in template.items():
            if key == SRC:
                continue
            columns = [None if window is None else window[key] for window in windows]
            data[key] = self._field(key, columns, files, like, width)
        if self.padding_mode == "edge":
            self._remember_edges(windows)
        if not self.seq_len:
            valid = valid[:, 0]
        meta = {FIRST: first, VALID: valid.T.copy() if self.time_major else valid, REPLAY: replay,
                STREAM_ID: stream_id, POSITION: position}
        return Batch(epoch, index, data, tuple(sorted(paths)), meta)

    async def iterate(self, items: AsyncIterator[ReadItem], read: ReadFiles) -> AsyncIterator[Group]:
        items = aiter(items)
        while True:
            head = await anext(items, None)
            if head is None:
                return
            if isinstance(head, EpochEnd):
                if self.target is not None:  # this rank has no file this epoch: padding steps only
                    async for batch in self._epoch(_nothing(), read, head.epoch):
                        yield batch
                continue
            epoch = head.task.epoch

            async def unread(head: FileStream = head) -> AsyncIterator[FileStream]:
                yield head
                async for item in items:
                    if isinstance(item, EpochEnd):
                        return
                    yield item

            files = unread()
            async for batch in self._epoch(files, read, epoch):
                yield batch
            async for stream in files:  # cut short (even_batches="drop"): the rest is not read
                stream.cancel()


def _common_layout(key: str, columns: Sequence[Tuple[str, np.ndarray]]) -> Tuple[np.dtype, Tuple[int, ...]]:
    """The dtype and sample shape of field ``key`` in a batch whose rows hold these arrays
    (``(path, array)``, at least one): NumPy's common dtype, as files joined outside stream
    mode get. Samples of different shapes cannot share a batch (``ValueError``), nor
    dtypes without a common one (``TypeError``); either error names two of the files."""
    first_path, first = columns[0]
    dtype, sample = first.dtype, first.shape[1:]
    for path, col in columns[1:]:
        if col.shape[1:] != sample:
            raise ValueError(f"field {key!r} has samples of shape {sample} in file {first_path!r} but "
                             f"{col.shape[1:]} in file {path!r}: stream rows in one batch need one shape")
        if col.dtype != dtype:
            try:
                dtype = np.result_type(dtype, col.dtype)
            except TypeError as exc:
                raise TypeError(f"field {key!r} holds {first.dtype} in file {first_path!r} and {col.dtype} in "
                                f"file {path!r}, which have no common dtype: {exc}") from exc
    return dtype, sample


def _copy_sample(sample: Any) -> Any:
    """A sample kept beyond its batch: an array row is copied, so the piece it views can go."""
    return sample.copy() if isinstance(sample, np.ndarray) else sample


async def _nothing() -> AsyncIterator[FileStream]:
    return
    yield  # an async generator that yields nothing
