"""The path of a batch, top to bottom: files → pieces → batches (in groups) → encoded and collated → hand-over.

With ``cache_encoded`` each epoch takes one of three paths (``_stages.cached_epochs``): read from the
cache of encoded batches (then collated), from the files with its encoded batches written to
the cache before they are collated, or from the files as without the cache. With ``rotation``
the encoded batches are cut into samples, served several times and batched again
(``_stages.rotation``) before they are collated.
"""
from __future__ import annotations

import asyncio
import functools
import threading
from collections import abc  # isinstance against these, not typing's aliases: several times faster
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from ._abc import DataCollator, DataReader, Dataset, IdentityDataset
from ._counts import Counter
from ._errors import ErrorHandler, Stats, reraise
from ._execution.filter import with_filter
from ._execution.forking import needed_modules
from ._execution.pool import KeptPool, WorkerPool
from ._execution.runners import Exclusive, Lane, LocalSteps, PoolRunner, Runner, ThreadRunner
from ._execution.steps import Step
from ._frameworks.torch import attach_meta
from ._options import Options, resolved
from ._stages.batch import Batcher, Group, Stacked
from ._stages.bucket import Lengths
from ._stages.cached_epochs import CachedEpochs
from ._stages.entries import Entries, bounds_of, known_counts, with_memory
from ._stages.even import EvenSteps
from ._stages.map import OrderedMap
from ._stages.mix import MixSource
from ._stages.read import Ramp, ReadFiles
from ._stages.rotation import Rotation
from ._stages.shard import Sharding, batches_of
from ._stages.source import Elastic, FileSource, FileTask, SourceItem
from ._stages.sources import Mix
from ._stages.stream import StreamBatcher
from ._stages.stream_resume import StreamStart, stream_start
from ._state import Start
from ._storage.bytes import ReadAhead
from ._storage.cache import DiskCache
from ._storage.epoch_cache import EpochStore
from ._storage.held import InMemory, OnDisk

_COLLATING = 2  # groups of rotated batches being collated at once


@dataclass
class Settings:
    """What a run needs: the user's options, and the pieces the loader built from them."""

    options: Options  # checked and resolved when the loader was built (``_options``)
    files: List[str]  # of ``data_dir``, or of the weighted sources
    reader: DataReader  # the datareader, or the sources' readers (``mix``)
    num_workers: int  # worker processes of this run (``num_workers``, resolved: ``_execution.auto_workers``)
    concurrency: int  # groups being encoded and collated at once
    errors: ErrorHandler  # ``on_error`` and ``max_errors``, counted per run
    stats: Stats
    finish: Optional[Callable[[Any], Any]] = None  # e.g. pin_memory, run after collate_batch
    pool: Optional[WorkerPool] = None  # the worker processes, launched before the run (``launch_workers``)
    sharding: Sharding = Sharding()  # ``rank``, ``world_size``, ``even_batches``, resolved for this run
    count_cache: Dict[str, Any] = field(default_factory=dict)  # samples per file, kept across runs
    exclusive: Exclusive = field(default_factory=lambda: Exclusive(()))  # locks of the user objects
    cache: Optional[DiskCache] = None  # ``cache_dir``
    entries: Optional[Entries] = None  # stream mode: slices of files, or in-memory streams (``_stages.entries``)
    mix: Optional[Mix] = None  # weighted sources (``_stages.mix``): their files, each read by its own reader
    encoded_cache: Optional[EpochStore] = None  # ``cache_encoded``: this rank's share (``_stages.cached_epochs``)
    counter: Optional[Counter] = None  # counts the files, from and into the count indexes (``_counts``)


