"""Errors, shutdown, async iteration, arguments and data_dir forms."""
from __future__ import annotations

import asyncio
import gc
import logging
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import numpy as np
import pytest
from conftest import IdReader, ListCollator, ids_of, wait_no_children, wait_no_threads, write_chunks

import pyloader as pl

pytestmark = pytest.mark.timeout(60)


# -- errors ------------------------------------------------------------------------
def test_read_error_names_the_file_and_chains_the_cause(make_loader):
    loader = make_loader([4, 4, 4], batch_size=4, reader=IdReader(4, fail_on={"part-0001.txt"}))
    got = []
    with pytest.raises(pl.PipelineError) as info:
        for batch in loader:
            got.extend(batch["id"])
    assert "part-0001.txt" in str(info.value) and "read_file" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    assert got == [0, 1, 2, 3]  # in order: what precedes the broken file, nothing after it


def test_read_error_in_the_first_file_is_raised_not_hung(make_loader):
    loader = make_loader([4], batch_size=4, reader=IdReader(4, fail_on={"part-0000.txt"}))
    with pytest.raises(pl.PipelineError, match="part-0000.txt"):
        list(loader)


def test_skip_policy_warns_counts_and_delivers_the_rest(make_loader, caplog):
    loader = make_loader([4, 4, 4], batch_size=4, reader=IdReader(4, fail_on={"part-0001.txt"}), on_error="skip")
    with caplog.at_level(logging.WARNING, logger="pyloader"):
        got = ids_of(loader)
    assert got == [0, 1, 2, 3, 8, 9, 10, 11]
    assert loader.stats["skipped_files"] == 1 and len(loader.stats["errors"]) == 1
    assert any("part-0001.txt" in r.getMessage() for r in caplog.records)


def test_callable_policy_and_max_errors(make_loader):
    seen = []
    loader = make_loader([2] * 6, batch_size=2, on_error=pl.OnError(seen.append, max_errors=1),
                         reader=IdReader(2, fail_on={"part-0001.txt", "part-0003.txt"}))
    with pytest.raises(pl.TooManyErrors):
        list(loader)
    assert [e.paths for e in seen] == [(loader.files[1],), (loader.files[3],)]


class Boom(RuntimeError):
    pass


class FailingDataset(pl.Dataset):
    def batch_encode(self, batch):
        if 5 in batch["id"]:
            raise Boom("cannot encode five")
        return batch


class FailingCollator(ListCollator):
    def collate_batch(self, features):
        if 9 in features["id"]:
            raise Boom("cannot collate nine")
        return super().collate_batch(features)


@pytest.mark.parametrize("stage,kwargs", [("batch_encode", {"dataset": FailingDataset()}),
                                          ("collate_batch", {"collator": FailingCollator()})])
def test_user_method_errors_reach_the_consumer(make_loader, stage, kwargs):
    loader = make_loader([3, 3, 3, 3], batch_size=4, **kwargs)
    with pytest.raises(pl.PipelineError) as info:
        list(loader)
    assert stage in str(info.value) and isinstance(info.value.__cause__, Boom)
    assert any(p in str(info.value) for p in loader.files)


def test_skipped_batch_is_counted(make_loader):
    loader = make_loader([4, 4, 4], batch_size=4, dataset=FailingDataset(), on_error="skip")
    assert ids_of(loader) == [0, 1, 2, 3, 8, 9, 10, 11]
    assert loader.stats["skipped_batches"] == 1


def test_mismatched_lengths_name_the_file_and_key(tmp_path):
    write_chunks(tmp_path, [3])

    class Bad(pl.DataReader):
        def read_file(self, path):
            return {"a": [1, 2, 3], "b": [1, 2]}, 3

    with pytest.raises(pl.PipelineError) as info:
        list(pl.DataLoader(Bad(2), pl.IdentityDataset(), ListCollator(), str(tmp_path)))
    assert isinstance(info.value.__cause__, ValueError)
    assert "part-0000.txt" in str(info.value) and "'b'" in str(info.value)


def test_files_with_different_keys_cannot_share_a_batch(tmp_path):
    write_chunks(tmp_path, [3, 3])

    class Odd(IdReader):
        def read_file(self, path):
            cols, n = super().read_file(path)
            return ({"other": cols["id"]} if path.endswith("1.txt") else cols), n

    with pytest.raises(ValueError, match="part-0001.txt"):
        list(pl.DataLoader(Odd(4), pl.IdentityDataset(), ListCollator(), str(tmp_path)))


