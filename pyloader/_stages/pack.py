"""Document packing (``pack=Pack(...)``): each batch's tokenized documents packed into fixed-length sequences.

Contracts:

* **Where.** Between ``batch_encode`` and ``collate_batch``, in this process: each encoded batch
  (``batch_size`` documents, the field ``Pack.field`` holding each one's tokens) becomes one batch
  of packed sequences, collated here (with workers, the workers read and encode). A batch is its own
  window: nothing is carried from one batch to the next, so the batches keep their places, ``len()``,
  the steps every rank gives and resuming at any batch are those of the run without packing, and a
  batch's sequences are a pure function of its documents. Their number follows the tokens of the
  batch (``Pack.rows`` pads it to a fixed one).
* **Methods.** ``concat``: the documents end to end, in order, cut every ``seq_len`` tokens (as
  LitData's ``TokensLoader``; a document may continue in the next sequence); ``first_fit`` and
  ``best_fit``: the documents, longest first, each into the first sequence it fits in, or the one it
  fills most (Grain's packers; a document is cut only where it is longer than a sequence: into
  sequences of ``seq_len`` tokens of its own, and the rest packed as a document).
* **What a sequence carries.** The field's tokens (``pad_value`` after the last document),
  ``segment_ids`` (1, 2, ... for the pieces of documents in it, in order; 0 on padding),
  ``positions`` (0, 1, ... restarting at each piece) and ``loss_mask`` (0 on padding, and on the
  documents ranks repeated to even out the steps; 1 elsewhere), all ``[rows, seq_len]``. The batch's
  other fields are not kept (they are per document). Under ranks, ``__padding__`` is one flag for the
  whole batch (``[1]``): true only on a copy of another batch given in place of one that failed.
* **Errors.** A batch without the field, or whose field does not hold sequences of integers, or
  that needs more than ``Pack.rows`` sequences, fails at stage ``pack`` naming its files; ``on_error``
  handles it as a failed ``batch_encode``.

``layout`` and ``fill`` are the packers, pure NumPy functions of the documents' lengths and tokens;
``first_fit`` and ``best_fit`` place one document at a time (a NumPy scan of the open sequences, a
bisection of their free room), everything else is vectorized.
"""
from __future__ import annotations

import bisect
from typing import AsyncIterator, Callable, Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from .._errors import ErrorHandler
from .._stats import Stats
from .batch import PADDING, Batch, Group

METHODS = ("concat", "first_fit", "best_fit")
FIELDS = ("segment_ids", "positions", "loss_mask")  # what each packed batch carries besides the tokens


class Pieces(NamedTuple):
    """Where the documents go: piece ``i`` is tokens ``[start[i], start[i] + length[i])`` of document
    ``doc[i]``, at ``offset[i]`` in sequence ``row[i]``; ``rows`` sequences in all."""

    doc: np.ndarray
    start: np.ndarray
    length: np.ndarray
    row: np.ndarray
    offset: np.ndarray
    rows: int


def layout(lengths: Sequence[int], seq_len: int, method: str, window: Optional[int] = None) -> Pieces:
    """The pieces of documents of ``lengths`` packed by ``method`` into sequences of ``seq_len`` tokens;
    ``window``: with ``first_fit``/``best_fit``, the documents packed ``window`` at a time (their
    sequences one after the other), which bounds the work of each placement."""
    sizes = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if method == "concat":
        return _concat(sizes, seq_len)
    if method not in METHODS[1:]:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if window is None or window >= len(sizes):
        return _fitted(sizes, seq_len, method)
    return _windowed(sizes, seq_len, method, window)


def _windowed(sizes: np.ndarray, seq_len: int, method: str, window: int) -> Pieces:
    """``layout`` by a fitting ``method``, of the documents ``window`` at a time: each window's sequences
    after the previous window's."""
    parts, rows = [], 0
    for lo in range(0, len(sizes), window):
        part = _fitted(sizes[lo:lo + window], seq_len, method)
        parts.append(part._replace(doc=part.doc + lo, row=part.row + rows))
        rows += part.rows
    joined = [np.concatenate([getattr(p, f) for p in parts]) for f in Pieces._fields[:-1]]
    return Pieces(joined[0], joined[1], joined[2], joined[3], joined[4], rows)


