"""What ``loader.stats`` reports: counters, rates and timings, for the running iteration
and for the loader's life, and the per-epoch log line.

Contracts:

* Cheap: a ``time.perf_counter()`` pair around calls the loader makes anyway (a user
  method, a file piece, the consumer's ``next()``) and a few additions per batch, per
  piece or per call; never anything per sample.
* ``Busy`` sums seconds per slot (``BUSY_SLOTS``) over the threads of the loader's
  process and over its worker processes: each worker adds to a shared row of its own
  (made with the pool: ``_execution.shared``), which is folded into the process's sums when the pool closes, so
  nothing outlives the run.
* ``Stats.as_dict()`` is plain data (ints, floats, strings, lists, dicts): it can be
  handed to any logger as it is.
* ``profiled(name)`` is a torch profiler range (``pyloader::<name>``) while torch's
  profiler runs, else a no-op; it never imports torch.
* The per-epoch line goes to the ``pyloader`` logger at INFO; nothing here configures logging.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import threading
import time
import weakref
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    Iterable,
    Iterator,
    List,
    MutableSequence,
    Optional,
    Protocol,
    Sequence,
    Set,
    Tuple,
    TypeVar,
)

from ._trace import Recorder, SpanSink, batch_label, file_label

logger = logging.getLogger("pyloader")

METHODS = ("read_file", "batch_encode", "collate_batch", "pin_memory")
BUSY_SLOTS = ("read", "encode", "read_file", "batch_encode", "collate_batch", "pin_memory", "read_bytes")
_SLOT = {name: i for i, name in enumerate(BUSY_SLOTS)}
_NO_RANGE: ContextManager[Any] = contextlib.nullcontext()
T = TypeVar("T")


def profiling() -> bool:
    """Whether torch is imported and its profiler is on (torch is never imported here)."""
    profiler = sys.modules.get("torch.autograd.profiler")
    return profiler is not None and bool(getattr(profiler, "_is_profiler_enabled", False))


def profiled(name: str) -> ContextManager[Any]:
    """A torch profiler range ``pyloader::<name>`` while torch's profiler is on, else a no-op.

    Torch records ranges of the thread that started the profiler (the consumer's wait);
    those of the loader's threads show with ``profile_all_threads`` (see the README).
    """
    if not profiling():
        return _NO_RANGE
    return sys.modules["torch.autograd.profiler"].record_function(f"pyloader::{name}")


class Reporting(Protocol):
    def report(self) -> Dict[str, object]: ...


class Placed(Protocol):
    """A batch as the trace names it (``_stages.batch.Batch``)."""

    @property
    def index(self) -> int: ...

    @property
    def paths(self) -> Tuple[str, ...]: ...


class BusySink(Protocol):
    @property
    def trace(self) -> Optional[SpanSink]: ...  # with ``loader.trace``: where spans go (``_trace``)

    def add_all(self, spent: Iterable[Tuple[str, float]]) -> None: ...

    def add(self, slot: str, seconds: float) -> None: ...


class timed:
    """``with timed(busy, slot, path):`` adds the block's seconds to ``busy`` (when there is one)
    and shows the block as a profiler range, and as a span of ``path``'s file while traced."""

    __slots__ = ("busy", "slot", "began", "range", "path")

    def __init__(self, busy: Optional[BusySink], slot: str, path: str = "") -> None:
        self.busy = busy
        self.slot = slot
        self.path = path

    def __enter__(self) -> None:
        self.range = profiled(self.slot)
        self.range.__enter__()
        self.began = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        if self.busy is not None:
            end = time.perf_counter()
            self.busy.add(self.slot, end - self.began)
            if self.busy.trace is not None:
                self.busy.trace.span(self.slot, file_label(self.path), self.began, end)
        self.range.__exit__(*exc)


def waited(busy: Optional[BusySink], slot: str, path: str, began: float, seconds: Optional[float] = None) -> None:
    """Add ``seconds`` (else those since ``began``) to ``busy``'s ``slot``, and trace the time since ``began``
    as a span of ``path``'s file: a wait on the event loop (no profiler range there: other tasks run in
    between)."""
    if busy is not None:
        end = time.perf_counter()
        busy.add(slot, end - began if seconds is None else seconds)
        if busy.trace is not None:
            busy.trace.span(slot, file_label(path), began, end)


class GroupClock:
    """``with GroupClock(busy, steps) as clock:`` times a group's ``encode`` stage; ``run_steps``
    adds each step's seconds to ``clock.steps``; all go to ``busy`` at the end, in one call
    (one lock per group rather than per batch and step)."""

    __slots__ = ("busy", "names", "steps", "began", "range", "trace")

    def __init__(self, busy: Optional[BusySink], steps: Sequence[Tuple[str, Any]]) -> None:
        self.busy = busy
        self.names = [name for name, _ in steps]
        self.steps = [0.0] * len(steps)
        self.trace = None if busy is None else busy.trace  # each step of each batch is a span (``run_steps``)

    def __enter__(self) -> "GroupClock":
        self.range = profiled("encode")
        self.range.__enter__()
        self.began = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.busy is not None:
            self.busy.add_all([("encode", time.perf_counter() - self.began), *zip(self.names, self.steps, strict=True)])
        self.range.__exit__(*exc)


def clocked(items: Iterable[T], busy: Optional[BusySink], slot: str, path: str = "") -> Iterator[T]:
    """``items``, each ``next`` timed into ``slot`` (see ``timed``; ``path``: their file); closing this
    closes ``items``."""
    it = iter(items)
    try:
        while True:
            try:
                with timed(busy, slot, path):
                    item = next(it)
            except StopIteration:
                return
            yield item
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


class Busy:
    """Seconds spent in each of ``BUSY_SLOTS``: in this process's threads, and in workers."""

    def __init__(self) -> None:
        self._sums = [0.0] * len(BUSY_SLOTS)
        self._lock = threading.Lock()
        self._rows: List[Any] = []  # one per running worker
        self.trace: Optional[Recorder] = None  # with ``loader.trace``: the run's spans

    def add(self, slot: str, seconds: float) -> None:
        self.add_all(((slot, seconds),))

    def add_all(self, spent: Iterable[Tuple[str, float]]) -> None:
        with self._lock:
            _add(self._sums, spent)

    def track(self, rows: List[Any]) -> None:
        """Count the seconds of workers already running in ``rows`` from now on (until ``fold``)."""
        with self._lock:
            self._rows.extend(r for r in rows if all(r is not mine for mine in self._rows))

    def fold(self, rows: List[Any]) -> None:
        """The workers of ``rows`` have ended: keep their seconds here and let the rows go."""
        with self._lock:
            self._rows = [r for r in self._rows if all(r is not done for done in rows)]
            self._sums = _summed(self._sums, rows)

    def seconds(self) -> Dict[str, float]:
        with self._lock:
            sums = _summed(self._sums, self._rows)
        return dict(zip(BUSY_SLOTS, sums, strict=True))


class RowBusy:
    """A worker's ``Busy``: adds to the worker's shared row, which nothing else writes."""

    def __init__(self, row: Any, trace: Optional[SpanSink] = None) -> None:
        self.row = row
        self.trace = trace

    def add(self, slot: str, seconds: float) -> None:
        self.add_all(((slot, seconds),))

    def add_all(self, spent: Iterable[Tuple[str, float]]) -> None:
        _add(self.row, spent)


def _summed(sums: List[float], rows: Iterable[Sequence[float]]) -> List[float]:
    """``sums`` plus each of ``rows`` (workers' rows of seconds, by slot), as a new list."""
    for row in rows:
        sums = [a + b for a, b in zip(sums, row, strict=True)]
    return sums


def _add(sums: MutableSequence[float], spent: Iterable[Tuple[str, float]]) -> None:
    """Add each ``(slot, seconds)`` of ``spent`` to ``sums`` (a list, or a worker's shared row, by slot)."""
    for slot, seconds in spent:
        i = _SLOT.get(slot)
        if i is not None:  # a step the stats do not list counts only in its stage
            sums[i] += seconds


@dataclasses.dataclass
class Figures:
    """What the consumer saw of one iteration (or, summed, of several)."""

    batches: int = 0
    samples: int = 0  # rows of the batches handed over
    seconds: float = 0.0  # from iter() to the last batch handed over
    wait_s: float = 0.0  # inside next(): waiting for the pipeline, then handing the batch over
    step_s: float = 0.0  # between batches: from one handed over to the next next()
    hand_over_s: float = 0.0  # the part of wait_s spent handing over (unstacking, moving to a device)
    fill: float = 0.0  # queue fill, summed over the consumer's requests to the pipeline
    requests: int = 0
    resume_files: int = 0
    resume_batches: int = 0

    def rate(self) -> float:
        """Samples handed over per second."""
        return _ratio(self.samples, self.seconds)

    def stall_share(self) -> float:
        """The share of the consumer's time spent inside ``next()``."""
        return _ratio(self.wait_s, self.wait_s + self.step_s)

    def plus(self, other: "Figures") -> "Figures":
        return Figures(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)})

    def minus(self, other: "Figures") -> "Figures":
        return Figures(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in dataclasses.fields(self)})


