"""``pyloader.write``: any data into indexed chunk files, in parallel (see ``write``'s contract)."""
from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, Iterable, Iterator, List, Literal, Optional, Union

from .._abc import DataReader
from .._storage import writers
from . import formats
from .output import Output
from .parallel import Task, UserFn, Written, executor_for, run_task
from .sources import Part, Source, source_of

logger = logging.getLogger("pyloader")

Mode = Literal["create", "overwrite", "append"]
FIRST_PART = 256  # samples of each of the first parts when only chunk_bytes sizes the chunks
FIRST_PARTS = 2  # parts cut before the first one's result sizes the rest: two workers start at once
MAX_PART = 1 << 20  # samples of a part at most, sized from the first
MIN_PARTS = 32  # an input of known size is cut into at least this many parts: a small one runs in parallel too
MIN_PART = 64  # samples of a part at least, but for the last (MIN_PARTS does not cut a tiny input into 1-sample chunks)
DEFAULT_CHUNK_BYTES = 64 * 2**20
_INDEX_BATCH = 16  # the batch size of the reader the index is keyed by (any: counts do not depend on it)


@dataclass(frozen=True)
class WriteSummary:
    """What ``write`` did: the samples and chunks written, their bytes as stored, the seconds it took,
    and the samples per second."""

    output: str
    samples: int
    chunks: int
    bytes: int
    seconds: float
    rate: float

    def __str__(self) -> str:
        return (f"{self.output}: {self.samples:,} samples in {self.chunks} chunks, {self.bytes / 2**20:,.1f} MiB, "
                f"in {self.seconds:.2f} s ({self.rate:,.0f} samples/s)")


@dataclass
class _Run:
    """One run's settings, and its count of what was committed."""

    output: Output
    format: str
    compression: Optional[str]
    suffix: str
    chunk_bytes: Optional[int]
    chunk_samples: Optional[int]
    fn: Optional[UserFn]
    next_number: int
    samples: int = 0
    chunks: int = 0
    bytes: int = 0
    counts: Dict[str, int] = field(default_factory=dict)  # samples of each chunk committed, by name

    def task(self, index: int, part: Part) -> Task:
        return Task(index=index, part=part, fn=self.fn, format=self.format, compression=self.compression,
                    suffix=self.suffix, chunk_bytes=self.chunk_bytes, chunk_samples=self.chunk_samples,
                    output=self.output, tag=writers.tag())

    def commit(self, written: Written) -> None:
        """Rename a task's chunks to their numbers, in order (every task before it is committed)."""
        for name, samples, size in written.chunks:
            final = f"{self.output.prefix}-{self.next_number:06d}{self.suffix}"
            self.output.rename(name, final)
            self.counts[final] = samples
            self.next_number += 1
            self.samples, self.chunks, self.bytes = self.samples + samples, self.chunks + 1, self.bytes + size


