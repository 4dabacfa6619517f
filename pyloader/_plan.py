"""What a run is planned from, and the plan: the ``Settings`` the loader hands a run (the user's
options and what the loader built from them), the user's steps by where they run (``split_steps``),
and the frozen ``RunPlan`` resolved once per run from the settings, the start position and the counts
(``plan_run``): the mode, the source of files, the planned steps, and where each stage begins the
first epoch (``FirstEpoch``, the one place a saved position becomes the stages' resume points).
``_pipeline`` builds the chain of stages from the plan.
"""
from __future__ import annotations

import enum
import functools
import threading
from collections import abc  # isinstance against these, not typing's aliases: several times faster
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Dict, List, Mapping, NamedTuple, Optional, Protocol, Tuple, TypeVar, Union

from ._abc import DataCollator, DataReader, Dataset, IdentityDataset
from ._columns import Columns
from ._counts import Counted, Counter
from ._errors import ErrorHandler, NeverSkipped, Stats, reraise
from ._execution.measured import Measured
from ._execution.pool import WorkerPool
from ._execution.runners import Exclusive
from ._execution.steps import Step
from ._groups import Shuffle, Stream
from ._length import epoch_steps
from ._options import Options, resolved, seq_len_of, stream_of, times_of
from ._stages.batch import FROM_START, Bucketing, Buffers, Cut, ResumeRows, reads_from
from ._stages.bucket import Lengths
from ._stages.entries import Entries, bounds_of, known_counts
from ._stages.mix import MixSource
from ._stages.shard import Sharding
from ._stages.source import Elastic, FileSource, FileTask
from ._stages.sources import Mix
from ._stages.stream_resume import StreamStart, stream_start
from ._stages.tiled import TiledSource
from ._stages.tiles import pools_of
from ._state import Start
from ._storage.cache import DiskCache
from ._storage.epoch_cache import EpochStore
from .collators._base import ArrayCollator

T = TypeVar("T")
PlannedSource = Union[FileSource, MixSource, TiledSource]  # stage 1: the files, weighted sources, the global order


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
    errors: ErrorHandler  # ``on_error`` (an ``OnError``), counted per run
    stats: Stats
    finish: Optional[Callable[[object], object]] = None  # e.g. pin_memory, run after collate_batch
    pool: Optional[WorkerPool] = None  # the worker processes, launched before the run (``launch_workers``)
    sharding: Sharding = Sharding()  # ``ranks``, resolved for this run
    count_cache: Dict[str, object] = field(default_factory=dict)  # samples per file, kept across runs
    exclusive: Exclusive = field(default_factory=lambda: Exclusive(()))  # locks of the user objects
    cache: Optional[DiskCache] = None  # ``storage.cache_dir``
    entries: Optional[Entries] = None  # stream mode: slices of files, or in-memory streams (``_stages.entries``)
    mix: Optional[Mix] = None  # weighted sources (``_stages.mix``): their files, each read by its own reader
    encoded_cache: Optional[EpochStore] = None  # ``cache_encoded``: this rank's share (``_stages.cached_epochs``)
    counter: Optional[Counter] = None  # counts the files, from and into the count indexes (``_counts``)
    measured: Optional[Measured] = None  # ``"auto"`` with workers: each file placed by measurement

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
        if type(out) is not dict and not isinstance(out, abc.Mapping):  # the ABC's check costs more
            raise TypeError(f"batch_encode must return a dict of lists, got {type(out).__name__}")
        _check_lengths(out)
        return out

    def on_stacked(self, columns: Mapping) -> Optional[Mapping]:
        """``batch_encode`` on a stacked group at once: only ``IdentityDataset``'s, which returns its input."""
        return columns if type(self.dataset).batch_encode is IdentityDataset.batch_encode else None


def _check_lengths(out: Mapping) -> None:
    """``ValueError`` unless every value of ``out`` that has a length (a list, an array, a tensor; not a
    string) has the same one: one item per sample."""
    first: Optional[Tuple[object, int]] = None
    for key, value in out.items():
        if isinstance(value, (str, bytes)):
            continue
        try:
            n = len(value)
        except TypeError:  # a scalar, a 0-d array: no items to count
            continue
        if first is None:
            first = (key, n)
        elif n != first[1]:
            raise ValueError(f"batch_encode returned columns of different lengths: {first[0]!r} has {first[1]} "
                             f"items, {key!r} has {n}: every value holds one item per sample of the batch")


