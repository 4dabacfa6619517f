"""``len(loader)``: the batches one iteration yields, from the samples per file (``DataReader.count``).

Counting (``_counts``) takes each file's count from an index where it still matches and
calls ``DataReader.count`` for the others, the first time a length (or a split across
ranks) is needed, and the loader keeps the counts for its life. The built-in readers
count cheaply (a newline count, ``.npy`` headers); the default ``count`` parses the whole file.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Union

from ._abc import DataReader
from ._checks import is_integer
from ._errors import PipelineError
from ._rng import USER_COUNT, drawing
from ._stages.mix import MixSource
from ._stages.shard import batches_of
from ._stages.source import FileSource
from ._stages.stream_plan import stream_steps
from ._stages.tiled import TiledSource

if TYPE_CHECKING:
    from ._counts import Counter


def checked_count(reader: DataReader, path: str) -> int:
    """``reader.count(path)``, checked; a failure is a ``PipelineError`` naming the file."""
    try:
        with drawing(reader.random_seed, USER_COUNT):  # a count that reads through iter_file may use pyloader.rng()
            n = reader.count(path)
    except Exception as exc:
        raise PipelineError("count", [path], exc) from exc
    if not is_integer(n):
        raise PipelineError("count", [path], ValueError(f"count returned {n!r}, expected an int >= 0"))
    return n


def cached_counts(cache: Dict[str, object], files: Sequence[str]) -> Optional[List[Optional[int]]]:
    return cache["counts"] if cache.get("files") == list(files) else None  # type: ignore[return-value]


def count_files(counter: Counter, cache: Dict[str, object], skip_failed: bool,
                known: Optional[Sequence[Optional[int]]] = None, progress: bool = False) -> List[Optional[int]]:
    """The samples of every file (``_counts``: from the indexes, the rest counted concurrently), kept in
    ``cache``. A count that fails raises its ``PipelineError``, or with ``skip_failed`` is ``None`` and
    left out of the cache, so that the run counts it again and reports it through the error policy.
    ``known[i]``, where not ``None``, is file ``i``'s count without asking the reader (a stream's
    slice, an in-memory stream)."""
    counts = cached_counts(cache, counter.files)
    if counts is not None:
        return counts
    counted = counter.count(known, first_failure_stops=not skip_failed, progress=progress)
    failures = counted.take_failures()
    if not failures:
        cache.update(files=list(counter.files), counts=counted.counts, runs=counted.runs)
    elif not skip_failed:
        raise failures.pop(0)[1]  # out of the list this frame holds, which its traceback would reach
    return counted.counts


def epoch_batches(source: FileSource, epoch: int, batch_size: int, drop_last: bool, stream: bool,
                  seq_len: Optional[int], rotation: int = 1) -> int:
    """The batches (steps, in stream mode) of ``epoch`` for this rank, each sample served ``rotation``
    times; ``source`` holds the counts (a file whose count failed and was skipped counts as empty)."""
    if not stream:
        return batches_of(source.samples(epoch), batch_size, drop_last, rotation)
    return _stream_epoch_steps(source, epoch, batch_size, drop_last, seq_len)


def _stream_epoch_steps(source: FileSource, epoch: int, batch_size: int, drop_last: bool,
                        seq_len: Optional[int]) -> int:
    """``epoch_batches`` in stream mode: the steps of ``epoch`` for this rank."""
    if source.sharding.active:
        return source.steps(epoch, batch_size, seq_len, drop_last)
    counts = source.counts or []
    return stream_steps([counts[i] for i in source.order(epoch)], batch_size, seq_len or 1)


def epoch_steps(source: Union[FileSource, MixSource, TiledSource], epoch: int, batch_size: int, drop_last: bool,
                seq_len: Optional[int], rotation: int = 1) -> int:
    """Every batch (step) of ``epoch`` on this rank as planned from the counts, those of the parts
    taken under other world sizes included (elastic resume): under ranks, the steps every rank gives."""
    if rotation > 1:
        return batches_of(source.samples(epoch), batch_size, drop_last, rotation)
    return source.steps(epoch, batch_size, seq_len, drop_last)