def write(*, source: Union[Iterable[dict], str, os.PathLike, List[str], object], output: Union[str, os.PathLike],
          fn: Optional[UserFn] = None, format: str = "jsonl", compression: Optional[str] = None,
          chunk_bytes: Optional[int] = None, chunk_samples: Optional[int] = None, mode: Mode = "create",
          workers: Optional[int] = None, executor: object = None, kind: str = "auto",
          reader: Optional[DataReader] = None, prefix: str = "shard", index: bool = True, progress: bool = False,
          task_timeout_s: float = 3600.0) -> WriteSummary:
    """Write ``source``'s samples, through ``fn``, as chunk files in ``output``, with the index of counts.

    - ``source``: an iterable of dict samples (a list, a generator, a HF ``IterableDataset``); an object
      with ``__len__`` and ``__getitem__`` giving dicts (a HF ``Dataset``), read by index in the tasks
      when it pickles small, else here; a folder, glob or list of
      Parquet, CSV, TSV or JSON lines files (read by the built-in reader their names say, or by
      ``reader``), a row a sample; or a folder of any other files, the files sharing a key
      (``img/001.jpg`` and ``img/001.cls``) one sample ``{"__key__": "img/001", "jpg": b"..", "cls": b".."}``.
      ``kind`` (``"samples"``, ``"indexed"``, ``"files"``, ``"table"``) overrides how it is told.
    - ``fn(sample)``: a sample, a list of samples, or ``None`` (dropped): decode, resize, tokenize.
      With worker processes it must be picklable (a function of a module).
    - ``format``: ``"jsonl"``, ``"parquet"``, ``"tar"`` (webdataset: fields are extensions), ``"npy"`` (one
      array field) or ``"npz"``, each read back by its built-in reader (``JsonLinesReader``,
      ``ParquetReader``, ``TarReader``, ``NumpyReader``); ``compression``: ``"gzip"``, ``"zstd"``, ``"bz2"``,
      ``"xz"`` for the first ones, Parquet's own codecs for Parquet.
    - A chunk holds at most ``chunk_samples`` samples and about ``chunk_bytes`` bytes before compression
      (64 MiB when neither is given).
    - The input is cut into parts in input order, each a task: a table file; else ``chunk_samples``
      samples; else 256 samples first, whose bytes size the other parts to about a chunk, an input of
      known size being cut into 32 parts at least (of 64 samples at least), so that a small one runs in
      parallel too, its rest into an even number of parts of equal size (no worker left with a short
      last part while another runs a whole one). The parts depend on the input and the sizes alone:
      the output is the same bytes whatever runs the tasks: ``workers`` processes (``None``: one per CPU;
      0: this process), or ``executor``, any ``concurrent.futures.Executor`` (a Dask client's
      ``get_executor()``) or a pool with ``apply_async`` (Ray's ``ray.util.multiprocessing.Pool``).
    - Each task writes its chunks whole under hidden temporary names as they complete (uploaded at
      once to an fsspec URL); they are renamed ``<prefix>-000000<suffix>``, ... in input order. A killed
      writer leaves no visible partial chunk, and the next run removes its temporary files.
    - ``mode``: ``"create"`` (``output`` must hold no chunk), ``"overwrite"`` (its chunks and index are
      removed first) or ``"append"`` (chunks numbered after the last one there, which must be of the same
      format and compression; merge datasets so).
    - With ``index``, the index of counts is written as ``python -m pyloader index`` writes it, so a
      loader of the output counts nothing. ``progress``: a tqdm bar over the input.

    A failure in a task (``fn``'s included) is raised with its own type, a note naming the part of the
    input; chunks already renamed stay (each whole), the rest are removed.

    Example:
        ```python
        import pyloader

        summary = pyloader.write(source=({"id": i, "text": f"doc {i}"} for i in range(1000)),
                                 output="made/", chunk_samples=250, workers=0)
        assert (summary.samples, summary.chunks) == (1000, 4)
        ```
    """
    started = time.perf_counter()
    formats.check(format, compression)
    _check_numbers(chunk_bytes=chunk_bytes, chunk_samples=chunk_samples, workers=workers)
    if mode not in ("create", "overwrite", "append"):
        raise ValueError(f"mode must be 'create', 'overwrite' or 'append', got {mode!r}")
    out = Output(os.fspath(output), prefix)
    found = source_of(source, kind=kind, reader=reader)
    run = _Run(output=out, format=format, compression=compression, suffix=formats.suffix(format, compression),
               chunk_bytes=chunk_bytes if chunk_bytes or chunk_samples else DEFAULT_CHUNK_BYTES,
               chunk_samples=chunk_samples, fn=fn, next_number=0)
    run.next_number = _prepare(out, mode, run.suffix)
    pool, ours, width = executor_for(workers, executor, fn)
    try:
        _run_tasks(run, found, pool, width, _bar(progress, found), task_timeout_s)
    finally:
        if ours:
            pool.shutdown(wait=True, cancel_futures=True)
    if index and run.chunks:
        _write_index(out, format, run.counts)
    seconds = time.perf_counter() - started
    return WriteSummary(output=out.url, samples=run.samples, chunks=run.chunks, bytes=run.bytes, seconds=seconds,
                        rate=run.samples / seconds if seconds > 0 else 0.0)