class CollateResultError(NeverSkipped, TypeError):
    """What ``collate_batch`` returned cannot be a batch here (``None``; not a dict where the loader
    adds its own fields): a mistake in the collator, never skipped by ``on_error``."""


class Collate:
    """``collate_batch``, and the collator's ``collate_stacked`` for stacked groups where it has one.

    Any object ``collate_batch`` returns is the batch, except ``None`` (a missing ``return``); where the
    loader adds fields of its own to each batch (``needs_dict``: stream mode's flags, ``__padding__``
    under ranks) it must be a dict. Either mistake is a ``CollateResultError`` at the first batch."""

    def __init__(self, collator: DataCollator, needs_dict: bool = False) -> None:
        self.collator = collator
        self.needs_dict = needs_dict

    def __call__(self, features: Dict[str, object]) -> object:
        out = self.collator.collate_batch(features)
        if type(out) is not dict and (out is None or self.needs_dict and not isinstance(out, dict)):
            raise CollateResultError(_refused(out))
        return out

    def on_stacked(self, columns: Mapping) -> Optional[Mapping]:
        collate_stacked = getattr(self.collator, "collate_stacked", None)
        return None if collate_stacked is None else collate_stacked(columns)


def _refused(out: object) -> str:
    if out is None:
        return "collate_batch returned None: it must return the batch (is its return statement missing?)"
    return (f"collate_batch returned a {type(out).__name__}: stream mode and ranks add their flags "
            f"(__first__, __padding__...) to each batch, so it must return a dict here")


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
    collate: Step = ("collate_batch", Collate(s.options.datacollator, needs_dict=bool(s.options.stream)
                                              or s.sharding.active))
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
        for i, exc in counted.take_failures():
            s.errors("count", [s.files[i]], exc)
            s.stats.skipped_files += 1
        s.count_cache.update(files=list(s.files), counts=counted.counts, runs=counted.runs)
    counts: List[Optional[int]] = s.count_cache["counts"]  # type: ignore[assignment]
    return counts



class Mode(enum.Enum):
    """What happens to a batch between the batcher and the hand-over."""

    FILES = "files"  # encoded and collated at once
    ROTATED = "rotated"  # ``rotation``: each epoch encoded whole, its samples served again, then collated
    CACHED = "cached"  # ``cache_encoded``: each epoch read from the cache, written to it, or from the files


class FirstEpoch(NamedTuple):
    """Where each stage begins the run's first epoch: rebuilding a run from a saved position is
    planned here once, and each stage takes its part by keyword.

    ``past_files``: the source starts past the rows handed out already (read from ``read_from``,
    where the buffers rebuild their state), else the batches before the position are
    cut and dropped (``drop``); ``batcher``: its first batch's index and its buffers' resume point;
    ``stream``: in stream mode, where the rows are; ``read_again``: the files read before the
    position to find it (counted as replayed when the epoch is read).
    """

    batcher: ResumeRows = FROM_START
    past_files: bool = False
    read_from: int = 0
    drop: bool = False
    stream: Optional[StreamStart] = None
    read_again: Tuple[str, ...] = ()


@dataclass(frozen=True)
class RunPlan:
    """One run, resolved once from the options, the start position and the counts."""

    mode: Mode
    start: Start
    source: PlannedSource
    steps: Optional[Callable[[int], int]]  # under ranks: the batches every rank gives in an epoch
    # stacked groups only where a batch needs nothing on its own before the hand-over (no ranks' padding flags, packing,
    # rotation or cache of encoded batches), and not while ``"auto"`` places each file by measurement
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
    if isinstance(o.shuffle, Shuffle):  # the global order starts at the tile of any position
        return start.skip > 0
    return (start.skip > start.base and o.order.filter_fn is None and s.errors.policy is reraise and s.mix is None
            and o.rotation is None)


