"""The path of a batch, top to bottom: files → pieces → batches (in groups) → encoded and collated → hand-over.

A run is first planned (``_plan.plan_run``): a frozen ``RunPlan`` resolved once from the options
(``Settings``), the start position and the counts, holding the mode, the source of files,
the planned steps and where each stage begins the first epoch (``FirstEpoch``). The chain is
then built from it, stage by stage, by keyword (``batches``, ``FileStages``):

1. ``_stages.source`` (``FileSource``, ``MixSource``, or the global order's ``_stages.tiled.TiledSource``):
   which file (or range of one) is read when;
2. ``_stages.read`` (``ReadFiles``): the files read ahead, as pieces, by the runner;
3. ``_stages.batch`` (``Batcher``) or ``_stages.stream`` (``StreamBatcher``): pieces cut into batches;
4. ``_stages.map`` (``OrderedMap``): ``batch_encode`` and ``collate_batch`` on each group, in order;
5. ``_stages.even`` (``EvenSteps``): under ranks, every rank's epoch padded to the planned steps.

The mode picks what happens between 3 and 4. With ``cache_encoded`` each epoch takes one of
three paths (``_stages.cached_epochs``): read from the cache of encoded batches (then collated),
from the files with its encoded batches written to the cache before they are collated, or from
the files as without the cache. With ``rotation`` the encoded batches are cut into samples,
served several times and batched again (``_stages.rotation``) before they are collated. With
``pack`` each encoded batch's documents are packed into sequences (``_stages.pack``, after rotation
when both are on) before they are collated.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncGenerator, AsyncIterator, Iterator, List, Optional

from ._errors import Stats
from ._execution.filter import with_filter
from ._execution.forking import needed_modules
from ._execution.measured import HERE
from ._execution.pool import KeptPool, WorkerPool
from ._execution.runners import Lane, LocalSteps, MeasuredRunner, PoolRunner, Run, Runner, ThreadRunner
from ._execution.steps import Step
from ._frameworks.torch import attach_meta
from ._groups import Shuffle
from ._options import resolved, stream_of, workers_of
from ._plan import FirstEpoch, Mode, RunBlocking, RunPlan, Settings, plan_run, split_steps, stream_fallback
from ._stages.batch import Batcher, Group, RankSteps, RowBatcher, Stacked, drop_replayed
from ._stages.cached_epochs import CachedEpochs
from ._stages.entries import with_memory
from ._stages.even import EvenSteps
from ._stages.map import OrderedMap
from ._stages.pack import Packing
from ._stages.read import Ramp, ReadFiles
from ._stages.rotation import Rotation
from ._stages.source import FileSource, SourceItem
from ._stages.sources import readers_of
from ._stages.stream import StreamBatcher
from ._stages.stream_cut import StreamShape
from ._state import Start
from ._storage.bytes import ReadAhead
from ._storage.held import InMemory, OnDisk

_COLLATING = 2  # groups of rotated batches being collated at once


def launch_workers(s: Settings, kept: Optional[KeptPool], *, fork_only: bool = False) -> Optional[WorkerPool]:
    """The run's worker processes, started now if they do not run (a pool ``kept`` across runs with
    ``Workers.persistent``, else one for this run); called before the run's threads start.
    ``fork_only``: when they would not start by fork, ``forking.ForkUnsafe`` (and none starts)."""
    if not s.num_workers:
        return None
    objects = [*readers_of(s.mix, s.options.datareader), s.options.dataset, s.options.datacollator]

    workers = workers_of(s.options)

    def make_pool() -> WorkerPool:
        return WorkerPool(s.num_workers, with_filter(s.reader, s.options.order.filter_fn), split_steps(s).there,
                          workers.init_fn, workers.start_method, persistent=kept is not None,
                          imports=tuple(needed_modules(objects)))

    pool = make_pool() if kept is None else kept.get(make_pool)
    pool.busy, pool.fork_only = s.stats.busy, fork_only
    try:
        pool.launch()
    except BaseException:
        pool.close()
        raise
    return pool



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
    lane = Lane(run_blocking, resolved(workers_of(o).threads), s.exclusive)
    rotation: Optional[Rotation] = None
    try:
        storage = o.storage
        runner = _runner(s, lane, ReadAhead(run_blocking, s.reader, storage.readahead_bytes, storage.retries, s.cache))
        plan = await plan_run(s, start, run_blocking)
        chain = Chain(s=s, plan=plan, runner=runner, lane=lane, run_blocking=run_blocking, tasks=tasks)
        rotation = _rotation(chain) if plan.mode is Mode.ROTATED else None
        groups = _by_mode(chain, FileStages(chain), rotation)
        if plan.steps is not None:  # a batch skipped after an error leaves a hole, padded there
            groups = EvenSteps(plan.steps, start.epoch, start.skip, start.end).iterate(groups)
        async for group in groups:
            yield _with_meta(group)
    finally:
        if rotation is not None:
            rotation.close()
        if s.pool is not None:
            s.pool.finish()


def _by_mode(c: Chain, files: FileStages, rotation: Optional[Rotation]) -> AsyncIterator[Group]:
    """The groups of the run's epochs, by its mode (``Mode``): from the files, through the cache of encoded
    batches, or through ``rotation``."""
    start, runner, o = c.plan.start, c.runner, c.s.options
    if c.plan.mode is Mode.CACHED:
        return CachedEpochs(c.s, start=start, source=c.plan.source, from_files=files, full=runner.run,
                            encode=runner.encoding_only((o.dataset,)), after=split_steps(c.s).after_encode,
                            lane=c.lane, run_blocking=c.run_blocking, tasks=c.tasks).iterate()
    if rotation is not None:
        return _rotated(c, rotation, files(range(start.epoch, start.end), runner.encoding_only((o.dataset,)), False))
    if o.pack is not None:
        return _collated(c, _packed(c, files(range(start.epoch, start.end), runner.encoding_only((o.dataset,)))))
    return files(range(start.epoch, start.end), runner.run)


def _with_meta(group: Group) -> Group:
    """``group`` with its batches' metadata (``Batch.meta``) added to their collated data, where they carry any."""
    meta = group.meta if isinstance(group, Stacked) else group[0].meta
    return group if meta is None else attach_meta(group)


