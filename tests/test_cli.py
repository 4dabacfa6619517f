"""``python -m pyloader``: ``inspect``, ``bench`` and ``index``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import numpy as np
import pytest

from pyloader import _cli
from pyloader._execution import auto_workers

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[1]


def write_jsonl(folder: Path, sizes: List[int]) -> List[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths, next_id = [], 0
    for i, size in enumerate(sizes):
        path = folder / f"part-{i}.jsonl"
        path.write_text("".join(json.dumps({"id": next_id + j, "text": f"s{next_id + j}"}) + "\n" for j in range(size)))
        next_id += size
        paths.append(path)
    return paths


def run(argv: List[str]) -> "tuple[int, List[str]]":
    lines: List[str] = []
    return _cli.main(argv, out=lines.append), lines


def test_inspect_lists_each_file_with_its_size_and_samples_and_prints_a_first_batch(tmp_path):
    paths = write_jsonl(tmp_path / "data", [5, 7])
    rc, lines = run(["inspect", str(tmp_path / "data"), "--reader", "jsonl", "--batch-size", "3"])
    assert rc == 0, lines
    for path, n in zip(paths, (5, 7), strict=True):
        (row,) = [line for line in lines if line.endswith(str(path))]
        assert row.split()[:3] == [str(path.stat().st_size), "B", str(n)]  # small files: sizes in bytes
    assert any(line.startswith("2 files, ") and line.endswith(", 12 samples") for line in lines), lines
    assert "  id: ndarray int64 (3,): [0 1 2]" in lines
    assert "  text: list of 3 str: ['s0', 's1', 's2']" in lines


def test_inspect_lists_a_file_that_cannot_be_counted_with_its_error(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "a.npy", np.arange(6))
    (data / "b.npy").write_bytes(b"not an npy file")
    rc, lines = run(["inspect", str(data), "--reader", "npy"])
    assert rc == 1
    assert any(line.split()[-2:] == ["error", str(data / "b.npy")] for line in lines), lines
    assert any(line.startswith("error: count failed on ") and "b.npy" in line for line in lines), lines
    assert any(line.startswith("error: read_file failed on ") and "b.npy" in line for line in lines), lines
    assert any(line.startswith("  x: ndarray int64 (6,)") for line in lines), lines  # the first batch, without b.npy


def test_an_unavailable_reader_is_a_clear_error(tmp_path, monkeypatch, capsys):
    write_jsonl(tmp_path / "data", [3])
    monkeypatch.setitem(sys.modules, "pyloader.readers._parquet", None)  # as if it were not there
    rc, _ = run(["inspect", str(tmp_path / "data"), "--reader", "parquet"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "the parquet reader (pyloader.readers._parquet.ParquetReader) is not available" in err


def test_nothing_to_read_is_an_error_naming_what_was_searched(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    rc, _ = run(["bench", str(tmp_path / "empty"), "--reader", "jsonl"])
    assert rc == 1 and str(tmp_path / "empty") in capsys.readouterr().err


def test_bench_times_each_number_of_workers_and_recommends_one(tmp_path, capsys):
    write_jsonl(tmp_path / "data", [40, 30, 30])
    rc, lines = run(["bench", str(tmp_path / "data"), "--reader", "jsonl", "--workers", "0,1", "--batch-size", "8"])
    assert rc == 0, lines
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("bench: ")] == [
        f"bench: timing workers={w!r} ({k} of 3), one epoch in a new process" for k, w in ((1, 0), (2, 1), (3, "auto"))]
    rows = {line.split()[0]: line.split() for line in lines[1:3]}
    assert set(rows) == {"0", "1"}, lines
    for row in rows.values():
        assert float(row[1].replace(",", "")) > 0 and row[2] == "100" and row[5] == "MiB" and float(row[4]) > 0
    assert lines[-1].startswith("recommended: workers="), lines


def test_waiting_for_a_setting_says_how_long_it_has_run_until_it_ends(monkeypatch):
    monkeypatch.setattr(_cli, "PROGRESS_EVERY_S", 0.01)
    read, write = os.pipe()  # the child runs until the second tick closes this
    child = subprocess.Popen([sys.executable, "-c", f"import os; os.read({read}, 1)"], pass_fds=(read,),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.close(read)
    ticks: List[float] = []

    def tick(seconds: float) -> None:
        ticks.append(seconds)
        if len(ticks) == 2:
            os.close(write)
    assert _cli._wait(child, 60, tick) == ("", "") and child.returncode == 0
    assert len(ticks) >= 2 and ticks == sorted(ticks)


def test_bench_reports_settings_that_fail_and_recommends_nothing(tmp_path):
    write_jsonl(tmp_path / "data", [10])
    rc, lines = run(["bench", str(tmp_path / "data"), "--reader", "jsonl", "--workers", "0", "--timeout", "0.001"])
    assert rc == 1
    assert "failed: took longer than --timeout 0.001 s" in lines[1]
    assert lines[-1] == "no setting ran: nothing to recommend"


@pytest.mark.parametrize("reader", ["jsonl", "npy"])
def test_bench_times_the_default_and_recommends_it_with_where_it_ran(tmp_path, monkeypatch, reader):
    monkeypatch.delenv(auto_workers.ENV, raising=False)
    data = tmp_path / "data"
    if reader == "jsonl":
        write_jsonl(data, [30, 30])
    else:
        data.mkdir()
        for i in range(2):
            np.save(data / f"part-{i}.npy", np.arange(30 * i, 30 * i + 30))
    rc, lines = run(["bench", str(data), "--reader", reader, "--workers", "1", "--batch-size", "8"])
    assert rc == 0, lines
    (marked,) = [line for line in lines if "<- the default: ran in " in line]
    assert marked.split()[0] == "auto" and marked.split()[2] == "60", lines
    placed = marked.split("<- the default: ran in ")[1]
    recommended = lines[-1]
    if "measured: workers=1 was" in "\n".join(lines):  # the advice follows the measurement
        assert recommended.startswith(f'recommended: workers=1 (measured fastest here; the default, workers="auto", '
                                      f'which ran in {placed} here ('), lines
    else:
        assert recommended.startswith(f'recommended: workers="auto" (the default), which ran in {placed} here ('), lines
    if reader == "npy":  # every object releases the GIL: no worker is started, nothing to measure
        assert placed == "threads" and "releases the GIL" in lines[-1], lines
    elif auto_workers.cpu_share() >= 2:  # workers started: each file placed by measurement
        assert placed in ("workers", "threads", "workers, then threads", "workers, batches spread")
        assert "workers started; measur" in lines[-1]


def test_a_setting_measured_faster_than_the_default_is_the_one_found():
    def results(default_rate):
        return [_cli.Result(0, samples_per_s=900.0), _cli.Result(1, samples_per_s=1000.0),
                _cli.Result(3, error="died"), _cli.Result("auto", samples_per_s=default_rate)]
    assert _cli.faster_than_default(results(900.0), 0.05).workers == 1
    assert _cli.faster_than_default(results(980.0), 0.05) is None  # within the tolerance
    assert _cli.faster_than_default(results(1200.0), 0.05) is None  # the default is the fastest
    assert _cli.faster_than_default([*results(900.0)[:3], _cli.Result("auto", error="died")], 0.05) is None


@pytest.mark.parametrize("settled", [True, False])
def test_a_faster_setting_is_explained_when_the_run_ended_during_the_defaults_trial(settled):
    lines: list = []
    default = _cli.Result("auto", samples_per_s=900.0, memory="m", placed="workers",
                          why="2 workers started; measuring: the run ended before the trial did", settled=settled)
    _cli._recommend([_cli.Result(0, samples_per_s=1000.0, memory="m"), default], 0.05, lines.append)
    assert lines[1] == "measured: workers=0 was 11% faster than the default on this data", lines
    trial = [line for line in lines if "trial of where to run the files" in line]
    assert trial == ([] if settled else ["  this run ended during the default's trial of where to run the files: for "
                                         "runs as short as this one, workers=0 skips that trial; a longer run may "
                                         "settle the default on it"]), lines
    assert lines[-1].startswith('recommended: workers=0 (measured fastest here; the default, workers="auto", which '
                                'ran in workers here'), lines


def test_the_advice_follows_the_measurement():
    for default_rate, advice in ((650.0, "recommended: workers=1 (measured fastest here"),
                                 (980.0, 'recommended: workers="auto" (the default)')):
        lines: list = []
        _cli._recommend([_cli.Result(1, samples_per_s=1000.0, memory="m"),
                         _cli.Result("auto", samples_per_s=default_rate, memory="m", placed="threads", why="w")],
                        0.05, lines.append)
        assert lines[-1].startswith(advice), lines


def test_bench_memory_is_the_whole_process_tree_with_every_worker(tmp_path):
    # enough batches for the run to outlast many of the sampler's 20 ms rounds on a busy machine
    write_jsonl(tmp_path / "data", [3000] * 8)
    rc, lines = run(["bench", str(tmp_path / "data"), "--reader", "jsonl", "--workers", "0,2", "--batch-size", "4"])
    assert rc == 0, lines
    processes = {line.split()[0]: int(line.split()[6]) for line in lines[1:] if line.split()[0] in ("0", "2")}
    assert processes == {"0": 1, "2": 3}, lines  # the measured process, then it and its two workers
    assert "memory: peak of the summed RSS of the process and its workers" in "\n".join(lines)


TREE = """
import os, sys
held = b"x" * (64 << 20)  # 64 MiB resident in the parent, inherited by both children
for _ in range(2):
    if os.fork() == 0:
        own = b"y" * (64 << 20)
        os.write(1, b"ready\\n")  # one write: lines of the three processes do not interleave
        sys.stdin.read()
        os._exit(0)
