"""The epochs of a run with ``cache_encoded``: each one read from the cache of encoded batches, or from the files.

The path of a batch, by the kind of its epoch:

- **read** (the epoch's block has a complete cache, ``_storage.epoch_cache``): its manifest's
  batches, reordered (below) → ``[load, collate_batch, pin_memory]`` in this process's
  lane; no file is read and ``batch_encode`` is not called;
- **write** (the epoch starts a block, or is the first of its block to find no complete
  cache, and starts at its first batch): files → batches → ``batch_encode`` alone (in the
  workers, if any) → ``[write, collate_batch, pin_memory]`` here, so the encoded batch is
  written before ``collate_batch`` sees it; the cache is committed when the epoch ends
  with every batch written and no error skipped, else abandoned;
- **from the files**, as without the cache: an epoch resumed past its first batch that
  was not read from the cache, and the epochs of a block whose write went past ``limit``.

A read epoch gives the batches of the epoch that wrote the cache (their number is that
of any epoch: ``len()`` holds), under its own epoch number. With shuffling on
(``shuffle``, ``shuffle_buffer``, ``bucket_by`` or the reader's ``shuffle``) the full,
unpadded batches change places, drawn from ``(random_seed, epoch)``; the others (a short
last batch, padding under ranks) stay where they were, at the end.

Exact resume: each batch carries the epoch whose cache it belongs to (``Batch.cached``:
the epoch that wrote the cache it was read from, or its own epoch when that epoch
writes; ``None`` from the files alone), and a state records it. An epoch resumed past
its first batch takes the same path: read from the same cache (if it is gone, the epoch
that wrote it is encoded and written again first); written (if its cache was not
committed, the whole epoch is encoded and written again, the batches before the
position dropped once written); or from the files. An epoch resumed at its start after an
iteration that ended reads the cache of its block that the state names, written again first
if it is gone. For a ``batch_encode`` without randomness, the batches are those of the run
that saved the state.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import AsyncGenerator, AsyncIterator, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import numpy as np

from .._abc import DataCollator, DataReader
from .._errors import ErrorHandler
from .._execution.runners import Lane, LocalSteps, Run
from .._execution.steps import Step
from .._rng import CACHED_EPOCH, derive_rng
from .._state import Start
from .._stats import Stats
from .._storage.epoch_cache import BatchEntry, CachedRef, EpochStore, EpochWriter, Manifest, ToWrite, load
from .batch import PADDING, Batch, Group, GroupSize, drop_replayed
from .map import OrderedMap
from .shard import Sharding
from .source import Source


class _Order(Protocol):
    @property
    def shuffle_buffer(self) -> int: ...


class _Options(Protocol):
    """What this stage reads of the user's options (``_options.Options``)."""

    @property
    def random_seed(self) -> int: ...

    @property
    def shuffle(self) -> object: ...

    @property
    def order(self) -> _Order: ...

    @property
    def bucket(self) -> object: ...

    @property
    def datareader(self) -> DataReader: ...

    @property
    def datacollator(self) -> DataCollator: ...


class Settings(Protocol):
    """What this stage takes of the run's settings (``_plan.Settings``, made by the layer above)."""

    @property
    def options(self) -> _Options: ...

    encoded_cache: Optional[EpochStore]
    stats: Stats
    errors: ErrorHandler
    concurrency: int
    sharding: Sharding

    @property
    def draws(self) -> Tuple[int, int]: ...  # ``pyloader.rng()``'s seed and rank (``_stages.map.OrderedMap``)


logger = logging.getLogger("pyloader")
# (epochs, run, from_position) -> the encoded groups of those epochs (``_pipeline.FileStages``)
FromFiles = Callable[[range, Run, bool], AsyncGenerator[Group, None]]


def reorders(s: "Settings") -> bool:
    """Whether a read epoch's batches change places: when the batches of an epoch are shuffled anyway."""
    o = s.options
    return bool(o.shuffle) or o.order.shuffle_buffer > 0 or o.bucket is not None or o.datareader.shuffle