# -- shutdown ------------------------------------------------------------------------
def test_break_stops_everything_and_reiteration_is_clean(make_loader):
    loader = make_loader([50] * 20, batch_size=4, max_queue_size=2)
    for _ in loader:
        break
    assert wait_no_threads(1.0) == []
    assert ids_of(loader) == list(range(1000))


def test_close_and_context_manager(make_loader):
    loader = make_loader([50] * 20, batch_size=4)
    it = iter(loader)
    next(it)
    loader.close()
    assert wait_no_threads(1.0) == []
    with pytest.raises(StopIteration):
        next(it)
    with loader as same:
        next(iter(same))
    assert wait_no_threads(1.0) == []


def test_dropping_the_loader_stops_its_threads(tmp_path):
    write_chunks(tmp_path, [50] * 20)
    loader = pl.DataLoader(IdReader(4), pl.IdentityDataset(), ListCollator(), str(tmp_path), max_queue_size=2)
    it = iter(loader)
    next(it)
    ref = weakref.ref(loader)
    del it, loader
    gc.collect()
    assert ref() is None
    assert wait_no_threads(1.0) == []


def test_an_exception_in_the_training_loop_stops_the_pipeline(make_loader):
    loader = make_loader([50] * 20, batch_size=4)

    def train():
        for _ in loader:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train()
    gc.collect()
    assert wait_no_threads(1.0) == []


def _no_order(files, epoch, rng):
    raise LookupError("no order today")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_length_that_fails_inside_list_leaves_no_thread_or_process_behind(make_loader, num_workers):
    # list() calls iter() (the run starts) and then len(), which plans with file_order and raises
    loader = make_loader([5, 7, 3], batch_size=4, file_order=_no_order, num_workers=num_workers)
    for _ in range(2):
        with pytest.raises(LookupError, match="no order today"):
            list(loader)
        assert wait_no_threads(5.0) == [] and wait_no_children(5.0) == []
    loader.close()
    assert wait_no_threads(1.0) == []


class _CountFails(IdReader):
    def count(self, path):
        if path.endswith("part-0001.txt"):
            raise OSError("the index is gone")
        return super().count(path)