def _ratio(part: float, whole: float) -> float:
    """``part / whole``; 0 when ``whole`` is 0 (nothing happened yet)."""
    return part / whole if whole > 0 else 0.0


_COUNTERS = ("files_read", "samples_read", "filtered_samples", "rotated_samples", "skipped_files", "skipped_batches")


@dataclasses.dataclass
class Counting:
    """The counting of files' samples over the loader's life (``_counts``): by the reader, from an index."""

    counted: int = 0  # files whose count was asked of the reader
    indexed: int = 0  # files whose count an index gave
    stale: int = 0  # files an index held that had changed since
    seconds: float = 0.0

    def add(self, counted: int, indexed: int, stale: int, seconds: float) -> None:
        self.counted += counted
        self.indexed += indexed
        self.stale += stale
        self.seconds += seconds


class Watch:
    """The consumer's side of one iteration: its ``Figures``, the per-epoch log line, the progress bar."""

    def __init__(self, max_queue_size: int, epoch_files: Dict[int, int], counters: Dict[str, int],
                 busy: Dict[str, float], bar: Any = None, counting: Optional[Counting] = None,
                 live: Optional[Busy] = None) -> None:
        self.live = live or Busy()  # the loader's busy seconds, whose ``trace`` takes the consumer's spans
        self.max_queue_size = max_queue_size
        self.counting = counting or Counting()
        self._counting_mark = self.counting.seconds
        self.epoch_files = epoch_files
        self.counters = counters  # the loader's counters and busy seconds as the iteration began
        self.busy = busy
        self.bar = bar
        self.figures = Figures()
        self.began = time.perf_counter()
        self.first_batch_s: Optional[float] = None
        self.first_wait_s = 0.0  # the part of wait_s of the first batch (start-up, paid once: ``loader.report``)
        self._last: Optional[float] = None  # when the last batch was handed over
        self._resumed: Set[str] = set()
        self._epoch: Optional[int] = None
        self._epoch_mark = self.began
        self._epoch_figures = Figures()
        self.on_epoch: Optional[Callable[[int], None]] = None  # called after an epoch's log line (``report=True``)

    def asked(self, queued: int) -> None:
        """The consumer asks the pipeline for more, ``queued`` batches being ready."""
        self.figures.fill += min(1.0, queued / self.max_queue_size)
        self.figures.requests += 1

    def handed(self, epoch: int, rows: int, began: float, got: float, batch: Optional[Placed] = None) -> None:
        """A batch of ``epoch`` was handed over by a ``next()`` that began at ``began`` and had the batch
        from the pipeline at ``got`` (``batch``: its place and files, for the trace)."""
        now = time.perf_counter()
        trace = self.live.trace
        if trace is not None and batch is not None:
            self._traced(trace, batch_label((epoch, batch.index), batch.paths), began, got, now)
        f = self.figures
        if self._last is None:
            self.first_batch_s = now - self.began
            self.first_wait_s = now - began
        else:
            f.step_s += began - self._last
        if epoch != self._epoch:
            self._next_epoch(epoch, began)
        f.wait_s += now - began
        f.hand_over_s += now - got
        f.batches += 1
        f.samples += rows
        f.seconds = now - self.began
        self._last = now
        if self.bar is not None:
            self.bar.update(f, now)

    def _traced(self, trace: SpanSink, label: str, began: float, got: float, now: float) -> None:
        """The consumer's spans of a batch: its own step before asking, waiting for the batch, handing it over."""
        if self._last is not None:
            trace.span("consumer", f"before {label}", self._last, began)
        trace.span("wait", label, began, got)
        trace.span("hand_over", label, got, now)

    def replayed(self, batches: int, paths: Iterable[str]) -> None:
        """A resumed iteration read ``batches`` again (of files ``paths``) only to find its place."""
        new = set(paths) - self._resumed
        self._resumed |= new
        self.figures.resume_files += len(new)
        self.figures.resume_batches += batches

    def end(self, began: float) -> None:
        """The iteration ran to its end, found by a ``next()`` that began at ``began``."""
        if self._last is not None:
            self.figures.step_s += began - self._last
            self._last = None
        self.close()  # the bar's last line before the epoch's log line
        self._next_epoch(None, began)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close(self.figures)

    def _next_epoch(self, epoch: Optional[int], mark: float) -> None:
        """Log the epoch that ends at ``mark`` (if any), and start counting ``epoch``'s."""
        if self._epoch is not None:
            f = self.figures.minus(self._epoch_figures)
            f.seconds = mark - self._epoch_mark
            counted = self.counting.seconds - self._counting_mark
            line = (f"{self.epoch_files.pop(self._epoch, 0)} files, {f.samples} samples ({f.batches} batches) in "
                    f"{f.seconds:.2f} s, {f.rate():.1f} samples/s, data stall {100 * f.stall_share():.1f}%")
            logger.info("epoch %d: %s%s", self._epoch, line, f", counting files {counted:.2f} s" if counted else "")
            if self.on_epoch is not None:
                self.on_epoch(self._epoch)
            self._counting_mark = self.counting.seconds
            self._epoch_mark = mark  # the first epoch counts from iter(): its start-up is part of it
        self._epoch = epoch
        self._epoch_figures = dataclasses.replace(self.figures)


