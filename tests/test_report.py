"""``loader.report()`` and ``python -m pyloader diagnose``: the stage that limits a run, from ``loader.stats``.

Each case makes one stage slow by a known sleep (a fraction of a second in all) and checks that the report
names it, with no worker process and with two."""
from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from conftest import IdReader, ListCollator, write_chunks

import pyloader as pl
from pyloader._cli import main
from pyloader._diagnose import _more_workers
from pyloader._storage.latency import LatencyFileSystem
from pyloader.collators import NumpyCollator
from pyloader.readers import JsonLinesReader

pytestmark = pytest.mark.timeout(120)
SLEEP_S = 0.008


class SlowEncode(pl.Dataset):
    def batch_encode(self, batch_data):
        time.sleep(SLEEP_S)
        return batch_data


class SlowCollate(ListCollator):
    def collate_batch(self, features):
        time.sleep(SLEEP_S)
        return super().collate_batch(features)


def _run(loader: pl.DataLoader, step_s: float = 0.0) -> pl.DataLoader:
    with loader:
        for _ in loader:
            if step_s:
                time.sleep(step_s)
    return loader


def _local(tmp_path, workers, reader=None, dataset=None, collator=None):
    write_chunks(tmp_path / "data", [16] * 4)
    return pl.DataLoader(reader or IdReader(batch_size=2), dataset or pl.IdentityDataset(), collator or ListCollator(),
                         str(tmp_path / "data"), num_workers=workers)


@pytest.fixture
def slow_storage():
    fs = LatencyFileSystem.register("pyl-report-slow", latency=0.05)
    for i in range(3):
        fs().pipe(f"/data/part-{i}.jsonl", b"".join(b'{"x": %d}\n' % j for j in range(8)))
    return "pyl-report-slow://data/"


CASES = {
    "parse": lambda tmp_path, w: _run(_local(tmp_path, w, reader=IdReader(batch_size=4, delay=0.04))),
    "batch_encode": lambda tmp_path, w: _run(_local(tmp_path, w, dataset=SlowEncode())),
    "collate_batch": lambda tmp_path, w: _run(_local(tmp_path, w, collator=SlowCollate())),
    "consumer": lambda tmp_path, w: _run(_local(tmp_path, w, reader=IdReader(batch_size=4)), step_s=0.03),
}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stage", sorted(CASES))
def test_the_report_names_the_slow_stage(tmp_path, stage, workers):
    report = CASES[stage](tmp_path, workers).report()
    assert report.limiting == stage, str(report)
    assert "<- limits" in str(report) and report.suggestions


@pytest.mark.parametrize("workers", [0, 2])
def test_the_report_names_slow_storage(slow_storage, workers):
    loader = pl.DataLoader(JsonLinesReader(batch_size=4), pl.IdentityDataset(), NumpyCollator(), slow_storage,
                           num_workers=workers)
    report = _run(loader).report()
    assert report.limiting == "read_bytes", str(report)
    assert "prefetch_files" in report.suggestions[0]


def test_the_report_says_where_user_code_runs_and_how_long_the_consumer_waited(tmp_path):
    report = _run(_local(tmp_path, 2, dataset=SlowEncode())).report()
    text = str(report)
    assert "in 2 worker processes (num_workers given)" in text
    assert report.wait_share > 0.5 and f"{100 * report.wait_share:.0f}% of the consumer's time" in text
    assert "cache_encoded" in text and ("workers=" in text or "more worker processes need more" in text)


@pytest.mark.parametrize("workers, cores, more", [
    (0, 8, "workers=2 (now 0); expected: up to 2.0x"), (2, 8, "workers=4 (now 2); expected: up to 2.0x"),
    (4, 6, "workers=5 (now 4); expected: up to 1.2x"), (2, 3, "more worker processes need more than 3 cores"),
    (0, 1, "more worker processes need more than 1 cores")])
def test_more_workers_are_suggested_only_while_a_core_is_left_for_the_consumer(workers, cores, more):
    assert more in _more_workers(workers, cores, most=10.0)


def test_the_expected_gain_of_more_workers_is_bounded_by_the_consumers_own_pace():
    assert "expected: up to 1.3x" in _more_workers(2, 16, most=1.3)


def test_a_report_before_any_batch_says_nothing_was_measured(tmp_path):
    report = _local(tmp_path, 0).report()
    assert report.limiting == "" and "nothing measured" in str(report)


def test_trace_with_report_logs_the_report_after_each_epoch(tmp_path, caplog):
    loader = _local(tmp_path, 0, dataset=SlowEncode())
    caplog.set_level(logging.INFO, logger="pyloader")
    with loader.trace(str(tmp_path / "t.json"), report=True):
        _run(loader)
    lines = [r.getMessage() for r in caplog.records if "pyloader report" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("epoch 0: pyloader report") and "batch_encode" in lines[0]
    caplog.clear()
    _run(loader)  # the trace is closed: no report any more
    assert not [r for r in caplog.records if "pyloader report" in r.getMessage()]


def test_diagnose_prints_the_report_and_writes_the_trace_and_a_png(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "a.npy", np.arange(64, dtype=np.float32).reshape(32, 2))
    lines = []
    code = main(["diagnose", str(data), "--reader", "npy", "--batch-size", "4", "--workers", "0",
                 "--trace", str(tmp_path / "t.json"), "--png", str(tmp_path / "d.png")], out=lines.append)
    assert code == 0
    assert "pyloader report: 8 batches" in lines[0] and "limiting stage" in lines[0]
    assert (tmp_path / "t.json").stat().st_size > 0
    assert (tmp_path / "d.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_diagnose_refuses_a_bad_number_of_workers(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["diagnose", "x", "--reader", "npy", "--workers", "many"])
    assert exited.value.code == 2 and "expected 'auto' or a number of workers" in capsys.readouterr().err


def test_trace_of_no_path_logs_the_report_and_records_nothing(tmp_path, caplog):
    loader = _local(tmp_path, 0, dataset=SlowEncode())
    caplog.set_level(logging.INFO, logger="pyloader")
    with loader.trace(None, report=True) as tracing:
        assert loader._stats.busy.trace is None
        _run(loader)
    assert not tracing.recorder.spans and tracing.close() is None
    assert [r for r in caplog.records if r.getMessage().startswith("epoch 0: pyloader report")]
