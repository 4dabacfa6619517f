"""Shared test helpers: small chunk files of numbered samples, and readers over them."""
from __future__ import annotations

import contextlib
import gc
import inspect
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import psutil
import pytest

import pyloader as pl

_TENSORFLOW = ("tensorflow", "TFCollator", "to_tf_dataset")


@pytest.fixture(scope="session", autouse=True)
def _own_cache_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Placements remembered by the suite's runs go to a folder of the session's (fresh interpreters it
    starts too), not to the user's ``~/.cache``: a run of the suite starts as a first run does."""
    if "PYLOADER_CACHE_DIR" not in os.environ:
        os.environ["PYLOADER_CACHE_DIR"] = str(tmp_path_factory.mktemp("pyloader-cache"))


def _uses_tensorflow(item: pytest.Item) -> bool:
    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        source = ""
    named = source + item.nodeid  # a parameter's id names it where the test's source does not
    return "tf" in getattr(item, "fixturenames", ()) or any(word in named for word in _TENSORFLOW)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: List[pytest.Item]) -> None:
    """Tests that may import TensorFlow run last: once it is imported, ``num_workers="auto"`` keeps user
    code in threads (forking TensorFlow is unsafe), and every test after it would no longer run the
    default placement that a user's process without TensorFlow gets."""
    for item in items:
        if _uses_tensorflow(item):
            item.add_marker("tensorflow")
    items.sort(key=lambda item: item.get_closest_marker("tensorflow") is not None)  # stable: order kept within


def write_chunks(folder: Path, sizes: Sequence[int], prefix: str = "part") -> List[str]:
    """One text file per size; sample ids run 0..sum(sizes)-1 across files in order."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, next_id = [], 0
    for i, size in enumerate(sizes):
        path = folder / f"{prefix}-{i:04d}.txt"
        path.write_text("".join(f"{next_id + j}\n" for j in range(size)))
        next_id += size
        paths.append(str(path))
    return paths


class IdReader(pl.DataReader):
    """Reads one integer id per line; optional per-file delay and failure."""

    def __init__(self, batch_size=4, shuffle=False, random_seed=42, delay=0.0, fail_on=(), calls=None):
        super().__init__(batch_size, shuffle=shuffle, random_seed=random_seed)
        self.delay = delay
        self.fail_on = set(fail_on)
        self.calls = calls

    def read_file(self, path):
        if self.delay:
            time.sleep(self.delay)
        if self.calls is not None:
            self.calls.append(path)
        if os.path.basename(path) in self.fail_on:
            raise OSError(f"disk says no to {os.path.basename(path)}")
        with open(path) as f:
            ids = [int(line) for line in f if line.strip()]
        return {"id": ids}, len(ids)


class ListCollator(pl.DataCollator):
    def collate_batch(self, features: Dict[str, list]) -> Dict[str, list]:
        return {k: list(v) for k, v in features.items()}


def ids_of(batches) -> List[int]:
    return [i for b in batches for i in b["id"]]


def take(loader: pl.DataLoader, it: Iterator[Dict[str, list]], k: int) -> List[Tuple[Optional[int], List[int]]]:
    """The next ``k`` batches of ``it`` (an iteration of ``loader``): each as the epoch the loader
    reports after it, and its ids."""
    got = []
    for _ in range(k):
        ids = list(next(it)["id"])
        got.append((loader.epoch, ids))
    return got


def take_steps(make: Callable[[int, int], pl.DataLoader], world_size: int, steps: int,
               real: Callable[[Dict[str, Any]], List[int]],
               state: Optional[Dict[str, Any]] = None) -> Tuple[List[int], Optional[Dict[str, Any]]]:
    """Every rank of ``world_size`` (``make(rank, world_size)``, resumed from ``state``) takes ``steps``
    steps of epoch 0: the samples they delivered (``real(batch)`` of each batch), and rank 0's state
    after them (through JSON)."""
    delivered: List[int] = []
    saved = None
    for rank in range(world_size):
        loader = make(rank, world_size)
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        for _ in range(steps):
            delivered += real(next(it))
        assert loader.epoch == 0
        saved = saved or json.loads(json.dumps(loader.state_dict()))
        it.close()
    return delivered, saved


def spread_positions(epochs: Sequence[Optional[int]]) -> List[int]:
    """The positions of a run of ``n = len(epochs)`` batches (``epochs``: ``loader.epoch`` after each)
    that a resume check keeps where checking all of them would repeat itself: the first two, the
    last two, every epoch boundary and the batch after it, and the middle of each epoch. For
    ``check_resume(make, positions=spread_positions)``."""
    n = len(epochs)
    starts = [0] + [k for k in range(1, n) if epochs[k] != epochs[k - 1]]
    middles = [(a + b) // 2 for a, b in zip(starts, starts[1:] + [n])]
    return sorted({p for p in [0, 1, n - 1, n, *starts, *(k + 1 for k in starts), *middles] if 0 <= p <= n})


def state_after(loader: pl.DataLoader, steps: int) -> Dict[str, Any]:
    """``loader``'s state after ``steps`` batches of a new iteration (through JSON, as a checkpoint holds it)."""
    it = iter(loader)
    for _ in range(steps):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()
    return state


def few_positions(epochs: Sequence[Optional[int]]) -> List[int]:
    """The first and last positions and each epoch's first: for a run whose every resume starts worker
    processes (they cut, order and draw as threads do, which the runs checked at more positions show)."""
    n = len(epochs)
    starts = [0] + [k for k in range(1, n) if epochs[k] != epochs[k - 1]]
    return sorted({p for p in [0, n - 1, n, *starts] if 0 <= p <= n})


