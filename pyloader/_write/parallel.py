"""Where ``write``'s tasks run, and what a task does.

Contracts:

- ``workers=0``: in this process, one task at a time. Otherwise a ``ProcessPoolExecutor`` of
  ``workers`` processes (``None``: ``os.cpu_count()``) forked from this process when no other thread
  runs in it (one could hold a lock the children would wait for forever) and TensorFlow is not
  imported; else started by ``forkserver`` where there is one (its server, when this starts it,
  imports pyloader first), else ``spawn``. An ``fn`` defined in an interactive session (a notebook:
  ``__main__`` has no file), which such workers could not import, has them forked beside other
  threads (named in a ``RuntimeWarning``) unless forking is unsafe for pyloader itself
  (``forking.why_not_fork``): then ``pickle.PicklingError`` says what to do.
  The user's ``fn`` must then be picklable (a function of a module, not a lambda).
- A user's ``concurrent.futures.Executor`` (a Dask ``Client.get_executor()``, a thread pool) is used as
  given and never shut down here; so is a pool with ``apply_async`` (``multiprocessing.Pool``,
  ``ray.util.multiprocessing.Pool``), wrapped by ``PoolExecutor``.
- ``run_task`` runs one part: its samples through ``fn`` (a sample, a list of samples, or ``None`` to
  drop it), into chunks of at most ``chunk_samples`` samples, each closed at the first sample that takes it to
  ``chunk_bytes`` bytes before compression or more, each written whole under a temporary name as it
  is complete. A failure names the part and, for ``fn``, the sample, keeping its type.
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import pickle
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Protocol, Tuple, TypeVar

from .._execution import forking
from .formats import KEY, Chunk, new_chunk
from .output import Output
from .sources import Part, Sample, samples_of

UserFn = Callable[[Sample], object]
T = TypeVar("T")


@dataclass(frozen=True)
class Task:
    """One part and how to write it; picklable."""

    index: int
    part: Part
    fn: Optional[UserFn]
    format: str
    compression: Optional[str]
    suffix: str
    chunk_bytes: Optional[int]
    chunk_samples: Optional[int]
    output: Output
    tag: str  # the run's (``_storage.writers``): its temporary files are told by it


@dataclass
class Written:
    """What a task wrote: its chunks' temporary names with their samples and bytes (as stored)."""

    index: int
    units: int
    chunks: List[Tuple[str, int, int]] = field(default_factory=list)
    raw_bytes: int = 0  # before compression

    @property
    def samples(self) -> int:
        return sum(n for _, n, _ in self.chunks)


def _outputs(fn: Optional[UserFn], sample: Sample, part: Part, k: int) -> List[object]:
    if fn is None:
        return [sample]
    try:
        out = fn(sample)
    except Exception as exc:
        exc.add_note(f"pyloader.write: in fn, on sample {k} of {part.describe()}")
        raise
    if out is None:
        return []
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _samples_out(task: Task) -> Iterator[Sample]:
    """The samples the task writes, keyed for a tar chunk when they carry no key of their own."""
    n = 0
    for k, sample in enumerate(samples_of(task.part)):
        for out in _outputs(task.fn, sample, task.part, k):
            if not isinstance(out, dict):
                raise TypeError(f"pyloader.write: a sample must be a dict, got {type(out).__name__} "
                                f"(sample {k} of {task.part.describe()})")
            if task.format == "tar" and KEY not in out:
                out = {KEY: f"{task.index:06d}-{n:07d}", **out}
            n += 1
            yield out


