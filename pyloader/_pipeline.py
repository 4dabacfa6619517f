"""The path of a batch, top to bottom: files → pieces → batches (in groups) → encoded and collated → hand-over.

A run is first planned (``plan_run``): a frozen ``RunPlan`` resolved once from the options
(``Settings``), the start position and the counts, holding the mode, the source of files,
the planned steps and where each stage begins the first epoch (``FirstEpoch``). The chain is
then built from it, stage by stage, by keyword (``batches``, ``FileStages``):

1. ``_stages.source`` (``FileSource``, ``MixSource``): which file is read when;
2. ``_stages.read`` (``ReadFiles``): the files read ahead, as pieces, by the runner;
3. ``_stages.batch`` (``Batcher``) or ``_stages.stream`` (``StreamBatcher``): pieces cut into batches;
4. ``_stages.map`` (``OrderedMap``): ``batch_encode`` and ``collate_batch`` on each group, in order;
5. ``_stages.even`` (``EvenSteps``): under ranks, every rank's epoch padded to the planned steps.

The mode picks what happens between 3 and 4. With ``cache_encoded`` each epoch takes one of
three paths (``_stages.cached_epochs``): read from the cache of encoded batches (then collated),
from the files with its encoded batches written to the cache before they are collated, or from
the files as without the cache. With ``rotation`` the encoded batches are cut into samples,
served several times and batched again (``_stages.rotation``) before they are collated.
"""
from __future__ import annotations

import asyncio
import enum
import functools
import threading
from collections import abc  # isinstance against these, not typing's aliases: several times faster
from dataclasses import dataclass, field
from typing import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Protocol,
    Tuple,
    TypeVar,
    Union,
)

from ._abc import DataCollator, DataReader, Dataset, IdentityDataset
from ._columns import Columns
from ._counts import Counted, Counter
from ._errors import ErrorHandler, Stats, reraise
from ._execution.filter import with_filter
from ._execution.forking import needed_modules
from ._execution.pool import KeptPool, WorkerPool
from ._execution.runners import Exclusive, Lane, LocalSteps, PoolRunner, Run, Runner, ThreadRunner
from ._execution.steps import Step
from ._frameworks.torch import attach_meta
from ._length import epoch_steps
from ._options import Options, resolved
from ._stages.batch import (
    FROM_START,
    Batcher,
    Bucketing,
    Buffers,
    Cut,
    Group,
    RankSteps,
    ResumeRows,
    RowBatcher,
    Stacked,
    reads_from,
)
from ._stages.bucket import Lengths
from ._stages.cached_epochs import CachedEpochs
from ._stages.entries import Entries, bounds_of, known_counts, with_memory
from ._stages.even import EvenSteps
from ._stages.map import OrderedMap
from ._stages.mix import MixSource
from ._stages.read import Ramp, ReadFiles
from ._stages.rotation import Rotation
from ._stages.shard import Sharding
from ._stages.source import Elastic, FileSource, FileTask, Source, SourceItem
from ._stages.sources import Mix
from ._stages.stream import StreamBatcher
from ._stages.stream_cut import StreamShape
from ._stages.stream_resume import StreamStart, stream_start
from ._state import Start
from ._storage.bytes import ReadAhead
from ._storage.cache import DiskCache
from ._storage.epoch_cache import EpochStore
from ._storage.held import InMemory, OnDisk
from .collators._base import ArrayCollator

_COLLATING = 2  # groups of rotated batches being collated at once
T = TypeVar("T")


class RunBlocking(Protocol):
    """``run_blocking(fn, *args)``: ``fn(*args)`` run off the event loop (``_execution.engine``)."""

    def __call__(self, fn: Callable[..., T], /, *args: object) -> Awaitable[T]: ...


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
    finish: Optional[Callable[[object], object]] = None  # e.g. pin_memory, run after collate_batch
    pool: Optional[WorkerPool] = None  # the worker processes, launched before the run (``launch_workers``)
    sharding: Sharding = Sharding()  # ``rank``, ``world_size``, ``even_batches``, resolved for this run
    count_cache: Dict[str, object] = field(default_factory=dict)  # samples per file, kept across runs
    exclusive: Exclusive = field(default_factory=lambda: Exclusive(()))  # locks of the user objects
    cache: Optional[DiskCache] = None  # ``cache_dir``
    entries: Optional[Entries] = None  # stream mode: slices of files, or in-memory streams (``_stages.entries``)
    mix: Optional[Mix] = None  # weighted sources (``_stages.mix``): their files, each read by its own reader
    encoded_cache: Optional[EpochStore] = None  # ``cache_encoded``: this rank's share (``_stages.cached_epochs``)
    counter: Optional[Counter] = None  # counts the files, from and into the count indexes (``_counts``)

    @property
    def draws(self) -> Tuple[int, int]:
        """What ``pyloader.rng()`` in a batch's steps draws from besides its place (``_stages.map.OrderedMap``)."""
        return self.options.random_seed, self.sharding.rank

    @property
    def batch_size(self) -> int:
        """Rows per batch (stream mode: per step), the ``DataReader``'s."""
        return self.reader.batch_size


