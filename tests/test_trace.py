"""``loader.trace(path)``: a Chrome/Perfetto trace of a run, with spans from every thread and worker process."""
from __future__ import annotations

import json
import multiprocessing
from collections import defaultdict

import pytest
from conftest import IdReader, ListCollator, write_chunks

import pyloader as pl
from pyloader._diagnose import spans_of
from pyloader._execution.shared import shared_bytes
from pyloader._trace import RING_BYTES, RING_SPANS, RingWriter, WorkerRing

pytestmark = pytest.mark.timeout(120)


def _loader(tmp_path, workers, **kwargs):
    write_chunks(tmp_path / "data", [8] * 4)
    return pl.DataLoader(IdReader(batch_size=4), pl.IdentityDataset(), ListCollator(), str(tmp_path / "data"),
                         num_workers=workers, **kwargs)


def _traced(loader, path, **kwargs):
    with loader, loader.trace(str(path), **kwargs):
        for _ in loader:
            pass
    return json.loads(path.read_text())


def _nested(events):
    """The complete spans of each thread nest (a viewer draws them as a stack): none ends inside another
    that it began before."""
    by_track = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            by_track[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for spans in by_track.values():
        open_ends = []
        for began, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1] <= began + 1e-3:  # touching is not overlapping
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + 1e-3, f"{name} overlaps the span it began inside"
            open_ends.append(end)
    return True


