"""Where a run's time goes: ``loader.trace(path)`` (a timeline) and ``loader.report()`` (what to change).

* ``Tracing``: while it is open, the loader records spans (``_trace``) of every file read, piece
  parsed, batch encoded and collated, handed over, and of the consumer's waits and steps; closing it
  writes them as a Chrome/Perfetto trace. Worker processes record theirs when they start while it is
  open (a pool kept with ``persistent_workers`` from before is not traced).
* ``Report``: from ``loader.stats`` alone (the latest iteration): the share of the consumer's time
  spent waiting, the stage that limits throughput, where the user code runs and why, and one or
  two suggestions with their expected effect. ``str(report)`` is the text.

The rule: the consumer limits the run when, after its first batch, it waited under ``LOADER_BOUND``
of its time (start-up is reported apart: it is paid once); otherwise the loader's stage with the most
busy seconds does (summed over its threads and workers: the one more hands would speed up most).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import os
import weakref
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    ContextManager,
    Dict,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Union,
)

from ._trace import Recorder

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ._loader import DataLoader

Trace = Mapping[str, Any]  # a trace read back from its JSON (``traceEvents``)

logger = logging.getLogger("pyloader")

LOADER_BOUND = 0.2  # a consumer waiting this share of its time (past its first batch) is held up by the loader
MAX_EVENTS = 200_000
STAGES = ("read_bytes", "parse", "batch_encode", "collate_batch", "hand_over", "consumer")
STAGE_NAMES = {"read_bytes": "reading bytes from storage", "parse": "parsing files (the reader's read_file)",
               "batch_encode": "batch_encode", "collate_batch": "collate_batch",
               "hand_over": "handing batches over (in the consumer's thread)",
               "consumer": "the consumer itself (the training step)"}


class Tracing:
    """What ``loader.trace(path)`` returns: records from now on; ``close()`` (or leaving a ``with``)
    writes the trace to ``path`` and stops; ``save()`` writes it and goes on. With ``path`` None nothing
    is recorded (``report=True`` alone: the report logged after each epoch)."""

    def __init__(self, loader: "DataLoader", path: Optional[str], max_events: int = MAX_EVENTS,
                 report: bool = False) -> None:
        if max_events < 1:
            raise ValueError(f"max_events must be >= 1, got {max_events!r}")
        self.path = None if path is None else str(path)
        self.recorder = Recorder(max_events)
        self._stats = stats = loader._stats
        self._before = stats.busy.trace, stats.on_epoch
        if self.path is not None:
            stats.busy.trace = self.recorder
        if report:
            stats.on_epoch = functools.partial(_log_report, weakref.ref(loader))
        self.closed = False

    def __enter__(self) -> "Tracing":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def save(self) -> Optional[str]:
        """Write the trace so far to ``path``; the path."""
        if self.path is not None:
            self.recorder.write(self.path)
        return self.path

    def close(self) -> Optional[str]:
        """Stop recording and write the trace (once); the path."""
        if not self.closed:
            self.closed = True
            self._stats.busy.trace, self._stats.on_epoch = self._before
            self.save()
        return self.path


def _log_report(loader: "weakref.ref[DataLoader]", epoch: int) -> None:
    """After an epoch's log line (``report=True``): the loader's report, at INFO."""
    alive = loader()
    if alive is not None:
        logger.info("epoch %d: %s", epoch, alive.report())


@dataclasses.dataclass
class Report:
    """A run's bottleneck report: ``str()`` is the text, the fields are its figures."""

    batches: int
    seconds: float
    wait_share: float  # the consumer's time spent waiting for batches, past its first one
    first_batch_s: float
    stage_s: Dict[str, float]  # busy seconds of each of ``STAGES``, summed over threads and workers
    limiting: str  # one of ``STAGES``, or "" when nothing was measured yet
    placement: str
    suggestions: List[str]

    def as_dict(self) -> Dict[str, object]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        if not self.limiting:
            return "pyloader report: no batch handed over yet, nothing measured"
        per = self.seconds / self.batches
        lines = [f"pyloader report: {self.batches} batches in {self.seconds:.2f} s ({1e3 * per:.1f} ms per batch, "
                 f"first batch after {self.first_batch_s:.2f} s)",
                 f"  waiting for batches: {100 * self.wait_share:.0f}% of the consumer's time after its first batch",
                 f"  limiting stage: {STAGE_NAMES[self.limiting]}",
                 "  busy seconds per stage (summed over threads and workers):"]
        lines += [f"    {name:<14}{self.stage_s[name]:8.3f} s{'   <- limits' if name == self.limiting else ''}"
                  for name in STAGES]
        lines.append(f"  user code: {self.placement}")
        lines += [f"  suggestion: {text}" for text in self.suggestions]
        return "\n".join(lines)