def first_epoch_and_spread(epochs: Sequence[Optional[int]]) -> List[int]:
    """Every position up to the first epoch boundary and the batch after it, then those
    ``spread_positions`` keeps: for a run whose later epochs repeat the first one's kinds of position."""
    n = len(epochs)
    first = next((k for k in range(1, n) if epochs[k] != epochs[k - 1]), n)
    return sorted({*range(min(first + 1, n) + 1), *spread_positions(epochs)})


# What an earlier test left behind (and ``_isolated`` reported and tried to end): a leak is the
# test's that made it, so the leak checks of the tests after it do not see it.
_carried_threads: Set[int] = set()
_carried_pids: Set[int] = set()


def our_threads() -> List[str]:
    return [t.name for t in threading.enumerate()
            if t.name.startswith("pyloader") and t.ident not in _carried_threads]


def wait_no_threads(timeout: float = 1.5) -> List[str]:
    deadline = time.monotonic() + timeout
    while our_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    return our_threads()


def _is_mp_infrastructure(proc: psutil.Process) -> bool:
    """The forkserver server or resource tracker multiprocessing keeps for this process's lifetime."""
    try:
        if proc.ppid() != os.getpid():
            return False
        cmdline = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    return "multiprocessing.forkserver" in cmdline or "multiprocessing.resource_tracker" in cmdline


def leftover_children() -> List[Tuple[int, str]]:
    """Descendants of this process, zombies included, except multiprocessing's own helpers."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        if _is_mp_infrastructure(proc) or proc.pid in _carried_pids:
            continue
        try:
            out.append((proc.pid, proc.status()))
        except psutil.NoSuchProcess:
            continue
    return out


def wait_no_children(timeout: float = 2.0) -> List[Tuple[int, str]]:
    deadline = time.monotonic() + timeout
    while leftover_children() and time.monotonic() < deadline:
        time.sleep(0.02)
    return leftover_children()


def _end_leftovers() -> Tuple[List[str], List[Tuple[int, str]]]:
    """Stop every run and worker pool of pyloader's still alive, kill our leftover processes, and
    return what was still there before (threads by name, processes by pid and status)."""
    from pyloader._execution import engine, pool

    threads, children = wait_no_threads(3.0), wait_no_children(3.0)
    if threads or children:
        for run in list(engine._live):
            run.stop(0.5)
        for workers in list(pool._pools):
            workers.close(0.5)
        for pid, _ in leftover_children():
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        wait_no_threads(2.0)
        wait_no_children(2.0)
    return threads, children


@pytest.fixture(autouse=True)
def _isolated(request) -> Iterator[None]:
    """After each test: what it left running is named (a warning) and ended, or, if it cannot be
    (a thread stuck in user code), set aside so that it fails no later test."""
    had_tensorflow = "tensorflow" in sys.modules
    yield
    threads, children = _end_leftovers()
    if threads or children:
        import warnings

        warnings.warn(f"{request.node.nodeid} left threads {threads} and processes {children} behind",
                      UserWarning, stacklevel=2)
    _carried_threads.update(t.ident for t in threading.enumerate()
                            if t.name.startswith("pyloader") and t.ident is not None)
    _carried_pids.update(pid for pid, _ in leftover_children())
    if not had_tensorflow and "tensorflow" in sys.modules and request.node.get_closest_marker("tensorflow") is None:
        # every later test would run "auto" in threads and start explicit workers by forkserver: the
        # suite would silently stop testing the default placement (and take three times as long)
        pytest.fail(f"{request.node.nodeid} imported TensorFlow but is not among the tests run last: name "
                    f"one of {_TENSORFLOW} in it or in its id (tests/conftest.py)", pytrace=False)


@contextlib.contextmanager
def moto_server() -> Iterator[int]:
    """moto's S3 server on 127.0.0.1 (its port), credentials and endpoint in the usual
    environment variables while inside."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    _forget_s3_filesystems()
    env = pytest.MonkeyPatch()
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")):
        env.setenv(name, value)
    try:
        yield port
    finally:
        env.undo()
        server.stop()
        _forget_s3_filesystems()


def _forget_s3_filesystems() -> None:
    """fsspec keeps S3 filesystems by their options, not by the endpoint in the environment: one
    made against another test's server would be used again, and could not connect."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


STOP_WAYS = ("break", "close", "exception", "drop")


def stop_early(make: Callable[[], pl.DataLoader], how: str, after: int = 3) -> pl.DataLoader:
    """Make a loader, take ``after`` batches, then stop in one of ``STOP_WAYS``: ``break`` out of
    the loop, ``close()`` it, raise in the loop, or drop every reference (and collect). Returns
    the loader, or a fresh one from ``make`` once it was dropped."""
    loader = make()
    if how in ("close", "drop"):
        it = iter(loader)
        for _ in range(after):
            next(it)
        if how == "close":
            loader.close()
            return loader
        del it, loader
        gc.collect()
        return make()
    with pytest.raises(RuntimeError, match="training failed") if how == "exception" else contextlib.nullcontext():
        for k, _ in enumerate(loader, 1):
            if k == after:
                if how == "break":
                    break
                raise RuntimeError("training failed")
    return loader


@pytest.fixture
def make_loader(tmp_path):
    """make_loader(sizes, **loader_kwargs, reader=..., batch_size=...) -> DataLoader over fresh files."""
    loaders = []

    def make(sizes, batch_size=4, reader=None, dataset=None, collator=None, **kwargs):
        write_chunks(tmp_path / "data", sizes)
        loader = pl.DataLoader(reader or IdReader(batch_size), dataset or pl.IdentityDataset(),
                               collator or ListCollator(), str(tmp_path / "data"), **kwargs)
        loaders.append(loader)
        return loader

    yield make
    for loader in loaders:
        loader.close()
    assert wait_no_threads() == [], "a loader left threads behind"
