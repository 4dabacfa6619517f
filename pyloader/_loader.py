"""The public ``DataLoader``: settings, iteration, resume state."""
from __future__ import annotations

import hashlib
import multiprocessing
import json
import weakref
from typing import Any, Callable, Dict, Iterator, Optional

from ._abc import DataCollator, DataReader, Dataset
from ._batch import Batch, Group, Stacked
from ._engine import Engine
from ._errors import ErrorHandler, ErrorPolicy, Stats
from ._files import DataDir, list_files
from ._frameworks import mover, pinner, unstack
from ._pipeline import Settings, Start, batches
from ._pool import KeptPool
from ._shard import resolve as resolve_sharding
from ._stream import PADDING_MODES

_STATE_FORMAT = "pyloader.state/1"
_GROUPS_IN_FLIGHT = 2  # being encoded and collated without workers
_GROUPS_PER_WORKER = 4  # with workers: enough that one worker's file does not hold the other idle


def _positive(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


class DataLoader:
    """Streams the chunk files of ``data_dir`` as collated batches, for ``num_epoch`` epochs.

    Each iteration (``for`` or ``async for``) is a fresh pass over ``num_epoch``
    epochs, run by an asyncio pipeline on a background thread. Every sample of
    every file is delivered exactly once per epoch; only an epoch's last batch
    may be short (dropped with ``drop_last``). Memory is bounded by settings:
    ``max_queue_size`` collated batches ready (or one group, when a group is
    larger), 2 groups of at most 32 consecutive batches being encoded and
    collated (4 per worker with ``num_workers``), ``prefetch_files`` files read ahead
    (in stream mode ``max(prefetch_files, batch_size)``: one per row)
    (each holding at most 2 pieces from ``iter_file``, or the whole file when
    ``read_file`` is used), and ``shuffle_buffer`` samples.

    User methods that run in this process (all of them without ``num_workers``)
    run ``num_threads`` at a time (default: one per file read ahead and per group
    being encoded). Methods that release the GIL (NumPy parsing, decompression,
    slow I/O) use them all; code written in Python holds the GIL, so its threads
    only take turns, and ``num_threads=1`` spares the switches.

    Randomness is a pure function of ``random_seed`` (file order, shuffle
    buffer), ``datareader.random_seed`` (in-file order) and the epoch.
    """

    def __init__(self, datareader: DataReader, dataset: Dataset, datacollator: DataCollator,
                 data_dir: DataDir, num_epoch: int = 1, max_queue_size: int = 10,
                 shuffle: bool = False, random_seed: int = 42, *, shuffle_buffer: int = 0,
                 drop_last: bool = False, prefetch_files: int = 4, on_error: ErrorPolicy = "raise",
                 max_errors: Optional[int] = None, pin_memory: bool = False, device: Any = None,
                 stream: bool = False, seq_len: Optional[int] = None, padding_mode: str = "zeros",
                 pad_value: Any = 0, num_workers: int = 0, num_threads: Optional[int] = None,
                 worker_init_fn: Optional[Callable[[int], None]] = None,
                 start_method: Optional[str] = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None, even_batches: str = "pad",
                 persistent_workers: bool = False) -> None:
        self._arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        for name, obj, cls in (("datareader", datareader, DataReader), ("dataset", dataset, Dataset),
                               ("datacollator", datacollator, DataCollator)):
            if not isinstance(obj, cls):
                raise TypeError(f"{name} must be a pyloader.{cls.__name__}, got {type(obj).__name__}")
        _positive("batch_size", datareader.batch_size)
        _positive("num_epoch", num_epoch)
        _positive("max_queue_size", max_queue_size)
        _positive("prefetch_files", prefetch_files)
        if not isinstance(shuffle_buffer, int) or shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be an integer >= 0, got {shuffle_buffer!r}")
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 0:
            raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
        # default: every file read ahead and every group in flight at once
        self.num_threads = prefetch_files + _GROUPS_IN_FLIGHT if num_threads is None else \
            _positive("num_threads", num_threads)
        if start_method is not None and start_method not in multiprocessing.get_all_start_methods():
            raise ValueError(f"start_method must be one of {multiprocessing.get_all_start_methods()}, "
                             f"got {start_method!r}")
        self.num_workers = num_workers
        self.sharding = resolve_sharding(rank, world_size, even_batches)
        self._count_cache: Dict[str, Any] = {}
        self.worker_init_fn = worker_init_fn
        self.start_method = start_method
        if persistent_workers and not num_workers:
            raise ValueError("persistent_workers=True keeps worker processes: it needs num_workers > 0")
        self.persistent_workers = bool(persistent_workers)
        # ended by close(), or when the loader is collected or the interpreter exits
        self._kept_workers = KeptPool() if persistent_workers else None
        if self._kept_workers is not None:
            weakref.finalize(self, self._kept_workers.close)
        if seq_len is not None:
            _positive("seq_len", seq_len)
        if padding_mode not in PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {PADDING_MODES}, got {padding_mode!r}")
        if stream and shuffle_buffer:
            raise ValueError("stream mode keeps each row in file order: shuffle_buffer must be 0")
        if stream and datareader.shuffle:
            raise ValueError("stream mode reads every file in order: use DataReader(shuffle=False) "
                             "(DataLoader(shuffle=True) still shuffles the file order)")
        if not stream and seq_len is not None:
            raise ValueError("seq_len applies to stream mode only (stream=True)")
        self.stream = bool(stream)
        self.seq_len = seq_len
        self.padding_mode = padding_mode
        self.pad_value = pad_value
        self.datareader = datareader
        self.dataset = dataset
        self.datacollator = datacollator
        self.files = list_files(data_dir)
        self.num_epoch = num_epoch
        self.max_queue_size = max_queue_size
        self.shuffle = bool(shuffle)
        self.random_seed = int(random_seed)
        self.shuffle_buffer = shuffle_buffer
        self.drop_last = bool(drop_last)
        self.prefetch_files = prefetch_files
        self.pin_memory = bool(pin_memory)
        self.device = device
        self._stats = Stats()
        self._errors = ErrorHandler(on_error, max_errors, self._stats)
        self._finish = pinner() if self.pin_memory else None
        self._move = mover(device, self.pin_memory) if device is not None else None
        self._run: Optional[weakref.ref] = None
        self._start = Start()
        self._position = (0, 0)  # (epoch, batches of it consumed)
        self.epoch: Optional[int] = None

    # -- iteration -----------------------------------------------------------------
    def __iter__(self) -> "LoaderIterator":
        self._stop_run()
        start, self._start = self._start, Start()
        self._position = (start.epoch, start.skip)
        it = LoaderIterator(self, self._engine(start))
        self._run = weakref.ref(it)
        return it

    def __aiter__(self) -> "LoaderIterator":
        return self.__iter__()

    def _engine(self, start: Start) -> Engine:
        settings = Settings(
            files=self.files, reader=self.datareader, dataset=self.dataset, collator=self.datacollator,
            num_epoch=self.num_epoch, max_queue_size=self.max_queue_size, shuffle=self.shuffle,
            random_seed=self.random_seed, shuffle_buffer=self.shuffle_buffer, drop_last=self.drop_last,
            prefetch_files=self.prefetch_files, concurrency=_GROUPS_PER_WORKER * self.num_workers or _GROUPS_IN_FLIGHT,
            errors=self._errors,
            stats=self._stats, finish=self._finish, stream=self.stream, seq_len=self.seq_len,
            padding_mode=self.padding_mode, pad_value=self.pad_value, num_workers=self.num_workers,
            num_threads=self.num_threads, worker_init_fn=self.worker_init_fn, start_method=self.start_method,
            kept_workers=self._kept_workers, sharding=self.sharding,
            count_cache=self._count_cache)
        return Engine(lambda run_blocking, tasks: batches(settings, start, run_blocking, tasks),
                      self.max_queue_size, threads=self.prefetch_files + self.num_threads)

    def _consumed(self, batch: Batch) -> Any:
        self.epoch = batch.epoch
        self._position = (batch.epoch, batch.index + 1)
        self._stats.batches += 1
        return self._move(batch.data) if self._move is not None else batch.data

    def close(self) -> None:
        """Stop the running iteration, if any: its tasks and threads end within a second; and
        end the worker processes kept with ``persistent_workers`` (the next iteration starts new ones)."""
        self._stop_run()
        if self._kept_workers is not None:
            self._kept_workers.close()

    def _stop_run(self) -> None:
        it = self._run() if self._run is not None else None
        if it is not None:
            it.close()
        self._run = None

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def stats(self) -> Dict[str, Any]:
        """Counters: files and samples read, batches handed over, files and batches skipped, errors."""
        return self._stats.as_dict()

    # -- resume --------------------------------------------------------------------
    def _fingerprint(self) -> Dict[str, Any]:
        digest = hashlib.sha1("\n".join(self.files).encode()).hexdigest()
        return {"files": digest, "num_files": len(self.files), "batch_size": self.datareader.batch_size,
                "shuffle": self.shuffle, "random_seed": self.random_seed,
                "reader_shuffle": self.datareader.shuffle, "reader_seed": self.datareader.random_seed,
                "shuffle_buffer": self.shuffle_buffer, "drop_last": self.drop_last, "stream": self.stream,
                "seq_len": self.seq_len, "padding_mode": self.padding_mode, "rank": self.sharding.rank,
                "world_size": self.sharding.world_size, "even_batches": self.sharding.even_batches}

    def state_dict(self) -> Dict[str, Any]:
        """Where the consumer is: the batches handed over so far, not those read ahead.

        Small and JSON-serializable; restoring it with ``load_state_dict`` makes
        the next iteration yield exactly the batches that would have followed.
        """
        epoch, consumed = self._position
        return {"format": _STATE_FORMAT, "epoch": epoch, "batches_in_epoch": consumed,
                "settings": self._fingerprint()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Make the next iteration resume from ``state`` (from ``state_dict``).

        Everything is checked before anything changes: a state that is not
        ours, or that was saved with other data or settings, raises ``ValueError``.
        """
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            raise ValueError(f"not a pyloader state (expected format {_STATE_FORMAT!r})")
        theirs = state.get("settings")
        if not isinstance(theirs, dict):
            raise ValueError("the state has no settings fingerprint")
        ours = self._fingerprint()
        diff = sorted(k for k in ours if json.dumps(ours[k]) != json.dumps(theirs.get(k)))
        if diff:
            raise ValueError(f"the state was saved with other data or settings: {', '.join(diff)} differ")
        epoch, consumed = state.get("epoch"), state.get("batches_in_epoch")
        for name, value in (("epoch", epoch), ("batches_in_epoch", consumed)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"the state's {name} must be an integer >= 0, got {value!r}")
        if epoch > self.num_epoch:
            raise ValueError(f"the state's epoch {epoch} is beyond num_epoch={self.num_epoch}")
        self._stop_run()
        self._start = Start(epoch, consumed)
        self._position = (epoch, consumed)

    def shard(self, rank: int, world_size: int) -> "DataLoader":
        """A loader with the same settings that reads only the share of ``rank`` among ``world_size``."""
        return DataLoader(**{**self._arguments, "rank": rank, "world_size": world_size})

    # -- frameworks ----------------------------------------------------------------
    def to_tf_dataset(self, output_signature: Any = None, input_context: Any = None):
        """A ``tf.data.Dataset`` over this loader (``from_generator``); see ``pyloader._tf``.

        Inside ``strategy.distribute_datasets_from_function(fn)``, pass ``fn``'s
        ``tf.distribute.InputContext``: the dataset then holds input pipeline
        ``input_pipeline_id``'s share of ``num_input_pipelines``, split like ranks.
        """
        from ._tf import to_tf_dataset

        loader = self
        if input_context is not None:
            loader = self.shard(input_context.input_pipeline_id, input_context.num_input_pipelines)
        return to_tf_dataset(loader, output_signature)


class LoaderIterator:
    """One pass over the data; ``break``, ``close()`` or dropping it stops the pipeline.

    Batches arrive from the pipeline in groups and are handed out one at a time;
    the loader's position advances only as each is handed out.
    """

    def __init__(self, loader: DataLoader, engine: Engine) -> None:
        self._loader = loader
        self._engine = engine
        self._ready: Iterator[Batch] = iter(())
        self._finalizer = weakref.finalize(self, engine.stop)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        batch = next(self._ready, None)
        if batch is None:
            self._ready = _each(self._engine.get())
            batch = next(self._ready)  # groups are never empty
        return self._loader._consumed(batch)

    def __aiter__(self) -> "LoaderIterator":
        return self

    async def __anext__(self) -> Any:
        batch = next(self._ready, None)
        if batch is None:
            self._ready = _each(await self._engine.aget())
            batch = next(self._ready)
        return self._loader._consumed(batch)

    def close(self) -> None:
        self._ready = iter(())
        self._finalizer()


def _each(group: Group) -> Iterator[Batch]:
    """The batches of a group in order; a ``Stacked`` one's are given their data as they are taken."""
    return group.each(unstack) if isinstance(group, Stacked) else iter(group)
