"""Worker faults that used to hang or hide their cause: replies that cannot be unpickled in
the loader, results that cannot be pickled in the worker, ``worker_init_fn`` raising, running
out of file descriptors, and a script that lacks the ``if __name__ == "__main__":`` guard.

Each of these reaches the consumer as one error that says what happened (and names the
file where there is one), never as a hang or a bare ``WorkerDied``.
"""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import write_chunks
from test_workers import REPO, TESTS, all_notes, consume_until_error, ids_of, nothing_left_behind  # noqa: F401
from worker_helpers import (
    EncodeDataset,
    ExitingDataset,
    ListCollator,
    LockReader,
    NumReader,
    OddResultCollator,
    recorded_workers,
    refuse_to_init,
)

import pyloader as pl

pytestmark = pytest.mark.timeout(120)


def run_script(code: str, cwd: Path, timeout: float = 100) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)])}
    script = cwd / "script.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=str(cwd))


# -- results that cannot cross the process boundary ------------------------------------------
@pytest.mark.timeout(60)
def test_a_result_that_cannot_be_unpickled_in_the_loader_fails_its_batch_naming_the_file(tmp_path):
    paths = write_chunks(tmp_path / "data", [8] * 6)
    start = time.monotonic()
    loader = pl.DataLoader(NumReader(4), EncodeDataset(), OddResultCollator(21, "rebuild"), str(tmp_path / "data"),
                           num_workers=2)
    got, err = consume_until_error(loader)
    assert time.monotonic() - start < 30
    assert ids_of(got) == list(range(20))  # every batch before the bad one, in order
    assert err.stage == "collate_batch" and err.paths == (paths[2],) and paths[2] in str(err)
    assert type(err.__cause__) is ValueError and "cannot be rebuilt here: batch of 21" in str(err)
    assert "could not be unpickled in the loader's process" in all_notes(err.__cause__)

    # only that batch fails: skipping it delivers every other one
    loader = pl.DataLoader(NumReader(4), EncodeDataset(), OddResultCollator(21, "rebuild"), str(tmp_path / "data"),
                           num_workers=2, on_error="skip")
    with loader:
        assert ids_of(loader) == [i for i in range(48) if not 20 <= i < 24]
    assert loader.stats["skipped_batches"] == 1


@pytest.mark.timeout(60)
def test_a_collate_batch_result_that_cannot_be_pickled_is_an_error_naming_the_file(tmp_path):
    paths = write_chunks(tmp_path / "data", [8] * 6)
    loader = pl.DataLoader(NumReader(4), EncodeDataset(), OddResultCollator(21, "lock"), str(tmp_path / "data"),
                           num_workers=2)
    got, err = consume_until_error(loader)
    assert ids_of(got) == list(range(20))
    assert err.stage == "collate_batch" and err.paths == (paths[2],) and paths[2] in str(err)
    cause = err.__cause__
    assert type(cause) is TypeError and "pickle" in str(cause) and "lock" in str(cause)
    assert "must be picklable" in all_notes(cause) and "in the worker process" in all_notes(cause)


@pytest.mark.timeout(60)
def test_rows_that_cannot_be_pickled_are_an_error_naming_their_file(tmp_path):
    """With a shuffle buffer the rows read in a worker come to the loader's process."""
    paths = write_chunks(tmp_path / "data", [8] * 4)
    loader = pl.DataLoader(LockReader(4, locked={"part-0002.txt"}), EncodeDataset(), ListCollator(),
                           str(tmp_path / "data"), num_workers=2, shuffle_buffer=4)
    with pytest.raises(pl.PipelineError) as info:
        list(loader)
    loader.close()
    err = info.value
    assert err.stage == "read_file" and err.paths == (paths[2],) and paths[2] in str(err)
    assert type(err.__cause__) is TypeError and "lock" in str(err.__cause__)
    assert "must be picklable" in all_notes(err.__cause__)


# -- worker_init_fn ----------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_an_exception_in_worker_init_fn_is_reported_with_its_traceback(tmp_path):
    write_chunks(tmp_path / "data", [8] * 4)
    loader = pl.DataLoader(NumReader(4), EncodeDataset(), ListCollator(), str(tmp_path / "data"),
                           num_workers=2, worker_init_fn=refuse_to_init)
    start = time.monotonic()
    with pytest.raises(pl.WorkerDied) as info:
        list(loader)
    assert time.monotonic() - start < 30
    text = str(info.value)
    assert "failed in worker_init_fn: ValueError: no device for worker" in text, text
    cause = info.value.__cause__
    assert type(cause) is ValueError and str(cause).startswith("no device for worker")
    assert "in the worker process" in all_notes(cause) and "refuse_to_init" in all_notes(cause)
    loader.close()


# -- file descriptors ----------------------------------------------------------------------------
FD_SCRIPT = """
    import os, resource
    import pyloader as pl
    from worker_helpers import BlobCollator, NumReader

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, hard))
    loader = pl.DataLoader(NumReader(1), pl.IdentityDataset(), BlobCollator(), {data!r}, num_workers=2)
"""