def batch_order(entries: Sequence[BatchEntry], batch_size: int, rng: Optional[np.random.Generator]) -> List[int]:
    """The order of a read epoch's batches: the full, unpadded ones permuted by ``rng`` (if any) among their
    places, the others left where they are."""
    order = list(range(len(entries)))
    if rng is None:
        return order
    plain = [k for k, entry in enumerate(entries) if entry.rows == batch_size and not entry.padding]
    for place, k in zip(plain, rng.permutation(len(plain)).tolist()):
        order[place] = plain[k]
    return order


def padding_runs(meta: Optional[Dict[str, np.ndarray]]) -> List[List[int]]:
    """The ``[start, end)`` runs of a batch's rows flagged as padding."""
    flags = None if meta is None else meta.get(PADDING)
    if flags is None or not flags.any():
        return []
    edges = np.flatnonzero(np.diff(np.concatenate([[0], flags.astype(np.int8), [0]])))
    return edges.reshape(-1, 2).tolist()


def padding_flags(runs: List[List[int]], rows: int) -> Dict[str, np.ndarray]:
    flags = np.zeros(rows, dtype=bool)
    for start, end in runs:
        flags[start:end] = True
    return {PADDING: flags}


class CachedEpochs:
    """Yields the encoded and collated groups of every epoch of a run, each epoch read from the
    cache, written to it, or read from the files (see the module's docstring).

    ``from_files(epochs, run, from_position)``: the run's file stages over ``epochs``, ``run``
    encoding (or encoding and collating) each group; ``encode``: the runner's ``run`` with ``batch_encode``
    alone; ``after``: the steps after it (``collate_batch``, ``pin_memory``), run here.
    """

    def __init__(self, s: "Settings", start: Start, source: Source, from_files: FromFiles, full: Run,
                 encode: Run, after: List[Step], lane: Lane, run_blocking: Callable,
                 tasks: asyncio.TaskGroup) -> None:
        assert s.encoded_cache is not None
        self.s, self.start, self.source = s, start, source
        self.store: EpochStore = s.encoded_cache
        self.from_files, self.full, self.encode, self.after = from_files, full, encode, after
        self.lane, self.run_blocking, self.tasks = lane, run_blocking, tasks
        # the loader's, over its life (``loader.stats["cache_encoded"]``)
        self.counters: Dict[str, int] = s.stats.cache if s.stats.cache is not None else {}

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    async def iterate(self) -> AsyncGenerator[Group, None]:
        for epoch in range(self.start.epoch, self.start.end):
            async with contextlib.aclosing(await self._epoch(epoch)) as groups:
                async for group in groups:
                    yield group

    async def _epoch(self, epoch: int) -> AsyncGenerator[Group, None]:
        """The groups of ``epoch``, by its kind."""
        start, store = self.start, self.store
        block = store.block(epoch)
        if epoch == start.epoch:
            if start.skip:
                return await self._resumed(epoch, block)
            await self._restore(epoch, block)
        if epoch != block:
            manifest = await self._manifest(block)
            if manifest is not None:
                return self._read(epoch, manifest, 0)
            if self._oversized(block):
                return self._files(epoch)
        return await self._written(epoch, 0)

    async def _written(self, epoch: int, deliver_from: int) -> AsyncGenerator[Group, None]:
        """``epoch`` written to a new cache (``_write``), or from the files when none can be made."""
        writer = await self._writer(epoch)
        return self._files(epoch) if writer is None else self._write(writer, deliver_from)

    def _oversized(self, block: int) -> bool:
        """Whether a write of ``block``'s cache went past its limit (its epochs are read from the files)."""
        return (self.store.key, block) in self.store.oversized

    def _files(self, epoch: int) -> AsyncGenerator[Group, None]:
        """``epoch`` as without the cache (the run's first epoch from its position)."""
        return self.from_files(range(epoch, epoch + 1), self.full, True)

    async def _resumed(self, epoch: int, block: int) -> AsyncGenerator[Group, None]:
        """The run's first epoch, resumed past its first batch: by the path the saved run took."""
        cached = self.start.cached
        if cached == epoch and await self._manifest(block, epoch) is None:
            # it was writing the cache, which was not committed: write it whole
            return await self._written(epoch, self.start.skip)
        if cached is None or cached == epoch:
            return self._files(epoch)
        found = await self._manifest(block, cached)
        return self._read(epoch, found or await self._rebuild(epoch, cached), self.start.skip)

    async def _restore(self, epoch: int, block: int) -> None:
        """The run's first epoch, from its start: a state saved after the run before it ended names the cache
        that run left for the epoch's block (``start.cached``); if it is gone, it is written again first, so
        that the epoch reads it as that run would have (if it cannot be, the epoch goes on as it would then)."""
        source, store = self.start.cached, self.store
        if source is None or source == epoch or store.block(source) != block or self._oversized(block):
            return
        if await self._manifest(block, source) is None:
            await self._write_again(epoch, source)

    async def _manifest(self, block: int, source: Optional[int] = None) -> Optional[Manifest]:
        """The block's complete cache (written by epoch ``source``, when given), if any."""
        manifest = await self.run_blocking(self.store.manifest, block)
        return manifest if manifest is None or source is None or manifest.source_epoch == source else None

    async def _rebuild(self, epoch: int, source: int) -> Manifest:
        """Write the cache of epoch ``source`` again, for ``epoch`` resumed in it; raises when it cannot be."""
        manifest = await self._write_again(epoch, source)
        if manifest is None:
            raise RuntimeError(f"cannot resume epoch {epoch} exactly: its first batches came from the cache of "
                               f"encoded batches that epoch {source} wrote, which is gone from "
                               f"{self.store.folder!r} and could not be written again (see the warning above)")
        return manifest

    async def _write_again(self, epoch: int, source: int) -> Optional[Manifest]:
        """Encode epoch ``source`` and write its cache again, for ``epoch`` resumed in it: the cache, if committed."""
        logger.warning("pyloader cache_encoded: epoch %d resumes in batches read from the cache that epoch %d "
                       "wrote, which is gone from %r: encoding epoch %d again first", epoch, source,
                       self.store.folder, source)
        writer = await self._writer(source)
        if writer is not None:
            async with contextlib.aclosing(self._write(writer, None)) as groups:
                async for _ in groups:
                    pass
        return await self._manifest(self.store.block(source), source)

    async def _read(self, epoch: int, manifest: Manifest, skip: int) -> AsyncGenerator[Group, None]:
        s = self.s
        rng = derive_rng(s.options.random_seed, CACHED_EPOCH, epoch) if reorders(s) else None
        order = batch_order(manifest.batches, s.options.datareader.batch_size, rng)
        self._count("epochs_read")
        self._count("files_not_read", sum(1 for _ in self.source.tasks(epoch)))
        steps: List[Step] = [("cache_encoded", load), *self.after]
        run = LocalSteps(steps, self.lane, (s.options.datacollator,), s.stats.busy).run
        async for group in OrderedMap(run, s.concurrency, s.errors, s.stats, s.draws).iterate(
                _refs(epoch, manifest, order, skip), self.tasks):
            self._count("batches_read", len(group))
            yield group

    async def _writer(self, epoch: int) -> Optional[EpochWriter]:
        """A new cache for ``epoch``'s block, or ``None`` when the folder cannot be written (the epoch
        then goes on from the files, as for any write given up)."""
        try:
            writer: EpochWriter = await self.run_blocking(self.store.writer, epoch)
            return writer
        except OSError as exc:
            self._count("writes_abandoned")
            logger.warning("pyloader cache_encoded: cannot write the encoded batches of epoch %d to %r (%s): "
                           "encoding it from the files", epoch, self.store.folder, exc)
            return None

    async def _write(self, writer: EpochWriter, deliver_from: Optional[int]) -> AsyncGenerator[Group, None]:
        """The whole of the writer's epoch from the files, its encoded batches written to the cache, then
        collated and handed on from batch ``deliver_from`` (``None``: none; they are dropped once written)."""
        s = self.s
        skipped = s.errors.skipped
        finished = committing = False
        try:
            async for group in self._encoded(writer, deliver_from is not None):
                kept = _from_batch(group, deliver_from, s.stats)
                if kept:
                    yield kept
            finished = True
            if s.errors.skipped != skipped:
                writer.failed = writer.failed or "errors were skipped in it"
            if writer.complete():
                committing = True  # from here the cache is whole: a run stopped now still lets it commit
                committing = await self._commit(writer)
            if committing:
                self._count_written(writer)
        finally:
            if not committing:
                writer.abort()
                self._abandoned(writer, finished)

    def _encoded(self, writer: EpochWriter, collated: bool) -> AsyncIterator[Group]:
        """The writer's epoch from the files, each batch encoded then written to the cache, and with
        ``collated`` given on to ``collate_batch`` and ``pin_memory``."""
        s, epoch = self.s, writer.epoch
        after, uses = (self.after, (s.options.datacollator,)) if collated else ([], ())
        steps: List[Step] = [("cache_encoded", writer.write), *after]
        run = LocalSteps(steps, self.lane, uses, s.stats.busy).run
        encoded = _to_write(self.from_files(range(epoch, epoch + 1), self.encode, False), writer)
        return OrderedMap(run, s.concurrency, s.errors, s.stats, s.draws).iterate(encoded, self.tasks)

    def _count_written(self, writer: EpochWriter) -> None:
        self._count("epochs_written")
        self._count("batches_written", len(writer.entries))
        self._count("bytes_written", writer.bytes)

    async def _commit(self, writer: EpochWriter) -> bool:
        try:
            await self.run_blocking(writer.commit, self.s.sharding.active)
            return True
        except OSError as exc:
            writer.failed = f"committing it failed: {exc}"
            return False

    def _abandoned(self, writer: EpochWriter, finished: bool) -> None:
        """Count a write given up; say why, unless the epoch was left before its end (a ``break``)."""
        self._count("writes_abandoned")
        if writer.over_limit:
            self.store.oversized.add((self.store.key, writer.block))
        if finished:
            logger.warning("pyloader cache_encoded: the encoded batches of epoch %d are not cached (%s): the "
                           "epochs of its block are encoded from the files", writer.epoch, writer.failed)


