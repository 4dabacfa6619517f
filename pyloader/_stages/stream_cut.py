"""Stream mode, cutting: the rows' next windows made a batch, one step at a time or a group of steps at once.

Per row and step the batch holds one sample, or a window of ``seq_len``
consecutive samples padded at a file's end. Padding (``__valid__`` false) holds
``pad_value``, or with ``padding_mode="edge"`` the row's last real sample (of the
window, else the last one the row delivered this epoch; ``pad_value`` before it
has any). With ``time_major`` the data fields and ``__valid__`` are ``[T, B, ...]``.

While no row reaches the end of its piece, the next steps are cut all at once:
one array copy per row and field for a whole group of steps (``Cutter.cut_steps``).
Steps where a row reaches a piece's end, and list columns, are cut one at a time
(``Cutter.step``). Both give the same batches.

Rows from different files share a batch as files share one outside stream mode:
array fields take NumPy's common dtype (an int64 file beside a float64 one gives
float64); samples of different shapes and fields only some files have are a
``ValueError``, dtypes with no common one a ``TypeError``, each naming two of the files.
"""
from __future__ import annotations

from collections import abc  # isinstance against these, not typing's aliases: several times faster
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, cast

import numpy as np

from .._columns import Columns, concat, slice_rows
from .batch import Batch, Stacked
from .stream_rows import Row

FIRST, VALID, REPLAY, STREAM_ID, POSITION = "__first__", "__valid__", "__replay__", "__stream_id__", "__position__"
Rows = Sequence[Optional[Row]]
Window = Sequence  # a row's samples of one field in a step (empty: a row without a file)
Cut = Optional[Tuple[str, Columns, int]]  # a row's file, its piece and the offset there (``None``: no file)


class StreamShape(NamedTuple):
    """What a stream batch looks like: ``rows`` rows, each a sample or a window of ``seq_len`` samples
    (``[T, B, ...]`` with ``time_major``), a file's end padded by ``padding_mode`` (``pad_value``)."""

    rows: int
    seq_len: Optional[int] = None
    padding_mode: str = "zeros"
    pad_value: object = 0
    time_major: bool = False