os.write(1, b"ready\\n")
sys.stdin.read()
os.wait(); os.wait()
"""


def test_tree_memory_sums_the_resident_memory_of_a_process_and_its_descendants():
    child = subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        with _cli.TreeMemory(child.pid) as memory:
            assert [child.stdout.readline() for _ in range(3)] == ["ready\n"] * 3  # bounded by the module timeout
            seen = memory.samples
            while memory.samples < seen + 2:  # two samples taken with all three ready
                time.sleep(0.01)
    finally:
        child.communicate("", timeout=30)
    assert memory.processes == 3
    assert memory.peak >= (64 + 2 * 128) << 20  # each child: the inherited 64 MiB and its own


def test_the_measured_process_runs_no_thread_of_the_bench_when_its_workers_are_forked(tmp_path):
    write_jsonl(tmp_path / "data", [30, 30])
    spec = {"data": str(tmp_path / "data"), "reader": "jsonl", "batch_size": 4, "workers": 2, "max_batches": 0}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "pyloader", "_measure", json.dumps(spec)], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert "other threads of this process run" not in out.stderr, out.stderr
    assert json.loads(out.stdout.splitlines()[-1])["samples"] == 60


def test_bad_workers_are_refused_by_the_argument_parser(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        _cli.main(["bench", str(tmp_path), "--reader", "jsonl", "--workers", "0,-1"])
    assert info.value.code == 2 and "numbers of workers >= 0" in capsys.readouterr().err


def test_python_dash_m_pyloader_runs_the_command_line(tmp_path):
    write_jsonl(tmp_path / "data", [4])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "pyloader", "inspect", str(tmp_path / "data"), "--reader", "jsonl"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "1 files, " in out.stdout and "first batch" in out.stdout


def test_index_writes_every_files_count_next_to_the_data_and_reuses_what_still_matches(tmp_path):
    paths = write_jsonl(tmp_path / "data", [5, 7, 3])
    rc, lines = run(["index", str(tmp_path / "data"), "--reader", "jsonl"])
    assert rc == 0, lines
    index = json.loads((tmp_path / "data" / "_pyloader_counts.json").read_text())
    assert {name: e["count"] for name, e in index["files"].items()} == {"part-0.jsonl": 5, "part-1.jsonl": 7,
                                                                       "part-2.jsonl": 3}
    assert index["key"]["reader"] == "pyloader.readers._jsonl.JsonLinesReader"
    assert "15 samples" in lines[0] and "3 counted" in lines[0]
    paths[2].unlink()
    rc, lines = run(["index", str(tmp_path / "data"), "--reader", "jsonl"])
    assert rc == 0 and "2 from the index there, 0 counted" in lines[0]
    assert lines[1:] == ["in the old index, no longer in the data: part-2.jsonl"]
    assert "part-2.jsonl" not in json.loads((tmp_path / "data" / "_pyloader_counts.json").read_text())["files"]


def test_index_names_a_file_that_cannot_be_counted_and_leaves_it_out(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "a.npy", np.arange(6))
    (data / "b.npy").write_bytes(b"not an npy file")
    rc, lines = run(["index", str(data), "--reader", "npy"])
    assert rc == 1
    assert any(line.startswith("error: count failed on ") and "b.npy" in line for line in lines), lines
    assert {name: e["count"] for name, e in json.loads((data / "_pyloader_counts.json").read_text())["files"].items()} \
        == {"a.npy": 6}


def test_index_progress_without_tqdm_is_an_error_naming_the_progress_extra(tmp_path, monkeypatch, capsys):
    write_jsonl(tmp_path / "data", [4])
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm: ImportError, as when it is not installed
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    rc, lines = run(["index", str(tmp_path / "data"), "--reader", "jsonl", "--progress"])
    assert rc == 1 and lines == []
    assert capsys.readouterr().err.strip() == (
        "pyloader: error: --progress needs tqdm: pip install tqdm (or the 'progress' extra of pyloader-ml: "
        "pip install 'pyloader-ml[progress]')")
    assert not (tmp_path / "data" / "_pyloader_counts.json").exists()


def test_image_shards_are_inspected_and_indexed_with_the_tar_reader(tmp_path):
    import tarfile
    from io import BytesIO

    pil = pytest.importorskip("PIL.Image")
    (tmp_path / "shards").mkdir()
    for s in range(2):
        with tarfile.open(tmp_path / "shards" / f"shard-{s}.tar", "w") as tar:
            for i in range(3):
                image = BytesIO()
                pil.new("RGB", (8, 6), (i, s, 0)).save(image, format="PNG")
                for ext, data in (("png", image.getvalue()), ("cls", str(i % 2).encode())):
                    info = tarfile.TarInfo(f"{s}{i:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, BytesIO(data))
    rc, lines = run(["inspect", str(tmp_path / "shards"), "--reader", "tar", "--batch-size", "2"])
    assert rc == 0, lines
    assert lines[3] == "2 files, 20.0 KiB, 6 samples" and "  png: ndarray uint8 (2, 6, 8, 3): [0 0 0 0] ..." in lines
    rc, lines = run(["index", str(tmp_path / "shards"), "--reader", "tar"])
    assert rc == 0 and "2 files, 6 samples" in lines[0], lines


def test_the_index_is_written_readable_by_everyone_the_umask_allows(tmp_path):
    write_jsonl(tmp_path / "data", [4])
    old = os.umask(0o027)  # this process's only; restored below
    try:
        rc, lines = run(["index", str(tmp_path / "data"), "--reader", "jsonl"])
    finally:
        os.umask(old)
    assert rc == 0, lines
    assert (tmp_path / "data" / "_pyloader_counts.json").stat().st_mode & 0o777 == 0o640  # 0666 less the umask
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["_pyloader_counts.json", "part-0.jsonl"]  # no .tmp