def _check_numbers(**numbers: Optional[int]) -> None:
    """``ValueError`` for a number that is not ``None`` or an integer, >= 1 (>= 0 for ``workers``)."""
    for name, value in numbers.items():
        least = 0 if name == "workers" else 1
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < least):
            raise ValueError(f"{name} must be an integer >= {least} or None, got {value!r}")


def _prepare(out: Output, mode: Mode, suffix: str) -> int:
    """Clean up after dead writers, apply ``mode``, and the number of the first chunk to write."""
    out.make()
    removed = out.clean()
    if removed:
        logger.info("pyloader.write: removed %d temporary files of writers that died in %s", len(removed), out.url)
    chunks = {name: n for name in out.names() if (n := out.chunk_number(name)) is not None}
    if mode == "append":
        return _appended_after(out, chunks, suffix)
    if mode == "create" and chunks:
        raise FileExistsError(f"{out.url!r} holds chunks already ({len(chunks)}): pass mode='append' to add "
                              "to them, or mode='overwrite' to replace them")
    _remove_dataset(out, chunks)
    return 0


def _remove_dataset(out: Output, chunks: Dict[str, int]) -> None:
    """``mode="overwrite"``: the chunks there and their indexes removed."""
    for name in [*chunks, *(n for n in out.names() if n.startswith("_pyloader"))]:
        out.remove(name)


def _appended_after(out: Output, chunks: Dict[str, int], suffix: str) -> int:
    """The number of the first chunk appended to ``chunks``, which must all end in ``suffix``."""
    other = [name for name in chunks if not name.endswith(suffix)]
    if other:
        raise ValueError(f"{out.url!r} holds chunks of another format or compression ({other[0]!r}), "
                         f"not {suffix!r} ones: append needs the same")
    return max(chunks.values(), default=-1) + 1


