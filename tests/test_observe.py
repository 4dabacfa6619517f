"""Watching a run: ``loader.stats`` (rates, stall, busy times, per iteration and over the
loader's life), the per-epoch log line, ``progress=True`` and the torch profiler ranges."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import IdReader, ListCollator, wait_no_threads, write_chunks

import pyloader as pl

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[1]
SLEEP_S = 0.02


class SleepyDataset(pl.Dataset):
    """``batch_encode`` takes at least ``SLEEP_S``: its busy time has a known lower bound."""

    def batch_encode(self, batch_data):
        time.sleep(SLEEP_S)
        return batch_data


REPORT_KEYS = {
    "files_read", "samples_read", "filtered_samples", "rotated_samples", "skipped_files", "skipped_batches",
    "error_count", "batches",
    "samples",
    "seconds", "batches_per_s", "samples_per_s", "wait_s", "step_s", "stall_share", "queue_fill", "stage_s",
    "method_s", "resume_files", "resume_batches",
}


def test_stats_give_rates_stall_and_busy_times_of_the_iteration_and_of_the_loaders_life(make_loader):
    loader = make_loader([10, 7, 13], batch_size=4, reader=IdReader(4, delay=SLEEP_S), dataset=SleepyDataset())
    for _ in loader:
        time.sleep(SLEEP_S)  # the consumer's "training step"
    first = loader.stats["iteration"]
    assert set(first) == REPORT_KEYS | {"first_batch_s"}
    assert set(loader.stats["total"]) == REPORT_KEYS | {"iterations"}
    assert first["batches"] == 8 and first["samples"] == 30 and first["files_read"] == 3
    assert first["seconds"] > 0 and first["samples_per_s"] == pytest.approx(30 / first["seconds"])
    assert first["batches_per_s"] == pytest.approx(8 / first["seconds"])
    assert first["step_s"] >= 7 * SLEEP_S  # the time between the 8 batches, spent in the loop
    assert first["wait_s"] > 0 and 0 < first["stall_share"] < 1
    assert first["stall_share"] == pytest.approx(first["wait_s"] / (first["wait_s"] + first["step_s"]))
    assert 0 <= first["queue_fill"] <= 1 and 0 < first["first_batch_s"] <= first["seconds"]
    assert first["method_s"]["read_file"] >= 3 * SLEEP_S and first["method_s"]["batch_encode"] >= 8 * SLEEP_S
    assert first["stage_s"]["read"] >= first["method_s"]["read_file"]
    assert first["stage_s"]["encode"] >= first["method_s"]["batch_encode"] + first["method_s"]["collate_batch"]
    assert 0 < first["stage_s"]["hand_over"] < first["wait_s"]

    second_batches = list(loader)  # the next iteration: the next epoch
    assert len(second_batches) == 8
    stats = loader.stats
    assert stats["iteration"]["batches"] == 8 and stats["iteration"]["files_read"] == 3
    assert stats["iteration"]["method_s"]["batch_encode"] >= 8 * SLEEP_S
    total = stats["total"]
    assert total["iterations"] == 2 and total["batches"] == 16 == stats["batches"]
    assert total["samples"] == 60 and total["files_read"] == 6 == stats["files_read"]
    assert total["seconds"] == pytest.approx(first["seconds"] + stats["iteration"]["seconds"])
    assert total["method_s"]["batch_encode"] >= 16 * SLEEP_S
    json.dumps(stats)  # plain data, for any logger


def test_stats_count_the_time_of_user_methods_run_in_worker_processes(make_loader):
    loader = make_loader([10, 7, 13], batch_size=4, reader=IdReader(4, delay=SLEEP_S), dataset=SleepyDataset(),
                         num_workers=2)
    assert len(list(loader)) == 8
    seen = loader.stats["iteration"]
    assert seen["method_s"]["read_file"] >= 3 * SLEEP_S
    assert seen["method_s"]["batch_encode"] >= 8 * SLEEP_S
    assert seen["stage_s"]["read"] >= seen["method_s"]["read_file"]
    assert seen["stage_s"]["encode"] >= seen["method_s"]["batch_encode"]


def test_an_iteration_left_early_keeps_its_stats_and_the_next_one_counts_afresh(make_loader):
    loader = make_loader([20], batch_size=4)
    for k, _ in enumerate(loader, 1):
        if k == 2:
            break
    assert loader.stats["iteration"]["batches"] == 2 and loader.stats["iteration"]["samples"] == 8
    it = iter(loader)
    assert loader.stats["iteration"]["batches"] == 0 and loader.stats["iteration"]["first_batch_s"] is None
    next(it)
    assert loader.stats["iteration"]["batches"] == 1 and loader.stats["total"]["batches"] == 3
    loader.close()


@pytest.mark.parametrize("kwargs, replayed, files", [
    ({"filter_fn": bool}, 2, 2),  # the counts cannot place the position past a filter: the epoch is replayed
    ({}, 0, 1),  # otherwise the counts say where the position is: only its file is read again
    ({"shuffle_buffer": 3}, 0, 1),  # and the shuffle buffer's window that holds it (rows 6..8 at most)
])
def test_a_resumed_iteration_counts_the_batches_and_files_it_read_again_to_find_its_place(make_loader, kwargs,
                                                                                          replayed, files):
    loader = make_loader([6, 6, 6], batch_size=4, **kwargs)
    it = iter(loader)
    for _ in range(2):  # 8 samples: the first file, and 2 of the second
        next(it)
    state = loader.state_dict()
    loader.close()
    resumed = make_loader([6, 6, 6], batch_size=4, **kwargs)
    resumed.load_state_dict(state)
    assert [len(b["id"]) for b in resumed] == [4, 4, 2]
    seen = resumed.stats["iteration"]
    assert seen["resume_batches"] == replayed and seen["resume_files"] == files
    assert seen["batches"] == 3 and seen["samples"] == 10


def test_stream_mode_counts_the_rows_of_each_step(make_loader):
    loader = make_loader([5, 3, 4, 2], batch_size=2, stream=True)
    steps = list(loader)
    assert loader.stats["iteration"]["samples"] == 2 * len(steps)


def epoch_lines(caplog) -> list:
    """The INFO lines of logger ``pyloader`` about epochs (not, say, the placement ``"auto"`` chose)."""
    return [r.getMessage() for r in caplog.records
            if r.name == "pyloader" and r.levelno == logging.INFO and r.getMessage().startswith("epoch ")]


def test_each_epoch_logs_one_info_line_with_its_files_samples_time_rate_and_stall(make_loader, caplog):
    loader = make_loader([10, 7, 13], batch_size=4, num_epoch=2)
    with caplog.at_level(logging.INFO, logger="pyloader"):
        assert len(list(loader)) == 16
    lines = epoch_lines(caplog)
    assert len(lines) == 2, lines
    for epoch, line in enumerate(lines):
        assert line.startswith(f"epoch {epoch}: 3 files, 30 samples (8 batches) in "), line
        assert "samples/s" in line and "data stall" in line


def test_an_epoch_left_early_logs_no_line(make_loader, caplog):
    loader = make_loader([10, 7, 13], batch_size=4, num_epoch=2)
    with caplog.at_level(logging.INFO, logger="pyloader"):
        for k, _ in enumerate(loader, 1):
            if k == 10:  # in the second epoch
                break
    lines = epoch_lines(caplog)
    assert len(lines) == 1 and lines[0].startswith("epoch 0: 3 files, 30 samples"), lines


def test_progress_shows_a_bar_with_the_loaders_length_its_rate_and_the_stall(make_loader, capsys):
    loader = make_loader([10, 7, 13], batch_size=4, num_epoch=2, progress=True)
    assert len(list(loader)) == 16
    err = capsys.readouterr().err
    assert "pyloader" in err and "16/16" in err and "batch/s" in err
    assert "samples/s" in err and "data stall" in err


def test_a_progress_bar_left_early_is_closed(make_loader, capsys):
    loader = make_loader([10, 7, 13], batch_size=4, progress=True)
    for k, _ in enumerate(loader, 1):
        if k == 3:
            break
    loader.close()
    err = capsys.readouterr().err
    assert "3/8" in err and err.endswith("\n")  # closed: tqdm ends its line
    assert wait_no_threads() == []


def test_a_progress_bar_starts_no_thread_that_a_later_iteration_s_workers_would_be_forked_beside(tmp_path):
    """tqdm's monitor thread holds tqdm's lock at times: forked beside it, a worker could inherit it held."""
    pytest.importorskip("tqdm")
    write_chunks(tmp_path, [10, 7, 13])
    code = textwrap.dedent("""
        import sys, threading, warnings
        warnings.simplefilter("error")  # the warning about threads running at fork fails the script
        import pyloader as pl
        from pyloader.collators import NumpyCollator
        from pyloader.readers import TextLinesReader
        loader = pl.DataLoader(TextLinesReader(4), pl.IdentityDataset(), NumpyCollator(), sys.argv[1],
                               workers=2, progress=True)
        for epoch in range(2):
            assert sum(len(b["text"]) for b in loader) == 30
            assert [t.name for t in threading.enumerate()] == ["MainThread"], threading.enumerate()
        loader.close()
    """)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_progress_without_tqdm_says_what_to_install(tmp_path, monkeypatch):
    write_chunks(tmp_path, [3])
    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if it were not installed
    with pytest.raises(ImportError, match="progress=True needs tqdm"):
        pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(tmp_path), progress=True)


def test_profiler_ranges_show_the_wait_for_data_and_each_user_method(make_loader):
    torch = pytest.importorskip("torch")
    from torch._C._profiler import _ExperimentalConfig

    loader = make_loader([10, 7, 13], batch_size=4, num_workers=0)  # the profiler sees this process's threads
    with torch.profiler.profile(experimental_config=_ExperimentalConfig(profile_all_threads=True)) as prof:
        assert len(list(loader)) == 8
    names = {e.name for e in prof.events()}
    assert {"pyloader::wait", "pyloader::read", "pyloader::read_file", "pyloader::encode",
            "pyloader::batch_encode", "pyloader::collate_batch"} <= names, sorted(n for n in names if "pyloader" in n)


def test_watching_a_run_never_imports_torch(tmp_path):
    write_chunks(tmp_path, [10, 7])
    code = textwrap.dedent("""
        import sys
        import pyloader as pl
        from pyloader.collators import NumpyCollator
        from pyloader.readers import TextLinesReader
        loader = pl.DataLoader(TextLinesReader(4), pl.IdentityDataset(), NumpyCollator(), sys.argv[1])
        assert len(list(loader)) == 5 and loader.stats["iteration"]["samples"] == 17
        assert "torch" not in sys.modules
        print("clean")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                         env=env)
    assert out.stdout.strip() == "clean", out.stderr