class CheckedEncode:
    """``batch_encode`` plus the check of what it returns (a class, so workers can unpickle it)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __call__(self, columns: Columns) -> Mapping:
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

    def __call__(self, features: Dict[str, object]) -> object:
        return self.collator.collate_batch(features)

    def on_stacked(self, columns: Mapping) -> Optional[Mapping]:
        collate_stacked = getattr(self.collator, "collate_stacked", None)
        return None if collate_stacked is None else collate_stacked(columns)


class Steps(NamedTuple):
    """The user's steps of a batch, by where they run."""

    there: List[Step]  # where the batch is encoded (a worker process, or this one)
    here: List[Step]  # in this process afterwards
    local: List[Step]  # all of them, as run when a batch is encoded in this process

    @property
    def after_encode(self) -> List[Step]:
        """The steps after ``batch_encode`` (``collate_batch``, pinning), run in this process."""
        return self.local[1:]


def split_steps(s: Settings) -> Steps:
    """The steps of a batch, by where they run.

    With workers, a collator that makes tensors a worker should not (TF's) is
    split: NumPy stacking in the worker, conversion here; pinning is always here.
    """
    encode: Step = ("batch_encode", CheckedEncode(s.options.dataset))
    collate: Step = ("collate_batch", Collate(s.options.datacollator))
    finish: List[Step] = [] if s.finish is None else [("pin_memory", s.finish)]
    split = s.options.datacollator
    if s.num_workers and isinstance(split, ArrayCollator) and split.converts_in_main:  # stacking there, converting here
        there: List[Step] = [encode, ("collate_batch", split.stack)]
        return Steps(there, [("collate_batch", split.convert), *finish], [encode, collate, *finish])
    return Steps([encode, collate], finish, [encode, collate, *finish])


async def count_samples(s: Settings, run_blocking: RunBlocking) -> List[Optional[int]]:
    """Samples per file (``_counts``: from the indexes, the rest counted concurrently); computed once per
    loader. A failure goes through the error policy: skipped, the file's count is ``None`` (it is left out)."""
    if s.count_cache.get("files") != s.files:
        assert s.counter is not None
        stop = threading.Event()  # set when the run ends while counting: no count begins after it
        count = functools.partial(s.counter.count, known_counts(s.entries), stop=stop,
                                  first_failure_stops=s.errors.policy is reraise, progress=s.options.progress)
        try:
            counted: Counted = await run_blocking(count)
        finally:
            stop.set()
        for i, exc in counted.failures:
            s.errors("count", [s.files[i]], exc)
            s.stats.skipped_files += 1
        s.count_cache.update(files=list(s.files), counts=counted.counts)
    counts: List[Optional[int]] = s.count_cache["counts"]  # type: ignore[assignment]
    return counts


def launch_workers(s: Settings, kept: Optional[KeptPool]) -> Optional[WorkerPool]:
    """The run's worker processes, started now if they do not run (a pool ``kept`` across runs with
    ``persistent_workers``, else one for this run); called before the run's threads start."""
    if not s.num_workers:
        return None
    readers = s.mix.readers.readers if s.mix is not None else [s.options.datareader]
    objects = [*readers, s.options.dataset, s.options.datacollator]

    def make_pool() -> WorkerPool:
        return WorkerPool(s.num_workers, with_filter(s.reader, s.options.filter_fn), split_steps(s).there,
                          s.options.worker_init_fn, s.options.start_method, persistent=kept is not None,
                          imports=tuple(needed_modules(objects)))

    pool = make_pool() if kept is None else kept.get(make_pool)
    pool.busy = s.stats.busy
    try:
        pool.launch()
    except BaseException:
        pool.close()
        raise
    return pool


