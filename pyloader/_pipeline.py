"""The path of a batch, top to bottom: files → pieces → batches → encoded and collated → hand-over."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, List, Mapping, Optional

from ._abc import DataCollator, DataReader, Dataset
from ._batch import Batch, Batcher
from ._errors import ErrorHandler, Stats
from ._map import OrderedMap, Step
from ._pool import WorkerPool
from ._read import ReadFiles
from ._runners import PoolRunner, ThreadRunner
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
    num_workers: int = 0
    worker_init_fn: Optional[Callable[[int], None]] = None
    start_method: Optional[str] = None


@dataclass(frozen=True)
class Start:
    """Where a run begins: ``epoch``, after skipping its first ``skip`` batches."""

    epoch: int = 0
    skip: int = 0


class CheckedEncode:
    """``batch_encode`` plus the check of what it returns (a class, so workers can unpickle it)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __call__(self, columns: Mapping) -> Any:
        out = self.dataset.batch_encode(columns)
        if not isinstance(out, Mapping):
            raise TypeError(f"batch_encode must return a dict of lists, got {type(out).__name__}")
        return out


def split_steps(s: Settings) -> tuple[List[Step], List[Step]]:
    """The steps run where the batch is encoded, and those run in this process afterwards.

    With workers, a collator that makes tensors a worker should not (TF's) is
    split: NumPy stacking in the worker, conversion here; pinning is always here.
    """
    encode: Step = ("batch_encode", CheckedEncode(s.dataset))
    here: List[Step] = []
    if s.num_workers and getattr(s.collator, "converts_in_main", False):
        there = [encode, ("collate_batch", s.collator.stack)]
        here.append(("collate_batch", s.collator.convert))
    else:
        there = [encode, ("collate_batch", s.collator.collate_batch)]
    if s.finish is not None:
        here.append(("pin_memory", s.finish))
    return there, here


async def _skip(batches: AsyncIterator[Batch], start: Start) -> AsyncIterator[Batch]:
    async for batch in batches:
        if batch.epoch == start.epoch and batch.index < start.skip:
            continue  # replayed to rebuild the state, not encoded again
        yield batch


async def batches(s: Settings, start: Start, run_blocking: Callable, tasks: asyncio.TaskGroup) -> AsyncIterator[Batch]:
    """The stages of one run, chained; ``run_blocking(fn, *args)`` runs ``fn`` off the loop."""
    there, here = split_steps(s)
    pool = None
    if s.num_workers:
        pool = WorkerPool(s.num_workers, s.reader, there, s.worker_init_fn, s.start_method)
        pool.start()
        runner: Any = PoolRunner(pool, here, run_blocking)
    else:
        runner = ThreadRunner(s.reader, there + here, run_blocking)
    try:
        source = FileSource(s.files, s.num_epoch, s.shuffle, s.random_seed)
        read = ReadFiles(runner, s.stream or s.shuffle_buffer > 0, s.prefetch_files, s.errors, s.stats)
        files = read.iterate(source.iterate(start.epoch), tasks)
        if s.stream:
            batcher: Any = StreamBatcher(s.files, s.reader.batch_size, s.seq_len, s.padding_mode, s.pad_value)
        else:
            batcher = Batcher(s.files, s.reader.batch_size, s.drop_last, s.shuffle_buffer, s.random_seed)
        raw = batcher.iterate(files, read)
        if start.skip:
            raw = _skip(raw, start)
        async for batch in OrderedMap(runner.run, s.concurrency, s.errors, s.stats).iterate(raw, tasks):
            yield batch
    finally:
        if pool is not None:
            pool.close()
