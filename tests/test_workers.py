"""Worker processes (``num_workers > 0``): same batches as in-process, every start method,
arrays through memfd, errors and deaths reported clearly, and nothing left behind.

The readers, datasets and collators live in ``worker_helpers`` so that ``spawn`` and
``forkserver`` workers can unpickle them.
"""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import psutil
import pytest
from conftest import STOP_WAYS, our_threads, stop_early, wait_no_children, wait_no_threads, write_chunks
from worker_helpers import EncodeDataset, InitRecorder, ListCollator, NumReader, OpenFileReader, recorded_workers

import pyloader as pl
from pyloader.collators import NumpyCollator
from pyloader.readers import NumpyReader

pytestmark = pytest.mark.timeout(120)

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

# uneven files, some empty: 89 samples whose ids run 0..88 across the files in order
SIZES = [0, 7, 13, 1, 0, 25, 4, 9, 0, 16, 3, 11]
TOTAL = sum(SIZES)


# -- helpers ---------------------------------------------------------------------------
def gone(pid: int) -> bool:
    try:
        return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def shm_entries() -> set:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


@pytest.fixture(autouse=True)
def nothing_left_behind():
    """Every test ends with no worker process and no pyloader thread."""
    shm_before = shm_entries()
    yield
    gc.collect()
    assert wait_no_children(3.0) == [], "worker processes were left behind"
    assert wait_no_threads() == [], "pyloader threads were left behind"
    new = shm_entries() - shm_before
    if new:  # other programs on the machine (torch's own DataLoader) name short-lived segments there too
        time.sleep(0.5)
        new &= shm_entries()
    assert new == set(), "something was named in /dev/shm and left there"


def ids_of(batches) -> List[int]:
    return [int(i) for b in batches for i in np.asarray(b["id"]).reshape(-1)]


def expected_ids(sizes, skip_files=()) -> List[int]:
    out, start = [], 0
    for i, n in enumerate(sizes):
        if i not in skip_files:
            out.extend(range(start, start + n))
        start += n
    return out


def assert_same_batches(got: List[Tuple[Any, Dict]], want: List[Tuple[Any, Dict]], label: str) -> None:
    assert len(got) == len(want), f"{label}: {len(got)} batches instead of {len(want)}"
    for k, ((epoch_a, a), (epoch_b, b)) in enumerate(zip(got, want)):
        assert epoch_a == epoch_b, f"{label}: batch {k} epoch {epoch_a} != {epoch_b}"
        assert list(a) == list(b), f"{label}: batch {k} keys {list(a)} != {list(b)}"
        for key in a:
            va, vb = np.asarray(a[key]), np.asarray(b[key])
            assert va.dtype == vb.dtype, f"{label}: batch {k} key {key!r} dtype {va.dtype} != {vb.dtype}"
            assert np.array_equal(va, vb), f"{label}: batch {k} key {key!r}:\n{va}\n!=\n{vb}"


def all_notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


# -- 1. determinism --------------------------------------------------------------------
CONFIGS: Dict[str, Dict[str, Any]] = {
    "plain": {},
    "file_shuffle": {"shuffle": True},
    "reader_shuffle": {"reader": {"shuffle": True, "random_seed": 7}},
    "shuffle_buffer": {"shuffle_buffer": 13, "shuffle": True},
    "drop_last": {"drop_last": True, "reader": {"batch_size": 5}},
    "two_epochs": {"num_epoch": 2, "shuffle": True, "reader": {"shuffle": True}},
    "pieces_across_files": {"reader": {"batch_size": 6, "piece": 4}},
    "stream": {"stream": pl.Stream(seq_len=3), "shuffle": True, "reader": {"batch_size": 3, "piece": 2},
               "dataset": "identity"},
    "everything": {"num_epoch": 2, "shuffle": True, "shuffle_buffer": 13, "drop_last": True,
                   "reader": {"shuffle": True, "batch_size": 5, "piece": 3}},
}