def test_keeping_more_batches_than_the_descriptor_limit_holds_no_descriptor(tmp_path):
    """Each batch comes in its own reply (a file per batch, files alternating between the workers),
    its arrays in a memfd mapping; 300 batches kept alive under a limit of 200 descriptors."""
    write_chunks(tmp_path / "data", [1] * 300)
    out = run_script(FD_SCRIPT.format(limit=200, data=str(tmp_path / "data")) + """
    kept = list(loader)
    open_fds = len(os.listdir("/proc/self/fd"))
    ok = [int(b["id"][0]) for b in kept] == list(range(300)) and all((b["blob"] == b["id"][0]).all() for b in kept)
    views = not any(b["blob"].flags.owndata for b in kept)  # still no copy on the way in
    print("BATCHES", len(kept), "INTACT", ok, "VIEWS", views, "FDS", open_fds)
    """, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    words = out.stdout.split()
    assert words[:6] == ["BATCHES", "300", "INTACT", "True", "VIEWS", "True"], out.stdout
    assert int(words[7]) < 100, out.stdout


def test_running_out_of_descriptors_is_reported_as_such(tmp_path):
    # 1,000 batches: far more than a run holds in flight, so some arrive after the descriptors ran out
    write_chunks(tmp_path / "data", [10] * 100)
    out = run_script(FD_SCRIPT.format(limit=256, data=str(tmp_path / "data")) + """
    it = iter(loader)
    next(it)
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    try:
        for batch in it:
            pass
        print("NO ERROR")
    except Exception as exc:
        for fd in held:
            os.close(fd)
        print("TYPE", type(exc).__name__, "ERRNO", getattr(exc, "errno", None))
        print("TEXT", str(exc).replace("\\n", " "))
    loader.close()
    """, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert lines.get("TYPE") == f"OSError ERRNO {errno.EMFILE}", out.stdout
    assert "Too many open files" in lines["TEXT"] and "ulimit -n is 256" in lines["TEXT"], out.stdout
    assert "stopped answering" not in out.stdout


# -- the __main__ guard ----------------------------------------------------------------------
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_script_without_the_main_guard_gets_one_clear_error(tmp_path, method):
    write_chunks(tmp_path / "data", [8] * 4)
    (tmp_path / "init").mkdir()
    out = run_script(f"""
        import pyloader as pl
        from worker_helpers import EncodeDataset, InitRecorder, ListCollator, NumReader

        loader = pl.DataLoader(NumReader(4), EncodeDataset(), ListCollator(), {str(tmp_path / "data")!r},
                               num_workers=2, start_method={method!r},
                               worker_init_fn=InitRecorder({str(tmp_path / "init")!r}))
        for batch in loader:
            print("BATCH")
    """, tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "BATCH" not in out.stdout
    assert out.stderr.count("Traceback") == 1, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("pyloader._errors.WorkerDied: worker ") and "could not start" in last, last
    assert 'Put the script\'s code under `if __name__ == "__main__":`' in last and method in last
    assert str(tmp_path / "script.py") in last
    assert recorded_workers(str(tmp_path / "init")) == []  # no worker got as far as worker_init_fn


@pytest.mark.parametrize("exc_type", [SystemExit, KeyboardInterrupt])
def test_an_exit_request_from_batch_encode_in_a_worker_arrives_as_itself_after_the_batches_before_it(
        tmp_path, exc_type):
    """As with threads (tests/test_engine.py): the worker lives on, the loader raises what user code raised."""
    write_chunks(tmp_path, [4] * 6)
    loader = pl.DataLoader(NumReader(4), ExitingDataset(exc_type), ListCollator(), str(tmp_path), num_workers=2)
    got = []
    with pytest.raises(exc_type) as info:
        for batch in loader:
            got.append(batch)
    if exc_type is SystemExit:
        assert info.value.code == 3
    assert "in the worker process" in "\n".join(getattr(info.value, "__notes__", []))
    assert ids_of(got) == list(range(8))  # the batches before the one that asked to exit, in order
    loader.close()



# -- what an error in a worker prints ------------------------------------------------------------
SHOWN_SCRIPT = """
    import sys
    import pyloader as pl
    from worker_helpers import ListCollator, NumReader

    class Encode(pl.Dataset):
        def batch_encode(self, batch_data):
            return encode_helper(batch_data)

    def encode_helper(batch_data):
        raise ValueError("no encoding for this batch")

    class Read(pl.DataReader):
        def read_file(self, path):
            return read_helper(path)

    def read_helper(path):
        raise ValueError("no reading this file")

    for reader, dataset in [(NumReader(4), Encode()), (Read(4), pl.IdentityDataset())]:
        for workers in (2, 0):
            try:
                with pl.DataLoader(reader, dataset, ListCollator(), {data!r}, num_workers=workers) as loader:
                    list(loader)
            except Exception:
                sys.excepthook(*sys.exc_info())
            print("=== END", file=sys.stderr, flush=True)
"""


SHOWN_CASES = [("batch_encode", "encode_helper", "no encoding for this batch")] * 2 + \
              [("read_file", "read_helper", "no reading this file")] * 2  # with 2 workers, then 0


def test_an_error_in_a_worker_shows_the_users_frames_once_and_its_message_once(tmp_path):
    write_chunks(tmp_path / "data", [8])
    out = run_script(SHOWN_SCRIPT.format(data=str(tmp_path / "data")), tmp_path)
    blocks = out.stderr.split("=== END")[:4]
    assert len(blocks) == 4, out.stderr[-3000:]
    path = str(tmp_path / "data" / "part-0000.txt")
    for block, (method, helper, message) in zip(blocks, SHOWN_CASES):
        lines = block.strip().splitlines()
        assert block.count(f", in {method}\n") == 1 and block.count(f", in {helper}\n") == 1, block
        assert [line for line in lines if line.startswith("ValueError")] == [f"ValueError: {message}"], block
        assert lines[-1] == f"pyloader.PipelineError[ValueError]: {method} failed on {path!r}: ValueError: {message}"
        assert "pyloader/_stages" not in block and "_execution/worker.py" not in block, block
        assert len(lines) < 35, block