def report_of(loader: "DataLoader") -> Report:
    """The report of ``loader``'s latest iteration (see the module's rule)."""
    stats = loader.stats
    it = stats["iteration"]
    stage_s = _stage_seconds(it)
    first = it["first_batch_s"] or 0.0
    waited = max(0.0, it["wait_s"] - loader._stats.first_wait_s())
    share = waited / (waited + it["step_s"]) if waited + it["step_s"] > 0 else 0.0
    placement = _placement(stats["placement"])
    if not it["batches"]:
        return Report(batches=0, seconds=it["seconds"], wait_share=share, first_batch_s=first, stage_s=stage_s,
                      limiting="", placement=placement, suggestions=[])
    limiting = "consumer" if share < LOADER_BOUND else max(STAGES[:-1], key=lambda name: stage_s[name])
    report = Report(batches=it["batches"], seconds=it["seconds"], wait_share=share, first_batch_s=first,
                    stage_s=stage_s, limiting=limiting, placement=placement, suggestions=[])
    report.suggestions = _suggestions(report, loader, stats["placement"].get("num_workers", 0), it["files_read"])
    return report


def _stage_seconds(it: Dict[str, Any]) -> Dict[str, float]:
    stage, method = it["stage_s"], it["method_s"]
    return {"read_bytes": stage.get("read_bytes", 0.0), "parse": stage["read"],
            "batch_encode": method["batch_encode"], "collate_batch": method["collate_batch"],
            "hand_over": stage["hand_over"], "consumer": it["step_s"]}


def _placement(placement: Dict[str, Any]) -> str:
    n = placement.get("num_workers", 0)
    where = f"in {n} worker process{'es' if n != 1 else ''}" if n else "in threads of the loader's process"
    why = placement.get("why")
    return f"{where}{f' ({why})' if why else ''}"


def _more_workers(workers: int, cores: int, most: float) -> str:
    """Run the stage in more worker processes: twice as many while the cores allow (one left for the consumer),
    with the expected gain (``most``: the consumer's own pace allows no more)."""
    if workers + 1 >= cores:
        return (f"more worker processes need more than {cores} cores (the {workers} workers and the consumer use "
                f"them all)")
    more = min(max(2, 2 * workers), cores - 1)
    gain = min(more / workers if workers else 2.0, most)
    return (f"run it in more worker processes, workers={more} (now {workers}); expected: up to {gain:.1f}x "
            f"the samples/s (until another stage limits)")