class CheckedEncode:
    """``batch_encode`` plus the check of what it returns (a class, so workers can unpickle it)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __call__(self, columns: Dict[str, Any]) -> Any:
        out = self.dataset.batch_encode(columns)
        if not isinstance(out, abc.Mapping):
            raise TypeError(f"batch_encode must return a dict of lists, got {type(out).__name__}")
        return out

    def on_stacked(self, columns: Mapping) -> Optional[Mapping]:
        """``batch_encode`` on a stacked group at once: only ``IdentityDataset``'s, which returns its input."""
        return columns if type(self.dataset).batch_encode is IdentityDataset.batch_encode else None


class Collate:
    """``collate_batch``, and the collator's ``collate_stacked`` for stacked groups where it has one."""

    def __init__(self, collator: DataCollator) -> None:
        self.collator = collator

    def __call__(self, features: Dict[str, Any]) -> Any:
        return self.collator.collate_batch(features)

    def on_stacked(self, columns: Mapping) -> Optional[Mapping]:
        collate_stacked = getattr(self.collator, "collate_stacked", None)
        return None if collate_stacked is None else collate_stacked(columns)


def split_steps(s: Settings) -> Tuple[List[Step], List[Step], List[Step]]:
    """The steps run where the batch is encoded, those run in this process afterwards,
    and all of them as run when a batch is encoded in this process.

    With workers, a collator that makes tensors a worker should not (TF's) is
    split: NumPy stacking in the worker, conversion here; pinning is always here.
    """
    encode: Step = ("batch_encode", CheckedEncode(s.options.dataset))
    collate: Step = ("collate_batch", Collate(s.options.datacollator))
    finish: List[Step] = [] if s.finish is None else [("pin_memory", s.finish)]
    if s.num_workers and getattr(s.options.datacollator, "converts_in_main", False):
        split: Any = s.options.datacollator  # an ArrayCollator: stacking there, converting here
        there = [encode, ("collate_batch", split.stack)]
        here = [("collate_batch", split.convert), *finish]
    else:
        there, here = [encode, collate], finish
    return there, here, [encode, collate, *finish]


async def count_samples(s: Settings, run_blocking: Callable) -> List[Optional[int]]:
    """Samples per file (``_counts``: from the indexes, the rest counted concurrently); computed once per
    loader. A failure goes through the error policy: skipped, the file's count is ``None`` (it is left out)."""
    if s.count_cache.get("files") != s.files:
        assert s.counter is not None
        stop = threading.Event()  # set when the run ends while counting: no count begins after it
        count = functools.partial(s.counter.count, known_counts(s.entries), stop=stop,
                                  first_failure_stops=s.errors.policy is reraise, progress=s.options.progress)
        try:
            counted = await run_blocking(count)
        finally:
            stop.set()
        for i, exc in counted.failures:
            s.errors("count", [s.files[i]], exc)
            s.stats.skipped_files += 1
        s.count_cache.update(files=list(s.files), counts=counted.counts)
    return s.count_cache["counts"]


async def _skip(groups: AsyncIterator[Group], start: Start, stats: Stats) -> AsyncIterator[Group]:
    async for group in groups:
        # batches replayed to rebuild the state are not encoded again
        kept = [k for k, b in enumerate(group) if b.epoch != start.epoch or b.index >= start.skip]
        if len(kept) < len(group):
            stats.replayed(len(group) - len(kept), {p for b in group[:len(group) - len(kept)] for p in b.paths})
        if len(kept) == len(group):
            yield group
        elif kept:
            yield group.pick(kept) if isinstance(group, Stacked) else [group[k] for k in kept]


def launch_workers(s: Settings, kept: Optional[KeptPool]) -> Optional[WorkerPool]:
    """The run's worker processes, started now if they do not run (a pool ``kept`` across runs with
    ``persistent_workers``, else one for this run); called before the run's threads start."""
    if not s.num_workers:
        return None
    there, _, _ = split_steps(s)
    readers = s.mix.readers.readers if s.mix is not None else [s.options.datareader]
    objects = [*readers, s.options.dataset, s.options.datacollator]

    def make_pool() -> WorkerPool:
        return WorkerPool(s.num_workers, with_filter(s.reader, s.options.filter_fn), there, s.options.worker_init_fn,
                          s.options.start_method, persistent=kept is not None,
                          imports=tuple(needed_modules(objects)))

    pool = make_pool() if kept is None else kept.get(make_pool)
    pool.busy = s.stats.busy
    try:
        pool.launch()
    except BaseException:
        pool.close()
        raise
    return pool