def _runner(s: Settings, lane: Lane, readahead: ReadAhead) -> Runner:
    """Where user methods run: the launched worker processes, threads of this process, or, file by
    file, where they measured faster (``_execution.measured``)."""
    steps = split_steps(s)
    if s.pool is None:
        return with_memory(_threads(s, steps.local, lane, readahead), s.entries)
    s.pool.attach()
    there = PoolRunner(s.pool, steps.here, lane, readahead, all_steps=steps.local,
                       uses=(s.options.dataset, s.options.datacollator), busy=s.stats.busy)
    if s.measured is None:
        return with_memory(there, s.entries)
    return with_memory(MeasuredRunner(_threads(s, steps.local, lane, readahead), there, s.measured), s.entries)


def _threads(s: Settings, steps: List[Step], lane: Lane, readahead: ReadAhead) -> ThreadRunner:
    """User methods (``steps``: all of them, as run when a batch is encoded here) run in threads of this process."""
    return ThreadRunner(with_filter(s.reader, s.options.order.filter_fn), steps, lane, readahead,
                        uses=(s.options.dataset, s.options.datacollator), busy=s.stats.busy)


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
        """Stage 1: the files of ``epochs``; the first from ``read_from`` (past the rows handed out, where the
        counts place them), or from where its stream rows are."""
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
    if o.stream:
        return ReadFiles(runner, True, max(o.storage.prefetch_files, s.batch_size), s.errors, s.stats, ramp=ramp)
    if isinstance(o.shuffle, Shuffle):
        # a tile's first batch needs all its columns (batch_size of them on a rank): the next tile's are read
        # while this one's batches are encoded, and there is no ramp; rows meet here
        return ReadFiles(runner, True, o.storage.prefetch_files + s.batch_size, s.errors, s.stats, ramp=ramp)
    buffered = o.order.shuffle_buffer > 0 or o.bucket is not None or s.mix is not None  # rows meet here
    return ReadFiles(runner, buffered, o.storage.prefetch_files, s.errors, s.stats, start_ahead=_start_ahead(s),
                     ramp=ramp)


def _start_ahead(s: Settings) -> int:
    """Files read beside the first until its first batch is out: one per extra worker, none in threads
    (there a second file would share the cores with the first, and a reader that is not thread-safe
    could even make the first file wait for the second's read)."""
    if s.measured is not None and s.measured.first_place() == HERE:
        return 0
    return max(0, s.num_workers - 1)