def run_config(data: str, num_workers: int, config: Dict[str, Any], seed: int = 3) -> List[Tuple[Any, Dict]]:
    config = dict(config)
    reader_kw = dict(config.pop("reader", {}))
    batch_size = reader_kw.pop("batch_size", 4)
    dataset = pl.IdentityDataset() if config.pop("dataset", None) == "identity" else EncodeDataset()
    loader = pl.DataLoader(NumReader(batch_size, **reader_kw), dataset, NumpyCollator(), data,
                           num_workers=num_workers, random_seed=seed, **config)
    with loader:
        return [(loader.epoch, batch) for batch in loader]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_same_batches_with_any_number_of_workers(tmp_path, name):
    write_chunks(tmp_path / "data", SIZES)
    data = str(tmp_path / "data")
    config = CONFIGS[name]
    want = run_config(data, 0, config)
    assert want, "the configuration yields no batch at all"
    if name == "plain":
        assert ids_of(b for _, b in want) == list(range(TOTAL))
    if not config.get("stream") and not config.get("drop_last"):
        per_epoch = config.get("num_epoch", 1)
        assert sorted(ids_of(b for _, b in want)) == sorted(list(range(TOTAL)) * per_epoch)
    for num_workers in (1, 2, 4):
        assert_same_batches(run_config(data, num_workers, config), want, f"{name}, num_workers={num_workers}")


def test_another_seed_gives_another_order_with_workers(tmp_path):
    """The comparison above is not vacuous: the shuffled order does depend on the seed."""
    write_chunks(tmp_path / "data", SIZES)
    data = str(tmp_path / "data")
    config = {"shuffle": True, "shuffle_buffer": 13}
    a = ids_of(b for _, b in run_config(data, 2, config, seed=3))
    b = ids_of(b for _, b in run_config(data, 2, config, seed=4))
    assert sorted(a) == sorted(b) == list(range(TOTAL))
    assert a != b


# -- 2. NumPy columns and large batches ----------------------------------------------------
def write_npy(folder: Path, sizes, width: int, seed: int = 0) -> np.ndarray:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    arrays = []
    for i, n in enumerate(sizes):
        arr = rng.standard_normal((n, width)).astype(np.float32)
        np.save(folder / f"chunk-{i:03d}.npy", arr)
        arrays.append(arr)
    return np.concatenate(arrays)


def collect_arrays(data: str, num_workers: int, batch_size: int, **kwargs) -> List[np.ndarray]:
    reader_kw = {k: kwargs.pop(k) for k in ("shuffle", "random_seed", "piece_size") if k in kwargs}
    loader = pl.DataLoader(NumpyReader(batch_size, **reader_kw), pl.IdentityDataset(), NumpyCollator(), data,
                           num_workers=num_workers, **kwargs)
    with loader:
        return [batch["x"] for batch in loader]