def _runner(s: Settings, lane: Lane, readahead: ReadAhead) -> Runner:
    """Where user methods run: the launched worker processes, or threads of this process."""
    _, here, local = split_steps(s)
    uses = (s.options.dataset, s.options.datacollator)
    if s.pool is None:
        reader = with_filter(s.reader, s.options.filter_fn)
        return with_memory(ThreadRunner(reader, local, lane, readahead, uses=uses, busy=s.stats.busy), s.entries)
    s.pool.attach()
    runner = PoolRunner(s.pool, here, lane, readahead, all_steps=local, uses=uses, busy=s.stats.busy)
    return with_memory(runner, s.entries)


def resumes_past_files(s: Settings, start: Start) -> bool:
    """Whether a resumed epoch can start past the files before its position (or past those before
    where the buffers' state there is rebuilt from: ``_stages.shuffle``, ``_stages.bucket``; in stream mode, at the
    rows' places there: ``_stages.stream_resume``), found from the counts: not when the counts cannot place
    the position (mixing, samples filtered or errors skipped), nor with rotation (its batches are not
    the files' in order): those replay it."""
    o = s.options
    return (start.skip > start.base and o.filter_fn is None and s.errors.policy is reraise and s.mix is None
            and o.rotation == 1)


def _source(s: Settings, start: Start, counts: Optional[List[Optional[int]]]) -> Any:
    """The plan of files of every epoch of the run (``FileSource``, or ``MixSource`` for sources)."""
    o = s.options
    if s.mix is not None:
        return MixSource(s.mix, counts or [], o.stop, o.shuffle, o.random_seed, start.end, s.sharding, s.stats.sources)
    elastic = Elastic(start.epoch, start.splits, s.reader.batch_size, o.seq_len or 1) if start.splits else None
    return FileSource(s.files, start.end, o.shuffle, o.random_seed, s.sharding, counts, whole_files=o.stream,
                      file_order=o.file_order, bounds=bounds_of(s.entries), elastic=elastic)


def _fallback(s: Settings) -> Optional[Callable[[int], List[FileTask]]]:
    """Stream mode under ranks: the files a rank with none of its own replays (padding needs the fields)."""
    if not s.sharding.active:
        return None
    o = s.options

    def fallback(epoch: int) -> List[FileTask]:
        return list(FileSource(s.files, o.num_epoch, o.shuffle, o.random_seed,
                               file_order=o.file_order, bounds=bounds_of(s.entries)).tasks(epoch))
    return fallback


def _stream_start(s: Settings, start: Start, source: Any, steps: Optional[Callable[[int], int]],
                  past_files: bool) -> Optional[StreamStart]:
    """Stream mode: where the first epoch's rows are, when it does not begin at its first step (a
    resume past files, or an elastic one); the files read again to get there count in the stats."""
    o = s.options
    if not o.stream or not (past_files or start.splits):
        return None
    at = stream_start(source, start.epoch, start.base, start.skip - start.base if past_files else 0,
                      s.reader.batch_size, o.seq_len or 1, o.padding_mode == "data",
                      None if steps is None else steps(start.epoch), _fallback(s))
    s.stats.replayed(0, at.read_again(edges=o.padding_mode == "edge"))
    return at