def _concat(sizes: np.ndarray, seq_len: int) -> Pieces:
    """The documents end to end, cut every ``seq_len`` tokens."""
    ends = np.cumsum(sizes)
    starts = ends - sizes
    total = int(ends[-1]) if len(ends) else 0
    first_row, last_row = starts // seq_len, np.maximum(ends - 1, 0) // seq_len
    count = np.where(sizes > 0, last_row - first_row + 1, 0)
    doc = np.repeat(np.arange(len(sizes)), count)
    row = np.repeat(first_row, count) + _within(count)
    begin = np.maximum(starts[doc], row * seq_len)
    end = np.minimum(ends[doc], (row + 1) * seq_len)
    return Pieces(doc, begin - starts[doc], end - begin, row, begin - row * seq_len, -(-total // seq_len))


def _within(counts: np.ndarray) -> np.ndarray:
    """0, 1, ... counts[0] - 1, 0, 1, ... counts[1] - 1, ...: each item's place within its group."""
    total = int(counts.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)


def _fitted(sizes: np.ndarray, seq_len: int, method: str) -> Pieces:
    """``first_fit``/``best_fit``: each document longer than a sequence first gives whole sequences of its
    own; the rest of every document is placed, longest first."""
    full = sizes // seq_len
    rest = sizes - full * seq_len
    full_doc = np.repeat(np.arange(len(sizes)), full)
    full_start = _within(full) * seq_len
    nfull = len(full_doc)
    docs = np.flatnonzero(rest)
    docs = docs[np.argsort(-rest[docs], kind="stable")]
    place = _first_fit if method == "first_fit" else _best_fit
    row, offset, rows = place(rest[docs], seq_len)
    return Pieces(np.concatenate([full_doc, docs]), np.concatenate([full_start, full[docs] * seq_len]),
                  np.concatenate([np.full(nfull, seq_len, dtype=np.int64), rest[docs]]),
                  np.concatenate([np.arange(nfull, dtype=np.int64), row + nfull]),
                  np.concatenate([np.zeros(nfull, dtype=np.int64), offset]), nfull + rows)


def _first_fit(sizes: np.ndarray, seq_len: int) -> tuple:
    """Each item into the first sequence with room for it (a new one if none): rows, offsets, sequences."""
    free = np.empty(len(sizes), dtype=np.int64)
    row, offset = np.empty(len(sizes), dtype=np.int64), np.empty(len(sizes), dtype=np.int64)
    opened = 0
    for i, size in enumerate(sizes.tolist()):
        j = int(np.argmax(free[:opened] >= size)) if opened else 0
        if not opened or free[j] < size:
            j, opened = opened, opened + 1
            free[j] = seq_len
        row[i], offset[i] = j, seq_len - free[j]
        free[j] -= size
    return row, offset, opened


def _best_fit(sizes: np.ndarray, seq_len: int) -> tuple:
    """Each item into the sequence it leaves the least room in (a new one if none has room): the open
    sequences' room kept sorted, as ``room * scale + row``, and bisected."""
    scale = len(sizes) + 1
    rooms: List[int] = []
    row, offset = np.empty(len(sizes), dtype=np.int64), np.empty(len(sizes), dtype=np.int64)
    opened = 0
    for i, size in enumerate(sizes.tolist()):
        k = bisect.bisect_left(rooms, size * scale)
        if k < len(rooms):
            room, j = divmod(rooms.pop(k), scale)
        else:
            room, j, opened = seq_len, opened, opened + 1
        row[i], offset[i] = j, seq_len - room
        if room > size:
            bisect.insort(rooms, (room - size) * scale + j)
    return row, offset, opened


def fill(tokens: np.ndarray, lengths: np.ndarray, pieces: Pieces, seq_len: int, pad_value: object = 0, *,
         masked: Optional[np.ndarray] = None, rows: Optional[int] = None) -> Dict[str, np.ndarray]:
    """The packed sequences: ``tokens`` (the documents of ``lengths`` end to end) laid out as ``pieces``
    say, with their ``segment_ids``, ``positions`` and ``loss_mask`` (0 on padding and on the documents
    ``masked`` flags); ``rows``: at least that many sequences (padding ones after)."""
    n = max(pieces.rows, rows or 0)
    doc_starts = np.cumsum(lengths) - lengths
    within = _within(pieces.length)
    src = np.repeat(doc_starts[pieces.doc] + pieces.start, pieces.length) + within
    dst = np.repeat(pieces.row * seq_len + pieces.offset, pieces.length) + within
    out = np.full((n, seq_len), pad_value, dtype=tokens.dtype)
    out.reshape(-1)[dst] = tokens[src]
    positions = np.zeros((n, seq_len), dtype=np.int32)
    positions.reshape(-1)[dst] = within
    segments = np.zeros((n, seq_len), dtype=np.int32)
    segments.reshape(-1)[dst] = np.repeat(_segment_ids(pieces), pieces.length)
    mask = np.zeros((n, seq_len), dtype=bool)
    real = np.ones(len(pieces.doc), dtype=bool) if masked is None else ~masked[pieces.doc]
    mask.reshape(-1)[dst] = np.repeat(real, pieces.length)
    return {"tokens": out, "segment_ids": segments, "positions": positions, "loss_mask": mask}


def _segment_ids(pieces: Pieces) -> np.ndarray:
    """Each piece's place among the pieces of its sequence, by offset, from 1."""
    order = np.lexsort((pieces.offset, pieces.row))
    rows = pieces.row[order]
    first = np.r_[True, rows[1:] != rows[:-1]] if len(rows) else np.zeros(0, dtype=bool)
    starts = np.flatnonzero(first)
    ids = np.empty(len(order), dtype=np.int32)
    ids[order] = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)])) + 1
    return ids