class _Chunks:
    """The task's chunk being filled, written whole under a temporary name when it is full."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.written = Written(task.index, task.part.units)
        self.chunk: Optional[Chunk] = None
        self.size = 0

    def add(self, sample: Sample) -> None:
        task = self.task
        if self.chunk is None:
            self.chunk = new_chunk(task.format, task.compression)
        self.size += self.chunk.add(sample)
        if self.chunk.samples >= (task.chunk_samples or self.chunk.samples + 1) or \
                self.size >= (task.chunk_bytes or self.size + 1):
            self.flush()

    def flush(self) -> None:
        if self.chunk is not None and self.chunk.samples:
            task, written = self.task, self.written
            name = task.output.temp_name(task.tag, task.index, len(written.chunks), task.suffix)
            data = self.chunk.encoded()
            task.output.put(name, data)
            written.chunks.append((name, self.chunk.samples, len(data)))
            written.raw_bytes += self.size
        self.chunk, self.size = None, 0

    def remove(self) -> None:
        for name, _, _ in self.written.chunks:
            self.task.output.remove(name)


def run_task(task: Task) -> Written:
    chunks = _Chunks(task)
    try:
        for sample in _samples_out(task):
            chunks.add(sample)
        chunks.flush()
    except BaseException as exc:
        chunks.remove()
        if isinstance(exc, Exception) and not any("pyloader.write" in n for n in getattr(exc, "__notes__", ())):
            exc.add_note(f"pyloader.write: writing {task.part.describe()} to {task.output.url}")
        raise
    return chunks.written


class InProcess(cf.Executor):
    """Runs each task when it is submitted, in this process."""

    def submit(self, fn: Callable[..., T], /, *args: object, **kwargs: object) -> "cf.Future[T]":
        future: "cf.Future[T]" = cf.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


class Pool(Protocol):
    def apply_async(self, func: Callable[..., object], args: Tuple[object, ...], kwds: dict, callback: Callable,
                    error_callback: Callable) -> object: ...


class PoolExecutor(cf.Executor):
    """A pool with ``apply_async`` (``multiprocessing.Pool``, Ray's) seen as an ``Executor``."""

    def __init__(self, pool: "Pool") -> None:
        self.pool = pool

    def submit(self, fn: Callable[..., T], /, *args: object, **kwargs: object) -> "cf.Future[T]":
        future: "cf.Future[T]" = cf.Future()
        self.pool.apply_async(fn, args, kwargs, callback=future.set_result, error_callback=future.set_exception)
        return future


def start_method(fn: bytes = b"") -> str:
    """``fork`` while no other thread runs here and forking is safe (``_execution.forking``): the workers
    start at once with what this process imported; else a fork server, else ``spawn``, which import
    ``fn`` (given pickled) by its module's name. An ``fn`` of an interactive session (a notebook's, whose ``__main__``
    has no file) is not found so: its workers are forked even beside other threads, named in a warning,
    where forking is safe for pyloader; else ``pickle.PicklingError`` says what to do."""
    if _alone():
        return "fork"
    if _interactive(fn):
        _fork_beside_threads()
        return "fork"
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _interactive(fn: bytes) -> bool:
    """Whether the pickled ``fn`` refers to ``__main__`` and ``__main__`` has no file to import it from."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None) or ""
    return not os.path.isfile(main_file) and b"__main__" in fn


def _fork_beside_threads() -> None:
    why = forking.why_not_fork()
    if why:
        raise pickle.PicklingError(
            f"pyloader.write: fn is defined in an interactive session, which worker processes started afresh "
            f"cannot import, and they cannot be forked from this process now ({why}): define fn in a module "
            f"(a .py file next to the notebook), or pass workers=0 to run it in this process")
    me = threading.get_ident()
    forking.wait_for_imports(me, fix="Define fn in a module, or pass workers=0")
    others = forking.user_threads(me)
    if others:
        warnings.warn(f"pyloader.write: worker processes are forked while other threads of this process run "
                      f"({', '.join(others)}), since fn is defined in an interactive session: a lock one of them "
                      f"holds at that moment stays held in the workers. Define fn in a module to have them "
                      f"started by the fork server instead, or pass workers=0", RuntimeWarning, stacklevel=6)


def _alone() -> bool:
    """Whether no other thread runs in this process, and nothing else makes a fork unsafe."""
    return threading.active_count() == 1 and not forking.why_not_fork()


def _context(fn: bytes) -> multiprocessing.context.BaseContext:
    """The workers' start method; a fork server not started yet imports this module (and so pyloader) once
    for all the workers it forks, which would each import it otherwise (seconds on a busy machine)."""
    method = start_method(fn)
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        from multiprocessing import forkserver

        preloaded = list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))
        if __name__ not in preloaded:
            context.set_forkserver_preload([*preloaded, __name__])
    return context


def pickled(fn: Optional[UserFn]) -> bytes:
    """``fn`` pickled as a worker process gets it; its failure (a lambda, a local function) keeps its type
    and gains a note saying what to do."""
    try:
        return pickle.dumps(fn)
    except Exception as exc:
        exc.add_note("pyloader.write: fn goes to worker processes, so it must be picklable (a function of a "
                     "module, or of your script's top level under if __name__ == '__main__'); workers=0 "
                     "runs it in this process instead")
        raise


def _width(workers: Optional[int], pool: object = None) -> int:
    """Tasks run at once: ``workers``, a pool's processes, or one per CPU."""
    return max(1, workers or getattr(pool, "_processes", 0) or os.cpu_count() or 1)


def executor_for(workers: Optional[int], executor: object, fn: Optional[UserFn]) -> Tuple[cf.Executor, bool, int]:
    """The executor to run tasks on, whether it is ours to shut down, and how many tasks it runs at once."""
    if isinstance(executor, cf.Executor):
        return executor, False, _width(workers)
    if hasattr(executor, "apply_async"):
        return PoolExecutor(executor), False, _width(workers, executor)
    if executor is not None:
        raise TypeError(f"executor must be a concurrent.futures.Executor or a pool with apply_async, "
                        f"got {type(executor).__name__}")
    if workers == 0:
        return InProcess(), True, 1
    n = _width(workers)
    return cf.ProcessPoolExecutor(n, mp_context=_context(pickled(fn))), True, n