# -- the plan ---------------------------------------------------------------------------------------------------


class Mode(enum.Enum):
    """What happens to a batch between the batcher and the hand-over."""

    FILES = "files"  # encoded and collated at once
    ROTATED = "rotated"  # ``rotation``: each epoch encoded whole, its samples served again, then collated
    CACHED = "cached"  # ``cache_encoded``: each epoch read from the cache, written to it, or from the files


class FirstEpoch(NamedTuple):
    """Where each stage begins the run's first epoch: rebuilding a run from a saved position is
    planned here once, and each stage takes its part by keyword.

    ``past_files``: the source starts past the rows handed out already (``skip_rows``, read from
    ``read_from``, where the buffers rebuild their state), else the batches before the position are
    cut and dropped (``drop``); ``batcher``: its first batch's index and its buffers' resume point;
    ``stream``: in stream mode, where the rows are; ``read_again``: the files read before the
    position to find it (counted as replayed when the epoch is read).
    """

    batcher: ResumeRows = FROM_START
    past_files: bool = False
    skip_rows: int = 0
    read_from: int = 0
    drop: bool = False
    stream: Optional[StreamStart] = None
    read_again: Tuple[str, ...] = ()


@dataclass(frozen=True)
class RunPlan:
    """One run, resolved once from the options, the start position and the counts."""

    mode: Mode
    start: Start
    source: Union[FileSource, MixSource]
    steps: Optional[Callable[[int], int]]  # under ranks: the batches every rank gives in an epoch
    cut: Cut
    buffers: Buffers  # the mix, shuffle and bucket buffers rows meet in before they are cut
    resumed: FirstEpoch  # the first epoch, read from the position
    whole: FirstEpoch  # the first epoch, read from its start (rotation, a cache rewritten)

    def first(self, from_position: bool) -> FirstEpoch:
        return self.resumed if from_position else self.whole


def resumes_past_files(s: Settings, start: Start) -> bool:
    """Whether a resumed epoch can start past the files before its position (or past those before
    where the buffers' state there is rebuilt from: ``_stages.shuffle``, ``_stages.bucket``; in stream mode, at the
    rows' places there: ``_stages.stream_resume``), found from the counts: not when the counts cannot place
    the position (mixing, samples filtered or errors skipped), nor with rotation (its batches are not
    the files' in order): those replay it."""
    o = s.options
    return (start.skip > start.base and o.filter_fn is None and s.errors.policy is reraise and s.mix is None
            and o.rotation == 1)


async def plan_run(s: Settings, start: Start, run_blocking: RunBlocking) -> RunPlan:
    """The run from ``start``: the counts are asked for only where the plan needs them."""
    past_files = resumes_past_files(s, start)
    needs_counts = s.sharding.active or past_files or bool(start.splits) or s.mix is not None
    source = make_source(s, start, await count_samples(s, run_blocking) if needs_counts else None)
    steps = _planned_steps(s, source)
    buffers = _buffers(s, source)
    whole = FirstEpoch(batcher=ResumeRows(start.epoch, start.base))
    resumed = _resumed(s, start, source, steps, buffers) if past_files or start.splits else whole
    if start.skip and not resumed.past_files:
        resumed = resumed._replace(drop=True)
    return RunPlan(mode=_mode(s), start=start, source=source, steps=steps, cut=Cut(s.batch_size, s.options.drop_last),
                   buffers=buffers, resumed=resumed, whole=whole)


def _mode(s: Settings) -> Mode:
    if s.encoded_cache is not None:
        return Mode.CACHED
    return Mode.ROTATED if s.options.rotation > 1 else Mode.FILES


def _buffers(s: Settings, source: Union[FileSource, MixSource]) -> Buffers:
    """The buffers rows meet in before they are cut: the weighted sources' mix, the shuffle buffer, bucketing."""
    o = s.options
    bucket = None if o.bucket_by is None else Bucketing(Lengths(o.bucket_by), resolved(o.bucket_buffer))
    return Buffers(o.shuffle_buffer, o.random_seed, bucket, source.buffer if isinstance(source, MixSource) else None)


