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

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Dict, List

from ._trace import Recorder

if TYPE_CHECKING:
    from ._loader import DataLoader

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
    writes the trace to ``path`` and stops; ``save()`` writes it and goes on."""

    def __init__(self, loader: "DataLoader", path: str, max_events: int = MAX_EVENTS, report: bool = False) -> None:
        if max_events < 1:
            raise ValueError(f"max_events must be >= 1, got {max_events!r}")
        self.path = str(path)
        self.recorder = Recorder(max_events)
        self._loader = loader
        stats = loader._stats
        self._before = stats.busy.trace, stats.on_epoch
        stats.busy.trace = self.recorder
        if report:
            stats.on_epoch = lambda epoch: logger.info("epoch %d: %s", epoch, loader.report())
        self.closed = False

    def __enter__(self) -> "Tracing":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def save(self) -> str:
        """Write the trace so far to ``path``; the path."""
        self.recorder.write(self.path)
        return self.path

    def close(self) -> str:
        """Stop recording and write the trace (once); the path."""
        if not self.closed:
            self.closed = True
            stats = self._loader._stats
            stats.busy.trace, stats.on_epoch = self._before
            self.save()
        return self.path


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

    def as_dict(self) -> Dict[str, Any]:
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
        return Report(0, it["seconds"], share, first, stage_s, "", placement, [])
    limiting = "consumer" if share < LOADER_BOUND else max(STAGES[:-1], key=lambda name: stage_s[name])
    report = Report(it["batches"], it["seconds"], share, first, stage_s, limiting, placement, [])
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


def _suggestions(r: Report, loader: "DataLoader", workers: int, files: int) -> List[str]:
    if r.limiting == "consumer":
        text = (f"the loader keeps up: a faster loader would save at most {r.wait_share * 100:.0f}% of the "
                f"consumer's time; speed up the training step itself")
        more = [] if not workers else [f"if the step needs the CPU, fewer workers (num_workers={max(0, workers // 2)}, "
                                       f"now {workers}) leave it more cores"]
        return [text, *more]
    own = r.stage_s["consumer"] + r.stage_s["hand_over"]
    gain = r.seconds / own if own > 0 else float("inf")
    best = (f"expected: at best the consumer's own pace, {own:.2f} s instead of {r.seconds:.2f} s "
            f"({gain:.1f}x)" if gain != float("inf") else "")
    per_batch = 1e3 * r.stage_s[r.limiting] / r.batches
    more_workers = f"num_workers={max(2, 2 * workers)} (now {workers})"
    texts = {
        "read_bytes": [f"storage is slow ({1e3 * r.stage_s['read_bytes'] / max(1, files):.0f} ms waited per file): "
                       f"read more files at once, prefetch_files={2 * loader.prefetch_files} (now "
                       f"{loader.prefetch_files}), up to 2x faster reading while latency, not bandwidth, limits; or "
                       f"keep the files on a local disk (Storage cache_dir) for the epochs after the first"],
        "parse": [f"parsing takes {1e3 * r.stage_s['parse'] / max(1, files):.0f} ms per file: parse more files at "
                  f"once in worker processes, {more_workers}, or use a faster parser or format (npy, parquet)"],
        "batch_encode": [f"batch_encode takes {per_batch:.1f} ms per batch: run it in more processes, {more_workers}, "
                         f"or cache_encoded to run it once and reuse its batches in later epochs"],
        "collate_batch": [f"collate_batch takes {per_batch:.1f} ms per batch: move its work into batch_encode "
                          f"(which runs on several groups at once, and in workers), or {more_workers}"],
        "hand_over": [f"handing over takes {per_batch:.1f} ms per batch in the consumer's thread (unstacking, pinning, "
                      f"moving to the device): return arrays the collator stacks, or move less per batch"],
    }[r.limiting]
    return [f"{texts[0]}; {best}" if best else texts[0]]
