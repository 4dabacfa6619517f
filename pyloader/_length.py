"""``len(loader)``: the batches one iteration yields, from the samples per file (``DataReader.count``).

Counting calls ``DataReader.count`` once per file, the first time a length (or a
split across ranks) is needed, and the loader keeps the counts for its life. The
built-in readers count cheaply (a newline count, ``.npy`` headers); the default
``count`` parses the whole file.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence

from ._abc import DataReader
from ._errors import PipelineError
from ._runners import Exclusive
from ._shard import Sharding, bounds, stream_steps, stream_target


def checked_count(reader: DataReader, path: str) -> int:
    """``reader.count(path)``, checked; a failure is a ``PipelineError`` naming the file."""
    try:
        n = reader.count(path)
    except Exception as exc:
        raise PipelineError("count", [path], exc) from exc
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise PipelineError("count", [path], ValueError(f"count returned {n!r}, expected an int >= 0"))
    return n


def cached_counts(cache: Dict[str, object], files: Sequence[str]) -> Optional[List[int]]:
    return cache["counts"] if cache.get("files") == list(files) else None  # type: ignore[return-value]


def count_files(reader: DataReader, files: Sequence[str], cache: Dict[str, object], threads: int,
                exclusive: Exclusive) -> List[int]:
    """The samples of every file, counted ``threads`` at a time (one at a time, under its lock,
    for a reader that is not thread-safe), kept in ``cache``."""
    counts = cached_counts(cache, files)
    if counts is None:
        keys = exclusive.keys([reader])
        if keys or threads == 1:
            counts = [exclusive.call(keys, checked_count, reader, p) for p in files]
        else:
            with ThreadPoolExecutor(threads, thread_name_prefix="pyloader-count") as pool:
                counts = list(pool.map(lambda p: checked_count(reader, p), files))
        cache.update(files=list(files), counts=counts)
    return counts


def epoch_batches(counts: Sequence[int], order: Sequence[int], batch_size: int, drop_last: bool,
                  sharding: Sharding, stream: bool, seq_len: Optional[int]) -> int:
    """The batches (steps, in stream mode) of one epoch whose files come in ``order``, for this rank."""
    if stream:
        if sharding.active:
            return stream_target(order, counts, batch_size, seq_len or 1, sharding)
        return stream_steps([counts[i] for i in order], batch_size, seq_len or 1)
    samples = sum(counts)
    if sharding.active:
        cuts = bounds(samples, sharding.world_size)
        sizes = [cuts[r + 1] - cuts[r] for r in range(sharding.world_size)]
        samples = max(sizes) if sharding.even_batches == "pad" else min(sizes)
    return samples // batch_size if drop_last else -(-samples // batch_size)
