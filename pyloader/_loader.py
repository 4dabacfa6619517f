"""The public ``DataLoader``: iteration and resume state over its options (declared in ``_options``)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

from ._abc import DataCollator, DataReader, Dataset
from ._checks import is_integer
from ._compose import callable_name
from ._counts import Counter, IndexPlaces
from ._diagnose import Report, Tracing, report_of
from ._errors import ErrorHandler, ErrorPolicy, PipelineError, Stats
from ._execution.auto_workers import Placement, Placer
from ._execution.engine import Engine
from ._execution.forking import ForkUnsafe
from ._execution.measured import Measured
from ._execution.pool import KeptPool, WorkerPool
from ._execution.runners import Exclusive
from ._frameworks.progress import progress_bar
from ._frameworks.torch import mover, pinner, unstack
from ._groups import Bucket, OnError, Order, Pack, Ranks, Rotation, Shuffle, Storage, Stream, Workers
from ._length import count_files, epoch_batches, epoch_steps
from ._options import (
    GROUPS_IN_FLIGHT,
    GROUPS_PER_WORKER,
    OPTIONS,
    Options,
    binding,
    describe,
    device_of,
    errors_of,
    fingerprint,
    resolved,
    seq_len_of,
    times_of,
    values_of,
    workers_of,
)
from ._pipeline import batches, launch_workers
from ._plan import PlannedSource, Settings, elastic_of, source_of
from ._stages.batch import Batch, Group, Stacked
from ._stages.entries import Entries, known_counts, stream_data
from ._stages.mix import MixSource, mix_fingerprint
from ._stages.order import declares_drops_or_repeats
from ._stages.shard import Sharding
from ._stages.shard import resolve as resolve_sharding
from ._stages.source import Elastic, FileSource
from ._stages.sources import Source, build_mix, is_mix, readers_of
from ._stages.tiled import TiledSource
from ._state import Start, after, files_digest, fresh, make_state, old_files_digest, read_state
from ._stats import profiled
from ._storage.cache import DiskCache
from ._storage.epoch_cache import COUNTERS as CACHE_COUNTERS
from ._storage.epoch_cache import CacheEncoded, EpochStore, as_cache_encoded, data_stamp
from ._storage.files import DataDir


def _weighted_sources(data_dir: Any, reader: DataReader, stream: bool, retries: int) -> Any:
    """The weighted sources (``_stages.mix``) a ``data_dir`` of ``Source``s names, else ``None``."""
    if not is_mix(data_dir):
        return None
    if stream:
        raise ValueError("weighted sources (a data_dir of Sources) are not supported in stream mode")
    return build_mix(data_dir, reader, retries)


class _Run:
    """The bookkeeping of one iteration, shared by the loader and its iterator: where it
    began, the position of the last batch handed out, and how it ended."""

    def __init__(self, start: Start) -> None:
        self.start = start
        self.epoch, self.consumed, self.cached = start.epoch, start.skip, start.cached
        self.last_epoch: Optional[int] = None  # the epoch of the last batch handed out
        self.ended: Optional[str] = None  # "exhausted", "closed"

    def position(self) -> Start:
        splits = self.start.splits if self.epoch == self.start.epoch else ()
        return Start(self.epoch, self.consumed, self.start.end, splits, self.cached)

    def close(self) -> None:
        if self.ended is None:
            self.ended = "closed"


class DataLoader(Options):
    """Streams the chunk files of ``data_dir`` as collated batches, ``num_epoch`` epochs per iteration.

    Each iteration (``for`` or ``async for``) runs the next ``num_epoch`` epochs on
    an asyncio pipeline in a background thread: the first iteration epochs
    ``0 .. num_epoch-1``, the next one the epochs after them, so a framework that
    calls ``iter()`` once per epoch gets every epoch reshuffled. ``set_epoch(e)``
    makes the next iteration start at epoch ``e``. An iteration left early
    (``break``, ``close()``, an error) is over: the next one starts with the epoch
    after the last one it handed a batch of (at the same place when it handed
    out none). Every sample of every file is delivered exactly once per epoch;
    only an epoch's last batch may be short (dropped with ``drop_last``).

    Memory is bounded by settings: ``max_queue_size`` collated batches ready (or
    one group, when a group is larger), 2 groups of at most 32 consecutive batches
    being encoded and collated (4 per worker when worker processes run, as ``"auto"``
    may start them),
    ``Storage.prefetch_files`` files read ahead (in stream mode ``max(prefetch_files,
    batch_size)``: one per row) (each holding at most 2 pieces from
    ``iter_file``, or the whole file when ``read_file`` is used), the bytes
    read ahead of the readers (``Storage.readahead_bytes``, exceeded by at most one file or
    block per file the consumer waits for), ``Order.shuffle_buffer`` and ``Bucket.buffer`` samples,
    and with ``rotation`` ``Rotation.size`` encoded samples (on disk with ``Rotation.folder``) and
    2 groups of rotated batches being collated.

    User methods that run in this process (all of them with ``workers=0``)
    run ``Workers.threads`` at a time (default: one per file read ahead and per group
    being encoded), and never two at once on one object unless its class says
    ``thread_safe = True``.

    Randomness is a pure function of ``random_seed`` (file order, ``Order.file_order``'s
    ``rng``, shuffle buffer, bucketing), ``datareader.random_seed`` (in-file order)
    and the epoch. Composing data (``order``: ``filter_fn``, ``file_order``; ``bucket``,
    stream slices and in-memory streams, ``rotation``): see ``_compose`` and the modules it names.

    Example:
        ```python
        loader = DataLoader(JsonLinesReader(batch_size=32), IdentityDataset(), TorchCollator(), "data/",
                            num_epoch=2, shuffle=True)
        with loader:
            for batch in loader:          # epochs 0 and 1; the next `for` runs epochs 2 and 3
                ...
        ```
    """

    @binding
    def __init__(self, datareader: DataReader, dataset: Dataset, datacollator: DataCollator,
                 data_dir: Union[DataDir, Sequence[Source]], num_epoch: int = 1, max_queue_size: int = 10,
                 shuffle: Union[bool, Shuffle] = False, random_seed: int = 42, *, drop_last: bool = False,
                 order: Order = Order(),
                 on_error: Union[ErrorPolicy, OnError] = "raise", device: Any = None,
                 stream: Union[bool, Stream] = False, workers: Union[int, str, Workers] = "auto",
                 ranks: Ranks = Ranks(), storage: Storage = Storage(), progress: bool = False,
                 bucket: Optional[Bucket] = None, cache_encoded: Union[None, CacheEncoded, Dict[str, Any]] = None,
                 rotation: Optional[Rotation] = None, pack: Optional[Pack] = None) -> None:
        given = locals()  # the options, as declared in ``_options.Options`` (this signature is checked against it)
        self._arguments = {name: given[name] for name in OPTIONS}
        super().__init__(**self._arguments)  # checks every option, resolves Workers.threads, Bucket.buffer...
        self.options = Options(**values_of(self))  # the options alone (not the loader), for the pipeline
        workers = workers_of(self)
        self._placer = Placer(workers.processes, workers.start_method, workers.init_fn)
        self._count_cache: Dict[str, object] = {}
        self._mix = _weighted_sources(self.data_dir, self.datareader, bool(self.stream), self.storage.retries)
        self._reader = self.datareader if self._mix is None else self._mix.readers
        self._exclusive = Exclusive((self._reader, self.datareader, self.dataset, self.datacollator))
        self._kept_workers = self._keep_workers(workers.persistent)
        self.files, self._entries = self._listed()
        storage = self.storage
        self._cache = None if storage.cache_dir is None else DiskCache(str(storage.cache_dir), storage.cache_limit)
        self._stats = self._new_stats()
        self._counter = self._make_counter()
        self._oversized: Set[Tuple[str, int]] = set()  # blocks of cache_encoded whose write went past its limit
        device = device_of(self)
        self._finish = pinner() if device.pin_memory else None
        self._move = mover(device.target, device.pin_memory) if device.target is not None else None
        self._iterator: Optional[weakref.ref] = None
        self._held: Optional[LoaderIterator] = None  # the iteration get_batch() started
        self._iterating = threading.RLock()
        self._record: Optional[_Run] = None  # the latest iteration, if any since the last set_epoch/load
        self._next = fresh(0, self.num_epoch)
        self._files_digest: Optional[str] = None
        self.epoch: Optional[int] = None

    def _listed(self) -> Tuple[List[str], Optional[Entries]]:
        """The files (a name per stream), and the streams ``data_dir`` lists when it lists slices or
        in-memory streams (``_stages.entries``)."""
        if self._mix is not None:
            return self._mix.files, None
        files, entries = stream_data(self.data_dir, bool(self.stream), self.storage.retries)
        if entries is not None:  # an iterator of streams is read once: keep the list it gave
            self._arguments["data_dir"] = entries.listed
        return files, entries

    def _new_stats(self) -> Stats:
        """The loader's counters, with those of ``cache_encoded`` and of each weighted source where they count."""
        stats = Stats()
        if self.cache_encoded is not None:
            stats.cache = dict.fromkeys(CACHE_COUNTERS, 0)
        if self._mix is not None:
            stats.sources = [{"data_dir": str(s.data_dir), "weight": w, "samples": 0}
                             for s, w in zip(self._mix.sources, self._mix.weights())]
        return stats

    def _make_counter(self) -> Counter:
        """Counts the files' samples, from and into the count indexes (none for mixed sources and stream entries)."""
        places = None
        if self._mix is None and self._entries is None:
            places = IndexPlaces.of(self.datareader, self.data_dir, self.files,
                                    None if self._cache is None else self._cache.folder)
        return Counter(self._reader, self.files, self._exclusive, places, self._stats.counting)

    def _keep_workers(self, persistent: bool) -> Optional[KeptPool]:
        """The pool kept across iterations with ``Workers.persistent``: ended by ``close()``, or
        when the loader is collected or the interpreter exits."""
        if not persistent:
            return None
        kept = KeptPool()
        weakref.finalize(self, kept.close)
        return kept

    # -- iteration -----------------------------------------------------------------
    def __iter__(self) -> "LoaderIterator":
        with self._iterating:  # two threads calling iter() at once: one supersedes the other, never both run
            start = self._upcoming()
            self._stop_run(superseded=True)
            record = _Run(start)
            self._record = record
            it = LoaderIterator(self, record)
            self._iterator = weakref.ref(it)
            return it

    def __aiter__(self) -> "LoaderIterator":
        return self.__iter__()

    def _upcoming(self) -> Start:
        """Where the next iteration begins (see the class docstring)."""
        r = self._record
        if r is None:
            return self._next
        if r.ended == "exhausted":
            return fresh(r.start.end, self.num_epoch)
        return after(r.last_epoch, r.start, self.num_epoch)

    def _where(self) -> Start:
        """The consumer's position: after the last batch handed out, or where the next iteration begins."""
        r = self._record
        if r is None:
            return self._upcoming()
        if r.ended == "exhausted":  # the next epoch's start, with the cache the run left it (``_stages.cached_epochs``)
            return dataclasses.replace(self._upcoming(), cached=r.cached)
        return r.position()

    @property
    def sharding(self) -> Sharding:
        """This process's rank and world size: the explicit ones, else resolved now (see ``_stages.shard.resolve``)."""
        return resolve_sharding(self.ranks.rank, self.ranks.world_size, self.ranks.even_batches, self.ranks.replication)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration start at ``epoch`` (as ``DistributedSampler.set_epoch`` does).

        A running iteration is not changed; the next ``iter()`` ends it.
        """
        if not is_integer(epoch):
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        self._next = fresh(epoch, self.num_epoch)
        self._record = None

    def _placement(self) -> Placement:
        """Where this iteration runs user methods (``_execution.auto_workers``)."""
        python = [] if self.order.filter_fn is None else [self.order.filter_fn]
        placement = self._placer([*readers_of(self._mix, self.datareader), self.dataset, self.datacollator, *python])
        self._stats.placement = placement.as_dict()
        return placement

    def _engine(self, start: Start) -> Tuple[Engine, Optional[WorkerPool], Optional[Measured]]:
        """A run from ``start``, its worker processes unless they are kept across runs, and the measure of
        where its files run (``"auto"`` with workers). The workers are started here, in the thread calling
        ``iter()``, before the run's own threads."""
        placement = self._placement()
        settings = self._settings(placement.num_workers)
        try:
            settings.pool = launch_workers(settings, self._kept_workers, fork_only=placement.decided)
        except ForkUnsafe as exc:  # a thread of ours began between the placement and the fork
            placement = self._placer.fallback(str(exc))
            self._stats.placement = placement.as_dict()
            settings = self._settings(0)
        if settings.pool is not None:
            self._stats.placement = {**self._stats.placement, "start_method": settings.pool.method}
            settings.measured = self._placer.measured(placement, bool(self.stream), self.files)
        self._stats.measured = settings.measured
        own = settings.pool if self._kept_workers is None else None
        threads = self.storage.prefetch_files + resolved(workers_of(self).threads)
        try:
            return Engine(lambda run_blocking, tasks: batches(settings, start, run_blocking, tasks),
                          self.max_queue_size, threads=threads), own, settings.measured
        except BaseException:
            if own is not None:
                own.close()
            raise

    def _settings(self, num_workers: int) -> Settings:
        """What a run with ``num_workers`` worker processes is built from (``_plan.Settings``)."""
        errors = errors_of(self)
        return Settings(
            options=self.options, files=self.files, reader=self._reader, num_workers=num_workers,
            concurrency=GROUPS_PER_WORKER * num_workers or GROUPS_IN_FLIGHT,
            errors=ErrorHandler(errors.policy, errors.max_errors, self._stats), stats=self._stats,
            finish=self._finish, sharding=self.sharding,
            count_cache=self._count_cache, exclusive=self._exclusive, cache=self._cache, entries=self._entries,
            mix=self._mix, encoded_cache=self._epoch_store(), counter=self._counter)

    def _epoch_store(self) -> Optional[EpochStore]:
        """This rank's share of the cache of encoded epochs, keyed by the data and every setting that
        changes its batches (see ``_storage.epoch_cache``)."""
        config = as_cache_encoded(self.cache_encoded)  # a CacheEncoded already (the option converts it)
        if config is None:
            return None
        sharding = self.sharding
        key = {**self._fingerprint(), "stamp": data_stamp(self.files), "reader": callable_name(type(self.datareader)),
               "dataset": callable_name(type(self.dataset))}
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:32]
        return EpochStore(config, f"rank{sharding.rank}-of{sharding.world_size}-{digest}", digest,
                          self._oversized)

    def _consumed(self, batch: Batch, record: _Run) -> object:
        if self.epoch != batch.epoch:  # rarely: assigning goes through the frozen dataclass's __setattr__
            self.epoch = batch.epoch
        record.epoch, record.consumed, record.last_epoch = batch.epoch, batch.index + 1, batch.epoch
        record.cached = batch.cached
        self._stats.batches += 1
        return self._move(batch.data) if self._move is not None else batch.data

    def close(self) -> None:
        """Stop the running iteration, if any: its tasks and threads end within a second; and
        end the worker processes kept with ``Workers.persistent`` (the next iteration starts new ones)."""
        self._stop_run()
        if self._kept_workers is not None:
            self._kept_workers.close()

    def _stop_run(self, superseded: bool = False) -> None:
        """End the running iteration; ``superseded``: by a newer ``iter()`` (it then says so if used)."""
        it = self._iterator() if self._iterator is not None else None
        self._iterator = None
        if it is None:
            return
        if superseded:
            it.supersede()
        else:
            it.close()

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __bool__(self) -> bool:
        return True  # not len(): truth must not count the files

    def __len__(self) -> int:
        """The batches one iteration yields on this rank (steps, in stream mode): those of the
        epochs of the running iteration, else of the next one, from their first batch.

        It needs the samples of every file: ``DataReader.count`` is called once per
        file on first use, and the counts are kept for the loader's life. When a
        count fails, the length is unknown: ``TypeError``, as for any unsized
        object, with the count's error (naming the file) as its cause; when
        errors are skipped (``on_error``), that file counts as empty. With
        ``filter_fn`` the length is unknown (``TypeError``) unless ranks plan it.
        """
        if self._hides_length():
            raise TypeError("the loader's length is unknown: filter_fn drops samples, and how many is known "
                            "only once they are read (under ranks the planned steps are the length)")
        start = self._running_start()
        try:
            counts = self._counts(progress=self.progress)
        except PipelineError as exc:
            raise TypeError(f"the loader's length is unknown: {exc}") from exc
        source = self._plan(start, counts)
        epochs = range(start.epoch, start.end)
        if isinstance(source, (MixSource, TiledSource)):
            return sum(source.batches(e, self.datareader.batch_size, self.drop_last, times_of(self)) for e in epochs)
        # epochs differ in batches when the order changes the steps (stream mode) or the files read
        if self.stream or declares_drops_or_repeats(self.order.file_order):
            return sum(self._epoch_batches(source, e) for e in epochs)
        return self._epoch_batches(source, start.epoch) * len(epochs)

    def _running_start(self) -> Start:
        """Where the running iteration began, else where the next one begins."""
        r = self._record
        return r.start if r is not None and r.ended is None else self._upcoming()

    def _epoch_batches(self, source: FileSource, epoch: int) -> int:
        return epoch_batches(source, epoch, self.datareader.batch_size, self.drop_last, stream=bool(self.stream),
                             seq_len=seq_len_of(self), rotation=times_of(self))

    def _hides_length(self) -> bool:
        """Whether ``filter_fn`` hides the length: it drops samples, and no ranks plan the steps."""
        return self.order.filter_fn is not None and not self.sharding.active

    def _counts(self, progress: bool = False) -> List[Optional[int]]:
        """Samples per file (``_length.count_files``), counted once for the loader's life."""
        return count_files(self._counter, self._count_cache, skip_failed=errors_of(self).policy != "raise",
                           known=known_counts(self._entries), progress=progress)

    @property
    def stats(self) -> Dict[str, Any]:
        """Counters over the loader's life (files and samples read, batches handed over, files and
        batches skipped, errors), and rates and timings of the running iteration (``"iteration"``)
        and of the loader's life (``"total"``): a plain dict, see the README, *Watching a run*."""
        return self._stats.as_dict()

    def trace(self, path: Optional[str], *, max_events: int = 200_000, report: bool = False) -> "Tracing":
        """Record a timeline of the iterations from now on; closing what this returns (or leaving its
        ``with``) writes it to ``path`` as a Chrome/Perfetto trace (``chrome://tracing``, ui.perfetto.dev):
        a track per thread of this process and per worker process, the latest ``max_events`` spans.
        With ``report``, ``report()`` is logged at INFO after each epoch's line until then (with ``path``
        None, only that). See ``_diagnose``."""
        return Tracing(self, path, max_events, report)

    def report(self) -> Report:
        """What limits the latest iteration, from ``stats``, and what to change: ``str()`` is the text."""
        return report_of(self)

    # -- resume --------------------------------------------------------------------
    def _fingerprint(self) -> Dict[str, object]:
        if self._files_digest is None:
            self._files_digest = files_digest(self.files) if self._entries is None else self._entries.digest()
        sharding = self.sharding
        reader = self.datareader
        # the global order's batches are global ones: its states resume under any world size of that global batch
        batch_size = reader.batch_size * (sharding.world_size if isinstance(self.shuffle, Shuffle) else 1)
        return {"files": self._files_digest, "num_files": len(self.files), "batch_size": batch_size,
                "reader_shuffle": reader.shuffle, "reader_seed": reader.random_seed,
                **fingerprint(self, rank=sharding.rank, world_size=sharding.world_size,
                              even_batches=sharding.even_batches),
                "mix": mix_fingerprint(self._mix, self.order.stop)}

    def state_dict(self) -> Dict[str, object]:
        """Where the consumer is: the batches handed over so far, not those read ahead.

        Small and JSON-serializable; restoring it with ``load_state_dict`` makes
        the next iteration yield exactly the batches that would have followed the
        last one handed out (also when that iteration was left early), or, after
        an iteration that ran to its end, the next iteration.
        """
        return make_state(self._where(), self._fingerprint(), self.num_epoch)

    def load_state_dict(self, state: Dict[str, object]) -> None:
        """Make the next iteration resume from ``state`` (from ``state_dict``).

        Everything is checked before anything changes: a state that is not
        ours, or that was saved with other data or settings, raises ``ValueError``
        naming each setting that differs, with both values.
        """
        start = read_state(state, self._fingerprint(), old_files_digest(self.files), self.num_epoch)
        if start.splits and self._mix is not None:
            raise ValueError("a mixed loader (a data_dir of Sources) resumes under the world size it was saved with")
        self._check_position(start)
        self._stop_run()
        self._next, self._record = start, None

    def _plan(self, start: Start, counts: List[Optional[int]],
              elastic: Optional[Elastic] = None) -> PlannedSource:
        """The plan of the epochs ``start`` begins, from the counts (as a run makes it)."""
        return source_of(self, self.files, start, counts, sharding=self.sharding, mix=self._mix, entries=self._entries,
                         elastic=elastic)

    def _check_position(self, start: Start) -> None:
        """Refuse a position that the data cannot have, before any run plans from it: a part of the epoch
        taken under a world size wider than the epoch (stream mode: than its files), or a batch past the
        epoch's end. Where a count fails, or ``filter_fn`` hides the length, the run checks (``_pipeline``)."""
        if not start.skip or (self._hides_length() and not start.splits):
            return
        try:
            counts = self._counts()
        except PipelineError:
            return  # the run counts again, and raises this error before planning anything
        total = epoch_steps(self._plan(start, counts, self._elastic(start, counts)), start.epoch,
                            self.datareader.batch_size, self.drop_last, seq_len_of(self), times_of(self))
        if start.skip > total:
            raise ValueError(f"the state's batches_in_epoch {start.skip} is past the end of epoch {start.epoch}, "
                             f"which has {total} batches on this rank: it was not saved from this data and settings")

    def _elastic(self, start: Start, counts: List[Optional[int]]) -> Optional[Elastic]:
        """The parts of ``start``'s epoch taken under other world sizes, each no wider than the epoch's
        samples; in stream mode of any width (a rank without a file of its own streamed padding)."""
        if not start.splits:
            return None
        plain = self._plan(start, counts)
        assert isinstance(plain, FileSource), "a mixed loader's state has no splits (load_state_dict)"
        size = sum(counts[i] or 0 for i in plain.order(start.epoch))
        wider = [] if self.stream else [w for w, _ in start.splits if w > max(size, 1)]
        if wider:
            raise ValueError(f"the state's epoch {start.epoch} was begun under world_size={wider[0]}, more ranks "
                             f"than its {size} samples: it was not saved from this "
                             f"data, or resume it under world_size={wider[0]}")
        return elastic_of(start, self.datareader.batch_size, seq_len_of(self))

    def shard(self, rank: int, world_size: int) -> "DataLoader":
        """A loader with the same settings that reads only the share of ``rank`` among ``world_size``."""
        ranks = dataclasses.replace(self.ranks, rank=rank, world_size=world_size)
        return DataLoader(**{**self._arguments, "ranks": ranks})

    # -- pickling: the settings and the position, never a running iteration -------------
    def __getstate__(self) -> Dict[str, object]:
        start = self._where()
        return {"arguments": self._arguments, "next": (start.epoch, start.skip, start.end, start.splits, start.cached),
                "counts": dict(self._count_cache)}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(**state["arguments"])  # type: ignore[misc]
        self._next = Start(*state["next"])
        self._count_cache.update(state["counts"])

    # -- the original PyLoader's names (docs/guides/migrating.md) ---------------------
    def get_batch(self) -> Any:
        """The next batch of the running iteration, or of a new one when none runs (the original PyLoader's
        ``loader.get_batch()``); ``StopIteration`` after an iteration's last batch, and the next call starts
        the next iteration. As ``next(iter(loader))`` would, without ending the running iteration."""
        it = self._iterator() if self._iterator is not None else None
        if it is None or it.ended:
            it = self._held = self.__iter__()  # held here: the loader keeps only a weak reference to it
        return next(it)

    def get_epoch(self) -> int:
        """The epoch of the last batch handed out, counted from 1 as the original PyLoader counted (0 before
        the first batch); ``loader.epoch`` counts from 0 (``None`` before the first batch)."""
        return 0 if self.epoch is None else self.epoch + 1

    # -- frameworks ----------------------------------------------------------------
    def to_tf_dataset(self, output_signature: Any = None, input_context: Any = None) -> Any:
        """A ``tf.data.Dataset`` over this loader (``from_generator``); see ``pyloader._frameworks.tf``.

        Each pass over it is the loader's next iteration (the next epoch). Inside
        ``strategy.distribute_datasets_from_function(fn)``, pass ``fn``'s
        ``tf.distribute.InputContext``: the dataset then holds input pipeline
        ``input_pipeline_id``'s share of ``num_input_pipelines``, split like ranks.
        """
        from ._frameworks.tf import to_tf_dataset

        loader = self
        if input_context is not None:
            loader = self.shard(input_context.input_pipeline_id, input_context.num_input_pipelines)
        return to_tf_dataset(loader, output_signature)

    def _peek(self, limit: int) -> list:
        """Up to ``limit`` first batches of the next iteration, leaving the loader's position as it was."""
        it = LoaderIterator(self, _Run(self._upcoming()), track=False)
        try:
            return [batch for _, batch in zip(range(limit), it)]
        finally:
            it.close()


