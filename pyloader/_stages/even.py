"""Under ranks, every epoch gives this rank exactly the steps planned for it, whatever was skipped.

Ranks never talk to each other, so each must give the number of steps planned
from the file counts (``FileSource.steps``), or DDP waits forever at the next
collective. The batchers cut that many batches (padding a share that lost
samples to a skipped read), and never more. A batch whose ``batch_encode`` or
``collate_batch`` failed and was skipped leaves a hole: ``EvenSteps`` fills it
with a padding batch, a copy of the next batch that succeeded (of the last one,
at the end of the run) with its metadata saying padding (``__padding__`` true;
in stream mode ``__valid__`` false and ids and positions -1). The copy is of the
next batch, not the previous one, so that a resumed run fills a hole with what
the uninterrupted run used.
"""
from __future__ import annotations

from typing import AsyncIterator, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .batch import PADDING, Batch, Group, GroupSize, Stacked
from .stream import FIRST, POSITION, REPLAY, STREAM_ID, VALID

# what each metadata field says on a padding batch
PAD_FLAGS = {PADDING: True, FIRST: False, VALID: False, REPLAY: False, STREAM_ID: -1, POSITION: -1}
Sample = Tuple[object, Dict[str, np.ndarray]]  # a batch's collated data (without metadata) and its metadata
Step = Tuple[int, int]  # (epoch, batch index)


class EvenSteps:
    """Passes collated groups on, with padding batches where planned steps are missing.

    ``steps(e)`` is the number of batches of epoch ``e``; the run starts at batch
    ``skip`` of epoch ``epoch`` (resuming) and ends with epoch ``num_epoch - 1``.
    Runs before the metadata is attached to the collated batches.
    """

    def __init__(self, steps: Callable[[int], int], epoch: int, skip: int, num_epoch: int) -> None:
        self._steps = steps
        self._planned: Dict[int, int] = {}
        self._due: Step = (epoch, skip)  # the next step to give
        self._end: Step = (num_epoch, 0)
        self._cached: Dict[int, Optional[int]] = {}  # each epoch's ``Batch.cached``, for its padding batches

    def _planned_steps(self, epoch: int) -> int:
        if epoch not in self._planned:
            self._planned[epoch] = self._steps(epoch)
        return self._planned[epoch]

    def _holes(self, until: Step) -> List[Step]:
        """The steps due before ``until`` that no batch came for."""
        holes = []
        epoch, index = self._due
        while (epoch, index) < until:
            if index >= self._planned_steps(epoch):
                epoch, index = epoch + 1, 0
            else:
                holes.append((epoch, index))
                index += 1
        return holes

    async def iterate(self, groups: AsyncIterator[Group]) -> AsyncIterator[Group]:
        last: Optional[Sample] = None  # for holes at the end of the run: keeps one group's arrays alive
        async for group in groups:
            sample = _sample(group, len(group) - 1)  # before the consumer joins the metadata to the data
            for part in self._filled(group):
                yield part
            last = sample
        for padding in self._final_padding(last):
            yield padding

    def _filled(self, group: Group) -> Iterator[Group]:
        """``group``, with padding batches for the holes before its batches (split around them)."""
        start = 0
        # a Stacked group is whole (a failure turns it into a plain one): holes come only before it
        for k in range(1 if isinstance(group, Stacked) else len(group)):
            batch = group[k]
            self._cached[batch.epoch] = batch.cached
            holes = self._holes((batch.epoch, batch.index))
            if holes:
                if k > start:
                    yield group[start:k]
                yield from _padding(holes, _sample(group, k), self._cached)
                start = k
            self._due = (batch.epoch, batch.index + 1)
        self._due = (group[-1].epoch, group[-1].index + 1)
        yield group[start:] if start else group

    def _final_padding(self, last: Optional[Sample]) -> Iterator[Group]:
        """Padding for the steps this rank still owes at the run's end, copied from its ``last`` batch."""
        holes = self._holes(self._end)
        if not holes:
            return iter(())
        if last is None:
            raise RuntimeError(f"no batch of this run came through (each was skipped after an error, or filter_fn "
                               f"left too few samples for one): there is nothing to pad the {len(holes)} steps "
                               f"this rank still owes with (the other ranks would wait for them)")
        return _padding(holes, last, self._cached)


def _sample(group: Group, k: int) -> Sample:
    """Batch ``k``'s collated data and metadata, as they are before the metadata joins the data."""
    batch = group[k]
    if isinstance(group, Stacked):
        data = batch.data if group.outputs is None else {key: value[k] for key, value in group.outputs.items()}
        return data, {key: value[k] for key, value in (group.meta or {}).items()}
    return batch.data, batch.meta or {}


def _padding(holes: List[Step], sample: Sample, cached: Dict[int, Optional[int]]) -> Iterator[Group]:
    """A padding batch for each hole, copied from ``sample``, in groups of at most ``GroupSize.LIMIT``
    (``cached``: each epoch's ``Batch.cached``, so that a state saved after a padding batch resumes alike)."""
    data, meta = sample
    flags = {key: np.full_like(value, PAD_FLAGS[key]) for key, value in meta.items()}
    for start in range(0, len(holes), GroupSize.LIMIT):
        yield [Batch(epoch, index, data, (), dict(flags), cached=cached.get(epoch))
               for epoch, index in holes[start:start + GroupSize.LIMIT]]