class _Sizer:
    """The units of each part: ``chunk_samples`` when set, else ``FIRST_PART`` for each of the ``FIRST_PARTS``
    first parts and then as many as make about ``chunk_bytes`` (from the first part's bytes per unit), at
    most a ``MIN_PARTS``-th of an input of known size (or ``MIN_PART``). The rest of an input of known size
    is then cut into an even number of parts of equal size (at most that one), so that no worker is left
    with a short last part while another still runs a whole one. The same for any executor."""

    def __init__(self, run: _Run, source: Source) -> None:
        most = max(MIN_PART, -(-source.total // MIN_PARTS)) if source.total else MAX_PART
        self.fixed = 1 if source.kind == "table" else run.chunk_samples  # a table's part is a file
        self.chunk_bytes = run.chunk_bytes or DEFAULT_CHUNK_BYTES
        self.most = most
        self.learned: Optional[int] = None
        self.left = source.total or 0  # units not yet handed out of an input of known size (else 0)
        self.parts_left: Optional[int] = None  # parts of the rest, once learned

    @property
    def waits_for_first(self) -> bool:
        return self.fixed is None

    def learn(self, written: Written) -> None:
        if self.learned is None and written.units:
            per_unit = written.raw_bytes / written.units
            fit = MAX_PART if per_unit == 0 else int(self.chunk_bytes / per_unit)
            self.learned = max(1, min(fit, self.most))

    def __call__(self) -> int:
        if self.fixed:
            return self.fixed
        if self.learned is None:
            size = min(FIRST_PART, self.most)
        else:
            size = self.learned if self.left <= 0 else self._equal_share(self.learned)
        self.left -= size
        return size

    def _equal_share(self, size: int) -> int:
        """The next of the parts of equal size the rest (``left``) is cut into: an even number of them,
        of ``size`` at most, planned at the first call."""
        if self.parts_left is None:
            parts = -(-self.left // size)
            self.parts_left = parts + parts % 2 if parts > 1 else 1
        share = -(-self.left // max(1, self.parts_left))
        self.parts_left -= 1
        return share


def _run_tasks(run: _Run, source: Source, pool: cf.Executor, width: int,
               advance: Callable[[int], None], timeout: float) -> None:
    """Submit the parts (at most ``2 * width`` in flight), commit what they wrote in input order."""
    sizer = _Sizer(run, source)
    parts: Iterator[Part] = source.parts(sizer)
    pending: Deque[cf.Future] = collections.deque()
    index = 0
    try:
        for part in parts:
            pending.append(pool.submit(run_task, run.task(index, part)))
            index += 1
            if index == FIRST_PARTS and sizer.waits_for_first:  # the first part's result sizes the rest
                _commit(run, pending.popleft(), timeout, advance, sizer)
            while len(pending) >= 2 * width:
                _commit(run, pending.popleft(), timeout, advance, sizer)
        while pending:
            _commit(run, pending.popleft(), timeout, advance, sizer)
    except BaseException:
        _abandon(run.output, pending, timeout)
        raise
    finally:
        advance(-1)


def _commit(run: _Run, future: cf.Future, timeout: float, advance: Callable[[int], None], sizer: _Sizer) -> None:
    try:
        written: Written = future.result(timeout=timeout)
    except cf.TimeoutError as exc:
        raise TimeoutError(f"pyloader.write: a task took longer than task_timeout_s={timeout:g} s") from exc
    sizer.learn(written)
    run.commit(written)
    advance(written.units)


def _abandon(out: Output, pending: Deque[cf.Future], timeout: float) -> None:
    """After a failure: cancel the tasks not started, and remove what those that ran wrote."""
    for future in pending:
        future.cancel()
    for future in pending:
        if future.cancelled():
            continue
        try:
            written = future.result(timeout=timeout)
        except BaseException:  # its own failure, or the executor's: nothing of it to remove
            continue
        for name, _, _ in written.chunks:
            out.remove(name)


def _bar(progress: bool, source: Source) -> Callable[[int], None]:
    """A function advancing a tqdm bar by the units given (-1: closes it); one doing nothing without ``progress``."""
    if not progress:
        return lambda n: None
    from .._frameworks.progress import check

    check()
    from tqdm import tqdm

    bar = tqdm(total=source.total, unit=" samples" if source.kind in ("samples", "indexed") else
               {"files": " keys", "table": " files"}[source.kind], desc="pyloader.write")

    def advance(n: int) -> None:
        if n < 0:
            bar.close()
        else:
            bar.update(n)

    return advance


def _write_index(out: Output, format: str, counts: Dict[str, int]) -> None:
    """The index of counts, by what ``python -m pyloader index`` runs (and whatever it writes with it),
    given the ``counts`` of the chunks this run wrote: it counts none of them again (a tar shard would
    be read whole for it), only the chunks of an earlier run that no index holds."""
    from .. import _cli
    from .._counts import IndexPlaces
    from .._storage import count_index as ix

    reader = _cli.make_reader(formats.READER_OF[format], _INDEX_BATCH)
    files = [out.url_of(name) for name in counts]
    places = IndexPlaces.of(reader, out.url, files, None)
    stamps = ix.stamps(files, places.folder)
    ix.write_index(places.data_index, places.key, {
        name: ix.entry(stamp, n)
        for name, stamp, n in zip(ix.names_in(places.folder, files), stamps, counts.values()) if stamp is not None})
    lines: List[str] = []
    args = argparse.Namespace(data=out.url, reader=formats.READER_OF[format], batch_size=_INDEX_BATCH, progress=False)
    if _cli.index(args, lines.append) != 0:
        raise ValueError(f"pyloader.write: the index of {out.url!r} could not be written: " + "; ".join(lines))
    logger.info("pyloader.write: %s", "; ".join(lines))
