"""Starting worker processes safely under the default settings (``_execution.forking``, ``_execution.pool``):
no fork while a thread of ours runs, nothing a forked child can do to the workers, every death reported,
one consumer per loader, and the README's usage started in many fresh interpreters."""
from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import ListCollator, write_chunks
from worker_helpers import EncodeDataset, InitRecorder, NumReader, recorded_workers

import pyloader as pl
from pyloader._execution import forking

TESTS = Path(__file__).parent
REPO = TESTS.parent
# The fresh-interpreter start: forty interpreters, two at a time (the CI machine has 2 cores); the project's
# own checks start hundreds more, outside the suite.
VARIANTS = {"plain": 16, "importing": 4, "tokenizer": 8, "forked": 5, "forked-run": 4, "torch": 3}


def _fresh_start(variant: str, folder: Path) -> subprocess.CompletedProcess:
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "true"}
    env.pop("PYLOADER_NUM_WORKERS", None)
    try:
        return subprocess.run([sys.executable, str(TESTS / "fresh_start.py"), variant, str(folder)],
                              capture_output=True, text=True, timeout=90, env=env)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(exc.cmd, -1, str(exc.stdout), f"hung (no end after 90 s): {exc.stderr}")


def _ok(out: subprocess.CompletedProcess) -> bool:
    return out.returncode == 0 and any(line.startswith("OK ") for line in out.stdout.splitlines())


@pytest.mark.timeout(600)  # about 25 s on a quiet 2-core machine; each run has its own 90 s
def test_the_readme_usage_starts_in_forty_fresh_interpreters_without_a_hang(tmp_path):
    runs = [(variant, tmp_path / f"{variant}-{k}") for variant, count in VARIANTS.items() for k in range(count)]
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda run: (run[0], _fresh_start(*run)), runs))
    failed = [(variant, out.returncode, out.stdout[-500:] + out.stderr[-1500:])
              for variant, out in done if not _ok(out)]
    assert len(done) >= 40
    assert failed == [], f"{len(failed)} of {len(done)} failed; first: {failed[:2]}"


def test_a_user_thread_importing_a_module_while_workers_start_does_not_hang_them(tmp_path):
    # before the fix the workers were forked while the user's thread held the module's import lock:
    # the reader's import of it in the workers waited forever
    out = _fresh_start("importing", tmp_path / "run")
    assert _ok(out), out.stdout + out.stderr[-3000:]


@pytest.mark.parametrize("variant", ["forked", "forked-run"])
def test_a_child_forked_by_the_training_script_cannot_touch_the_workers_when_it_exits(tmp_path, variant):
    out = _fresh_start(variant, tmp_path / "run")
    assert _ok(out), out.stdout + out.stderr[-3000:]
    assert "WorkerDied" not in out.stderr


class _ForkWatch:
    """Which thread forks, and which other threads of ours run then (an at-fork hook, on while ``on``)."""

    def __init__(self) -> None:
        self.on = False
        self.seen: list = []
        os.register_at_fork(before=self._before)

    def _before(self) -> None:
        if self.on:
            self.seen.append((threading.current_thread().name, forking.busy_threads_of_ours()))


_watch = _ForkWatch()


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_are_forked_by_an_idle_launcher_while_no_other_thread_of_ours_runs(tmp_path, persistent):
    write_chunks(tmp_path / "data", [30] * 6)
    loader = pl.DataLoader(NumReader(4), EncodeDataset(), ListCollator(), str(tmp_path / "data"), num_workers=2,
                           persistent_workers=persistent, start_method="fork")
    _watch.seen.clear()
    _watch.on = True
    try:
        with loader:
            for _ in range(2):
                assert len(list(loader)) == 45
    finally:
        _watch.on = False
    assert len(_watch.seen) == (2 if persistent else 4)
    for thread, others in _watch.seen:
        assert thread.startswith(forking.LAUNCHER) and others == [], _watch.seen


