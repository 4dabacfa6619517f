"""The event-loop engine and the hand-over: cancelled awaits, fork(), exit requests from user code."""
from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, List

import pytest
from conftest import IdReader, ListCollator, ids_of, wait_no_threads, write_chunks
from worker_helpers import ExitingDataset

import pyloader as pl
from pyloader._execution.engine import Engine

pytestmark = pytest.mark.timeout(120)
ROOT = str(Path(__file__).resolve().parents[1])


# -- a cancelled wait loses nothing (issue 18, item 1) ---------------------------------
class GatedReader(IdReader):
    """Reads nothing until ``gate`` is set: the consumer's first waits cannot succeed."""

    def __init__(self, batch_size: int, gate: threading.Event) -> None:
        super().__init__(batch_size)
        self.gate = gate

    def read_file(self, path):
        if not self.gate.wait(60):
            raise TimeoutError("the test never opened the gate")
        return super().read_file(path)


@pytest.mark.timeout(60)
@pytest.mark.asyncio
async def test_an_async_for_wait_cancelled_by_a_timeout_loses_no_batch(make_loader):
    gate = threading.Event()
    loader = make_loader([4] * 6, batch_size=4, reader=GatedReader(4, gate), num_workers=0)  # the gate is here
    it = loader.__aiter__()
    got: List[int] = []
    timeouts = 0
    while True:
        try:
            batch = await asyncio.wait_for(it.__anext__(), 0.05)
        except asyncio.TimeoutError:
            timeouts += 1
            if timeouts == 3:  # three waits were cancelled before anything could be read
                gate.set()
            continue
        except StopAsyncIteration:
            break
        got.extend(batch["id"])
    assert got == list(range(24))


class NoThreads(concurrent.futures.ThreadPoolExecutor):
    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        raise AssertionError("async for ran a wait in the caller's executor")


@pytest.mark.timeout(60)
@pytest.mark.asyncio
async def test_async_for_waits_without_a_thread_of_the_callers_loop(make_loader):
    asyncio.get_running_loop().set_default_executor(NoThreads())
    loader = make_loader([5, 6, 7], batch_size=4, reader=IdReader(4, delay=0.05))
    got = []
    async for batch in loader:
        got.extend(batch["id"])
    assert got == list(range(18))


# -- SystemExit and KeyboardInterrupt from user code (issue 18, item 16) -----------------
def pending_tasks_of_ours() -> List[str]:
    """asyncio tasks of pyloader's code still pending (alive, never finished), after a collection."""
    gc.collect()
    return [repr(t) for t in gc.get_objects() if isinstance(t, asyncio.Task) and not t.done()
            and "pyloader" in getattr(getattr(t.get_coro(), "cr_code", None), "co_filename", "")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("exc_type", [SystemExit, KeyboardInterrupt])
def test_an_exit_request_from_batch_encode_arrives_as_itself_and_leaves_no_pending_task(
        tmp_path, caplog, exc_type):
    write_chunks(tmp_path, [4] * 6)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, logger="asyncio"):
        warnings.simplefilter("always")
        for run in range(20):
            # in this process: a worker that exits is a WorkerDied (tests/test_worker_faults.py)
            loader = pl.DataLoader(IdReader(4), ExitingDataset(exc_type), ListCollator(), str(tmp_path),
                                   workers=0)
            with pytest.raises(exc_type) as info:
                list(loader)
            if exc_type is SystemExit:
                assert info.value.code == 3
            del loader, info
            # a scan of every object costs about a second in a full test session: after the first run, and
            # after the last (a task left pending by any run is still there; one destroyed pending, logged)
            if run in (0, 19):
                assert pending_tasks_of_ours() == []
    assert [r.getMessage() for r in caplog.records] == []  # e.g. "Task was destroyed but it is pending!"
    # only warnings about this test's runs count: scanning every object can make other libraries warn,
    # and collect what earlier tests left to the garbage collector
    ours = [str(w.message) for w in caught
            if str(tmp_path) in str(w.message) or not issubclass(w.category, ResourceWarning)
            and (issubclass(w.category, RuntimeWarning) or "pyloader" in w.filename or "asyncio" in w.filename)]
    assert ours == []
    assert wait_no_threads() == []


