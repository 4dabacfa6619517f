"""Multi-node training: which rank reads which samples, and how many steps every rank takes.

An epoch's samples, in the epoch's file order (the same on every rank), are cut
into ``world_size`` contiguous ranges whose sizes differ by at most one; rank
``r`` reads range ``r`` (a file on a boundary is read in part by two ranks).
The ranges are disjoint and together cover the epoch. To give every rank the
same number of steps, ``even_batches="pad"`` tops the short ranks up with
repeated samples flagged as padding, and ``"drop"`` trims the long ones.
Under replication (``Ranks(replication=R)``) a "rank" here is a replica: ``resolve``
maps process ``rank`` of ``world_size`` to replica ``rank // R`` of ``world_size // R``.

Every rank's step count is planned from ``DataReader.count`` alone (the same on
every rank), so no rank needs to ask the others; a rank that loses samples or
batches to a skipped error still gives the planned steps (``_stages.batch``, ``_stages.even``).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, TypeVar

import numpy as np

from .stream_plan import stream_steps

EVEN_BATCHES = ("pad", "drop")
EVEN_OUT = {"pad": max, "drop": min}  # per even_batches: what every rank takes of the ranks' counts
T = TypeVar("T")
Range = Tuple[int, int, int]  # (position in the epoch's order, first row, end row)


@dataclass(frozen=True)
class Sharding:
    rank: int = 0
    world_size: int = 1
    even_batches: str = "pad"

    @property
    def active(self) -> bool:
        return self.world_size > 1


SINGLE = Sharding()  # one process


def _found() -> Tuple[int, int]:
    """The rank and world size of an initialized ``torch.distributed`` group, else of ``RANK``/``WORLD_SIZE``."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def resolve(rank: Optional[int], world_size: Optional[int], even_batches: str, replication: int = 1) -> Sharding:
    """Explicit values, else an initialized ``torch.distributed`` group, else ``RANK``/``WORLD_SIZE``, else 0/1;
    with ``replication`` R, the data-parallel place: replica ``rank // R`` of ``world_size // R`` (the one
    place replication acts, so that every order of the data shares it out by replica)."""
    if even_batches not in EVEN_BATCHES:
        raise ValueError(f"even_batches must be one of {EVEN_BATCHES}, got {even_batches!r}")
    if rank is None or world_size is None:
        found_rank, found_world = _found()
        rank = found_rank if rank is None else rank
        world_size = found_world if world_size is None else world_size
    _check_place(rank, world_size)
    if world_size % replication:
        raise ValueError(f"replication ({replication}) must divide world_size ({world_size})")
    return Sharding(rank // replication, world_size // replication, even_batches)


def _check_place(rank: int, world_size: int) -> None:
    """``ValueError`` unless ``rank`` and ``world_size`` are integers with ``0 <= rank < world_size``."""
    for name, value in (("rank", rank), ("world_size", world_size)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if not 0 <= rank < world_size:  # no rank fits a world_size below 1
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")


def bounds(total: int, world_size: int) -> List[int]:
    return [r * total // world_size for r in range(world_size + 1)]


def offsets(order: Sequence[int], counts: Sequence[int]) -> np.ndarray:
    """Where each file of ``order`` starts in the epoch stream, and (last) where the epoch ends."""
    out = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(np.asarray(counts, dtype=np.int64)[np.asarray(order, dtype=np.int64)], out=out[1:])
    return out


def ranges(order: Sequence[int], counts: Sequence[int], lo: int, hi: int,
           starts: Optional[np.ndarray] = None) -> List[Range]:
    """The rows of the epoch stream ``[lo, hi)`` (files in ``order``) as per-file ranges, each
    naming its file by its position in ``order`` (a file may appear there more than once).
    ``starts``: ``offsets(order, counts)``, when the caller has them; only the files the rows
    fall in are looked at."""
    at = offsets(order, counts) if starts is None else starts
    out: List[Range] = []
    pos = max(0, int(np.searchsorted(at, lo, side="right")) - 1)  # the last file starting at or before lo
    while pos < len(order) and at[pos] < hi:
        offset = int(at[pos])
        start, end = max(lo, offset), min(hi, int(at[pos + 1]))
        if start < end:
            out.append((pos, start - offset, end - offset))
        pos += 1
    return out


Span = Tuple[int, int]  # rows [a, b) of an epoch's sample stream
Split = Tuple[int, int]  # (world size, batches every rank took) of a part of an epoch (elastic resume)


def _length(spans: Sequence[Span]) -> int:
    return sum(b - a for a, b in spans)


def _slice(spans: Sequence[Span], lo: int, hi: int) -> List[Span]:
    """Rows ``[lo, hi)`` of the rows of ``spans`` put end to end, as spans of the epoch stream."""
    out, offset = [], 0
    for a, b in spans:
        start, end = max(lo, offset), min(hi, offset + b - a)
        if start < end:
            out.append((a + start - offset, a + end - offset))
        offset += b - a
    return out


def shares(spans: Sequence[Span], world_size: int, even_batches: str) -> Tuple[List[int], int]:
    """Where the ranks' shares of ``spans`` start (and the last ends), and how many samples every
    rank reads: the longest share (pad) or the shortest (drop)."""
    cuts = bounds(_length(spans), world_size)
    sizes = [cuts[r + 1] - cuts[r] for r in range(world_size)]
    return cuts, EVEN_OUT[even_batches](sizes)


def undelivered(total: int, splits: Sequence[Split], batch_size: int, even_batches: str) -> List[Span]:
    """The rows of an epoch of ``total`` rows that no rank delivered in the ``splits`` before
    (elastic resume): each split shares out what the one before it left, and every rank of it
    took the same number of batches (from its share; beyond it, padding)."""
    left: List[Span] = [(0, total)]
    for world_size, batches in splits:
        cuts, target = shares(left, world_size, even_batches)
        rest: List[Span] = []
        for r in range(world_size):
            taken = min(batches * batch_size, cuts[r + 1] - cuts[r], target)
            rest.extend(_slice(left, cuts[r] + taken, cuts[r + 1]))
        left = rest
    return left


def _spans(order: Sequence[int], counts: Sequence[int], splits: Sequence[Split], batch_size: int,
           even_batches: str, total: Optional[int] = None) -> List[Span]:
    total = int(offsets(order, counts)[-1]) if total is None else total
    return undelivered(total, splits, batch_size, even_batches)


def batches_of(samples: int, batch_size: int, drop_last: bool, rotation: int = 1) -> int:
    """The batches an epoch of ``samples`` gives, each sample served ``rotation`` times (``_stages.rotation``):
    with ``drop_last`` the short batch is dropped before rotating, so every rotated batch is full."""
    if drop_last:
        return samples // batch_size * rotation
    return -(-samples * rotation // batch_size)


def planned_steps(order: Sequence[int], counts: Sequence[int], s: Sharding, batch_size: int, drop_last: bool,
                  splits: Sequence[Split] = ()) -> int:
    """The number of batches every rank gives in an epoch (outside stream mode), or in what the
    ``splits`` before left of it."""
    target = shares(_spans(order, counts, splits, batch_size, s.even_batches), s.world_size, s.even_batches)[1]
    return batches_of(target, batch_size, drop_last)


def rank_ranges(order: Sequence[int], counts: Sequence[int], s: Sharding, splits: Sequence[Split] = (),
                batch_size: int = 1) -> Tuple[List[Range], List[Range]]:
    """This rank's share of an epoch (or of what the ``splits`` before left of it), and the
    padding ranges that even out the step count."""
    starts = offsets(order, counts)
    left = _spans(order, counts, splits, batch_size, s.even_batches, int(starts[-1]))

    def as_ranges(lo: int, hi: int) -> List[Range]:
        return [r for a, b in _slice(left, lo, hi) for r in ranges(order, counts, a, b, starts)]

    cuts, target = shares(left, s.world_size, s.even_batches)
    total = cuts[-1]
    lo, hi = cuts[s.rank], cuts[s.rank + 1]
    if target <= hi - lo:
        return as_ranges(lo, lo + target), []
    # pad with the samples that follow this rank's share, wrapping around (a longer share holds some)
    need, pad, start = target - (hi - lo), [], hi % total
    while need:
        take = min(need, total - start)
        pad.extend(as_ranges(start, start + take))
        need -= take
        start = 0
    return as_ranges(lo, hi), pad


def stream_shares(items: Sequence[T], world_size: int) -> List[List[T]]:
    """Stream mode splits whole files: rank ``r`` takes every ``world_size``-th file of the epoch."""
    return [list(items[r::world_size]) for r in range(world_size)]


def stream_target(lengths: Sequence[Sequence[int]], rows: int, width: int, even_batches: str) -> int:
    """The step count every rank gives in stream mode, its files being of ``lengths[rank]``: the
    longest rank's (pad) or the shortest's (drop)."""
    steps = [stream_steps(share, rows, width) for share in lengths]
    return EVEN_OUT[even_batches](steps)