class Cutter:
    """Cuts the batches of ``rows`` rows of ``seq_len`` samples (or one) from the rows' files.

    Between steps it keeps, per epoch, the columns last cut (``template``: the fields'
    layout for a step with no live row) and each row's last real sample (``edge``,
    ``padding_mode="edge"``); ``reset`` clears both at each epoch, so every epoch pads
    alike whatever came before it, a resumed one too.
    """

    def __init__(self, shape: StreamShape) -> None:
        self.rows = shape.rows
        self.seq_len = shape.seq_len
        self.width = shape.seq_len or 1
        self.padding_mode = shape.padding_mode
        self.pad_value = shape.pad_value
        self.time_major = shape.time_major  # [T, B, ...] rather than [B, T, ...] (with seq_len)
        self.row_axis = 2 if shape.time_major else 1  # in a group of steps: [steps, T, B, ...] or [steps, B, ...]
        self.template: Optional[Columns] = None
        self.edge: List[Dict[str, object]] = []  # per row (empty: no real sample yet)
        self.reset()

    def reset(self) -> None:
        self.template = None
        self.edge = [{} for _ in range(self.rows)]

    def steps_ahead(self, rows: Rows) -> int:
        """How many steps can be cut at once: no row reaches the end of its piece, and every
        field is an array (the same fields in every row)."""
        live = [row for row in rows if row is not None]
        steps = max(0, min(((row.ahead() - 1) // self.width for row in live), default=0))
        layouts = {row.array_keys for row in live}
        return steps if len(layouts) == 1 and None not in layouts else 0

    # -- a group of steps at once ------------------------------------------------------------------
    def cut_steps(self, rows: Rows, first: np.ndarray, epoch: int, index: int, steps: int) -> Stacked:
        """``steps`` consecutive batches, each field filled with one copy per row for all of them."""
        meta = self._group_meta(rows, first, steps)  # positions before the rows move on
        end = steps * self.width
        cuts = _cuts(rows, end)
        files = [(path, piece) for path, piece, _ in filter(None, cuts)]
        self.template = files[0][1]
        data = {key: self._stacked_field(key, cuts, files, steps) for key in self.template}
        if self.padding_mode == "edge":  # each row's last sample of the group
            self.remember_edges(_last_samples(cuts, end))
        paths = _paths(rows)
        return Stacked([Batch(epoch, index + k, None, paths) for k in range(steps)], data, meta)

    def _stacked_field(self, key: str, cuts: Sequence[Cut], files: Sequence[Tuple[str, Columns]],
                       steps: int) -> np.ndarray:
        """Field ``key`` of ``steps`` batches: ``[steps, B, (T,) ...]`` or ``[steps, T, B, ...]``,
        so that each step's batch is one contiguous block."""
        window = (steps, self.width) if self.seq_len else (steps,)
        dtype, sample = _common_layout(key, [(path, piece[key]) for path, piece in files])
        shape = window[:self.row_axis] + (len(cuts),) + window[self.row_axis:] + sample
        pad = self._pad(key)
        out = np.empty(shape, dtype) if all(cuts) else np.full(shape, pad, dtype)
        for r, cut in enumerate(cuts):
            row_out = out[(slice(None),) * self.row_axis + (r,)]
            if cut is not None:
                _, piece, offset = cut
                row_out[...] = piece[key][offset:offset + steps * self.width].reshape(window + sample)
            else:
                row_out[...] = self._fill(key, r, (), pad)
        return out

    def _group_meta(self, rows: Rows, first: np.ndarray, steps: int) -> Dict[str, np.ndarray]:
        """The metadata of ``steps`` batches at once (row ``k`` of each array is batch ``k``'s)."""
        live = np.array([row is not None for row in rows])
        firsts = np.zeros((steps, len(rows)), dtype=bool)
        firsts[0] = first
        one = self._laid_out(np.broadcast_to(live[:, None], live.shape + (self.width,)))  # one step's __valid__
        valid = np.broadcast_to(one, (steps,) + one.shape).copy()
        each = _row_meta(rows)
        start = each[POSITION]
        position = np.where(live, start + self.width * np.arange(steps)[:, None], -1)
        return {FIRST: firsts, VALID: valid, REPLAY: np.broadcast_to(each[REPLAY], firsts.shape).copy(),
                STREAM_ID: np.broadcast_to(each[STREAM_ID], firsts.shape).copy(), POSITION: position}

    # -- one step ----------------------------------------------------------------------------------
    async def step(self, rows: Rows, first: np.ndarray, epoch: int, index: int) -> Batch:
        """One batch, each row's window taken sample by sample (a row may reach its file's end)."""
        each = _row_meta(rows)  # positions before the rows move on
        windows, live, valid = await self._take(rows)
        template = self._template_of(live)
        data = {key: self._field(key, [() if w is None else w[key] for w in windows], live, like)
                for key, like in template.items()}
        if self.padding_mode == "edge":
            self.remember_edges(windows)
        meta = {FIRST: first, VALID: self._laid_out(valid), REPLAY: each[REPLAY],
                STREAM_ID: each[STREAM_ID], POSITION: each[POSITION]}
        return Batch(epoch, index, data, _paths(rows), meta)

    async def _take(self, rows: Rows) -> Tuple[List[Optional[Columns]], List[Tuple[str, Columns]], np.ndarray]:
        """Each row's next window (``None`` for a row without a file); the windows with their files, in row
        order; and which of their samples are real. A row with a file has a sample at hand
        (``Rows.step_files``): its window is never empty."""
        valid = np.zeros((self.rows, self.width), dtype=bool)
        windows: List[Optional[Columns]] = []
        live: List[Tuple[str, Columns]] = []
        for r, row in enumerate(rows):
            if row is None:
                windows.append(None)
                continue
            parts, got = await row.take(self.width)
            valid[r, :got] = True
            window = concat(parts, f"file {row.task.path!r}")
            windows.append(window)
            live.append((row.task.path, window))
        return windows, live, valid

    def _template_of(self, live: Sequence[Tuple[str, Columns]]) -> Columns:
        """The step's first window (else the last cut's), which every window's fields must match."""
        template = live[0][1] if live else self.template
        assert template is not None, "a step has a window, or follows one"
        self.template = template
        for path, window in live:
            if window.keys() != template.keys():
                raise ValueError(f"files {live[0][0]!r} and {path!r} have different fields ({sorted(template)} and "
                                 f"{sorted(window)}): stream rows in one batch need the same fields")
        return template

    def _field(self, key: str, columns: List[Window], live: Sequence[Tuple[str, Columns]], like: Sequence) -> object:
        """Field ``key`` of the batch from each row's window (``<= width`` samples; empty for a row
        without a file), padded to ``width``. ``live``: the windows with their files; ``like`` is the
        field in the epoch's template, which gives the layout when no row has a file.

        When every window holds an array: an array ``[B, ...]``, ``[B, T, ...]`` or (time-major)
        ``[T, B, ...]`` of their common dtype (``_common_layout``). Otherwise a list of samples,
        of ``T``-sample lists, or (time-major) of ``T`` lists of ``B`` samples.
        """
        seen: List[Tuple[Optional[str], Window]] = [(path, window[key]) for path, window in live] or [(None, like)]
        if all(isinstance(col, np.ndarray) for _, col in seen):
            return self._array_field(key, columns, seen)
        return self._list_field(key, columns, seen[0][1])

    def _array_field(self, key: str, columns: List[Window], seen: Sequence[Tuple[Optional[str], Window]]) -> np.ndarray:
        """``seen``: the windows that hold samples, with their files (else the template's field)."""
        pad = self._pad(key)
        dtype, sample = _common_layout(key, cast(Any, seen))
        out = np.full((len(columns), self.width) + sample, pad, dtype=dtype)
        for r, col in enumerate(columns):
            if len(col):
                out[r, :len(col)] = col
            fill = self._fill(key, r, col, pad)
            if fill is not pad:
                out[r, len(col):] = fill
        return self._laid_out(out)

    def _laid_out(self, rows: np.ndarray) -> np.ndarray:
        """A field's ``[B, T, ...]`` array as the batch holds it: ``[B, ...]`` without ``seq_len``,
        ``[T, B, ...]`` time-major."""
        if not self.seq_len:
            return rows[:, 0]
        return np.ascontiguousarray(rows.swapaxes(0, 1)) if self.time_major else rows

    def _list_field(self, key: str, columns: List[Window], like: Sequence) -> List[Any]:
        """``like``: samples of the field (of a window, else of the template). A row is padded
        with a sample like its own last one (else like ``like``'s first): ``pad_like``."""
        pad = self._pad(key)
        rows = []
        for r, col in enumerate(columns):
            rows.append(self._padded_row(key, r, col, like, pad))
        if not self.seq_len:
            return [row[0] for row in rows]
        return [list(step) for step in zip(*rows)] if self.time_major else rows

    def _padded_row(self, key: str, r: int, col: Window, like: Sequence, pad: object) -> List[Any]:
        """Row ``r``'s samples ``col`` of field ``key``, then its padding up to the width (see ``_list_field``)."""
        short = self.width - len(col)
        fill = self._fill(key, r, col, pad_like(col[-1] if len(col) else like[0], pad)) if short else None
        return list(col) + [fill] * short

    def remember_edges(self, windows: Sequence[Optional[Columns]]) -> None:
        """``padding_mode="edge"``: keep each row's last real sample (a copy: not the piece it came from)."""
        for r, window in enumerate(windows):
            if window is not None:
                self.remember_edge(r, window)

    def remember_edge(self, r: int, window: Columns) -> None:
        self.edge[r] = {key: _copy_sample(col[-1]) for key, col in window.items()}

    def _pad(self, key: str) -> object:
        return self.pad_value.get(key, 0) if isinstance(self.pad_value, abc.Mapping) else self.pad_value

    def _fill(self, key: str, r: int, window: Window, pad: object) -> object:
        """What pads row ``r`` of field ``key``: ``pad``, or with ``padding_mode="edge"`` the row's
        last real sample (of this window, else of an earlier step; ``pad`` before it has any)."""
        if self.padding_mode != "edge":
            return pad
        if len(window):
            return window[-1]
        return self.edge[r].get(key, pad)


def _row_meta(rows: Rows) -> Dict[str, np.ndarray]:
    """Per row: the file's place in the epoch's order, the row's position in it, whether it is replayed."""
    each = [(False, -1, -1) if row is None else (row.replay, row.task.pos, row.position) for row in rows]
    replay, stream_id, position = zip(*each)  # a batch has rows
    return {REPLAY: np.array(replay, dtype=bool), STREAM_ID: np.array(stream_id, dtype=np.int64),
            POSITION: np.array(position, dtype=np.int64)}


def _cuts(rows: Rows, end: int) -> List[Cut]:
    """Each row's next ``end`` samples, cut from its file (``None`` for a row without a file)."""
    return [None if row is None else (row.task.path, *row.cut(end)) for row in rows]


def _last_samples(cuts: Sequence[Cut], end: int) -> List[Optional[Columns]]:
    """The last of the ``end`` samples of each of ``cuts`` (``None`` where a row has no file)."""
    return [None if cut is None else slice_rows(cut[1], cut[2] + end - 1, cut[2] + end) for cut in cuts]


def _paths(rows: Rows) -> Tuple[str, ...]:
    return tuple(sorted({row.task.path for row in rows if row is not None}))


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


def pad_like(sample: object, pad: object) -> object:
    """The padding of a list field whose real samples are like ``sample``: ``pad`` itself when it is
    a sample of its own (a list, tuple, array or tensor), else ``sample``'s type and shape with every
    number ``pad``: a tuple ``([frames], label)`` gives a tuple, a dict a dict, an array an array of
    its dtype, a tensor a tensor, a ragged list a list of its lengths."""
    if isinstance(pad, (list, tuple)) or getattr(pad, "ndim", None):  # an array or tensor of 1 dim or more
        return pad
    if isinstance(sample, abc.Mapping):
        return {key: pad_like(value, pad) for key, value in sample.items()}
    if isinstance(sample, (list, tuple)):
        return _padded_sequence(sample, pad)
    if isinstance(sample, np.ndarray):
        return np.full_like(sample, pad)
    if hasattr(sample, "new_full") and hasattr(sample, "shape"):  # a torch tensor (stages import no framework)
        return sample.new_full(tuple(sample.shape), _scalar(pad))
    return pad


def _padded_sequence(sample: Sequence, pad: object) -> object:
    """``pad_like`` of a list or tuple ``sample``: one of its type (a named tuple's too), part by part."""
    parts = [pad_like(part, pad) for part in sample]
    kind: Any = type(sample)
    return kind(*parts) if hasattr(sample, "_fields") else kind(parts)  # a named tuple, else a list or tuple


def _scalar(pad: object) -> object:
    """``pad`` as a Python number where it is a 0-D array or tensor (``.item()``), else itself."""
    return pad.item() if hasattr(pad, "item") else pad


def _copy_sample(sample: object) -> object:
    """A sample kept beyond its batch: an array row is copied, so the piece it views can go."""
    return sample.copy() if isinstance(sample, np.ndarray) else sample
