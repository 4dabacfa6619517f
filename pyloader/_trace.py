"""Spans of a run, for ``loader.trace(path)``: a Chrome/Perfetto trace (the ``traceEvents`` JSON format).

Contracts:

* Off costs one attribute check per span site: ``busy.trace is None`` (``_stats.timed``, ``GroupClock``,
  ``clocked``, ``_execution.steps.run_steps``, the consumer's ``Watch``); names are made only when on.
* A span is ``(stage, label, began, end)``: ``label`` names its file or batch; times are
  ``time.perf_counter()``, the system's monotonic clock, the same in the loader's worker processes.
* Bounded: this process keeps its latest ``max_events`` spans (``Recorder``); each worker process writes
  into a ring of ``RING_SPANS`` fixed-size records shared with the loader (``WorkerRing``), read here as its
  run ends and when the trace is written; the file holds the latest ``max_events`` spans of them all.
* Nothing is unpickled: a ring's records are ``struct``s of two floats and utf-8 text.
"""
from __future__ import annotations

import collections
import json
import os
import struct
import threading
from typing import TYPE_CHECKING, Deque, Dict, List, Optional, Protocol, Tuple

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

RING_SPANS = 4096  # the latest spans of a worker process kept between two reads
_HEADER = struct.Struct("<qqq")  # spans written, the worker's pid, its index
_RECORD = struct.Struct("<dd104s")  # began, end, "stage\x1flabel" (utf-8, cut to fit)
_SEP = "\x1f"
RING_BYTES = _HEADER.size + RING_SPANS * _RECORD.size
OVERLAPPING = frozenset({"read_bytes"})  # awaited on the event loop, several at once: async events, not nested ones

Span = Tuple[int, int, str, str, float, float]  # pid, tid, stage, label, began, end


class SpanSink(Protocol):
    def span(self, stage: str, label: str, began: float, end: float) -> None: ...


class RingWriter:
    """A worker process's end of its ``WorkerRing``: nothing else writes it."""

    def __init__(self, buffer: "WriteableBuffer", index: int) -> None:
        self.buffer = buffer
        self.written = 0
        _HEADER.pack_into(buffer, 0, 0, os.getpid(), index)
        self._index = index

    def span(self, stage: str, label: str, began: float, end: float) -> None:
        text = f"{stage}{_SEP}{label}".encode("utf-8", "replace")[:_RECORD.size - 16]
        _RECORD.pack_into(self.buffer, _HEADER.size + (self.written % RING_SPANS) * _RECORD.size, began, end, text)
        self.written += 1
        _HEADER.pack_into(self.buffer, 0, self.written, os.getpid(), self._index)


class WorkerRing:
    """The loader's end of a worker's ring: ``buffer`` (``RING_BYTES`` shared bytes) and how far it was read."""

    def __init__(self, buffer: "WriteableBuffer") -> None:
        self.buffer = buffer
        self.seen = 0

    def take(self) -> Tuple[int, int, List[Tuple[str, str, float, float]]]:
        """``(pid, index, spans)``: the worker's spans written since the last ``take`` (at most a ring's)."""
        written, pid, index = _HEADER.unpack_from(self.buffer, 0)
        spans = []
        for n in range(max(self.seen, written - RING_SPANS), written):
            began, end, raw = _RECORD.unpack_from(self.buffer, _HEADER.size + (n % RING_SPANS) * _RECORD.size)
            stage, _, label = raw.rstrip(b"\0").decode("utf-8", "ignore").partition(_SEP)
            if end >= began > 0:  # else overwritten as it was read: dropped
                spans.append((stage, label, began, end))
        self.seen = written
        return pid, index, spans


class Recorder:
    """The spans of this process's threads, and the rings of the workers running for it."""

    def __init__(self, max_events: int) -> None:
        self.spans: Deque[Span] = collections.deque(maxlen=max_events)
        self.max_events = max_events
        self.threads: Dict[int, str] = {}
        self.workers: Dict[int, str] = {}  # pid: name
        self._rings: List[WorkerRing] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def span(self, stage: str, label: str, began: float, end: float) -> None:
        tid = threading.get_ident()
        if tid not in self.threads:
            self.threads[tid] = threading.current_thread().name
        self.spans.append((self._pid, tid, stage, label, began, end))

    def watch(self, rings: List[Optional[WorkerRing]]) -> None:
        """Read ``rings`` (of workers attached to a run) from now on, until ``let_go``."""
        with self._lock:
            self._rings.extend(r for r in rings if r is not None and all(r is not mine for mine in self._rings))

    def let_go(self, rings: List[Optional[WorkerRing]]) -> None:
        """The run of the workers of ``rings`` ended: read them one last time, and no more."""
        with self._lock:
            self._take([r for r in rings if r is not None])
            self._rings = [r for r in self._rings if all(r is not done for done in rings)]

    def _take(self, rings: List[WorkerRing]) -> None:
        for ring in rings:
            pid, index, spans = ring.take()
            self.workers[pid] = f"pyloader worker {index}"
            self.spans.extend((pid, pid, *span) for span in spans)

    def events(self) -> Dict[str, object]:
        """The trace so far, in the ``traceEvents`` format: the latest ``max_events`` spans."""
        with self._lock:
            self._take(self._rings)
        spans = sorted(self.spans, key=lambda s: s[4])[-self.max_events:]
        names = {(self._pid, tid): name for tid, name in self.threads.items()}
        names.update({(pid, pid): name for pid, name in self.workers.items()})
        meta: List[Dict[str, object]] = [_meta("process_name", self._pid, self._pid, "pyloader (loader's process)")]
        meta += [_meta("process_name", pid, pid, name) for pid, name in self.workers.items()]
        meta += [_meta("thread_name", pid, tid, name) for (pid, tid), name in names.items()]
        events: List[Dict[str, object]] = []
        for n, (pid, tid, stage, label, began, end) in enumerate(spans):
            ts, te = round(began * 1e6, 3), round(end * 1e6, 3)  # µs, to the ns: a span ending as the next begins
            event: Dict[str, object] = {"name": f"{stage} {label}" if label else stage, "cat": stage, "pid": pid,
                                        "tid": tid, "ts": ts, "args": {"label": label}}
            if stage in OVERLAPPING:  # an async pair: the viewers stack them rather than nest them
                events += [{**event, "ph": "b", "id": n}, {**event, "ph": "e", "id": n, "ts": te}]
            else:
                events.append({**event, "ph": "X", "dur": round(te - ts, 3)})
        return {"traceEvents": meta + events, "displayTimeUnit": "ms"}

    def write(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.events(), f)


def _meta(kind: str, pid: int, tid: int, name: str) -> Dict[str, object]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def file_label(path: str) -> str:
    """A file's label: its name (the whole path is long, and the same for every file of a folder)."""
    return os.path.basename(path.rstrip("/")) or path


def batch_label(key: Optional[Tuple[int, ...]], paths: Tuple[str, ...]) -> str:
    """A batch's label: its epoch and index (``key``: its ``pyloader.rng()`` place, ending with them) and files."""
    place = f"epoch {key[-2]} batch {key[-1]}" if key is not None and len(key) >= 2 else "batch"
    return f"{place} ({', '.join(file_label(p) for p in paths)})" if paths else place