@pytest.mark.filterwarnings("ignore:pyloader. worker processes are forked while other threads")
@pytest.mark.parametrize("user_thread", [False, True], ids=["alone", "beside-a-user-thread"])
@pytest.mark.parametrize("failing", ["count", "file_order", "read_file"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_failed_iteration_is_freed_without_the_garbage_collector(make_loader, failing, num_workers, user_thread):
    """No reference cycle keeps a failed iteration (its threads waiting for a consumer) until a collection;
    a thread of the user's running makes the fork look at every thread's frames."""
    stop = threading.Event()
    if user_thread:
        threading.Thread(target=stop.wait, name="user-thread", daemon=True).start()
    settings = {"count": {"reader": _CountFails(4), "ranks": pl.Ranks(rank=0, world_size=2)},
                "file_order": {"file_order": _no_order},
                "read_file": {"reader": IdReader(4, fail_on={"part-0002.txt"})}}[failing]
    loader = make_loader([5, 7, 3], batch_size=4, num_workers=num_workers, **settings)
    gc.collect()
    gc.disable()
    try:
        with pytest.raises((pl.PipelineError, LookupError)):
            list(loader)  # iter(), then len(), which counts the files (and may fail), then the batches
        assert [o for o in gc.get_objects() if isinstance(o, pl.LoaderIterator)] == []
        assert wait_no_threads(5.0) == [] and wait_no_children(5.0) == []
    finally:
        gc.enable()
        stop.set()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_list_of_a_loader_whose_length_is_unknown_delivers_every_sample_and_leaves_nothing(make_loader,
                                                                                           num_workers):
    loader = make_loader([5, 7, 3], batch_size=4, filter_fn=lambda s: s["id"] % 2 == 0, num_workers=num_workers)
    with pytest.raises(TypeError, match="length is unknown"):
        len(loader)
    for _ in range(2):  # list() takes len()'s TypeError as "no length hint"
        assert ids_of(list(loader)) == list(range(0, 15, 2))
        assert wait_no_threads(2.0) == [] and wait_no_children(2.0) == []
    loader.close()


def test_slow_user_method_does_not_block_close(tmp_path):
    write_chunks(tmp_path, [4] * 5)
    loader = pl.DataLoader(IdReader(4, delay=0.3), pl.IdentityDataset(), ListCollator(), str(tmp_path))
    it = iter(loader)
    next(it)
    t = time.monotonic()
    loader.close()
    assert time.monotonic() - t < 1.0
    assert wait_no_threads(1.0) == []


# -- async ---------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_async_for_inside_a_running_loop(make_loader):
    loader = make_loader([5, 6, 7], batch_size=4, num_epoch=2)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    got = []
    async for batch in loader:
        got.extend(batch["id"])
    task.cancel()
    assert got == list(range(18)) * 2
    assert ticks > 0  # the user's loop kept running while we waited


@pytest.mark.asyncio
async def test_async_errors_are_raised(make_loader):
    loader = make_loader([4, 4], batch_size=4, reader=IdReader(4, fail_on={"part-0001.txt"}))
    with pytest.raises(pl.PipelineError, match="part-0001.txt"):
        async for _ in loader:
            pass


# -- arguments and data_dir ------------------------------------------------------------
def test_abstract_classes_need_their_method():
    for cls in (pl.DataReader, pl.Dataset, pl.DataCollator):
        with pytest.raises(TypeError):
            cls()

    class NoRead(pl.DataReader):
        pass

    with pytest.raises(TypeError):
        NoRead()


@pytest.mark.parametrize("kwargs,match", [({"num_epoch": 0}, "num_epoch"), ({"max_queue_size": 0}, "max_queue_size"),
                                          ({"shuffle_buffer": -1}, "shuffle_buffer"),
                                          ({"on_error": "ignore"}, "on_error"), ({"num_threads": 0}, "Workers.threads"),
                                          ({"num_threads": True}, "Workers.threads"),
                                          ({"num_threads": 1.5}, "Workers.threads")])
def test_bad_arguments_fail_at_construction(tmp_path, kwargs, match):
    write_chunks(tmp_path, [3])
    with pytest.raises(ValueError, match=match):
        pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(tmp_path), **kwargs)


def test_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        IdReader(0)


def test_wrong_component_type(tmp_path):
    write_chunks(tmp_path, [3])
    with pytest.raises(TypeError, match="dataset"):
        pl.DataLoader(IdReader(2), object(), ListCollator(), str(tmp_path))


def test_folder_is_walked_recursively_sorted_without_hidden(tmp_path):
    write_chunks(tmp_path / "b", [2], prefix="x")
    write_chunks(tmp_path / "a" / "deep", [2], prefix="y")
    (tmp_path / ".hidden").write_text("1\n")
    (tmp_path / "a" / ".secret.txt").write_text("1\n")
    files = pl.list_files(str(tmp_path))
    assert [f[len(str(tmp_path)):] for f in files] == ["/a/deep/y-0000.txt", "/b/x-0000.txt"]


def test_glob_and_list_forms(tmp_path):
    paths = write_chunks(tmp_path, [2, 3, 4])
    assert pl.list_files(str(tmp_path / "*.txt")) == paths
    assert pl.list_files(paths[::-1]) == paths[::-1]
    loader = pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), [paths[2], paths[0]])
    assert ids_of(loader) == [5, 6, 7, 8, 0, 1]


@pytest.mark.parametrize("spec", ["missing-folder", "*.nothing", []])
def test_nothing_found_says_what_was_searched(tmp_path, spec):
    if isinstance(spec, str):
        spec = str(tmp_path / spec)
    with pytest.raises(FileNotFoundError) as info:
        pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), spec)
    if spec:
        assert spec in str(info.value)