# -- a stop that lands as the run fails ---------------------------------------------------
def test_a_stop_that_comes_as_the_run_fails_still_ends_the_loop_thread():
    ready = threading.Event()
    engines: List[Engine] = []

    async def failing_run(run_blocking: Callable, tasks: asyncio.TaskGroup) -> Any:
        async def fail() -> None:
            await run_blocking(ready.wait, 30)
            engines[0].stop(0)  # the consumer's stop (a dropped iterator), scheduled before the failure below
            raise LookupError("the run failed")

        tasks.create_task(fail())
        await asyncio.Event().wait()
        yield None

    engines.append(Engine(failing_run, max_queue_size=2, threads=2))
    ready.set()
    assert wait_no_threads(5.0) == []


# -- fork() while a loader runs (issue 18, item 11) --------------------------------------
CHILD_WAIT_S = 30.0


def in_forked_child(work: Callable[[], bool]) -> int:
    """Fork; the child runs ``work`` and leaves with ``os._exit``: 0 if it returned true, 1 if
    false, 2 if it raised. The parent waits up to ``CHILD_WAIT_S`` and returns the exit code,
    or -9 for a child that hung (killed)."""
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            code = 0 if work() else 1
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    deadline = time.monotonic() + CHILD_WAIT_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -9
        time.sleep(0.01)


def _inherited_iteration_says_it_is_dead(held: list) -> bool:
    try:
        for _ in held[1]:  # the batches of the group already handed out may still come first
            pass
    except RuntimeError as exc:
        return "fork" in str(exc)
    return False


def _closing_works(held: list) -> bool:
    held[0].close()
    return next(held[1], None) is None


def _collecting_works(held: list) -> bool:
    held.clear()
    gc.collect()
    return True


CHILD_WORK = {
    "iterate afresh": lambda held: ids_of(held[0]) == list(range(1000)),
    "close": _closing_works,
    "collect": _collecting_works,
    "use the inherited iteration": _inherited_iteration_says_it_is_dead,
}


@pytest.mark.parametrize("how", list(CHILD_WORK))
def test_a_child_forked_while_a_loader_runs_can_use_it_without_deadlock(tmp_path, how):
    write_chunks(tmp_path, [50] * 20)
    for _ in range(5):
        held = [pl.DataLoader(IdReader(4), pl.IdentityDataset(), ListCollator(), str(tmp_path), max_queue_size=2)]
        held.append(iter(held[0]))
        first = next(held[1])["id"]
        code = in_forked_child(lambda held=held: CHILD_WORK[how](held))
        assert code == 0, f"the child {'hung' if code == -9 else f'exited with {code}'}"
        assert first + ids_of(held[1]) == list(range(1000))  # the parent's run went on untouched
        held[0].close()
    assert wait_no_threads() == []


FORK_EXIT_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, sys.argv[2])
    import pyloader as pl
    from conftest import IdReader, ListCollator, ids_of

    def loader():
        return pl.DataLoader(IdReader(4), pl.IdentityDataset(), ListCollator(), sys.argv[1], max_queue_size=2)

    for _ in range(5):
        parents = loader()
        it = iter(parents)
        first = next(it)["id"]
        pid = os.fork()
        if pid == 0:
            mine = iter(loader())
            next(mine)
            sys.exit(0)  # the interpreter exits with the inherited run and its own one open
        deadline = time.monotonic() + 30
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                sys.exit("a child hung at exit")
            time.sleep(0.01)
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"a child exited with {os.waitstatus_to_exitcode(status)}")
        assert first + ids_of(it) == list(range(1000))
    print("ok")
""")


@pytest.mark.timeout(200)
def test_a_forked_child_exits_cleanly_with_a_run_inherited_from_its_parent(tmp_path):
    write_chunks(tmp_path, [50] * 20)
    done = subprocess.run([sys.executable, "-c", FORK_EXIT_SCRIPT, str(tmp_path), str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