def _suggestions(r: Report, loader: "DataLoader", workers: int, files: int) -> List[str]:
    if r.limiting == "consumer":
        text = (f"the loader keeps up: a faster loader would save at most {r.wait_share * 100:.0f}% of the "
                f"consumer's time; speed up the training step itself")
        more = [] if not workers else [f"if the step needs the CPU, fewer workers (workers={max(0, workers // 2)}, "
                                       f"now {workers}) leave it more cores"]
        return [text, *more]
    own = r.stage_s["consumer"] + r.stage_s["hand_over"]  # the consumer's pace: the best any loader allows
    most = r.seconds / own if own > 0 else float("inf")
    per_batch = 1e3 * r.stage_s[r.limiting] / r.batches
    more_workers = _more_workers(workers, os.cpu_count() or 1, most)
    return {
        "read_bytes": [f"storage is slow ({1e3 * r.stage_s['read_bytes'] / max(1, files):.0f} ms waited per file): "
                       f"read more files at once, Storage(prefetch_files={2 * loader.storage.prefetch_files}) (now "
                       f"{loader.storage.prefetch_files}); expected, while latency and not bandwidth limits: up to "
                       f"{min(2.0, most):.1f}x the samples/s",
                       "keep the files on a local disk (Storage cache_dir): the epochs after the first read them "
                       "from there"],
        "parse": [f"parsing takes {1e3 * r.stage_s['parse'] / max(1, files):.0f} ms per file: {more_workers}",
                  "or a faster parser or format (npy, parquet: no text to parse)"],
        "batch_encode": [f"batch_encode takes {per_batch:.1f} ms per batch: {more_workers}",
                         "or cache_encoded: batch_encode runs once, and later epochs read its batches back"],
        "collate_batch": [f"collate_batch takes {per_batch:.1f} ms per batch: move its work into batch_encode, which "
                          f"runs on several groups at once", more_workers],
        "hand_over": [f"handing over takes {per_batch:.1f} ms per batch in the consumer's thread (unstacking, "
                      f"pinning, moving to the device): return arrays the collator stacks, or move less per batch; "
                      f"expected: up to {min(most, r.seconds / max(1e-9, r.seconds - r.stage_s['hand_over'])):.1f}x"],
    }[r.limiting]


# -- the command line: ``python -m pyloader diagnose``, and the pictures of it and of ``bench`` --------------------
DIAGNOSE_HELP = "run one epoch, then say what limits the loader and what to change (optionally a trace and a PNG)"


def add_options(diagnose_: argparse.ArgumentParser, bench_: argparse.ArgumentParser) -> None:
    """``diagnose``'s own options (``data``, ``--reader`` and ``--batch-size`` are every command's), and
    ``bench``'s ``--png``."""
    diagnose_.add_argument("--workers", type=_workers, default="auto", help="num_workers (default: auto)")
    diagnose_.add_argument("--max-batches", type=int, default=0, help="stop after this many batches "
                           "(default 0: one epoch)")
    diagnose_.add_argument("--trace", default=None, help="write the run's trace (JSON, for ui.perfetto.dev) here")
    diagnose_.add_argument("--png", default=None, help="draw the busy time per stage (and the trace's "
                           "timeline, with --trace) into this PNG (needs matplotlib)")
    bench_.add_argument("--png", default=None, help="draw samples/s per setting into this PNG (needs matplotlib)")


def _workers(text: str) -> Union[int, str]:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number of workers, got {text!r}") from None