def make_source(s: Settings, start: Start, counts: Optional[List[Optional[int]]],
                counted: bool = True) -> Union[FileSource, MixSource]:
    """The plan of files of every epoch of the run (``FileSource``, or ``MixSource`` for sources);
    ``counted``: the samples batched are counted in the stats."""
    o = s.options
    if s.mix is not None:
        return MixSource(s.mix, counts or [], o.stop, o.shuffle, o.random_seed, num_epoch=start.end,
                         sharding=s.sharding, counted=s.stats.sources if counted else None)
    elastic = Elastic(start.epoch, start.splits, s.batch_size, o.seq_len or 1) if start.splits else None
    return FileSource(s.files, start.end, o.shuffle, o.random_seed, sharding=s.sharding, counts=counts,
                      whole_files=o.stream, file_order=o.file_order, bounds=bounds_of(s.entries), elastic=elastic)


def _planned_steps(s: Settings, source: Source) -> Optional[Callable[[int], int]]:
    """Under ranks, the steps every rank gives in an epoch (planned from the counts)."""
    if not s.sharding.active:
        return None
    o = s.options
    return functools.partial(_epoch_steps, source, s.batch_size, o.drop_last, o.seq_len, o.rotation)


def _epoch_steps(source: Source, batch_size: int, drop_last: bool, seq_len: Optional[int], rotation: int,
                 epoch: int) -> int:
    return epoch_steps(source, epoch, batch_size, drop_last, seq_len, rotation)  # type: ignore[arg-type]


def _fallback(s: Settings) -> Optional[Callable[[int], List[FileTask]]]:
    """Stream mode under ranks: the files a rank with none of its own replays (padding needs the fields)."""
    if not s.sharding.active:
        return None
    o = s.options

    def fallback(epoch: int) -> List[FileTask]:
        return list(FileSource(s.files, o.num_epoch, o.shuffle, o.random_seed,
                               file_order=o.file_order, bounds=bounds_of(s.entries)).tasks(epoch))
    return fallback


def _resumed(s: Settings, start: Start, source: Union[FileSource, MixSource], steps: Optional[Callable[[int], int]],
             buffers: Buffers) -> FirstEpoch:
    """Where each stage begins the first epoch when it resumes past files (``resumes_past_files``) or
    elastically: stream mode, where the rows are (``_stages.stream_resume``); else the rows the source
    skips, and where the buffers rebuild their state from."""
    o = s.options
    past_files = resumes_past_files(s, start)
    if o.stream:
        assert isinstance(source, FileSource), "stream mode reads no weighted sources"
        at = stream_start(source, start.epoch, start.base, start.skip - start.base if past_files else 0,
                          rows=s.batch_size, width=o.seq_len or 1, replay=o.padding_mode == "data",
                          target=None if steps is None else steps(start.epoch), fallback=_fallback(s))
        return FirstEpoch(batcher=ResumeRows(start.epoch, start.base), past_files=past_files, stream=at,
                          read_again=tuple(at.read_again(edges=o.padding_mode == "edge")))
    if not past_files:
        return FirstEpoch(batcher=ResumeRows(start.epoch, start.base))
    assert isinstance(source, FileSource), "a position is placed past files without weighted sources"
    skip_rows = (start.skip - start.base) * s.batch_size
    batcher = ResumeRows(start.epoch, start.skip, skip_rows, source.rows(start.epoch))
    read_from = reads_from(buffers, s.batch_size, batcher)
    return FirstEpoch(batcher=batcher, past_files=True, skip_rows=skip_rows, read_from=read_from,
                      read_again=tuple(source.read_again(start.epoch, skip_rows, read_from)))


# -- the chain --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chain:
    """What the stages of one run are built from: its settings and plan, where user code runs
    (``runner``, and ``lane`` for what runs in this process), and the event loop's helpers."""

    s: Settings
    plan: RunPlan
    runner: Runner
    lane: Lane
    run_blocking: RunBlocking
    tasks: asyncio.TaskGroup


