"""Stream mode, resumed: where a resumed epoch's rows are, found from the counts, and the files it reads.

A state records the steps of the epoch handed out. Which file each row is in at
that step, and how far, follows from the plan and ``DataReader.count``
(``_stages.stream_plan.Schedule``), so a resumed epoch reads the files in progress from
where their rows are (skipping the samples before, as a slice starts past its
file's first row) and the files not started yet, never the files that ended before
the position: before its first batch it reads those in progress (at most one per
row) and the read-ahead. With ``padding_mode="edge"`` a row without a file there
also reads its last file's last sample (what pads it); a position where no row has
a file (padding steps under ranks) reads the last sample of the file the last real
step was cut from (the fields' layout).

An elastic resume (``_stages.source.Elastic``) starts this rank's share of what the ranks
before left at step ``base`` of the epoch: a ``StreamStart`` at no step into it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional

from .source import EpochEnd, FileSource, FileTask, SourceItem
from .stream_plan import Item, RowsAt, Schedule
from .stream_rows import last_part


@dataclass
class StreamStart:
    """Epoch ``epoch`` of this rank begins at step ``base + at.step``: its plan is ``items``
    (tasks and lengths) from step ``base`` on, and ``at`` is where its rows are."""

    epoch: int
    base: int
    at: RowsAt
    items: List[Item]

    def tasks(self) -> List[FileTask]:
        """The files the epoch reads from its position: those in progress from where their rows
        are, in plan order, then those not started."""
        if self.at.ended:
            return []
        going = sorted(self.at.in_progress(replay=False), key=lambda row: row[1].place)
        return [last_part(held) for _, held in going] + [task for task, _ in self.items[self.at.started:]]

    def read_again(self, edges: bool) -> List[str]:
        """The files read before the position to find the rows' places (``edges``: with edge padding)."""
        if self.at.ended:
            return []
        rows = self.at.in_progress(replay=False) + self.at.in_progress(replay=True) + (self.at.edges if edges else [])
        template = [] if self.at.template is None else [self.at.template.item.path]
        return [held.item.path for _, held in rows] + template

    def source(self, source: FileSource, until: int) -> Iterator[SourceItem]:
        """``source``'s items to epoch ``until`` (exclusive), the first epoch from the position."""
        yield from self.tasks()
        yield EpochEnd(self.epoch)
        yield from source.iterate(self.epoch + 1, 0, until)


def stream_start(source: FileSource, epoch: int, base: int, steps: int, rows: int, width: int, replay: bool,
                 target: Optional[int], fallback: Optional[Callable[[int], List[FileTask]]]) -> StreamStart:
    """Where epoch ``epoch`` of this rank is ``steps`` steps past ``base`` (``replay``: padding
    with data; ``target``: the epoch's steps under ranks; ``fallback``: what a rank with no
    file replays there)."""
    items = [(task, source.length(task)) for task in source.tasks(epoch)]
    spare = [(task, source.length(task)) for task in fallback(epoch)] if fallback is not None else []
    schedule = Schedule(items, rows, width, replay, None if target is None else target - base, spare)
    return StreamStart(epoch, base, schedule.run(steps).at(), items)
