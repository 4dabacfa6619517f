"""``num_workers="auto"``, the default: where user methods run, decided at each iteration.

These tests clear ``PYLOADER_NUM_WORKERS`` and ``LOCAL_WORLD_SIZE`` if the environment sets them. The
end-to-end ones run a script in a fresh interpreter, as a user's program would run: whether
TensorFlow was imported by another test of this session must not decide what they see.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any, Dict, List, Sequence

import numpy as np
import pytest
from conftest import IdReader, ListCollator, write_chunks

import pyloader as pl
from pyloader._execution.auto_workers import MAX_WORKERS, Placer, cpu_share, place
from pyloader.collators import TorchCollator
from pyloader.readers import NumpyReader, TextLinesReader

REPO = Path(__file__).resolve().parents[1]
CPUS = len(os.sched_getaffinity(0))


@pytest.fixture(autouse=True)
def no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYLOADER_NUM_WORKERS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


class PythonReader(pl.DataReader):
    def read_file(self, path: str) -> Any:
        with open(path) as f:
            ids = [int(line) for line in f]
        return {"id": ids}, len(ids)


class MyNumpyReader(NumpyReader):
    def read_file(self, path: str) -> Any:  # a method of its own: no longer declared
        return super().read_file(path)


def test_objects_that_all_release_the_gil_stay_in_this_process() -> None:
    got = place("auto", [NumpyReader(4), pl.IdentityDataset(), TorchCollator()], "fork")
    assert got.num_workers == 0 and "releases the GIL" in got.why


def test_python_user_code_gets_one_worker_per_cpu_of_the_process_share() -> None:
    got = place("auto", [PythonReader(4), pl.IdentityDataset(), TorchCollator()], "fork")
    expected = 0 if cpu_share() < 2 else min(cpu_share(), MAX_WORKERS)
    assert got.num_workers == expected, got


def test_a_subclass_defining_its_own_method_is_python_code_again() -> None:
    got = place("auto", [MyNumpyReader(4), pl.IdentityDataset(), TorchCollator()], "fork")
    assert "releases the GIL" not in got.why


def test_the_cpus_are_shared_among_the_processes_of_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(CPUS))  # one CPU per rank
    assert cpu_share() == 1
    got = place("auto", [PythonReader(4), pl.IdentityDataset(), ListCollator()], "fork")
    assert got.num_workers == 0 and "1 CPU" in got.why


def test_a_given_num_workers_is_kept() -> None:
    assert place(3, [PythonReader(4)], None).num_workers == 3
    assert place(0, [PythonReader(4)], "fork").num_workers == 0


def test_the_environment_variable_replaces_the_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYLOADER_NUM_WORKERS", "1")
    got = place("auto", [NumpyReader(4)], None)
    assert got.num_workers == 1 and "PYLOADER_NUM_WORKERS=1" in got.why
    assert place(0, [PythonReader(4)], None).num_workers == 0  # a given value wins


@pytest.mark.parametrize("value", ["two", "-1", "1.5"])
def test_a_bad_environment_variable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("PYLOADER_NUM_WORKERS", value)
    with pytest.raises(ValueError, match="PYLOADER_NUM_WORKERS"):
        place("auto", [PythonReader(4)], None)


@pytest.mark.parametrize("value", ["many", -1, 1.5, True])
def test_a_bad_number_of_workers_is_refused_at_construction(tmp_path: Path, value: Any) -> None:
    write_chunks(tmp_path / "d", [3])
    with pytest.raises(ValueError, match="workers must be 'auto' or an integer >= 0"):
        pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(tmp_path / "d"), workers=value)
    with pytest.raises(ValueError, match=r"Workers\.processes must be 'auto' or an integer >= 0"):
        pl.Workers(value)


def test_the_choice_is_logged_once_while_it_holds(caplog: pytest.LogCaptureFixture) -> None:
    placer = Placer("auto", "fork")
    with caplog.at_level(logging.INFO, logger="pyloader"):
        for _ in range(3):
            placer([NumpyReader(4), pl.IdentityDataset()])
    lines = [r.getMessage() for r in caplog.records if "num_workers='auto'" in r.getMessage()]
    assert lines == ["num_workers='auto': 0 worker processes (every user object releases the GIL "
                     "(releases_gil = True))"]


def test_the_placement_is_in_the_stats_and_the_epoch_is_complete(tmp_path: Path) -> None:
    folder = tmp_path / "npy"
    folder.mkdir()
    for i in range(3):
        np.save(folder / f"part-{i}.npy", np.arange(i * 10, i * 10 + 10, dtype=np.int64).reshape(10, 1))
    loader = pl.DataLoader(NumpyReader(4), pl.IdentityDataset(), TorchCollator(), str(folder))
    got = sorted(int(x) for batch in loader for x in batch["x"].flatten())
    assert got == list(range(30))
    assert loader.stats["placement"]["num_workers"] == 0


SCRIPT = """
import json, os, sys
import pyloader as pl
{imports}

class PidReader(pl.DataReader):
    def read_file(self, path):
        with open(path) as f:
            ids = [int(line) for line in f]
        return {{"id": ids, "pid": [os.getpid()] * len(ids)}}, len(ids)

class Keep(pl.DataCollator):
    def collate_batch(self, features):
        return dict(features)

if __name__ == "__main__":
    runs = []
    for options in json.loads(sys.argv[2]):  # one loader after the other, as a program may make several
        loader = pl.DataLoader(PidReader(4), pl.IdentityDataset(), Keep(), sys.argv[1], shuffle=True, **options)
        out = []
        for epoch in range(2):
            batches = list(loader)
            out.append({{"ids": sorted(i for b in batches for i in b["id"]),
                         "pids": sorted({{p for b in batches for p in b["pid"]}})}})
        runs.append({{"epochs": out, "main": os.getpid(), "placement": loader.stats["placement"]}})
        loader.close()
    print(json.dumps(runs))