def _batcher(s: Settings, start: Start, source: Any, steps: Optional[Callable[[int], int]], skip_rows: int,
             stream: Optional[StreamStart], read: ReadFiles) -> Any:
    """Stage 3: files to batches (``Batcher``), or to stream batches (``StreamBatcher``); they take the
    pieces of each file (and stream rows files read again) through callables, not the read stage."""
    o = s.options
    if o.stream:
        return StreamBatcher(s.files, read.pieces, read.open, s.reader.batch_size, o.seq_len, o.padding_mode,
                             o.pad_value, steps, _fallback(s), o.time_major, stream)
    bucket = None if o.bucket_by is None else (Lengths(o.bucket_by), resolved(o.bucket_buffer))
    if o.rotation > 1:  # the steps are the rotated batches': a share short of samples is padded later (EvenSteps)
        steps = None
    return Batcher(s.files, read.pieces, s.errors, s.stats, s.reader.batch_size, o.drop_last, o.shuffle_buffer,
                   o.random_seed,
                   flag_padding=s.sharding.active, steps=steps, bucket=bucket,
                   resumed=(start.epoch, start.skip if skip_rows else start.base),
                   mix=None if s.mix is None else source.buffer,
                   resumed_rows=(skip_rows, source.rows(start.epoch) if skip_rows else 0))


def _reader_stage(s: Settings, runner: Runner, ramp: Ramp) -> ReadFiles:
    """Stage 2, reading few files ahead until ``ramp`` is set. Stream rows need several files before their
    first batch (no ramp there), and rows whose files end at the same step all need a new one at once:
    a file per row is read ahead."""
    ahead = max(s.options.prefetch_files, s.reader.batch_size) if s.options.stream else s.options.prefetch_files
    buffered = s.options.shuffle_buffer > 0 or s.options.bucket_by is not None or s.mix is not None  # rows meet here
    return ReadFiles(runner, s.options.stream or buffered, ahead, s.errors, s.stats,
                     start_ahead=None if s.options.stream else max(0, s.num_workers - 1), ramp=ramp)


def _planned_steps(s: Settings, source: Any) -> Optional[Callable[[int], int]]:
    """Under ranks, the steps every rank gives in an epoch (planned from the counts)."""
    if not s.sharding.active:
        return None
    o = s.options
    if o.rotation > 1:
        return lambda epoch: batches_of(source.samples(epoch), s.reader.batch_size, o.drop_last, o.rotation)
    return lambda epoch: source.steps(epoch, s.reader.batch_size, o.seq_len, o.drop_last)


def _rotation(s: Settings, run_blocking: Callable, steps: Optional[Callable[[int], int]]) -> Optional[Rotation]:
    """With ``rotation`` > 1, the stage serving encoded samples several times, re-batched (``_stages.rotation``)."""
    o = s.options
    if o.rotation == 1:
        return None
    held = InMemory() if o.rotation_dir is None else OnDisk(str(o.rotation_dir))
    return Rotation(o.rotation, resolved(o.rotation_size), s.reader.batch_size, o.drop_last, o.random_seed,
                    o.shuffle or o.file_order is not None, held, s.errors, s.stats, run_blocking, steps)


def _rotated(s: Settings, start: Start, rotation: Rotation, encoded: AsyncIterator[Group], lane: Lane,
             tasks: asyncio.TaskGroup) -> AsyncIterator[Group]:
    """The encoded samples served again and batched again (those before a resumed position
    dropped), then collated and pinned in this process."""
    rotated = rotation.iterate(encoded)
    if start.skip:
        rotated = _skip(rotated, start, s.stats)
    collate = LocalSteps(split_steps(s)[2][1:], lane, (s.options.datacollator,), s.stats.busy)
    return OrderedMap(collate.run, _COLLATING, s.errors, s.stats).iterate(rotated, tasks)


def _files(s: Settings, start: Start, source: Any, batcher: Any, skip_rows: int,
           epochs: range) -> Iterator[SourceItem]:
    """Stage 1: the files of ``epochs``, the first past its first ``skip_rows`` rows where the counts find
    them: from the file they end inside of, or from where the buffers' state is rebuilt from."""
    read_from = 0
    if skip_rows:  # read again to find the place: the file it falls in, and what the buffers' state needs
        read_from = batcher.reads_from()
        s.stats.replayed(0, source.read_again(start.epoch, skip_rows, read_from))
    return source.iterate(epochs.start, read_from, epochs.stop)


