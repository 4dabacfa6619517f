"""Stage 3, stream mode: batch row ``r`` continues where it stopped in the previous batch.

Each of the ``B`` rows reads one file at a time, in plan order, through
``iter_file``; a row whose file has ended takes the next unread file at the
next step (ties go to the lower row: ``_stages.stream_rows``). Per row and step the
batch holds one sample, or a window of ``seq_len`` consecutive samples padded at
a file's end (``_stages.stream_cut``). Metadata travels beside the data (``Batch.meta``),
never through user code. A row's file may be a slice of one (``_stages.entries``):
``__position__`` then counts rows of the file from the slice's start.

Under ranks the steps are planned from ``DataReader.count``, so each file is
checked against its count (a mismatch fails like a read error, naming the file),
and every epoch pads the same way whatever came before it (a resumed run too).
"""
from __future__ import annotations

from typing import Any, AsyncIterator, Callable, List, Optional, Sequence

from .batch import Group, GroupSize
from .read import FileStream, OpenFile, PiecesOf, ReadItem
from .source import EpochEnd, FileTask
from .stream_cut import FIRST, POSITION, REPLAY, STREAM_ID, VALID, Cutter, StreamShape
from .stream_plan import before
from .stream_resume import StreamStart
from .stream_rows import Rows

META_KEYS = (FIRST, VALID, REPLAY, STREAM_ID, POSITION)
PADDING_MODES = ("zeros", "data", "edge")


class StreamBatcher:
    """Cuts each epoch into stream batches of ``rows`` rows (``seq_len`` samples per row, or one).

    Groups cut from one block are sized in samples (``GroupSize.of_small``): stream
    batches are small.
    """

    def __init__(self, files: Sequence[str], pieces: PiecesOf, open_file: OpenFile, shape: StreamShape, *,
                 target: Optional[Callable[[int], int]] = None,
                 fallback: Optional[Callable[[int], List[FileTask]]] = None,
                 start: Optional[StreamStart] = None) -> None:
        self.files = files
        self.pieces = pieces  # a file's pieces, as the read stage delivers them
        self.open_file = open_file  # a file read again now (a row's replay, a resumed row), outside the plan
        self.rows = shape.rows
        self.seq_len = shape.seq_len
        self.padding_mode = shape.padding_mode
        self.cutter = Cutter(shape)
        # under ranks: the step count of epoch e every rank must give, and files to replay
        # for a rank that has none of its own (padding needs the fields' shapes)
        self.target = target
        self.fallback = fallback
        self.start = start  # where the first epoch begins, when not at its first step (``_stages.stream_resume``)
        step = shape.rows * (shape.seq_len or 1)
        self.group_limit = GroupSize.of_small(step)

    async def iterate(self, items: AsyncIterator[ReadItem]) -> AsyncIterator[Group]:
        items = aiter(items)
        async for head in items:
            if isinstance(head, EpochEnd):  # this rank has no file this epoch: under ranks, padding steps only
                files, epoch = _nothing(), head.epoch
            else:
                async def unread(head: FileStream = head) -> AsyncIterator[FileStream]:
                    yield head
                    async for item in items:
                        if isinstance(item, EpochEnd):
                            return
                        yield item

                files, epoch = unread(), head.task.epoch
            async for batch in self._epoch(files, epoch):
                yield batch
            async for stream in files:  # cut short (even_batches="drop"): the rest is not read
                stream.cancel()

    async def _epoch(self, unread: AsyncIterator[FileStream], epoch: int) -> AsyncIterator[Group]:
        start = self._start_in(epoch)
        if start is not None and start.at.ended:
            return  # resumed at the epoch's end
        rows = Rows(self.rows, unread, self.pieces, self.open_file, replay=self.padding_mode == "data")
        self.cutter.reset()
        sizes = GroupSize(self.group_limit)
        target = self._target_of(epoch)
        try:
            index = 0 if start is None else await self._restore(rows, start)
            while before(index, target):
                first = await rows.step_files(target is not None, self.cutter.template is not None,
                                              lambda: self._fallback(epoch))
                if first is None:
                    return
                group = await self._cut(rows, first, epoch, index, target, sizes)
                index += len(group)
                yield group
        finally:
            await rows.close()

    def _start_in(self, epoch: int) -> Optional[StreamStart]:
        """Where ``epoch`` begins, when it is the resumed one (``None``: at its first step)."""
        return self.start if self.start is not None and self.start.epoch == epoch else None

    def _target_of(self, epoch: int) -> Optional[int]:
        """Under ranks, the steps every rank gives in ``epoch`` (``None``: as many as the rows give)."""
        return self.target(epoch) if self.target is not None else None

    async def _restore(self, rows: Rows, start: StreamStart) -> int:
        """Put the rows of a resumed epoch where they were at its position, and what pads them
        there; the step that is."""
        at = start.at
        await rows.restore(at)
        if self.padding_mode == "edge":
            for r, held in at.edges:
                self.cutter.remember_edge(r, await rows.last_sample(held))
        if at.template is not None:
            self.cutter.template = await rows.last_sample(at.template)
        return start.base + at.step

    def _fallback(self, epoch: int) -> List[FileTask]:
        assert self.fallback is not None, "ranks give a fallback"
        return self.fallback(epoch)

    async def _cut(self, rows: Rows, first: Any, epoch: int, index: int, target: Optional[int],
                   sizes: GroupSize) -> Group:
        """The next group: as many steps as can be cut at once (none past ``target``), else one."""
        steps = self.cutter.steps_ahead(rows.rows)
        if target is not None:
            steps = min(steps, target - index)
        if steps:
            return self.cutter.cut_steps(rows.rows, first, epoch, index, min(steps, sizes.take()))
        return [await self.cutter.step(rows.rows, first, epoch, index)]

async def _nothing() -> AsyncIterator[FileStream]:
    return
    yield  # an async generator that yields nothing