async def plan_run(s: Settings, start: Start, run_blocking: RunBlocking) -> RunPlan:
    """The run from ``start``: the counts are asked for only where the plan needs them."""
    past_files = resumes_past_files(s, start)
    counts = await count_samples(s, run_blocking) if _needs_counts(s, start, past_files) else None
    source = make_source(s, start, counts)
    steps = _planned_steps(s, source)
    buffers = _buffers(s, source)
    whole = FirstEpoch(batcher=ResumeRows(start.epoch, start.base))
    resumed = _resumed(s, start, source, steps, buffers, past_files) if past_files or start.splits else whole
    if start.skip and not resumed.past_files:
        resumed = resumed._replace(drop=True)
    mode = _mode(s)
    cut = Cut(s.batch_size, s.options.drop_last, stack=_stacks(s, mode))
    return RunPlan(mode=mode, start=start, source=source, steps=steps, cut=cut, buffers=buffers, resumed=resumed,
                   whole=whole)


def _stacks(s: Settings, mode: Mode) -> bool:
    """Whether batches are cut as stacked rows: files read in order, nothing packed, no ranks, and no
    pool whose measured batches are needed."""
    return (mode is Mode.FILES and s.options.pack is None and not s.sharding.active
            and (s.pool is None or s.measured is None))


def _needs_counts(s: Settings, start: Start, past_files: bool) -> bool:
    """Whether the plan needs the samples of every file: ranks, a position placed past files, an epoch
    begun under other world sizes, weighted sources, or the global order."""
    return (s.sharding.active or past_files or bool(start.splits) or s.mix is not None
            or isinstance(s.options.shuffle, Shuffle))


def _mode(s: Settings) -> Mode:
    if s.encoded_cache is not None:
        return Mode.CACHED
    return Mode.ROTATED if s.options.rotation is not None else Mode.FILES


def _buffers(s: Settings, source: PlannedSource) -> Buffers:
    """The buffers rows meet in before they are cut: the weighted sources' mix, the shuffle buffer, bucketing."""
    o = s.options
    bucket = None if o.bucket is None else Bucketing(Lengths(o.bucket.by), resolved(o.bucket.buffer))
    return Buffers(o.order.shuffle_buffer, o.random_seed, bucket,
                   source.buffer if isinstance(source, (MixSource, TiledSource)) else None)


def make_source(s: Settings, start: Start, counts: Optional[List[Optional[int]]]) -> PlannedSource:
    """The plan of files of every epoch of the run (``FileSource``, or ``MixSource`` for sources)."""
    return source_of(s.options, s.files, start, counts, sharding=s.sharding, mix=s.mix, entries=s.entries,
                     elastic=elastic_of(start, s.batch_size, seq_len_of(s.options)), counted=s.stats.sources,
                     runs=s.count_cache.get("runs"))  # type: ignore[arg-type]


def elastic_of(start: Start, batch_size: int, seq_len: Optional[int]) -> Optional[Elastic]:
    """The parts of ``start``'s epoch taken under other world sizes (elastic resume), if any."""
    return Elastic(start.epoch, start.splits, batch_size, seq_len or 1) if start.splits else None


def source_of(o: Options, files: List[str], start: Start, counts: Optional[List[Optional[int]]], *,
              sharding: Sharding, mix: Optional[Mix], entries: Optional[Entries], elastic: Optional[Elastic] = None,
              counted: Optional[List[Dict[str, object]]] = None,
              runs: Optional[Dict[int, Dict[str, object]]] = None) -> PlannedSource:
    """The plan of the epochs ``start`` begins, for a run (``make_source``) or for the loader's own
    questions before one (its length, a position's check)."""
    if isinstance(o.shuffle, Shuffle):
        return _tiled_source(o, o.shuffle, files, start, counts, sharding=sharding, mix=mix, runs=runs)
    if mix is not None:
        return MixSource(mix, counts or [], o.order.stop, o.shuffle, o.random_seed, num_epoch=start.end,
                         sharding=sharding, counted=counted)
    return FileSource(files, start.end, bool(o.shuffle), o.random_seed, sharding=sharding, counts=counts,
                      whole_files=bool(o.stream), file_order=o.order.file_order, bounds=bounds_of(entries),
                      elastic=elastic)