async def _to_write(groups: AsyncGenerator[Group, None], writer: EpochWriter) -> AsyncGenerator[Group, None]:
    """Each encoded batch wrapped for the write step, its entry noted in the epoch's order."""
    async with contextlib.aclosing(groups):
        async for group in groups:
            for batch in group:
                name = f"{batch.index:08d}.npz"
                writer.expect(BatchEntry(name, batch.rows, batch.paths, padding_runs(batch.meta)))
                batch.data, batch.cached = ToWrite(batch.data, name), writer.epoch
            yield group


def _from_batch(group: Group, first: Optional[int], stats: Stats) -> Group:
    """The batches of ``group`` from index ``first`` on (``None``: none); those before it were only
    written, to resume after them (counted as replayed)."""
    if first is None:
        return []
    return drop_replayed(group, [k for k, batch in enumerate(group) if batch.index >= first], stats)


async def _refs(epoch: int, manifest: Manifest, order: List[int], skip: int) -> AsyncGenerator[Group, None]:
    """A read epoch's batches from its ``skip``-th on, in groups of batches of one size (as the batcher
    makes them: their metadata is stacked), each to be loaded by the ``load`` step."""
    sizes = GroupSize()
    k = skip
    while k < len(order):
        group: Group = []
        for index in range(k, min(len(order), k + sizes.take())):
            entry = manifest.batches[order[index]]
            if group and entry.rows != group[0].rows:
                break
            group.append(_ref(epoch, index, manifest, entry))
        k += len(group)
        yield group


def _ref(epoch: int, index: int, manifest: Manifest, entry: BatchEntry) -> Batch:
    """Batch ``index`` of a read epoch, the cache's ``entry``: its data a reference to its file."""
    ref = CachedRef(os.path.join(manifest.folder, entry.name), entry.size, entry.sha256)
    meta = padding_flags(entry.padding, entry.rows) if manifest.flags else None
    return Batch(epoch, index, ref, entry.paths, meta, rows=entry.rows, cached=manifest.source_epoch)