class Stats:
    """The counters of one loader (updated by the pipeline as it runs) and its iterations' ``Watch``es.

    The counters count over the loader's life; ``as_dict()`` adds the ``iteration`` and
    ``total`` reports (see the README, *Watching a run*).
    """

    def __init__(self) -> None:
        self.files_read = 0
        self.samples_read = 0  # kept by filter_fn, when there is one
        self.filtered_samples = 0  # dropped by filter_fn
        self.rotated_samples = 0  # served again by rotation (``_stages.rotation``)
        self.batches = 0
        self.skipped_files = 0
        self.skipped_batches = 0
        self.errors: List[str] = []
        self.sources: List[Dict[str, Any]] = []  # a mixed loader's: each source's samples batched (``_stages.mix``)
        self.cache: Optional[Dict[str, int]] = None  # with cache_encoded: its counters (``_stages.cached_epochs``)
        self.placement: Dict[str, Any] = {}  # where the latest iteration ran user methods (``_execution.auto_workers``)
        self.measured: Optional[Reporting] = None  # ... and, file by file, where they measured faster
        self.busy = Busy()
        self.counting = Counting()
        self.epoch_files: Dict[int, int] = {}  # files read per epoch, until its log line takes them
        self._watch: Optional[Watch] = None
        self.on_epoch: Optional[Callable[[int], None]] = None  # called after each epoch's log line
        self._finished = Figures()  # of the iterations before the current one
        self._iterations = 0

    def file_read(self, epoch: int) -> None:
        self.files_read += 1
        self.epoch_files[epoch] = self.epoch_files.get(epoch, 0) + 1

    def replayed(self, batches: int, paths: Iterable[str]) -> None:
        if self._watch is not None:
            self._watch.replayed(batches, paths)

    def watch(self, owner: object, max_queue_size: int, bar: Any = None) -> Watch:
        """Start watching a new iteration (``owner``, its iterator; the bar closes when it goes),
        before it reads any file."""
        if self._watch is not None:
            self._finished = self._finished.plus(self._watch.figures)
        self.epoch_files.clear()  # of epochs an earlier iteration left before their end
        self._watch = Watch(max_queue_size, self.epoch_files, self._counters(), self.busy.seconds(), bar,
                            self.counting, live=self.busy)
        self._watch.on_epoch = self._epoch_ended
        self._iterations += 1
        weakref.finalize(owner, self._watch.close)
        return self._watch

    def _epoch_ended(self, epoch: int) -> None:
        if self.on_epoch is not None:
            self.on_epoch(epoch)

    def first_wait_s(self) -> float:
        """How long the consumer waited for the latest iteration's first batch (0 before it)."""
        return 0.0 if self._watch is None else self._watch.first_wait_s

    def _counters(self) -> Dict[str, int]:
        counters = {name: getattr(self, name) for name in _COUNTERS}
        counters["error_count"] = len(self.errors)
        return counters

    def as_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {name: getattr(self, name) for name in (*_COUNTERS, "batches")}
        out["errors"] = list(self.errors)
        if self.sources:
            out["sources"] = [dict(source) for source in self.sources]
        if self.cache is not None:
            out["cache_encoded"] = dict(self.cache)
        out["placement"] = dict(self.placement)
        if self.measured is not None:
            out["placement"]["measured"] = self.measured.report()
        out["counting"] = dataclasses.asdict(self.counting)
        counters, busy = self._counters(), self.busy.seconds()
        current, out["iteration"] = self._iteration(counters, busy)
        out["total"] = _report(self._finished.plus(current), counters, busy)
        out["total"]["iterations"] = self._iterations
        return out

    def _iteration(self, counters: Dict[str, int], busy: Dict[str, float]) -> Tuple[Figures, Dict[str, object]]:
        """The figures of the iteration now (or the last one), and its report: ``counters`` and ``busy``
        (the loader's so far) less those at its start."""
        watch = self._watch
        if watch is None:  # no iteration yet: nothing counted since its start
            current, since, busy_since, first_batch_s = Figures(), counters, busy, None
        else:
            current, since, busy_since, first_batch_s = watch.figures, watch.counters, watch.busy, watch.first_batch_s
        iteration = _report(current, {k: v - since[k] for k, v in counters.items()},
                            {k: v - busy_since[k] for k, v in busy.items()})
        iteration["first_batch_s"] = first_batch_s
        return current, iteration


def _report(f: Figures, counters: Dict[str, int], busy: Dict[str, float]) -> Dict[str, Any]:
    """One of ``stats["iteration"]`` and ``stats["total"]``."""
    return {
        **counters,
        "batches": f.batches,
        "samples": f.samples,
        "seconds": f.seconds,
        "batches_per_s": _ratio(f.batches, f.seconds),
        "samples_per_s": f.rate(),
        "wait_s": f.wait_s,
        "step_s": f.step_s,
        "stall_share": f.stall_share(),
        "queue_fill": _ratio(f.fill, f.requests),
        "stage_s": {"read": busy["read"], "encode": busy["encode"], "hand_over": f.hand_over_s,
                    "read_bytes": busy["read_bytes"]},
        "method_s": {name: busy[name] for name in METHODS},
        "resume_files": f.resume_files,
        "resume_batches": f.resume_batches,
    }