def _tiled_source(o: Options, shuffle: Shuffle, files: List[str], start: Start,
                  counts: Optional[List[Optional[int]]], *, sharding: Sharding, mix: Optional[Mix],
                  runs: Optional[Dict[int, Dict[str, object]]]) -> TiledSource:
    """``source_of`` under the global order (``shuffle``, ``o.shuffle``)."""
    known = [n or 0 for n in counts or []]  # a count that failed and was skipped: left out
    pools = pools_of(shuffle.epoch_size, known, mix, o.order.stop)
    return TiledSource(files, known, pools, batch_size=o.datareader.batch_size, block=shuffle.block,
                       batching=shuffle.batching, seed=o.random_seed, num_epoch=start.end,
                       drop_last=o.drop_last, sharding=sharding, resume=(start.epoch, start.skip), runs=runs or {},
                       schedule=shuffle.schedule, epoch_size=shuffle.epoch_size)


def _planned_steps(s: Settings, source: PlannedSource) -> Optional[Callable[[int], int]]:
    """Under ranks, the steps every rank gives in an epoch (planned from the counts)."""
    if not s.sharding.active:
        return None
    o = s.options
    return lambda epoch: epoch_steps(source, epoch, s.batch_size, o.drop_last, seq_len_of(o), times_of(o))


def stream_fallback(s: Settings) -> Optional[Callable[[int], List[FileTask]]]:
    """Stream mode under ranks: the files a rank with none of its own replays (padding needs the fields)."""
    if not s.sharding.active:
        return None
    o = s.options

    def fallback(epoch: int) -> List[FileTask]:
        return list(FileSource(s.files, o.num_epoch, bool(o.shuffle), o.random_seed,
                               file_order=o.order.file_order, bounds=bounds_of(s.entries)).tasks(epoch))
    return fallback


def _resumed(s: Settings, start: Start, source: PlannedSource, steps: Optional[Callable[[int], int]],
             buffers: Buffers, past_files: bool) -> FirstEpoch:
    """Where each stage begins the first epoch when it resumes past files (``resumes_past_files``) or
    elastically: stream mode, where the rows are (``_stages.stream_resume``); the global order, at the tile of
    the position (``TiledSource``); else the rows the source skips, and where the buffers rebuild their state from."""
    if isinstance(source, TiledSource):
        return FirstEpoch(batcher=ResumeRows(start.epoch, start.skip), past_files=True)
    stream = stream_of(s.options)
    if stream is not None:
        assert isinstance(source, FileSource), "stream mode reads no weighted sources"
        return _stream_resumed(s, start, source, stream, steps=steps, past_files=past_files)
    if not past_files:
        return FirstEpoch(batcher=ResumeRows(start.epoch, start.base))
    assert isinstance(source, FileSource), "a position is placed past files without weighted sources"
    skip_rows = (start.skip - start.base) * s.batch_size
    batcher = ResumeRows(start.epoch, start.skip, skip_rows, source.rows(start.epoch))
    read_from = reads_from(buffers, s.batch_size, batcher)
    return FirstEpoch(batcher=batcher, past_files=True, read_from=read_from,
                      read_again=tuple(source.read_again(start.epoch, skip_rows, read_from)))


def _stream_resumed(s: Settings, start: Start, source: FileSource, stream: Stream, *,
                    steps: Optional[Callable[[int], int]], past_files: bool) -> FirstEpoch:
    """Stream mode's first epoch, resumed: where the rows are (``_stages.stream_resume``)."""
    at = stream_start(source, start.epoch, start.base, start.skip - start.base if past_files else 0,
                      rows=s.batch_size, width=stream.seq_len or 1, replay=stream.padding_mode == "data",
                      target=None if steps is None else steps(start.epoch), fallback=stream_fallback(s))
    return FirstEpoch(batcher=ResumeRows(start.epoch, start.base), past_files=past_files, stream=at,
                      read_again=tuple(at.read_again(edges=stream.padding_mode == "edge")))