async def _from_files(s: Settings, start: Start, source: Any, runner: Any, run: Callable, steps: Any,
                      past_files: bool, epochs: range, from_position: bool,
                      tasks: asyncio.TaskGroup) -> AsyncGenerator[Group, None]:
    """Stages 2 to 4 over ``epochs``: their files read, cut into batches, and ``run`` on each group
    (``batch_encode`` and ``collate_batch``, or ``batch_encode`` alone); with ``from_position``, the run's
    first epoch from the position it resumes at, else whole. The start-up ramp ends once the first group is
    out (``ramp``: a signal the read stage observes; nothing downstream calls into an earlier stage)."""
    resumed = from_position and epochs.start == start.epoch
    past_files = past_files and resumed
    ramp = Ramp()
    read = _reader_stage(s, runner, ramp)
    stream = _stream_start(s, start, source, steps, past_files) if resumed else None
    skip_rows = (start.skip - start.base) * s.reader.batch_size if past_files and stream is None else 0
    batcher = _batcher(s, start, source, steps, skip_rows, stream, read)
    files = _files(s, start, source, batcher, skip_rows, epochs) if stream is None else stream.source(source,
                                                                                                     epochs.stop)
    raw = batcher.iterate(read.iterate(files, tasks))
    if resumed and start.skip and not past_files:
        raw = _skip(raw, start, s.stats)
    async for group in OrderedMap(run, s.concurrency, s.errors, s.stats).iterate(raw, tasks):
        ramp.set()
        yield group


async def batches(s: Settings, start: Start, run_blocking: Callable,
                  tasks: asyncio.TaskGroup) -> AsyncGenerator[Group, None]:
    """The stages of one run, chained; ``run_blocking(fn, *args)`` runs ``fn`` off the loop.

    User methods run in this process ``num_threads`` at a time (``Lane``).
    """
    o = s.options
    lane = Lane(run_blocking, resolved(o.num_threads), s.exclusive)
    rotation: Optional[Rotation] = None
    try:
        runner = _runner(s, lane, ReadAhead(run_blocking, s.reader, o.readahead_bytes, o.retries, s.cache))
        past_files = resumes_past_files(s, start)
        needs_counts = s.sharding.active or past_files or bool(start.splits) or s.mix is not None
        source = _source(s, start, await count_samples(s, run_blocking) if needs_counts else None)
        steps = _planned_steps(s, source)

        def from_files(epochs: range, run: Callable, from_position: bool = True) -> AsyncGenerator[Group, None]:
            return _from_files(s, start, source, runner, run, steps, past_files, epochs, from_position, tasks)

        groups: AsyncIterator[Group]
        rotation = _rotation(s, run_blocking, steps)
        if s.encoded_cache is not None:
            groups = CachedEpochs(s, start, source, from_files, runner.run, runner.encoding_only((o.dataset,)),
                                  split_steps(s)[2][1:], lane, run_blocking, tasks).iterate()
        elif rotation is not None:  # each epoch encoded whole, its samples served again, then collated
            encoded = from_files(range(start.epoch, start.end), runner.encoding_only((o.dataset,)), False)
            groups = _rotated(s, start, rotation, encoded, lane, tasks)
        else:
            groups = from_files(range(start.epoch, start.end), runner.run)
        if steps is not None:  # a batch skipped after an error leaves a hole, padded there
            groups = EvenSteps(steps, start.epoch, start.skip, start.end).iterate(groups)
        async for group in groups:
            yield attach_meta(group) if isinstance(group, Stacked) or group[0].meta is not None else group
    finally:
        if rotation is not None:
            rotation.close()
        if s.pool is not None:
            s.pool.finish()
