"""The path of a batch, top to bottom: files → pieces → batches → encoded → collated → hand-over."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, List, Mapping, Optional

from ._abc import DataCollator, DataReader, Dataset
from ._batch import Batch, Batcher
from ._errors import ErrorHandler, Stats
from ._map import OrderedMap
from ._read import ReadFiles
from ._source import FileSource
from ._stream import StreamBatcher


@dataclass
class Settings:
    """Everything a run needs; fixed when the ``DataLoader`` is built."""

    files: List[str]
    reader: DataReader
    dataset: Dataset
    collator: DataCollator
    num_epoch: int
    max_queue_size: int
    shuffle: bool
    random_seed: int
    shuffle_buffer: int
    drop_last: bool
    prefetch_files: int
    concurrency: int
    errors: ErrorHandler
    stats: Stats
    finish: Optional[Callable[[Any], Any]] = None  # e.g. pin_memory, run after collate_batch
    stream: bool = False
    seq_len: Optional[int] = None
    padding_mode: str = "zeros"
    pad_value: Any = 0


@dataclass(frozen=True)
class Start:
    """Where a run begins: ``epoch``, after skipping its first ``skip`` batches."""

    epoch: int = 0
    skip: int = 0


def _checked_encode(dataset: Dataset) -> Callable:
    def encode(columns: Mapping) -> Any:
        out = dataset.batch_encode(columns)
        if not isinstance(out, Mapping):
            raise TypeError(f"batch_encode must return a dict of lists, got {type(out).__name__}")
        return out
    return encode


async def _skip(batches: AsyncIterator[Batch], start: Start) -> AsyncIterator[Batch]:
    async for batch in batches:
        if batch.epoch == start.epoch and batch.index < start.skip:
            continue  # replayed to rebuild the state, not encoded again
        yield batch


def batches(s: Settings, start: Start, run_blocking: Callable, tasks: asyncio.TaskGroup) -> AsyncIterator[Batch]:
    """The stages of one run, chained; ``run_blocking(fn, *args)`` runs ``fn`` off the loop."""
    source = FileSource(s.files, s.num_epoch, s.shuffle, s.random_seed)
    read = ReadFiles(s.reader, run_blocking, s.prefetch_files, s.errors, s.stats)
    files = read.iterate(source.iterate(start.epoch), tasks)
    if s.stream:
        batcher = StreamBatcher(s.files, s.reader.batch_size, s.seq_len, s.padding_mode, s.pad_value)
    else:
        batcher = Batcher(s.files, s.reader.batch_size, s.drop_last, s.shuffle_buffer, s.random_seed)
    raw = batcher.iterate(files, read)
    if start.skip:
        raw = _skip(raw, start)
    steps = [("batch_encode", _checked_encode(s.dataset)), ("collate_batch", s.collator.collate_batch)]
    if s.finish is not None:
        steps.append(("pin_memory", s.finish))
    return OrderedMap(steps, run_blocking, s.concurrency, s.errors, s.stats).iterate(raw, tasks)