async def batches(s: Settings, start: Start, run_blocking: RunBlocking,
                  tasks: asyncio.TaskGroup) -> AsyncGenerator[Group, None]:
    """The stages of one run, chained; ``run_blocking(fn, *args)`` runs ``fn`` off the loop.

    User methods run in this process ``num_threads`` at a time (``Lane``).
    """
    o = s.options
    lane = Lane(run_blocking, resolved(o.num_threads), s.exclusive)
    rotation: Optional[Rotation] = None
    try:
        runner = _runner(s, lane, ReadAhead(run_blocking, s.reader, o.readahead_bytes, o.retries, s.cache))
        plan = await plan_run(s, start, run_blocking)
        chain = Chain(s=s, plan=plan, runner=runner, lane=lane, run_blocking=run_blocking, tasks=tasks)
        files = FileStages(chain)
        groups: AsyncIterator[Group]
        if plan.mode is Mode.CACHED:
            groups = CachedEpochs(s, start=start, source=plan.source, from_files=files, full=runner.run,
                                  encode=runner.encoding_only((o.dataset,)), after=split_steps(s).after_encode,
                                  lane=lane, run_blocking=run_blocking, tasks=tasks).iterate()
        elif plan.mode is Mode.ROTATED:
            rotation = _rotation(chain)
            groups = _rotated(chain, rotation, files(range(start.epoch, start.end),
                                                     runner.encoding_only((o.dataset,)), False))
        else:
            groups = files(range(start.epoch, start.end), runner.run)
        if plan.steps is not None:  # a batch skipped after an error leaves a hole, padded there
            groups = EvenSteps(plan.steps, start.epoch, start.skip, start.end).iterate(groups)
        async for group in groups:
            yield attach_meta(group) if isinstance(group, Stacked) or group[0].meta is not None else group
    finally:
        if rotation is not None:
            rotation.close()
        if s.pool is not None:
            s.pool.finish()


def _runner(s: Settings, lane: Lane, readahead: ReadAhead) -> Runner:
    """Where user methods run: the launched worker processes, or threads of this process."""
    steps = split_steps(s)
    uses = (s.options.dataset, s.options.datacollator)
    if s.pool is None:
        reader = with_filter(s.reader, s.options.filter_fn)
        return with_memory(ThreadRunner(reader, steps.local, lane, readahead, uses=uses, busy=s.stats.busy),
                           s.entries)
    s.pool.attach()
    runner = PoolRunner(s.pool, steps.here, lane, readahead, all_steps=steps.local, uses=uses, busy=s.stats.busy)
    return with_memory(runner, s.entries)