def test_import_has_no_side_effects():
    code = textwrap.dedent("""
        import logging, random, sys
        import numpy as np
        random.seed(5); np.random.seed(5)
        state, np_state = random.getstate(), np.random.get_state()[1].copy()
        handlers = list(logging.getLogger().handlers)
        import pyloader, pyloader.readers, pyloader.collators
        assert random.getstate() == state
        assert (np.random.get_state()[1] == np_state).all()
        assert logging.getLogger().handlers == handlers and not logging.getLogger("pyloader").handlers
        assert "torch" not in sys.modules and "tensorflow" not in sys.modules
        assert set(pyloader.__all__) <= set(dir(pyloader))
        print("clean")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "clean", out.stderr


# -- memory bound ----------------------------------------------------------------------
def test_files_in_memory_are_bounded_by_settings(tmp_path):
    """However many files, only a fixed number of file payloads are alive at once."""
    write_chunks(tmp_path, [64] * 60)
    alive, peak = set(), [0]
    lock = threading.Lock()

    class Tracked(pl.DataReader):
        def read_file(self, path):
            ids = np.loadtxt(path, dtype=np.int64)
            payload = np.zeros((len(ids), 256))
            key = id(payload)
            with lock:
                alive.add(key)
                peak[0] = max(peak[0], len(alive))
            weakref.finalize(payload, alive.discard, key)
            return {"id": ids, "payload": payload}, len(ids)

    class Drop(pl.DataCollator):
        def collate_batch(self, features):
            return {"id": features["id"].tolist()}

    # threads: every payload is in this process (with workers, 4 groups a worker are in flight; they hold
    # the rows of the files that measured faster in threads, and the others are in the workers)
    loader = pl.DataLoader(Tracked(16), pl.IdentityDataset(), Drop(), str(tmp_path),
                           max_queue_size=3, prefetch_files=2, num_workers=0)
    got = []
    for batch in loader:
        got.extend(batch["id"])
        time.sleep(0.001)  # a slower consumer: read-ahead must stop, not pile up
    assert got == list(range(64 * 60))
    # prefetch_files read ahead + the file being batched + the 2 batch stages' slices
    assert peak[0] <= 2 + 1 + 4, peak[0]


EXIT_SCRIPT = """
import json, os, sys, tempfile
import torch
import pyloader as pl
from pyloader.collators import TorchCollator
from pyloader.readers import JsonLinesReader
folder = tempfile.mkdtemp()
for i in range(8):
    with open(os.path.join(folder, f"{i}.jsonl"), "w") as f:
        f.writelines(json.dumps({"x": [j] * 32, "y": j}) + "\\n" for j in range(2000))
loader = pl.DataLoader(JsonLinesReader(128), pl.IdentityDataset(), TorchCollator(), folder)
for k, batch in enumerate(loader):
    if k == 20:
        break
if sys.argv[1] == "close":
    loader.close()
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["close", "no-close"])
def test_process_exits_cleanly_right_after_stopping(how):
    """Threads still inside torch while the interpreter shuts down used to abort the process."""
    root = str(__import__("pathlib").Path(__file__).resolve().parents[1])
    # four processes at once (each spends most of its time importing torch): the same four exits
    runs = [subprocess.Popen([sys.executable, "-c", EXIT_SCRIPT, how], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env={**__import__("os").environ, "PYTHONPATH": root})
            for _ in range(4)]
    try:
        for run in runs:
            _, stderr = run.communicate(timeout=90)
            assert run.returncode == 0, stderr[-2000:]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()


def test_the_executor_shut_down_by_a_finalizer_inside_its_own_call_does_not_hang():
    """The garbage collector can run a dropped loader's finalizer anywhere Python allocates: inside the
    executor's ``submit`` (holding its lock), or on one of its own threads. Either stops it, and returns."""
    import concurrent.futures
    import threading

    from pyloader._execution.threads import DaemonExecutor

    ex = DaemonExecutor(2, "pyloader-test")
    ex.submit(lambda: None).result(timeout=5)
    done = threading.Event()

    def inside_submit():
        with ex._lock:  # as a finalizer run during ``submit`` finds it
            ex.shutdown(wait=True, cancel_futures=True, timeout=1)
        done.set()
    t = threading.Thread(target=inside_submit, daemon=True)
    t.start()
    t.join(10)
    assert done.is_set(), "shutting the executor down inside its own submit hung"

    other = DaemonExecutor(1, "pyloader-test")
    own = other.submit(lambda: other.shutdown(wait=True, timeout=1))
    assert concurrent.futures.wait([own], timeout=10).done and own.exception() is None


def test_a_dropped_iterators_finalizer_run_on_a_thread_of_ours_inside_its_pools_lock_stops_its_run_from_another(
        tmp_path):
    """The garbage collector may run the finalizer on a thread of pyloader's inside one of its locks (the
    loop thread stopping the pool): it must not wait there; another thread stops the run, and nothing is left."""
    write_chunks(tmp_path, [10, 10])
    loader = pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(tmp_path), workers=2)
    it = iter(loader)
    next(it)
    found = it._finalizer.peek()  # type: ignore[attr-defined]
    assert found is not None
    pool = found[2][2]
    assert pool is not None, "a run with workers has its pool"
    returned = threading.Event()

    def as_if_collected_in_the_pools_stop():
        with pool._lock:
            it._finalizer()  # type: ignore[attr-defined]
        returned.set()
    t = threading.Thread(target=as_if_collected_in_the_pools_stop, name="pyloader-loop-test", daemon=True)
    t.start()
    t.join(10)
    assert returned.is_set(), "the finalizer waited, on a thread of ours, for a lock that thread held"
    assert wait_no_threads(timeout=10) == []
    assert wait_no_children(timeout=10) == []