def _batcher(c: Chain, read: ReadFiles, first: FirstEpoch) -> RowBatcher:
    """Stage 3: files to batches (``Batcher``), or to stream batches (``StreamBatcher``); they take the
    pieces of each file (and stream rows files read again) through callables, not the read stage."""
    s, plan, o = c.s, c.plan, c.s.options
    stream = stream_of(o)
    if stream is not None:
        shape = StreamShape(s.batch_size, stream.seq_len, stream.padding_mode, stream.pad_value, stream.time_major)
        return StreamBatcher(s.files, read.pieces, read.open, shape, target=plan.steps, fallback=stream_fallback(s),
                             start=first.stream)
    # with rotation the steps are the rotated batches': a share short of samples is padded later (EvenSteps)
    ranks = RankSteps(flag=s.sharding.active, steps=None if plan.mode is Mode.ROTATED else plan.steps)
    return Batcher(s.files, read.pieces, s.errors, s.stats, cut=plan.cut, buffers=plan.buffers, ranks=ranks,
                   resume=first.batcher)


def _rotation(c: Chain) -> Rotation:
    """The stage serving encoded samples several times, re-batched (``_stages.rotation``)."""
    o, s = c.s.options, c.s
    assert o.rotation is not None, "a rotated run has rotation"
    held = InMemory() if o.rotation.folder is None else OnDisk(str(o.rotation.folder))
    return Rotation(o.rotation.times, resolved(o.rotation.size), s.batch_size, o.drop_last, o.random_seed,
                    by_epoch=bool(o.shuffle) or o.order.file_order is not None, held=held, errors=s.errors,
                    stats=s.stats, run_blocking=c.run_blocking, steps=c.plan.steps)


def _rotated(c: Chain, rotation: Rotation, encoded: AsyncIterator[Group]) -> AsyncIterator[Group]:
    """The encoded samples served again and batched again (those before a resumed position
    dropped), then collated and pinned in this process."""
    start = c.plan.start
    rotated = rotation.iterate(encoded)
    if start.skip:
        rotated = _skip(rotated, start, c.s.stats, whole=not c.s.sharding.active)
    return _collated(c, rotated if c.s.options.pack is None else _packed(c, rotated))


def _packed(c: Chain, encoded: AsyncIterator[Group]) -> AsyncIterator[Group]:
    """Each encoded batch's documents packed into sequences (``_stages.pack``)."""
    assert c.s.options.pack is not None, "a packed run has pack"
    return Packing(c.s.options.pack.spec(), c.s.errors, c.s.stats, c.run_blocking).iterate(encoded)


def _collated(c: Chain, encoded: AsyncIterator[Group]) -> AsyncIterator[Group]:
    """Encoded batches collated and pinned in this process."""
    collate = LocalSteps(split_steps(c.s).after_encode, c.lane, (c.s.options.datacollator,), c.s.stats.busy)
    return OrderedMap(collate.run, _COLLATING, c.s.errors, c.s.stats, c.s.draws).iterate(encoded, c.tasks)


async def _skip(groups: AsyncIterator[Group], start: Start, stats: Stats,
                whole: bool = False) -> AsyncIterator[Group]:
    """``groups`` less the batches of the resumed epoch before its position; ``whole``: that epoch gives all its
    batches here (no ranks pad it later), so one that ends before the position is a state from elsewhere
    (where the counts cannot tell its length, ``DataLoader._check_position`` could not refuse it)."""
    if whole:
        groups = _Reach(start).watch(groups)
    async for group in groups:
        kept = _past_position(group, start, stats)
        if kept:
            yield kept


def _past_position(group: Group, start: Start, stats: Stats) -> Group:
    """The batches of ``group`` past the position; those before it were replayed to rebuild the state,
    and are not encoded again."""
    return drop_replayed(group, [k for k, b in enumerate(group) if b.epoch != start.epoch or b.index >= start.skip],
                         stats)


class _Reach:
    """How far the resumed epoch went: a ``ValueError`` once it is known to end before the position."""

    def __init__(self, start: Start) -> None:
        self.start = start
        self.reached = start.base  # its batches so far

    async def watch(self, groups: AsyncIterator[Group]) -> AsyncIterator[Group]:
        """``groups`` as they come, seen on their way; checked at their end."""
        async for group in groups:
            self.see(group)
            yield group
        self.check()

    def see(self, group: Group) -> None:
        self.reached = max([self.reached] + [b.index + 1 for b in group if b.epoch == self.start.epoch])
        if group[-1].epoch != self.start.epoch:
            self.check()

    def check(self) -> None:
        if self.reached < self.start.skip:
            raise ValueError(f"the state's batches_in_epoch {self.start.skip} is past the end of epoch "
                             f"{self.start.epoch}, which gave {self.reached} batches: it was not saved from "
                             f"this data and settings")