def test_a_worker_killed_while_idle_is_reported_as_worker_died(tmp_path):
    # one file: worker 0 reads it and runs its batches, worker 1 waits for work
    write_chunks(tmp_path / "data", [4000])
    (tmp_path / "init").mkdir()
    loader = pl.DataLoader(NumReader(4, piece=4), EncodeDataset(), ListCollator(),
                           str(tmp_path / "data"), num_workers=2, max_queue_size=2,
                           worker_init_fn=InitRecorder(str(tmp_path / "init")))
    with loader:
        it = iter(loader)
        next(it)
        deadline = time.monotonic() + 30
        while len(recorded_workers(str(tmp_path / "init"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        idle = dict(recorded_workers(str(tmp_path / "init")))[1]
        os.kill(idle, signal.SIGKILL)
        with pytest.raises(pl.WorkerDied, match=rf"worker 1 \(pid {idle}\) was killed by SIGKILL while waiting"):
            for _ in it:
                pass


def test_two_threads_iterating_one_loader_never_get_a_silent_short_epoch(tmp_path):
    write_chunks(tmp_path / "data", [20] * 5)
    outcomes = []
    for _ in range(40):
        loader = pl.DataLoader(NumReader(4), EncodeDataset(), ListCollator(), str(tmp_path / "data"), num_workers=0)
        results: dict = {}

        def consume(name: str, loader: pl.DataLoader = loader, results: dict = results) -> None:
            try:
                results[name] = len([i for batch in loader for i in batch["id"]])
            except RuntimeError as exc:
                results[name] = str(exc)

        threads = [threading.Thread(target=consume, args=(name,)) for name in "ab"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        loader.close()
        outcomes.extend(results.values())
    short = [o for o in outcomes if isinstance(o, int) and o != 100]
    assert len(outcomes) == 80 and short == [], outcomes
    assert all("newer iter()" in o for o in outcomes if isinstance(o, str))


def test_workers_start_with_torch_imported_when_the_collator_needs_it(tmp_path):
    write_chunks(tmp_path / "data", [8, 8])
    code = f"""
import sys
import textwrap
import pyloader as pl
from pyloader.collators import TorchCollator
from worker_helpers import NumReader, EncodeDataset

def init(worker_id):
    print("TORCH", worker_id, "torch" in sys.modules, flush=True)

assert "torch" not in sys.modules
loader = pl.DataLoader(NumReader(4), EncodeDataset(), TorchCollator(), {str(tmp_path / "data")!r}, num_workers=2,
                       worker_init_fn=init)
print("BATCHES", len(list(loader)))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = sorted(line for line in out.stdout.splitlines() if line.startswith("TORCH"))
    assert lines == ["TORCH 0 True", "TORCH 1 True"], out.stdout
    assert "BATCHES 4" in out.stdout


def test_forking_while_a_user_thread_runs_warns_naming_it_and_the_fix(tmp_path):
    write_chunks(tmp_path / "data", [8])
    stop = threading.Event()
    user = threading.Thread(target=stop.wait, args=(30,), name="user-metrics-uploader")
    user.start()
    try:
        loader = pl.DataLoader(NumReader(4), EncodeDataset(), ListCollator(), str(tmp_path / "data"),
                               num_workers=2, start_method="fork")
        with pytest.warns(RuntimeWarning, match=r"user-metrics-uploader.*start_method='forkserver'"):
            assert len(list(loader)) == 2
    finally:
        stop.set()
        user.join()


def test_workers_of_a_loader_started_while_another_iterates_use_the_fork_server(tmp_path):
    write_chunks(tmp_path / "data", [40] * 4)
    data = str(tmp_path / "data")
    outer = pl.DataLoader(NumReader(4), EncodeDataset(), ListCollator(), data, num_workers=0, max_queue_size=1)
    with outer:
        it = iter(outer)
        next(it)
        deadline = time.monotonic() + 10
        while not forking.busy_threads_of_ours() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert forking.start_method() == "forkserver"
        explicit = pl.DataLoader(NumReader(4), EncodeDataset(), ListCollator(), data, num_workers=2)
        with explicit:
            assert sorted(i for b in explicit for i in b["id"]) == list(range(160))
            assert explicit.stats["placement"]["start_method"] == "forkserver"
        auto = pl.DataLoader(NumReader(4), EncodeDataset(), ListCollator(), data)
        with auto:
            assert len(list(auto)) == 40
            assert auto.stats["placement"]["num_workers"] == 0
        assert len([b for b in it]) == 39


THREADS_SCRIPT = """
    import threading, time, warnings
    from concurrent.futures import ThreadPoolExecutor
    import pyloader as pl
    from worker_helpers import EncodeDataset, ListCollator, NumReader

    def train(settle=0.0, **options):
        time.sleep(settle)  # for the thread that started this one to be in join() or result() by the fork
        with pl.DataLoader(NumReader(4), EncodeDataset(), ListCollator(), {data!r}, num_workers=2, **options) as loader:
            return len(list(loader))

    def forked():
        return [str(w.message) for w in seen if "forked" in str(w.message)]

    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loop = threading.Thread(target=train, args=(0.2,))
        loop.start()
        loop.join()
        with ThreadPoolExecutor(1) as pool:
            pool.submit(train, 0.2).result()
        print("WAITING", forked(), flush=True)
        loop = threading.Thread(target=train)
        loop.start()
        while loop.is_alive():
            sum(range(100))
        print("BUSY", forked(), flush=True)
        seen.clear()
        stop = threading.Event()
        user = threading.Thread(target=stop.wait, name="uploader")
        user.start()
        train(persistent_workers=True)
        stop.set()
        print("PERSISTENT", forked(), flush=True)
"""


def test_a_fork_warning_names_only_threads_that_can_run_meanwhile_with_advice_that_fits_them(tmp_path):
    write_chunks(tmp_path / "data", [8, 8])
    script = tmp_path / "threads.py"
    script.write_text(textwrap.dedent(THREADS_SCRIPT.format(data=str(tmp_path / "data"))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)])}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    said = {line.split(" ", 1)[0]: ast.literal_eval(line.split(" ", 1)[1]) for line in out.stdout.splitlines()}
    assert said.get("WAITING") == [], out.stdout + out.stderr[-3000:]  # the main thread waits for the loop
    busy, = said["BUSY"]  # the main thread runs while another thread iterates: it is named, and cannot start later
    assert "(MainThread)" in busy and "Iterate the loader from the main thread" in busy, busy
    assert "after the loader's first iteration" not in busy and "start_method='forkserver'" in busy, busy
    persistent, = said["PERSISTENT"]  # the workers are kept already: no advice to keep them
    assert "(uploader)" in persistent and "Start uploader after the loader's first iteration" in persistent
    assert "persistent_workers" not in persistent, persistent
