"""Stream mode's schedule from the counts alone: which file each row holds at a step of an epoch.

``Rows`` (``_stages.stream_rows``) gives files to rows as it reads them: at each step a
row whose file has ended takes the next unread file that has samples (lower rows
first); once none is left, ``padding_mode="data"`` replays the delivered files in
turn; under ranks, a rank with no file of its own replays one of the epoch's first.
A file of ``n`` samples holds its row for ``ceil(n / width)`` steps. Given every
file's length (``DataReader.count``), where each row is at any step is therefore a
function of the plan, which ``Schedule`` follows without reading a sample, jumping
from one file's end to the next (as many turns as files, not steps).

It gives the steps of an epoch (``stream_steps``: ``len()`` and, under ranks, the
step count every rank gives), where a resumed epoch's rows are (``Schedule.at``,
so that only the files in progress are read again), and what the ranks of an
elastic resume left undelivered (``leftover``).
"""
from __future__ import annotations

import copy
import dataclasses
import heapq
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

Item = Tuple[Any, int]  # something the plan lists (a FileTask, an index) and its length in samples


@dataclass(frozen=True)
class Held:
    """A row holds ``item`` (``length`` samples): at step ``since`` it had delivered ``offset`` of them.

    ``place``: the item's place in the plan (-1: a file replayed)."""

    item: Any
    length: int
    offset: int = 0
    since: int = 0
    replay: bool = False
    place: int = -1

    def end(self, width: int) -> int:
        """The step before which the row delivers the file's last sample."""
        return self.since - (-(self.length - self.offset) // width)

    def at(self, step: int, width: int) -> "Held":
        """The same file at ``step``."""
        offset = min(self.length, self.offset + (step - self.since) * width)
        return dataclasses.replace(self, offset=offset, since=step)


@dataclass
class RowsAt:
    """Where an epoch's rows are at ``step`` (counted from the plan's start), before they take files there.

    ``rows[r]``: the file row ``r`` is in, with samples left (``None``: none, or its file has
    ended); ``started``: the plan's items taken so far (``items[started:]`` are not started);
    ``delivered``, ``replays``, ``fresh_left``: what ``Rows`` holds there; ``cut``: whether a
    step before had a live row (then padding has a template). ``ended``: the epoch has no
    step ``step``. ``edges``: for each row without a file at ``step`` once the rows took
    files there, the last file it delivered from (``padding_mode="edge"`` pads it with that
    file's last sample); ``template``: when no row has a file there, the file the last step
    with one was cut from (its fields give the layout of padding).
    """

    step: int
    rows: List[Optional[Held]]
    started: int
    fresh_left: bool
    delivered: List[Item]
    replays: int
    cut: bool
    ended: bool
    edges: List[Tuple[int, Held]]
    template: Optional[Held]

    def in_progress(self, replay: bool) -> List[Tuple[int, Held]]:
        """The rows in a file (replayed ones, or the plan's), as ``(row, held)``."""
        return [(r, held) for r, held in enumerate(self.rows) if held is not None and held.replay == replay]


class Schedule:
    """``Rows``' rules over ``items`` (in plan order), ``rows`` rows of ``width`` samples a step.

    ``replay``: ``padding_mode="data"``; ``target``: the steps under ranks (``None``: the
    epoch ends once no row holds a file of the plan); ``fallback``: what a rank with no
    file of its own replays first. The rows whose files are live wait in a heap by the
    step their file ends, so a turn costs ``log(rows)``, not ``rows``.
    """

    def __init__(self, items: Sequence[Item], rows: int, width: int, replay: bool = False,
                 target: Optional[int] = None, fallback: Sequence[Item] = ()) -> None:
        self.items = items
        self.width = width
        self.replay = replay
        self.target = target
        self.fallback = fallback
        self.rows: List[Optional[Held]] = [None] * rows
        self.last: List[Optional[Held]] = [None] * rows  # each row's last file
        self.ends: List[Tuple[int, int]] = []  # heap of (end step, row) of the rows in a file
        self.idle = set(range(rows))  # rows without a file
        self.fresh = 0  # rows in a file of the plan (not a replay)
        self.template: Optional[Held] = None
        self.started = 0
        self.fresh_left = True
        self.delivered: List[Item] = []
        self.replays = 0
        self.step = 0
        self.cut = False
        self.ended = False

    def run(self, until: Optional[int] = None) -> "Schedule":
        """Follow the plan to step ``until`` (``None``: to the epoch's end)."""
        while not self.ended and before(self.step, until):
            self.ended = not before(self.step, self.target) or not self.take_files()
            if not self.ended:
                self._advance(until)
        return self

    def at(self) -> RowsAt:
        """Where the rows are now (see ``RowsAt``)."""
        after = self._fork()  # the files the rows take at this step: which rows stay without one
        goes_on = not self.ended and before(self.step, self.target) and after.take_files()
        rows = [None if held is None or held.end(self.width) <= self.step else held.at(self.step, self.width)
                for held in self.rows]
        edges, template = self._padding(after) if goes_on else ([], None)
        return RowsAt(self.step, rows, self.started, self.fresh_left, delivered=list(self.delivered),
                      replays=self.replays, cut=self.cut, ended=not goes_on, edges=edges, template=template)

    def _padding(self, after: "Schedule") -> Tuple[List[Tuple[int, Held]], Optional[Held]]:
        """What pads the rows once they took files at this step (``after``): ``RowsAt.edges``
        and ``RowsAt.template``."""
        edges = [(r, held) for r, held in enumerate(self.last) if r in after.idle and held is not None]
        return edges, None if after.ends else after.template

    def _fork(self) -> "Schedule":
        other = copy.copy(self)
        other.rows, other.ends, other.idle = list(self.rows), list(self.ends), set(self.idle)
        other.delivered = list(self.delivered)
        return other

    def take_files(self) -> bool:
        """Give each row whose file has ended the next one (``Rows.step_files``); whether the epoch
        has a step here."""
        ended = self._release()
        if ended and not self.ends:  # every row is without a file now (each is in the heap or idle)
            self.template = self.rows[min(ended)]  # what the last step with a live row was cut from
        for r in sorted(ended + list(self.idle)):
            self._hold(r, self._next_file())
        return self._has_step()

    def _has_step(self) -> bool:
        """Whether the epoch has a step here, the rows holding their files: yes while a row reads a file of
        its own; else only under ranks (``target``), where a rank with no file yet replays the fallback's."""
        if self.fresh:
            return True
        if self.target is None:
            return False
        if not self.cut and not self.ends:  # a rank with no file yet
            self._hold(0, self._replayed(self.fallback))
            return self.rows[0] is not None
        return True

    def _release(self) -> List[int]:
        """The rows whose files have ended by this step, taken out of the heap."""
        ended = []
        while self.ends and self.ends[0][0] <= self.step:
            r = heapq.heappop(self.ends)[1]
            held = self.rows[r]
            assert held is not None, "a row in the heap holds a file"
            self.fresh -= not held.replay
            ended.append(r)
        return ended

    def _hold(self, r: int, held: Optional[Held]) -> None:
        self.rows[r] = held
        if held is None:
            self.idle.add(r)
            return
        self.idle.discard(r)
        self.last[r] = held
        self.fresh += not held.replay
        heapq.heappush(self.ends, (held.end(self.width), r))

    def _next_file(self) -> Optional[Held]:
        new = self._next_unread()  # None once every item is started
        if new is not None:
            self.delivered.append((new.item, new.length))
            return new
        self.fresh_left = False
        return self._replayed(self.delivered) if self.replay and self.delivered else None

    def _next_unread(self) -> Optional[Held]:
        while self.started < len(self.items):
            item, length = self.items[self.started]
            self.started += 1
            if length:
                return Held(item, length, since=self.step, place=self.started - 1)
        return None

    def _replayed(self, items: Sequence[Item]) -> Optional[Held]:
        count = self.replays
        self.replays += 1
        for attempt in range(len(items)):
            item, length = items[(count + attempt) % len(items)]
            if length:
                return Held(item, length, since=self.step, replay=True)
        return None

    def _advance(self, until: Optional[int]) -> None:
        """Cut steps up to the next one where a row's file ends (or ``until``, or the target)."""
        bounds = [b for b in (until, self.target) if b is not None]
        self.cut = self.cut or bool(self.ends)
        self.step = min(bounds + [self.ends[0][0]] if self.ends else bounds)


def before(step: int, bound: Optional[int]) -> bool:
    """Whether ``step`` comes before ``bound`` (``None``: no bound)."""
    return bound is None or step < bound


def stream_steps(lengths: Sequence[int], rows: int, width: int) -> int:
    """How many steps stream mode takes for files of ``lengths`` (in order) over ``rows`` rows."""
    return Schedule([(k, n) for k, n in enumerate(lengths)], rows, width).run().step


def leftover(items: Sequence[Item], rows: int, width: int, steps: int) -> List[Tuple[Any, int, int]]:
    """What ``steps`` steps over ``items`` leave undelivered, in plan order: ``(item, offset,
    length)``, the files in progress from where their rows are, then those not started."""
    at = Schedule(items, rows, width).run(steps).at()
    going = sorted(at.in_progress(replay=False), key=lambda row: row[1].place)
    return [(held.item, held.offset, held.length) for _, held in going] + \
        [(item, 0, length) for item, length in items[at.started:]]
