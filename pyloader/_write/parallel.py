"""Where ``write``'s tasks run, and what a task does.

Contracts:

- ``workers=0``: in this process, one task at a time. Otherwise a ``ProcessPoolExecutor`` of
  ``workers`` processes (``None``: ``os.cpu_count()``) started by ``forkserver`` where there is one,
  else ``spawn``: never a fork of this process, whose threads (the user's, fsspec's) may hold locks.
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
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Tuple

from .formats import KEY, Chunk, new_chunk
from .output import Output
from .sources import Part, Sample, samples_of

UserFn = Callable[[Sample], Any]


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


def _outputs(fn: Optional[UserFn], sample: Sample, part: Part, k: int) -> List[Sample]:
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


def run_task(task: Task) -> Written:
    written = Written(task.index, task.part.units)
    chunk: Optional[Chunk] = None
    size = 0

    def flush() -> None:
        nonlocal chunk, size
        if chunk is not None and chunk.samples:
            name = task.output.temp_name(task.tag, task.index, len(written.chunks), task.suffix)
            data = chunk.encoded()
            task.output.put(name, data)
            written.chunks.append((name, chunk.samples, len(data)))
            written.raw_bytes += size
        chunk, size = None, 0

    try:
        for sample in _samples_out(task):
            if chunk is None:
                chunk = new_chunk(task.format, task.compression)
            size += chunk.add(sample)
            if (task.chunk_samples is not None and chunk.samples >= task.chunk_samples) or \
                    (task.chunk_bytes is not None and size >= task.chunk_bytes):
                flush()
        flush()
    except BaseException as exc:
        for name, _, _ in written.chunks:
            task.output.remove(name)
        if isinstance(exc, Exception) and not any("pyloader.write" in n for n in getattr(exc, "__notes__", ())):
            exc.add_note(f"pyloader.write: writing {task.part.describe()} to {task.output.url}")
        raise
    return written


class InProcess(cf.Executor):
    """Runs each task when it is submitted, in this process."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        future: cf.Future = cf.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


class PoolExecutor(cf.Executor):
    """A pool with ``apply_async`` (``multiprocessing.Pool``, Ray's) seen as an ``Executor``."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        future: cf.Future = cf.Future()
        self.pool.apply_async(fn, args, kwargs, callback=future.set_result, error_callback=future.set_exception)
        return future


def start_method() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def executor_for(workers: Optional[int], executor: Any) -> Tuple[cf.Executor, bool, int]:
    """The executor to run tasks on, whether it is ours to shut down, and how many tasks it runs at once."""
    if executor is not None:
        if isinstance(executor, cf.Executor):
            return executor, False, max(1, workers or os.cpu_count() or 1)
        if hasattr(executor, "apply_async"):
            return PoolExecutor(executor), False, max(1, workers or getattr(executor, "_processes", 0) or
                                                      os.cpu_count() or 1)
        raise TypeError(f"executor must be a concurrent.futures.Executor or a pool with apply_async, "
                        f"got {type(executor).__name__}")
    if workers == 0:
        return InProcess(), True, 1
    n = workers or os.cpu_count() or 1
    return cf.ProcessPoolExecutor(n, mp_context=multiprocessing.get_context(start_method())), True, n