def test_numpy_columns_arrive_intact(tmp_path):
    sizes = [50, 3, 77, 1, 40, 29]
    whole = write_npy(tmp_path / "npy", sizes, width=16)
    data = str(tmp_path / "npy")
    got = collect_arrays(data, 2, 12)
    for batch in got:
        assert isinstance(batch, np.ndarray) and batch.dtype == np.float32 and batch.shape[1:] == (16,)
    assert [len(b) for b in got] == [12] * (sum(sizes) // 12) + [sum(sizes) % 12]
    assert np.array_equal(np.concatenate(got), whole)
    for kwargs in ({"shuffle": True}, {"shuffle_buffer": 20, "piece_size": 16}):
        want = collect_arrays(data, 0, 12, **dict(kwargs))
        got = collect_arrays(data, 2, 12, **dict(kwargs))
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype == np.float32 and np.array_equal(a, b)


@pytest.mark.parametrize("shuffle_buffer", [0, 300])
def test_large_batches_arrive_intact(tmp_path, shuffle_buffer):
    whole = write_npy(tmp_path / "big", [1500, 1500], width=1024, seed=1)  # 6 MB per file
    data = str(tmp_path / "big")
    got = collect_arrays(data, 2, 1024, shuffle_buffer=shuffle_buffer)  # 4 MB per batch
    assert [b.shape for b in got] == [(1024, 1024), (1024, 1024), (952, 1024)]
    assert all(b.dtype == np.float32 for b in got)
    if shuffle_buffer:
        want = collect_arrays(data, 0, 1024, shuffle_buffer=shuffle_buffer)
        for a, b in zip(got, want):
            assert np.array_equal(a, b)
    else:
        assert np.array_equal(np.concatenate(got), whole)
    gc.collect()  # the batches outlive the workers and the loader: their memory is still readable
    assert float(np.concatenate(got).sum()) == pytest.approx(float(whole.sum()), rel=1e-4)


# -- 3. worker_init_fn -----------------------------------------------------------------
def test_worker_init_fn_runs_once_per_worker(tmp_path):
    write_chunks(tmp_path / "data", SIZES)
    (tmp_path / "init").mkdir()
    loader = pl.DataLoader(NumReader(4), EncodeDataset(), ListCollator(), str(tmp_path / "data"),
                           num_workers=3, worker_init_fn=InitRecorder(str(tmp_path / "init")))
    assert ids_of(loader) == list(range(TOTAL))
    records = recorded_workers(str(tmp_path / "init"))
    assert [wid for wid, _ in records] == [0, 1, 2]
    pids = [pid for _, pid in records]
    assert len(set(pids)) == 3 and os.getpid() not in pids


# -- 4. start methods ------------------------------------------------------------------
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_every_start_method_works(tmp_path, method):
    write_chunks(tmp_path / "data", SIZES)
    data = str(tmp_path / "data")
    (tmp_path / "init").mkdir()

    def run(num_workers, **kwargs):
        loader = pl.DataLoader(NumReader(5, piece=3, shuffle=False), EncodeDataset(), ListCollator(), data,
                               shuffle=True, num_epoch=2, num_workers=num_workers, **kwargs)
        with loader:
            return list(loader)

    want = run(0)
    got = run(2, start_method=method, worker_init_fn=InitRecorder(str(tmp_path / "init")))
    assert got == want
    assert sorted(ids_of(got)) == sorted(list(range(TOTAL)) * 2)
    assert all(b["sq"] == [i * i for i in b["id"]] for b in got)
    records = recorded_workers(str(tmp_path / "init"))
    assert [wid for wid, _ in records] == [0, 1]
    assert os.getpid() not in [pid for _, pid in records]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_unpicklable_reader_is_a_clear_error(tmp_path, method):
    write_chunks(tmp_path / "data", [5, 5])

    class LocalReader(NumReader):  # defined in a function: cannot be pickled by reference
        pass

    loader = pl.DataLoader(LocalReader(4), EncodeDataset(), ListCollator(), str(tmp_path / "data"),
                           num_workers=2, start_method=method)
    start = time.monotonic()
    with pytest.raises((RuntimeError, pl.PipelineError)) as info:
        list(loader)
    assert time.monotonic() - start < 30
    text = f"{info.value} {info.value.__cause__!r}"
    assert "picklable" in text or "pickle" in text.lower(), text
    loader.close()


# -- 5. the default start method with torch and TensorFlow imported ---------------------------
def test_default_start_method_with_torch_and_tensorflow_imported(tmp_path):
    sizes = [6, 0, 11, 4, 9, 13]
    write_chunks(tmp_path / "data", sizes)
    code = textwrap.dedent(f"""
        import tensorflow as tf
        import torch
        import pyloader as pl
        from pyloader.collators import TFCollator
        from pyloader._execution.forking import start_method as default_start_method
        from worker_helpers import EncodeDataset, NumReader

        loader = pl.DataLoader(NumReader(5, piece=4), EncodeDataset(), TFCollator(), {str(tmp_path / "data")!r},
                               num_workers=2, shuffle=True)
        count, ids, kinds = 0, [], set()
        for batch in loader:
            kinds.update(type(v).__name__ for v in batch.values())
            assert all(isinstance(v, tf.Tensor) for v in batch.values()), {{k: type(v) for k, v in batch.items()}}
            assert (batch["sq"].numpy() == batch["id"].numpy() ** 2).all()
            count += int(batch["id"].shape[0])
            ids.extend(batch["id"].numpy().tolist())
        print("METHOD", default_start_method())
        print("ALL_TF", all(isinstance(v, tf.Tensor) for v in batch.values()))
        print("IDS", sorted(ids) == list(range({sum(sizes)})))
        print("COUNT", count)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]), "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, env=env,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    lines = out.stdout.splitlines()
    assert "METHOD forkserver" in lines
    assert "ALL_TF True" in lines
    assert "IDS True" in lines
    assert f"COUNT {sum(sizes)}" in lines


# -- 6. errors inside workers ----------------------------------------------------------------
def consume_until_error(loader) -> Tuple[List[Dict], BaseException]:
    got = []
    with pytest.raises(pl.PipelineError) as info:
        for batch in loader:
            got.append(batch)
    loader.close()
    return got, info.value


def test_read_file_error_keeps_type_message_and_worker_traceback(tmp_path):
    sizes = [8] * 8
    paths = write_chunks(tmp_path / "data", sizes)
    loader = pl.DataLoader(NumReader(4, fail_on={"part-0003.txt"}), EncodeDataset(), ListCollator(),
                           str(tmp_path / "data"), num_workers=2)
    got, err = consume_until_error(loader)
    assert ids_of(got) == list(range(24))  # everything before the bad file, in order
    assert err.stage == "read_file" and paths[3] in err.paths and paths[3] in str(err)
    cause = err.__cause__
    assert type(cause) is OSError and str(cause) == "disk says no to part-0003.txt"
    assert "disk says no to part-0003.txt" in str(err)
    notes = all_notes(cause)
    assert "in the worker process" in notes
    assert "refuse_to_read" in notes and "_load" in notes


@pytest.mark.parametrize("where", ["batch_encode", "collate_batch"])
def test_step_error_keeps_type_message_and_worker_traceback(tmp_path, where):
    write_chunks(tmp_path / "data", [8] * 6)
    dataset = EncodeDataset(fail_on_id=21) if where == "batch_encode" else EncodeDataset()
    collator = ListCollator(fail_on_id=21) if where == "collate_batch" else ListCollator()
    loader = pl.DataLoader(NumReader(4), dataset, collator, str(tmp_path / "data"), num_workers=2)
    got, err = consume_until_error(loader)
    assert ids_of(got) == list(range(20))
    assert err.stage == where
    cause = err.__cause__
    if where == "batch_encode":
        assert type(cause) is ValueError and str(cause) == "cannot encode sample 21"
        assert "cannot encode sample 21" in str(err)
        function = "explode_in_encode"
    else:
        assert type(cause) is KeyError and "cannot collate sample 21" in str(cause)
        assert "cannot collate sample 21" in str(err)
        function = "explode_in_collate"
    notes = all_notes(cause)
    assert "in the worker process" in notes and function in notes


def test_unpicklable_exception_in_worker_is_still_clear(tmp_path):
    paths = write_chunks(tmp_path / "data", [8] * 5)
    loader = pl.DataLoader(NumReader(4, unpicklable_on={"part-0002.txt"}), EncodeDataset(), ListCollator(),
                           str(tmp_path / "data"), num_workers=2)
    start = time.monotonic()
    got, err = consume_until_error(loader)
    assert time.monotonic() - start < 20
    assert ids_of(got) == list(range(16))
    assert "cannot pickle me, from part-0002.txt" in str(err)
    assert "UnpicklableError" in str(err)
    assert paths[2] in str(err)
    assert "in the worker process" in all_notes(err.__cause__)


# -- 7. a worker that dies -------------------------------------------------------------------
def assert_death_message(err: BaseException, how: str, records: List[Tuple[int, int]],
                         path: Optional[str] = None) -> None:
    text = str(err)
    assert how in text, text
    assert any(f"worker {wid} " in text for wid, _ in records), (text, records)
    if path is not None:
        assert path in text, text



def consume_until_death(loader) -> Tuple[List[int], BaseException, float]:
    """Iterate until the worker's death is raised: the ids delivered before, the error, when it came."""
    got = []
    with pytest.raises(RuntimeError) as info:
        for batch in loader:
            got.append(batch)
    delivered = ids_of(got)
    # rows the dead worker held for earlier batches are lost with it: what arrived is an in-order prefix
    assert delivered == list(range(len(delivered)))
    return delivered, info.value, time.monotonic()


def assert_all_cleaned_up(loader, shm_before: set) -> None:
    loader.close()
    assert wait_no_children(2.0) == []
    assert shm_entries() - shm_before == set()
    assert wait_no_threads() == []


def test_worker_killed_mid_epoch(tmp_path):
    write_chunks(tmp_path / "data", [6] * 10)
    (tmp_path / "init").mkdir()
    (tmp_path / "marks").mkdir()
    shm_before = shm_entries()
    loader = pl.DataLoader(NumReader(4, hang_on={"part-0004.txt"}, marker_dir=str(tmp_path / "marks")),
                           EncodeDataset(), ListCollator(), str(tmp_path / "data"), num_workers=2,
                           worker_init_fn=InitRecorder(str(tmp_path / "init")))
    killed: Dict[str, Any] = {}

    def killer() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            marks = os.listdir(tmp_path / "marks")
            if marks:
                pid = int(marks[0].split("-")[1])
                killed["pid"], killed["at"] = pid, time.monotonic()
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=killer)
    thread.start()
    delivered, error, raised_at = consume_until_death(loader)
    thread.join()
    assert "pid" in killed, "the reader never reached the file it hangs on"
    assert raised_at - killed["at"] < 5, "the death was not noticed within a few seconds"
    assert len(delivered) <= 24
    records = recorded_workers(str(tmp_path / "init"))
    assert killed["pid"] in [pid for _, pid in records]
    assert_death_message(error, "SIGKILL", [r for r in records if r[1] == killed["pid"]])
    assert str(killed["pid"]) in str(error)
    assert_all_cleaned_up(loader, shm_before)
    assert all(gone(pid) for _, pid in records)


def test_worker_exits_inside_read_file(tmp_path):
    paths = write_chunks(tmp_path / "data", [6] * 12)
    (tmp_path / "init").mkdir()
    shm_before = shm_entries()
    loader = pl.DataLoader(NumReader(4, exit_on={"part-0005.txt"}), EncodeDataset(), ListCollator(),
                           str(tmp_path / "data"), num_workers=2, worker_init_fn=InitRecorder(str(tmp_path / "init")))
    start = time.monotonic()
    delivered, error, raised_at = consume_until_death(loader)
    assert raised_at - start < 10
    assert len(delivered) <= 30
    records = recorded_workers(str(tmp_path / "init"))
    assert_death_message(error, "code 3", records, path=paths[5])
    assert_all_cleaned_up(loader, shm_before)


def test_worker_segfaults_inside_batch_encode(tmp_path):
    write_chunks(tmp_path / "data", [6] * 12)
    (tmp_path / "init").mkdir()
    shm_before = shm_entries()
    loader = pl.DataLoader(NumReader(4), EncodeDataset(segv_on_id=33), ListCollator(), str(tmp_path / "data"),
                           num_workers=2, worker_init_fn=InitRecorder(str(tmp_path / "init")))
    start = time.monotonic()
    delivered, error, raised_at = consume_until_death(loader)
    assert raised_at - start < 10
    assert len(delivered) <= 32  # the batch of id 33 is batch 8
    records = recorded_workers(str(tmp_path / "init"))
    assert_death_message(error, "SIGSEGV", records)
    assert_all_cleaned_up(loader, shm_before)


# -- 8. stopping early ---------------------------------------------------------------------------
@pytest.mark.parametrize("how", STOP_WAYS)
def test_stopping_early_ends_the_workers(tmp_path, how):
    sizes = [10] * 20
    write_chunks(tmp_path / "data", sizes)
    (tmp_path / "init").mkdir()

    def make():
        return pl.DataLoader(NumReader(4, delay=0.01), EncodeDataset(), ListCollator(), str(tmp_path / "data"),
                             num_workers=2, worker_init_fn=InitRecorder(str(tmp_path / "init")))

    loader = stop_early(make, how)
    records = recorded_workers(str(tmp_path / "init"))
    assert len(records) == 2
    assert wait_no_children(2.0) == []
    assert all(gone(pid) for _, pid in records)
    assert wait_no_threads() == []
    with loader:
        assert ids_of(loader) == list(range(sum(sizes)))  # a fresh pass, in full
    assert wait_no_children(2.0) == []


# -- 9. the parent killed ----------------------------------------------------------------------
def test_workers_go_when_the_parent_is_killed(tmp_path):
    write_chunks(tmp_path / "data", [8] * 30)
    (tmp_path / "init").mkdir()
    code = textwrap.dedent(f"""
        import pyloader as pl
        from worker_helpers import InitRecorder, ListCollator, NumReader

        loader = pl.DataLoader(NumReader(4, delay=0.2), pl.IdentityDataset(), ListCollator(),
                               {str(tmp_path / "data")!r}, num_workers=2,
                               worker_init_fn=InitRecorder({str(tmp_path / "init")!r}, echo=True))
        for k, batch in enumerate(loader):
            print("batch", k, flush=True)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)])}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        seen = []
        while True:
            line = proc.stdout.readline()
            assert line, f"the script ended early: {seen} {proc.stderr.read()[-2000:]}"
            seen.append(line.strip())
            if line.startswith("batch"):
                break
        records = recorded_workers(str(tmp_path / "init"))
        assert len(records) == 2
        pids = [pid for _, pid in records]
        assert all(psutil.pid_exists(pid) and not gone(pid) for pid in pids), "the workers should be running"
        assert set(psutil.Process(proc.pid).children()) >= {psutil.Process(pid) for pid in pids}
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(5)
        deadline = time.monotonic() + 5
        while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in pids if not gone(pid)] == [], "workers outlived their parent"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


# -- 10. skipping a failing file -----------------------------------------------------------------
def test_skip_policy_with_workers(tmp_path, caplog):
    sizes = [5, 9, 6, 0, 7, 12, 3, 8]
    paths = write_chunks(tmp_path / "data", sizes)
    loader = pl.DataLoader(NumReader(4, fail_on={"part-0002.txt", "part-0005.txt"}), EncodeDataset(), ListCollator(),
                           str(tmp_path / "data"), num_workers=2, on_error="skip")
    with caplog.at_level("WARNING", logger="pyloader"):
        batches = list(loader)
    ids = ids_of(batches)
    assert ids == expected_ids(sizes, skip_files={2, 5})
    assert len(ids) == len(set(ids))
    assert all(len(b["id"]) == 4 for b in batches[:-1])
    stats = loader.stats
    assert stats["skipped_files"] == 2
    assert len(stats["errors"]) == 2
    assert paths[2] in stats["errors"][0] and paths[5] in stats["errors"][1]
    assert stats["samples_read"] == len(ids)
    assert paths[2] in caplog.text and paths[5] in caplog.text


# -- 11. persistent workers ----------------------------------------------------------------------
def alive_pids(records: List[Tuple[int, int]]) -> List[int]:
    return [pid for _, pid in records if not gone(pid)]


def threads_once_settled(expected: set, timeout: float = 1.5) -> List[str]:
    """Our threads, once none but ``expected`` remain (or the timeout passed)."""
    deadline = time.monotonic() + timeout
    while set(our_threads()) - expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return our_threads()


def test_persistent_workers_serve_every_iteration_until_close(tmp_path):
    write_chunks(tmp_path / "data", SIZES)
    (tmp_path / "init").mkdir()
    config = {"num_epoch": 2, "shuffle": True, "reader": {"shuffle": True, "piece": 3}}
    want = run_config(str(tmp_path / "data"), 0, config)
    loader = pl.DataLoader(NumReader(4, shuffle=True, piece=3), EncodeDataset(), NumpyCollator(),
                           str(tmp_path / "data"), num_epoch=2, shuffle=True, random_seed=3, num_workers=2,
                           worker_init_fn=InitRecorder(str(tmp_path / "init")), persistent_workers=True)
    for run in range(3):
        loader.set_epoch(0)  # every iteration compared with the same epochs
        assert_same_batches([(loader.epoch, batch) for batch in loader], want, f"iteration {run}")
        records = recorded_workers(str(tmp_path / "init"))
        assert [wid for wid, _ in records] == [0, 1], "workers were started again"
        assert alive_pids(records) == [pid for _, pid in records], "the workers ended with the iteration"
        # the thread that started the workers stays with them (a worker ends when that thread ends)
        assert threads_once_settled({"pyloader-workers-0"}) == ["pyloader-workers-0"]
    loader.close()
    assert wait_no_children(3.0) == []
    assert alive_pids(records) == []
    loader.set_epoch(0)
    with loader:  # closed is not broken: the next iteration starts new workers
        assert_same_batches([(loader.epoch, batch) for batch in loader], want, "after close")
    assert len(recorded_workers(str(tmp_path / "init"))) == 4


@pytest.mark.parametrize("name", ["plain", "shuffle_buffer", "pieces_across_files", "stream", "everything"])
def test_persistent_workers_after_an_early_stop_give_the_next_iteration_exactly_its_batches(tmp_path, name):
    """Stopping mid-iteration leaves requests in flight and pieces kept in the workers: none of
    it may reach the next iteration (which must equal a fresh loader's output)."""
    write_chunks(tmp_path / "data", SIZES * 3)
    config = dict(CONFIGS[name])
    want = run_config(str(tmp_path / "data"), 0, config)
    reader_kw = dict(config.pop("reader", {}))
    batch_size = reader_kw.pop("batch_size", 4)
    dataset = pl.IdentityDataset() if config.pop("dataset", None) == "identity" else EncodeDataset()
    loader = pl.DataLoader(NumReader(batch_size, delay=0.002, **reader_kw), dataset, NumpyCollator(),
                           str(tmp_path / "data"), num_workers=2, random_seed=3, persistent_workers=True, **config)
    with loader:
        for after in (1, 5, 2):
            for k, _ in enumerate(loader, 1):
                if k == after:
                    break
            loader.set_epoch(0)  # the next iteration would start with the next epoch
            assert_same_batches([(loader.epoch, batch) for batch in loader], want, f"{name} after {after}")


def test_persistent_workers_forget_the_files_of_an_iteration_left_early(tmp_path):
    write_chunks(tmp_path / "data", [40] * 6)
    (tmp_path / "init").mkdir()
    loader = pl.DataLoader(OpenFileReader(4, piece=4), EncodeDataset(), ListCollator(), str(tmp_path / "data"),
                           num_workers=2, worker_init_fn=InitRecorder(str(tmp_path / "init")), persistent_workers=True)

    def open_in_workers() -> List[str]:
        pids = [pid for _, pid in recorded_workers(str(tmp_path / "init"))]
        return [f.path for pid in pids for f in psutil.Process(pid).open_files() if "part-" in f.path]

    with loader:
        for k, _ in enumerate(loader, 1):
            if k == 3:
                break  # files are left mid-read in the workers (closed as soon as they see the run ended)
        assert ids_of(loader) == list(range(240))
        assert open_in_workers() == []


def test_persistent_workers_end_when_the_loader_is_collected(tmp_path):
    write_chunks(tmp_path / "data", SIZES)
    (tmp_path / "init").mkdir()
    loader = pl.DataLoader(NumReader(4), EncodeDataset(), ListCollator(), str(tmp_path / "data"), num_workers=2,
                           worker_init_fn=InitRecorder(str(tmp_path / "init")), persistent_workers=True)
    assert ids_of(loader) == list(range(TOTAL))
    records = recorded_workers(str(tmp_path / "init"))
    assert len(alive_pids(records)) == 2
    del loader
    gc.collect()
    assert wait_no_children(3.0) == []
    assert alive_pids(records) == []
    assert wait_no_threads() == []


def test_a_run_with_forked_workers_leaves_no_descriptor_open_once_closed(tmp_path):
    # a fresh interpreter: the first run with workers is the one that could leave something behind
    write_chunks(tmp_path / "data", SIZES)
    code = textwrap.dedent(f"""
        import gc, os
        import pyloader as pl
        from worker_helpers import EncodeDataset, ListCollator, NumReader

        def fds():
            return sorted(os.listdir("/proc/self/fd"))

        before = fds()
        loader = pl.DataLoader(NumReader(4), EncodeDataset(), ListCollator(), {str(tmp_path / "data")!r},
                               num_workers=2, start_method="fork")
        print("IDS", sum(len(b["id"]) for b in loader))
        loader.close()
        del loader
        gc.collect()
        print("NEW", [os.readlink("/proc/self/fd/" + fd) for fd in fds() if fd not in before])
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert out.stdout.splitlines() == [f"IDS {TOTAL}", "NEW []"]


@pytest.mark.parametrize("mid_iteration", [False, True])
def test_persistent_workers_end_at_interpreter_exit(tmp_path, mid_iteration):
    write_chunks(tmp_path / "data", SIZES)
    (tmp_path / "init").mkdir()
    code = textwrap.dedent(f"""
        import pyloader as pl
        from worker_helpers import EncodeDataset, InitRecorder, ListCollator, NumReader

        loader = pl.DataLoader(NumReader(4), EncodeDataset(), ListCollator(), {str(tmp_path / "data")!r},
                               workers=pl.Workers(2, init_fn=InitRecorder({str(tmp_path / "init")!r}),
                                                  persistent=True))
        print("IDS", sum(len(b["id"]) for b in loader))
        it = iter(loader)
        if {mid_iteration!r}:
            next(it)
        print("EXITING", flush=True)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert out.stdout.split() == ["IDS", str(TOTAL), "EXITING"]
    assert out.stderr == ""
    records = recorded_workers(str(tmp_path / "init"))
    assert len(records) == 2
    deadline = time.monotonic() + 5
    while alive_pids(records) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive_pids(records) == []


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_a_persistent_worker_killed_between_epochs_is_reported_then_replaced(tmp_path, start_method):
    # forkserver: the dead worker is the server's child, so is_alive() here learns of its end late
    write_chunks(tmp_path / "data", SIZES)
    (tmp_path / "init").mkdir()
    loader = pl.DataLoader(NumReader(4), EncodeDataset(), ListCollator(), str(tmp_path / "data"), num_workers=2,
                           worker_init_fn=InitRecorder(str(tmp_path / "init")), persistent_workers=True,
                           start_method=start_method)
    with loader:
        assert ids_of(loader) == list(range(TOTAL))
        first = recorded_workers(str(tmp_path / "init"))
        os.kill(first[0][1], signal.SIGKILL)
        deadline = time.monotonic() + 5
        while not gone(first[0][1]) and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(pl.WorkerDied, match=rf"worker 0 \(pid {first[0][1]}\) was killed by SIGKILL"):
            list(loader)
        loader.set_epoch(1)
        assert ids_of(loader) == list(range(TOTAL))
        assert len(recorded_workers(str(tmp_path / "init"))) == 4
        assert alive_pids(first) == []


def test_persistent_workers_need_workers_when_none_are_asked_for(tmp_path):
    write_chunks(tmp_path / "data", [3])
    with pytest.raises(ValueError, match=r"Workers.persistent=True keeps worker processes: it needs processes > 0"):
        pl.DataLoader(NumReader(4), EncodeDataset(), ListCollator(), str(tmp_path / "data"),
                      workers=pl.Workers(0, persistent=True))


def test_a_worker_serves_bookkeeping_then_the_next_piece_of_a_file_under_way_then_batches_then_new_files():
    from collections import deque

    from pyloader._execution.worker import _next_request

    inbox = deque([("next", 1, 7, 70, False), ("run", 2, []), ("next", 3, 5, 50, False), ("encode", 4, []),
                   ("release", [9]), ("next", 5, 5, 51, False)])
    order = [_next_request(inbox, {5})[1] for _ in range(6)]
    # release; the pieces of file 5, which is under way; the batches in turn; file 7, not started, last
    assert order == [[9], 3, 5, 2, 4, 1]


class PidReader(pl.DataReader):
    """Each row says which process read it."""

    def read_file(self, path):
        with open(path) as f:
            ids = [int(line) for line in f]
        return {"id": ids, "read_in": [os.getpid()] * len(ids)}, len(ids)


class RanIn(pl.Dataset):
    def batch_encode(self, batch):
        return {**batch, "ran_in": [os.getpid()] * len(batch["id"])}


def test_a_batch_spanning_two_workers_files_runs_in_the_worker_that_read_most_of_its_rows(tmp_path):
    write_chunks(tmp_path, [10] * 12)
    with pl.DataLoader(PidReader(batch_size=12), RanIn(), ListCollator(), str(tmp_path), num_workers=2) as loader:
        batches = [b for b in loader]
    assert sorted(i for b in batches for i in b["id"]) == list(range(120))
    spanning = [b for b in batches if len(set(b["read_in"])) == 2]
    assert len(spanning) >= 8  # files alternate between the workers, and batches of 12 cross files of 10
    for b in spanning:
        most = max(dict.fromkeys(b["read_in"]), key=b["read_in"].count)  # on a tie, the first file's
        assert set(b["ran_in"]) == {most}, b


class SlowIdReader(pl.DataReader):
    """``read_file`` takes a while (each file's parse, as a slow reader's); ``iter_file`` gives the same rows."""

    def __init__(self, streaming: bool) -> None:
        super().__init__(batch_size=4)
        if streaming:
            self.iter_file = self._pieces  # type: ignore[method-assign]

    def read_file(self, path):
        time.sleep(0.2)
        with open(path) as f:
            ids = [int(line) for line in f]
        return {"id": ids}, len(ids)

    def _pieces(self, path):
        yield self.read_file(path)[0]


@pytest.mark.parametrize("streaming", [False, True], ids=["whole_file", "streaming"])
def test_a_worker_runs_the_batch_of_a_file_it_just_read_before_reading_the_next_file_ahead(tmp_path, streaming):
    """The loader sends the next file to read ahead before the batch that needs the rows just read (as
    at a run's start): the worker waits a little for that batch rather than parse the next file first.
    With a streaming reader the file's end is a reply of its own, and the wait follows it."""
    from types import SimpleNamespace

    from pyloader._execution import ipc
    from pyloader._execution.reading import FileTask
    from pyloader._execution.worker import _Server

    paths = write_chunks(tmp_path, [5, 5])
    ours, theirs = ipc.channel_pair()
    server = _Server(theirs, SimpleNamespace(value=-1), SimpleNamespace(value=0), SlowIdReader(streaming),
                     [("collate_batch", lambda batch: batch)], None)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        ipc.send(ours, ("open", 0, FileTask(epoch=0, pos=0, index=0, path=paths[0]), None), gen=0)
        ipc.send(ours, ("next", 1, 0, 10, False), gen=0)
        assert ipc.recv(ours)[0] == 1  # the file's piece, kept under 10
        if streaming:
            ipc.send(ours, ("next", 2, 0, 11, False), gen=0)
            tag, _, (ok, reply) = ipc.recv(ours)
            assert (tag, ok, reply) == (2, True, None)  # the file ends
        ipc.send(ours, ("open", 3, FileTask(epoch=0, pos=1, index=1, path=paths[1]), None), gen=0)
        ipc.send(ours, ("next", 4, 3, 12, False), gen=0)
        time.sleep(0.002)  # the batch is sent a moment later, once the loader has cut it
        ipc.send(ours, ("run", 5, [([(10, 0, 4)], (paths[0],), None)]), gen=0)
        tag, _, (ok, reply) = ipc.recv(ours)
        assert (tag, ok) == (5, True)  # the batch first, not after the next file's parse
        assert reply[0][0] and list(reply[0][1].open()["id"]) == [0, 1, 2, 3]
        assert ipc.recv(ours)[0] == 4  # then the file read ahead
    finally:
        ours.close()
        thread.join(timeout=10)
    assert not thread.is_alive()