def documents(column: object, field: str) -> tuple:
    """A field of documents as their tokens end to end and their lengths; ``ValueError`` or ``TypeError``
    where it does not hold sequences of integers."""
    arrays = _document_arrays(column, field)
    lengths = np.array([a.size if a.ndim == 1 else -1 for a in arrays], dtype=np.int64)
    if (lengths < 0).any():
        raise ValueError(f"field {field!r} must hold one sequence of tokens per document: a document is not 1-D")
    tokens = _end_to_end(arrays)
    if tokens.dtype.kind not in "iu":
        raise TypeError(f"field {field!r} must hold integer tokens, got dtype {tokens.dtype}")
    return tokens, lengths


def _document_arrays(column: object, field: str) -> List[np.ndarray]:
    """Each document of ``column`` (the field ``field``) as an array; ``TypeError`` where ``column`` is
    not a sequence of them."""
    if isinstance(column, np.ndarray) and column.ndim == 2:  # documents of one length
        return list(column)
    if isinstance(column, (list, tuple, np.ndarray)):
        return [np.asarray(doc) for doc in column]
    raise TypeError(f"field {field!r} must hold each document's tokens (a list of sequences), got "
                    f"{type(column).__name__}")


def _end_to_end(arrays: List[np.ndarray]) -> np.ndarray:
    """The tokens of ``arrays`` one after the other (an empty int64 array where there are none)."""
    return np.concatenate([a for a in arrays if a.size] or [np.zeros(0, dtype=np.int64)])


class PackSpec(NamedTuple):
    """What ``Pack`` says, as the stage takes it."""

    field: str
    seq_len: int
    method: str
    pad_value: object
    rows: Optional[int]


def pack_columns(columns: object, spec: PackSpec, masked: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
    """One encoded batch's documents packed (``masked``: the documents ranks repeated, by row)."""
    tokens, lengths = documents(_packed_field(columns, spec.field), spec.field)
    if masked is not None and len(masked) != len(lengths):
        raise ValueError(f"batch_encode gave {len(lengths)} documents for {len(masked)} rows: under ranks "
                         f"each document keeps its row's {PADDING} flag, so packing needs one per row")
    pieces = layout(lengths, spec.seq_len, spec.method)
    if spec.rows is not None and pieces.rows > spec.rows:
        raise ValueError(f"the batch's documents need {pieces.rows} sequences of {spec.seq_len} tokens, more "
                         f"than Pack.rows ({spec.rows})")
    packed = fill(tokens, lengths, pieces, spec.seq_len, spec.pad_value, masked=masked, rows=spec.rows)
    return {spec.field: packed.pop("tokens"), **packed}


def _packed_field(columns: object, field: str) -> object:
    """The column ``field`` of the encoded batch ``columns``; ``ValueError`` where there is none."""
    if not isinstance(columns, dict) or field not in columns:
        fields = sorted(columns) if isinstance(columns, dict) else type(columns).__name__
        raise ValueError(f"Pack.field {field!r} is not among the fields batch_encode gave ({fields})")
    return columns[field]


class Packing:
    """The stage: each encoded batch of a group packed (see the module's contracts); ``run_blocking(fn,
    *args)`` runs ``fn`` off the event loop."""

    def __init__(self, spec: PackSpec, errors: ErrorHandler, stats: Stats, run_blocking: Callable) -> None:
        self.spec = spec
        self.errors = errors
        self.stats = stats
        self.run_blocking = run_blocking

    async def iterate(self, groups: AsyncIterator[Group]) -> AsyncIterator[Group]:
        async for group in groups:
            packed = await self.run_blocking(self._group, group)
            if packed:
                yield packed

    def _group(self, group: Group) -> Group:
        out = []
        for batch in group:
            if self._batch(batch):
                out.append(batch)
        return out

    def _batch(self, batch: Batch) -> bool:
        """``batch`` packed in place; ``False`` where it failed and was skipped."""
        flags = (batch.meta or {}).get(PADDING)
        try:
            batch.data = pack_columns(batch.data, self.spec, None if flags is None else np.asarray(flags, dtype=bool))
        except (ValueError, TypeError) as exc:
            self.errors("pack", batch.paths, exc)
            self.stats.skipped_batches += 1
            return False
        # the documents' padding flags are in the loss mask now; under ranks one flag for the batch stays, false,
        # which a copy made to keep the steps equal (``_stages.even``) turns true
        batch.meta = None if flags is None else {PADDING: np.zeros(1, dtype=bool)}
        return True