class LoaderIterator:
    """One iteration; ``break``, ``close()`` or dropping it stops the pipeline.

    Batches arrive from the pipeline in groups and are handed out one at a time;
    the loader's position advances only as each is handed out. A newer
    ``iter(loader)`` ends this one: taking another batch from it then raises
    ``RuntimeError`` (never a silent, short end).

    Example:
        ```python
        it = iter(loader)                 # the loader's next iteration
        first = next(it)
        it.close()                        # as `break` does: the pipeline stops, nothing keeps running
        ```
    """

    def __init__(self, loader: DataLoader, record: _Run, track: bool = True) -> None:
        self._loader = loader
        self._record = record
        self._track = track
        self._superseded = False
        self._ready: Iterator[Batch] = iter(())
        self._watch = loader._stats.watch(self, loader.max_queue_size) if track else None  # before any file is read
        self._start_engine(record.start)
        if self._watch is not None and loader.progress:
            self._watch.bar = progress_bar(loader, record.start.skip)

    def _start_engine(self, start: Start) -> None:
        self._engine, pool, self._measured = self._loader._engine(start)
        self._finalizer = weakref.finalize(self, _stop, self._engine, self._record, pool)

    def __iter__(self) -> Iterator[object]:
        return self

    def __next__(self) -> Any:
        began = got = time.perf_counter()
        batch = next(self._ready, None)
        if batch is None:
            self._check_current()
            self._asking()
            with profiled("wait"):
                while True:
                    try:
                        group = self._engine.get()
                        break
                    except StopIteration:
                        if not self._goes_on(began):
                            raise
            got = time.perf_counter()
            batch = self._took(group)
        return self._hand_out(batch, began, got)

    def __aiter__(self) -> "LoaderIterator":
        return self

    async def __anext__(self) -> object:
        began = got = time.perf_counter()
        batch = next(self._ready, None)
        if batch is None:
            self._check_current()
            self._asking()
            with profiled("wait"):
                while True:
                    try:
                        group = await self._engine.aget()
                        break
                    except StopAsyncIteration:
                        if not self._goes_on(began):
                            raise
            got = time.perf_counter()
            batch = self._took(group)
        return self._hand_out(batch, began, got)

    def _took(self, group: Group) -> Batch:
        """The first batch of a group from the pipeline; the others are handed out next."""
        self._ready = _each(group)
        return next(self._ready)  # groups are never empty

    def _hand_out(self, batch: Batch, began: float, got: float) -> object:
        """The batch's data, handed over by a ``next()`` that began at ``began`` and had it at ``got``."""
        if self._watch is None:  # not tracked (``DataLoader._peek``)
            return batch.data
        data = self._loader._consumed(batch, self._record)
        self._watch.handed(batch.epoch, batch.rows, began, got, batch)
        if self._measured is not None:
            self._measured.handed(batch.epoch, batch.paths, batch.rows, got - began)
        return data

    def _asking(self) -> None:
        if self._watch is not None:
            self._watch.asked(self._engine.queued())

    def _goes_on(self, began: float) -> bool:
        """At the end of the pipeline, found by a ``next()`` that began at ``began``: whether the iteration
        goes on (``_ended_empty``), else it ends here."""
        self._check_current()  # ended by a newer iter() while this one waited
        if self._ended_empty():
            return True
        if self._watch is not None:
            self._watch.end(began)
        return False

    def _check_current(self) -> None:
        if self._superseded:
            raise RuntimeError("this iterator was ended by a newer iter() of the same DataLoader: a loader "
                               "runs one iteration at a time (use loader.shard() or another DataLoader for two)")

    def _ended_empty(self) -> bool:
        """At the end: True when the iteration resumed past its last batch (a state saved at the
        very end of an iteration) and went on with the next iteration instead of ending empty."""
        r = self._record
        r.ended = "exhausted"
        if r.last_epoch is not None or r.start.skip == 0 or not self._track:
            return False
        self._finalizer()
        r = self._record = _Run(fresh(r.start.end, self._loader.num_epoch))
        self._loader._record = r
        self._start_engine(r.start)
        return True

    @property
    def ended(self) -> bool:
        """Whether this iteration is over (exhausted, closed, or ended by a newer ``iter()``)."""
        return self._record.ended is not None or self._superseded

    def supersede(self) -> None:
        if self._record.ended is None:
            self._superseded = True
        self.close()

    def close(self) -> None:
        self._ready = iter(())
        self._finalizer()
        if self._watch is not None:
            self._watch.close()


DataLoader.__doc__ = (DataLoader.__doc__ or "") + describe()


def _stop(engine: Engine, record: _Run, pool: Optional[WorkerPool]) -> None:
    """End a run (``close()``, or the finalizer of a loader or iterator dropped unclosed)."""
    if threading.current_thread().name.startswith("pyloader"):
        # the garbage collector ran a dropped loader's finalizer on a thread of ours, maybe inside one of our
        # locks (an executor's submit, a pool's stop): that thread cannot wait for its own run; another stops it
        threading.Thread(target=_stop_now, args=(engine, record, pool), name="pyloader-stop", daemon=True).start()
        return
    _stop_now(engine, record, pool)


def _stop_now(engine: Engine, record: _Run, pool: Optional[WorkerPool]) -> None:
    engine.stop()
    record.close()
    if pool is not None:  # the run closes it as it ends; this is for a run stopped before it began
        pool.close()


def _each(group: Group) -> Iterator[Batch]:
    """The batches of a group in order; a ``Stacked`` one's are given their data as they are taken."""
    return group.each(unstack) if isinstance(group, Stacked) else iter(group)