class FileStages:
    """Stages 1 to 4 over some epochs (``_stages.cached_epochs.FromFiles``): their files read, cut into
    batches, and ``run`` on each group (``batch_encode`` and ``collate_batch``, or ``batch_encode``
    alone); with ``from_position``, the run's first epoch from the position it resumes at, else whole.
    The start-up ramp ends once the first group is out (``ramp``: a signal the read stage observes;
    nothing downstream calls into an earlier stage)."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain

    async def __call__(self, epochs: range, run: Run, from_position: bool = True) -> AsyncGenerator[Group, None]:
        c, plan = self.chain, self.chain.plan
        first = plan.first(from_position) if epochs.start == plan.start.epoch else plan.whole
        if first.read_again:
            c.s.stats.replayed(0, first.read_again)
        ramp = Ramp()
        read = _reader_stage(c.s, c.runner, ramp)
        items = read.iterate(self._items(epochs, first), c.tasks)
        cut = _batcher(c, read, first).iterate(items)
        if first.drop:
            cut = _skip(cut, plan.start, c.s.stats, whole=not c.s.sharding.active)
        async for group in OrderedMap(run, c.s.concurrency, c.s.errors, c.s.stats, c.s.draws).iterate(cut, c.tasks):
            ramp.set()
            yield group

    def _items(self, epochs: range, first: FirstEpoch) -> Iterator[SourceItem]:
        """Stage 1: the files of ``epochs``, the first past its first ``skip_rows`` rows where the counts
        find them (from ``read_from``), or from where its stream rows are."""
        source = self.chain.plan.source
        if first.stream is not None:
            assert isinstance(source, FileSource)
            return first.stream.source(source, epochs.stop)
        return source.iterate(epochs.start, first.read_from, epochs.stop)


def _reader_stage(s: Settings, runner: Runner, ramp: Ramp) -> ReadFiles:
    """Stage 2, reading few files ahead until ``ramp`` is set. Stream rows need several files before their
    first batch (no ramp there), and rows whose files end at the same step all need a new one at once:
    a file per row is read ahead."""
    o = s.options
    ahead = max(o.prefetch_files, s.batch_size) if o.stream else o.prefetch_files
    buffered = o.shuffle_buffer > 0 or o.bucket_by is not None or s.mix is not None  # rows meet here
    return ReadFiles(runner, o.stream or buffered, ahead, s.errors, s.stats,
                     start_ahead=None if o.stream else max(0, s.num_workers - 1), ramp=ramp)


def _batcher(c: Chain, read: ReadFiles, first: FirstEpoch) -> RowBatcher:
    """Stage 3: files to batches (``Batcher``), or to stream batches (``StreamBatcher``); they take the
    pieces of each file (and stream rows files read again) through callables, not the read stage."""
    s, plan, o = c.s, c.plan, c.s.options
    if o.stream:
        shape = StreamShape(s.batch_size, o.seq_len, o.padding_mode, o.pad_value, o.time_major)
        return StreamBatcher(s.files, read.pieces, read.open, shape, target=plan.steps, fallback=_fallback(s),
                             start=first.stream)
    # with rotation the steps are the rotated batches': a share short of samples is padded later (EvenSteps)
    ranks = RankSteps(flag=s.sharding.active, steps=None if plan.mode is Mode.ROTATED else plan.steps)
    return Batcher(s.files, read.pieces, s.errors, s.stats, cut=plan.cut, buffers=plan.buffers, ranks=ranks,
                   resume=first.batcher)


def _rotation(c: Chain) -> Rotation:
    """The stage serving encoded samples several times, re-batched (``_stages.rotation``)."""
    o, s = c.s.options, c.s
    held = InMemory() if o.rotation_dir is None else OnDisk(str(o.rotation_dir))
    return Rotation(o.rotation, resolved(o.rotation_size), s.batch_size, o.drop_last, o.random_seed,
                    by_epoch=o.shuffle or o.file_order is not None, held=held, errors=s.errors, stats=s.stats,
                    run_blocking=c.run_blocking, steps=c.plan.steps)


def _rotated(c: Chain, rotation: Rotation, encoded: AsyncIterator[Group]) -> AsyncIterator[Group]:
    """The encoded samples served again and batched again (those before a resumed position
    dropped), then collated and pinned in this process."""
    start = c.plan.start
    rotated = rotation.iterate(encoded)
    if start.skip:
        rotated = _skip(rotated, start, c.s.stats, whole=not c.s.sharding.active)
    collate = LocalSteps(split_steps(c.s).after_encode, c.lane, (c.s.options.datacollator,), c.s.stats.busy)
    return OrderedMap(collate.run, _COLLATING, c.s.errors, c.s.stats, c.s.draws).iterate(rotated, c.tasks)


async def _skip(groups: AsyncIterator[Group], start: Start, stats: Stats,
                whole: bool = False) -> AsyncIterator[Group]:
    """``groups`` less the batches of the resumed epoch before its position; ``whole``: that epoch gives all its
    batches here (no ranks pad it later), so one that ends before the position is a state from elsewhere
    (where the counts cannot tell its length, ``DataLoader._check_position`` could not refuse it)."""
    reach = _Reach(start) if whole else None
    async for group in groups:
        if reach is not None:
            reach.see(group)
        kept = _past_position(group, start, stats)
        if kept:
            yield kept
    if reach is not None:
        reach.check()


def _past_position(group: Group, start: Start, stats: Stats) -> Group:
    """The batches of ``group`` past the position; those before it were replayed to rebuild the state,
    and are not encoded again."""
    kept = [k for k, b in enumerate(group) if b.epoch != start.epoch or b.index >= start.skip]
    if len(kept) == len(group):
        return group
    stats.replayed(len(group) - len(kept), {p for b in group[:len(group) - len(kept)] for p in b.paths})
    if not kept:
        return []
    return group.pick(kept) if isinstance(group, Stacked) else [group[k] for k in kept]


class _Reach:
    """How far the resumed epoch went: a ``ValueError`` once it is known to end before the position."""

    def __init__(self, start: Start) -> None:
        self.start = start
        self.reached = start.base  # its batches so far

    def see(self, group: Group) -> None:
        self.reached = max([self.reached] + [b.index + 1 for b in group if b.epoch == self.start.epoch])
        if group[-1].epoch != self.start.epoch:
            self.check()

    def check(self) -> None:
        if self.reached < self.start.skip:
            raise ValueError(f"the state's batches_in_epoch {self.start.skip} is past the end of epoch "
                             f"{self.start.epoch}, which gave {self.reached} batches: it was not saved from "
                             f"this data and settings")