"""


def run_script(folder: Path, imports: str = "", options: Sequence[Dict[str, Any]] = ({},),
               env: Dict[str, str] | None = None) -> List[Dict[str, Any]]:
    """A user's program in a fresh interpreter: a loader for each of ``options`` in turn, each iterated
    twice; what each one saw."""
    data = folder / "data"
    write_chunks(data, [7, 5, 9, 4, 6])
    script = folder / "user_script.py"
    script.write_text(textwrap.dedent(SCRIPT.format(imports=imports)))
    environ = {k: v for k, v in os.environ.items() if k not in ("PYLOADER_NUM_WORKERS", "LOCAL_WORLD_SIZE")}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    environ.update(env or {})
    done = subprocess.run([sys.executable, str(script), str(data), json.dumps(list(options))], capture_output=True,
                          text=True, timeout=180, env=environ)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def default_script(tmp_path_factory: pytest.TempPathFactory) -> List[Dict[str, Any]]:
    """One program under the defaults: a loader, then one with persistent workers (one interpreter for both)."""
    return run_script(tmp_path_factory.mktemp("default"), options=[{}, {"persistent_workers": True}])


@pytest.mark.timeout(240)
def test_a_user_script_with_python_code_starts_workers_and_places_its_files_by_measurement(
        default_script: List[Dict[str, Any]]) -> None:
    got = default_script[0]
    expected = 0 if cpu_share() < 2 else min(cpu_share(), MAX_WORKERS)
    assert got["placement"]["num_workers"] == expected
    for epoch in got["epochs"]:
        assert epoch["ids"] == list(range(31))  # every sample once, every epoch
        if expected:  # five small files: the trial's first window, in threads (tests/test_measured_placement.py)
            assert len(set(epoch["pids"]) - {got["main"]}) <= expected
        else:
            assert epoch["pids"] == [got["main"]]
    if expected:
        assert got["placement"]["measured"]["place"] in ("threads", "workers")


@pytest.mark.timeout(240)
def test_persistent_workers_follow_the_default(default_script: List[Dict[str, Any]]) -> None:
    got = default_script[1]
    decided = ("num_workers", "why", "start_method")
    assert {k: got["placement"].get(k) for k in decided} == {k: default_script[0]["placement"].get(k) for k in decided}
    assert all(epoch["ids"] == list(range(31)) for epoch in got["epochs"])


@pytest.mark.timeout(240)
def test_a_user_script_that_imported_tensorflow_keeps_its_code_in_this_process(tmp_path: Path) -> None:
    [got] = run_script(tmp_path, imports="import tensorflow")
    assert got["placement"]["num_workers"] == 0 and "fork" in got["placement"]["why"]
    assert all(epoch["pids"] == [got["main"]] and epoch["ids"] == list(range(31)) for epoch in got["epochs"])


@pytest.mark.timeout(240)
def test_the_environment_variable_keeps_a_script_in_its_process(tmp_path: Path) -> None:
    [got] = run_script(tmp_path, env={"PYLOADER_NUM_WORKERS": "0"})
    assert got["placement"] == {"num_workers": 0, "why": "PYLOADER_NUM_WORKERS=0"}
    assert all(epoch["pids"] == [got["main"]] for epoch in got["epochs"])


def _reader_starting_a_thread_of_ours(lasts: float, gone: threading.Event) -> pl.DataReader:
    """A reader (of a local class: it cannot be pickled for forkserver) that starts a thread named as
    pyloader's when the launch asks for its imports, after the placement: as a dropped iterator's
    finalizer starts one to stop its run. The thread lasts ``lasts`` seconds, or until ``gone`` is set."""

    class Reader(PythonReader):
        @property
        def worker_imports(self) -> tuple:
            threading.Thread(target=gone.wait, args=(lasts,), name="pyloader-stop", daemon=True).start()
            return ()

    return Reader(4)


@pytest.mark.skipif(cpu_share() < 2, reason="'auto' starts no worker with under 2 CPUs for the process")
@pytest.mark.parametrize("lasts", [0.2, 30.0])
def test_a_thread_of_ours_beginning_after_the_placement_never_makes_auto_start_workers_another_way(
        tmp_path: Path, lasts: float) -> None:
    """A thread that ends soon is waited for, and the workers are forked; one that stays keeps the user's
    code in this process. Never the fork server, which needs picklable objects the user never promised."""
    # with TensorFlow imported 'auto' would keep everything in this process from the start: the tests that
    # import it run last (conftest)
    assert "tensorflow" not in sys.modules
    write_chunks(tmp_path, [7, 5, 9])
    gone = threading.Event()
    loader = pl.DataLoader(_reader_starting_a_thread_of_ours(lasts, gone), pl.IdentityDataset(), ListCollator(),
                           str(tmp_path))
    try:
        assert sorted(i for batch in loader for i in batch["id"]) == list(range(21))
    finally:
        gone.set()
        loader.close()
    placement = loader.stats["placement"]
    if lasts < 1:
        assert placement["num_workers"] == min(cpu_share(), MAX_WORKERS) and placement["start_method"] == "fork"
    else:
        assert placement["num_workers"] == 0 and "pyloader-stop" in placement["why"], placement


def test_text_lines_are_parsed_by_python_code() -> None:
    assert "releases the GIL" not in place("auto", [TextLinesReader(4), pl.IdentityDataset()], "fork").why