def _tracks(trace):
    """``{track name: [span names]}``, a track per thread (``"process / thread"``) of the trace."""
    assert _nested(trace["traceEvents"])
    events = trace["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    tracks = defaultdict(list)
    for e in spans_of(events):
        assert e["dur"] >= 0 and e["cat"] in e["name"]
        tracks[f"{processes[e['pid']]} / {threads[(e['pid'], e['tid'])]}"].append(e["name"])
    return tracks


def test_a_trace_has_spans_from_every_worker_process_named_with_their_files_and_batches(tmp_path):
    tracks = _tracks(_traced(_loader(tmp_path, 2), tmp_path / "t.json"))
    workers = {name: spans for name, spans in tracks.items() if name.startswith("pyloader worker")}
    assert sorted(workers) == ["pyloader worker 0 / pyloader worker 0", "pyloader worker 1 / pyloader worker 1"]
    for spans in workers.values():
        assert any(s.startswith("read_file part-") for s in spans)
        assert any(s.startswith("batch_encode epoch 0 batch ") and "(part-" in s for s in spans)
        assert any(s.startswith("collate_batch epoch 0 batch ") for s in spans)
    consumer = tracks["pyloader (loader's process) / MainThread"]
    assert sum(s.startswith("wait epoch 0 batch") for s in consumer) == 8
    assert sum(s.startswith("hand_over epoch 0 batch") for s in consumer) == 8
    assert "wait epoch 0 batch 0 (part-0000.txt)" in consumer


def test_a_trace_without_workers_has_a_track_per_thread_of_the_loader(tmp_path):
    tracks = _tracks(_traced(_loader(tmp_path, 0), tmp_path / "t.json"))
    assert all(name.startswith("pyloader (loader's process) / ") for name in tracks)
    io = [s for name, spans in tracks.items() if "pyloader-io" in name for s in spans]
    assert {"read_file part-0000.txt", "read_file part-0003.txt"} <= set(io)
    assert any(s.startswith("batch_encode epoch 0 batch 7 ") for s in io)
    assert "read_bytes part-0000.txt" in tracks["pyloader (loader's process) / pyloader-loop"]
    consumer = tracks["pyloader (loader's process) / MainThread"]
    assert any(s.startswith("consumer before epoch 0 batch 1") for s in consumer)


def test_a_trace_keeps_the_latest_max_events_spans(tmp_path):
    trace = _traced(_loader(tmp_path, 0), tmp_path / "t.json", max_events=5)
    spans = spans_of(trace["traceEvents"])
    assert len(spans) == 5 and "epoch 0 batch 7" in spans[-1]["name"]


def test_a_closed_trace_records_nothing_more(tmp_path):
    loader = _loader(tmp_path, 2)
    tracing = loader.trace(str(tmp_path / "t.json"))
    with loader:
        next(iter(loader))
        tracing.close()
        before = len(tracing.recorder.spans)
        for _ in loader:
            pass
    assert loader._stats.busy.trace is None and len(tracing.recorder.spans) == before
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


def test_a_trace_refuses_max_events_below_one(tmp_path):
    with pytest.raises(ValueError, match="max_events must be >= 1"):
        _loader(tmp_path, 0).trace(str(tmp_path / "t.json"), max_events=0)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_worker_ring_gives_its_latest_spans_once(method):
    ring = WorkerRing(shared_bytes(multiprocessing.get_context(method), RING_BYTES))
    writer = RingWriter(ring.buffer, 3)
    writer.span("read_file", "a.txt", 1.0, 2.0)
    _, index, spans = ring.take()
    assert index == 3 and spans == [("read_file", "a.txt", 1.0, 2.0)]
    for k in range(RING_SPANS + 5):
        writer.span("batch_encode", f"batch {k}", 10.0 + k, 10.5 + k)
    _, _, spans = ring.take()
    assert len(spans) == RING_SPANS and spans[-1][1] == f"batch {RING_SPANS + 4}" and spans[0][1] == "batch 5"
    assert ring.take()[2] == []


def test_a_long_label_is_cut_to_fit_its_record():
    ring = WorkerRing(bytearray(RING_BYTES))
    RingWriter(ring.buffer, 0).span("read_file", "é" * 200, 1.0, 1.5)
    (stage, label, _, _), = ring.take()[2]
    assert stage == "read_file" and 40 < len(label) < 60 and set(label) == {"é"}


def test_workers_started_while_not_tracing_get_no_ring(tmp_path, monkeypatch):
    def no_ring(buffer):
        raise AssertionError("a ring was made while not tracing")

    monkeypatch.setattr("pyloader._execution.pool.WorkerRing", no_ring)
    loader = _loader(tmp_path, 2)
    with loader:
        assert len(list(loader)) == 8
    assert loader._stats.busy.trace is None


def test_kept_workers_started_while_tracing_give_spans_of_every_iteration(tmp_path):
    loader = _loader(tmp_path, 2, persistent_workers=True)
    with loader, loader.trace(str(tmp_path / "t.json")):
        for _ in range(2):  # epochs 0 and 1, the same two workers
            assert len(list(loader)) == 8
    tracks = _tracks(json.loads((tmp_path / "t.json").read_text()))
    workers = [s for name, spans in tracks.items() if name.startswith("pyloader worker") for s in spans]
    assert any("epoch 0 batch" in s for s in workers) and any("epoch 1 batch" in s for s in workers)


def test_waits_for_bytes_are_async_pairs_the_viewers_stack_rather_than_nest():
    from pyloader._trace import Recorder

    recorder = Recorder(10)
    recorder.span("read_bytes", "a.txt", 1.0, 3.0)
    recorder.span("read_bytes", "b.txt", 2.0, 4.0)  # overlaps a.txt on the same thread
    recorder.span("read_file", "a.txt", 3.0, 3.5)
    events = [e for e in recorder.events()["traceEvents"] if e["ph"] != "M"]
    assert [(e["ph"], e["name"]) for e in events] == [
        ("b", "read_bytes a.txt"), ("e", "read_bytes a.txt"), ("b", "read_bytes b.txt"), ("e", "read_bytes b.txt"),
        ("X", "read_file a.txt")]
    assert events[0]["id"] == events[1]["id"] != events[2]["id"]
    assert sorted((e["name"], e["dur"]) for e in spans_of(events)) == [
        ("read_bytes a.txt", 2e6), ("read_bytes b.txt", 2e6), ("read_file a.txt", 0.5e6)]
