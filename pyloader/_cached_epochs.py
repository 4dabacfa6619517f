"""The epochs of a run with ``cache_encoded``: each one read from the cache of encoded batches, or from the files.

The path of a batch, by the kind of its epoch:

- **read** (the epoch's block has a complete cache, ``_epoch_cache``): its manifest's
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
last batch, padding under ranks) stay where they were, at the end. Each batch carries
the epoch that wrote its cache (``Batch.cached``), so a state saved in a read epoch
resumes from the same cache; if that cache is gone, the epoch that wrote it is encoded
and written again first (the same batches for a ``batch_encode`` without randomness).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import TYPE_CHECKING, Any, AsyncGenerator, Callable, Dict, List, Optional, Sequence

import numpy as np

from ._batch import PADDING, Batch, Group, GroupSize
from ._epoch_cache import BatchEntry, CachedRef, EpochStore, EpochWriter, Manifest, ToWrite, load
from ._map import OrderedMap, Step
from ._rng import CACHED_EPOCH, derive_rng
from ._runners import Lane, LocalSteps
from ._state import Start

if TYPE_CHECKING:
    from ._pipeline import Settings

logger = logging.getLogger("pyloader")
FromFiles = Callable[[range, Callable], AsyncGenerator[Group, None]]  # (epochs, run) -> encoded groups (``_pipeline``)


def reorders(s: "Settings") -> bool:
    """Whether a read epoch's batches change places: when the batches of an epoch are shuffled anyway."""
    return s.shuffle or s.shuffle_buffer > 0 or s.bucket_by is not None or s.reader.shuffle


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

    ``from_files(epochs, run)``: the run's file stages over ``epochs``, ``run`` encoding (or
    encoding and collating) each group; ``encode``: the runner's ``run`` with ``batch_encode``
    alone; ``after``: the steps after it (``collate_batch``, ``pin_memory``), run here.
    """

    def __init__(self, s: "Settings", start: Start, source: Any, from_files: FromFiles, full: Callable,
                 encode: Callable, after: List[Step], lane: Lane, run_blocking: Callable,
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
        if epoch == start.epoch and start.skip:  # resumed: as the saved run had it
            if start.cached is None:
                return self.from_files(range(epoch, epoch + 1), self.full)
            found = await self._manifest(block, start.cached)
            return self._read(epoch, found or await self._rebuild(epoch, start.cached), start.skip)
        if epoch != block:
            manifest = await self._manifest(block)
            if manifest is not None:
                return self._read(epoch, manifest, 0)
            if (store.key, block) in store.oversized:
                return self.from_files(range(epoch, epoch + 1), self.full)
        return self._write(epoch, deliver=True)

    async def _manifest(self, block: int, source: Optional[int] = None) -> Optional[Manifest]:
        """The block's complete cache (written by epoch ``source``, when given), if any."""
        manifest = await self.run_blocking(self.store.manifest, block)
        return manifest if manifest is None or source is None or manifest.source_epoch == source else None

    async def _rebuild(self, epoch: int, source: int) -> Manifest:
        """Write the cache of epoch ``source`` again, for ``epoch`` resumed in it; raises when it cannot be."""
        logger.warning("pyloader cache_encoded: epoch %d resumes in batches read from the cache that epoch %d "
                       "wrote, which is gone from %r: encoding epoch %d again first", epoch, source,
                       self.store.folder, source)
        async with contextlib.aclosing(self._write(source, deliver=False)) as groups:
            async for _ in groups:
                pass
        manifest = await self._manifest(self.store.block(source), source)
        if manifest is None:
            raise RuntimeError(f"cannot resume epoch {epoch} exactly: its first batches came from the cache of "
                               f"encoded batches that epoch {source} wrote, which is gone from "
                               f"{self.store.folder!r} and could not be written again (see the warning above)")
        return manifest

    async def _read(self, epoch: int, manifest: Manifest, skip: int) -> AsyncGenerator[Group, None]:
        s = self.s
        rng = derive_rng(s.random_seed, CACHED_EPOCH, epoch) if reorders(s) else None
        order = batch_order(manifest.batches, s.reader.batch_size, rng)
        self._count("epochs_read")
        self._count("files_not_read", sum(1 for _ in self.source.tasks(epoch)))
        steps: List[Step] = [("cache_encoded", load), *self.after]
        run = LocalSteps(steps, self.lane, (s.collator,), s.stats.busy).run
        async for group in OrderedMap(run, s.concurrency, s.errors, s.stats).iterate(
                _refs(epoch, manifest, order, skip), self.tasks):
            self._count("batches_read", len(group))
            yield group

    async def _write(self, epoch: int, deliver: bool) -> AsyncGenerator[Group, None]:
        """``epoch`` from the files, its encoded batches written to the cache (``deliver``: and collated,
        then handed on; otherwise dropped once written)."""
        s = self.s
        writer: EpochWriter = await self.run_blocking(self.store.writer, epoch)
        skipped = s.errors.skipped
        committed = False
        try:
            steps: List[Step] = [("cache_encoded", writer.write), *(self.after if deliver else [])]
            uses = (s.collator,) if deliver else ()
            run = LocalSteps(steps, self.lane, uses, s.stats.busy).run
            encoded = _to_write(self.from_files(range(epoch, epoch + 1), self.encode), writer)
            async for group in OrderedMap(run, s.concurrency, s.errors, s.stats).iterate(encoded, self.tasks):
                if deliver:
                    yield group
            if s.errors.skipped != skipped:
                writer.failed = writer.failed or "errors were skipped in it"
            if writer.complete():
                await self.run_blocking(writer.commit, s.sharding.active)
                committed = True
                self._count("epochs_written")
                self._count("batches_written", len(writer.entries))
                self._count("bytes_written", writer.bytes)
            else:
                self._abandoned(writer)
        finally:
            if not committed:
                writer.abort()

    def _abandoned(self, writer: EpochWriter) -> None:
        self._count("writes_abandoned")
        if writer.failed is not None and "limit=" in writer.failed:
            self.store.oversized.add((self.store.key, writer.block))
        logger.warning("pyloader cache_encoded: the encoded batches of epoch %d are not cached (%s): the epochs "
                       "of its block are encoded from the files", writer.epoch, writer.failed)


async def _to_write(groups: AsyncGenerator[Group, None], writer: EpochWriter) -> AsyncGenerator[Group, None]:
    """Each encoded batch wrapped for the write step, its entry noted in the epoch's order."""
    async with contextlib.aclosing(groups):
        async for group in groups:
            for batch in group:
                name = f"{batch.index:08d}.npz"
                writer.expect(BatchEntry(name, batch.rows, batch.paths, padding_runs(batch.meta)))
                batch.data = ToWrite(batch.data, name)
            yield group


async def _refs(epoch: int, manifest: Manifest, order: List[int], skip: int) -> AsyncGenerator[Group, None]:
    """A read epoch's batches from its ``skip``-th on, in groups, each to be loaded by the ``load`` step."""
    sizes = GroupSize()
    k = skip
    while k < len(order):
        group: Group = []
        for index in range(k, min(len(order), k + sizes.take())):
            entry = manifest.batches[order[index]]
            ref = CachedRef(os.path.join(manifest.folder, entry.name), entry.size, entry.sha256)
            meta = padding_flags(entry.padding, entry.rows) if manifest.flags else None
            group.append(Batch(epoch, index, ref, entry.paths, meta, entry.rows, manifest.source_epoch))
        k += len(group)
        yield group