def diagnose(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    """Run one epoch (or ``--max-batches``) of the data and print the loader's report."""
    from ._cli import make_loader, make_reader

    reader = make_reader(args.reader, args.batch_size)
    with make_loader(reader, args.data, args.workers) as loader:
        tracing: ContextManager[object] = loader.trace(args.trace) if args.trace else contextlib.nullcontext()
        with tracing:
            for _ in itertools.islice(loader, args.max_batches or None):
                pass
        report = loader.report()
    out(str(report))
    if args.trace:
        out(f"trace: {args.trace} (open it in ui.perfetto.dev or chrome://tracing)")
    if args.png:
        trace = _read_json(args.trace) if args.trace else None
        out(f"picture: {stages_png(report, args.png, trace)}")
    return 0


def _read_json(path: str) -> Trace:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _figure(rows: int) -> "Figure":
    """A matplotlib figure of ``rows`` panels, drawn without pyplot (no backend is chosen for the process)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ValueError("drawing a PNG needs matplotlib: pip install matplotlib") from exc
    figure = Figure(figsize=(9, 2.6 + 3.2 * (rows - 1)), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def stages_png(report: Report, path: str, trace: Optional[Trace] = None) -> str:
    """Busy seconds per stage (the limiting one marked), and below them the timeline of ``trace``; the path."""
    figure = _figure(2 if trace else 1)
    axes = figure.subplots(2 if trace else 1, 1, squeeze=False)[:, 0]
    names = list(STAGES)
    axes[0].barh(names, [report.stage_s[n] for n in names],
                 color=["tab:red" if n == report.limiting else "tab:blue" for n in names])
    axes[0].invert_yaxis()
    axes[0].set_xlabel("busy seconds (summed over threads and workers)")
    axes[0].set_title(f"limiting: {STAGE_NAMES.get(report.limiting, 'nothing measured')}; "
                      f"waiting {100 * report.wait_share:.0f}% of the consumer's time")
    if trace:
        draw_timeline(axes[1], trace)
    figure.savefig(path, dpi=110)
    return path


def draw_timeline(ax: "Axes", trace: Trace) -> None:
    """The spans of a trace (``traceEvents``), a row per thread or worker, coloured by stage."""
    events = trace["traceEvents"]
    names = _thread_names(events)
    spans = spans_of(events)
    tracks = sorted({(e["pid"], e["tid"]) for e in spans}, key=lambda t: (names.get(t, "~"), t))
    start = min((e["ts"] for e in spans), default=0.0)
    stages = sorted({e["cat"] for e in spans})
    for row, track in enumerate(tracks):
        _draw_track(ax, row, _spans_on(spans, track), stages, start)
    ax.set_yticks(range(len(tracks)), [f"{names.get(t, 'thread')} ({t[0]})" for t in tracks])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=min(5, len(stages)), fontsize="small")


def _thread_names(events: Sequence[Mapping[str, Any]]) -> Dict[Tuple[Any, Any], str]:
    """The name of each thread (by ``(pid, tid)``) a trace's ``thread_name`` events give."""
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}


def _spans_on(spans: List[Mapping[str, Any]], track: Tuple[Any, Any]) -> List[Mapping[str, Any]]:
    """The ``spans`` of one thread or worker, ``track`` (its ``(pid, tid)``)."""
    return [e for e in spans if (e["pid"], e["tid"]) == track]


def spans_of(events: Sequence[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    """The spans of a trace's events as complete events (``"X"``, with ``dur``): an async pair (``"b"``,
    ``"e"``) becomes one."""
    begun = {e["id"]: e for e in events if e["ph"] == "b"}
    pairs = [{**begun[e["id"]], "ph": "X", "dur": e["ts"] - begun[e["id"]]["ts"]}
             for e in events if e["ph"] == "e" and e["id"] in begun]
    return [e for e in events if e["ph"] == "X"] + pairs


def _draw_track(ax: "Axes", row: int, spans: List[Mapping[str, Any]], stages: List[str], start: float) -> None:
    """One track's spans, a colour per stage (the legend names each stage once)."""
    for i, stage in enumerate(stages):
        bars = [((e["ts"] - start) / 1e3, e["dur"] / 1e3) for e in spans if e["cat"] == stage]
        if bars:
            labelled = stage in ax.get_legend_handles_labels()[1]
            ax.broken_barh(bars, (row - 0.4, 0.8), color=f"C{i % 10}", label=None if labelled else stage)


def timeline_png(trace: Trace, path: str) -> str:
    """The timeline of a trace alone (``draw_timeline``); the path."""
    figure = _figure(1)
    draw_timeline(figure.subplots(), trace)
    figure.savefig(path, dpi=110)
    return path


class _Rate(Protocol):
    workers: Union[int, str]
    samples_per_s: float
    error: Optional[str]


def throughput_png(results: Sequence[_Rate], path: str) -> str:
    """``bench``'s samples/s per setting (``_cli.Result``s; a failed one shows empty); the path."""
    figure = _figure(1)
    ax = figure.subplots()
    labels = [f"num_workers={r.workers}" for r in results]
    ax.barh(labels, [r.samples_per_s if r.error is None else 0.0 for r in results], color="tab:blue")
    ax.invert_yaxis()
    ax.set_xlabel("samples/s")
    ax.set_title("python -m pyloader bench: throughput per setting")
    figure.savefig(path, dpi=110)
    return path
