"""Placement by measurement: with ``num_workers="auto"`` and worker processes started, each file's
user code runs where the consumer measured it faster, in threads of this process or in the workers.

Where user code is cheapest depends on more than the code: a Python parse holds the GIL (workers
pay), a tokenizer with its own thread pool or a pyarrow read does not (the copies between
processes cost more than they save), and the training step shares the GIL with threads of this
process. So ``"auto"`` starts the workers (before any thread of the run, ``_execution.forking``)
and then measures both places as the consumer sees them.

Contract:

* **Placed per file.** As a file's reading starts (``place``), it is given a place: ``HERE``
  (read, encoded and collated in threads of this process), ``THERE`` (all in a worker) or
  ``SPLIT`` (read in a worker, encoded and collated here: a Python parse beside a
  ``batch_encode`` that releases the GIL or runs its own thread pool, as a tokenizer) or
  ``SPREAD`` (read in a worker, each batch encoded by the least busy worker: a file of many
  batches whose encoding is the cost, which ``THERE`` leaves to the one worker that read it) or
  ``FEWER`` (as ``THERE``, in all the workers but one, whose core is then left to a consumer busy
  with its own work: a training step sharing the cores with the workers). A file's
  place never changes once its reading began, and the batches are the same in both places (their
  cut, order, positions and ``pyloader.rng()`` draws do not depend on where they ran), so a change
  of place loses, repeats and reorders nothing, and resume is unaffected.
* **Measured by the consumer.** Consecutive files placed alike form a window. A window's figure
  is the samples handed over per second (``handed``), from its first batch handed over to the
  moment the next window's first file starts (after that the other place's work overlaps); its
  first quarter is left out (batches made while the previous window was consumed). The figure
  holds everything a place costs: copies between processes, the GIL shared with the training
  step, a thread pool of the user's own, a slow consumer (then both places measure alike).
* **Schedule.** The trial takes the two whole places in turn, then the first again
  (``WORKERS_FIRST``: workers, threads, workers), and each place's figure is its best window's:
  a run's first window holds its start-up (which only lowers it), and a window that follows one
  of the other place starts with the files read ahead for it, which come out at once (which
  raises it), so the first place's second window is the one that compares with the other's;
  but when the first window measured faster, the second was held back by the change of place
  (the other place's files still in flight beside its own). The workers go first when they
  start by fork: ``"auto"`` started them because user code runs Python, which they run beside
  the consumer, so a short run spends its first seconds in the place most often kept.
  Workers started by spawn or forkserver warm up for seconds (each imports the user's modules):
  there threads go first (``THREADS_FIRST``: nothing is copied, nothing waits). The faster is
  kept if it measured more than ``CLEAR`` faster than ``HERE``, else ``HERE`` is (a single
  window's figure varies by about that much, and the probes correct a close call).
  A first window in the workers whose consumer waited for batches under ``FED`` of it ends the trial
  with the workers kept: the loading is hidden, copies and all (a training step slower than the
  loading), and threads would share the GIL with the step; their window, waiting behind the files
  read ahead of a slow consumer, would take every file started meanwhile. ``FED`` (13%) is the
  share of waiting whose removal would make the run ``CLEAR`` faster: no place can beat the workers
  by more by feeding the consumer better. The window after that one is a probe of ``FEWER``: the
  consumer is the busy one, and may run faster with a core of its own.
  The kept place's first window (``2 * TRIAL_S``) confirms it: its figure replaces the trial's,
  and when another place's figure beats it by more than ``CLEAR``, that place is kept instead and
  confirmed in turn, once per place. The bar is ``CLEAR`` both ways: the other figures were
  measured after a change of place, which can flatter them (files read ahead during the window
  before come out at once), and the confirming window was not.
  Then the kept place runs in windows of ``STEADY_S``, with a probe window of another place after
  every ``PROBE_AFTER`` of them: the two mixed places first (``SPLIT``, ``SPREAD``: they pay on
  some workloads only, and each window in a slower place costs a short run most of what it lasts),
  then the other places in turn. ``SPREAD`` is left out while ``THERE`` measured no faster than
  ``HERE`` (it adds a round trip of the rows to what ``THERE`` pays, so it cannot win where copies
  already cost more than they save), and ``FEWER`` while the kept place's last window was not fed
  (fewer workers cannot feed a waiting consumer faster). A probe faster by more than ``MARGIN`` than the kept place's
  last window changes the place, and the new place's first window confirms it as above. A window
  of the trial or a probe that measured under half the best figure so far ends after half its
  batches (``MIN_BATCHES // 2``): such a place cannot be kept, and every batch there is slow.
* **Not at an epoch's end.** When an epoch has fewer files left than the current window had placed
  when it measured enough, the window goes on to the epoch's end: the next one could not measure as
  much before it (with read-ahead, most of its files would be those it cannot judge), and in a run
  of one short epoch its files would only run in a place not yet measured. The next epoch's first
  file opens it.
* **Carried over.** A loader's next iteration goes on from the decision (and the schedule) of the
  one before, so a run of one epoch per ``iter()`` pays for the trial once. A new loader, in this
  process or the next run of the program, starts where the last run of the same code on the same data
  kept its files (``remembered``, from ``_execution.remembered``): no trial, its first window confirms
  the place, and the probes go on. A run that ended before its trial did (a short one) leaves the
  trial's first place, unless another measured more than ``CLEAR`` faster.
* **Shown.** ``report()`` (in ``loader.stats["placement"]["measured"]``): the place now (a probe's,
  during one), the place kept (``None`` during the trial), the last windows' figures, and each
  change with its figures. Changes are logged (INFO, logger ``pyloader``).

``place`` and ``window_of`` run on the run's event loop, ``handed`` in the consumer's thread;
one lock keeps them apart. Nothing here runs user code or waits.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

HERE = "threads"  # read, encoded and collated in threads of this process
THERE = "workers"  # ... in a worker process
SPLIT = "workers, then threads"  # read in a worker, its rows brought here, encoded and collated in threads
SPREAD = "workers, batches spread"  # read in a worker, its rows brought here, each batch sent to the least busy one
FEWER = "workers, one fewer"  # as THERE, in all the workers but one: a core left to a busy consumer

_log = logging.getLogger("pyloader")

Key = Tuple[int, str]  # (epoch, path) of a file read in a run

WORKERS_FIRST = (THERE, HERE, SPLIT, SPREAD, FEWER)  # the trial's order when the workers start by fork
THREADS_FIRST = (HERE, THERE, SPLIT, SPREAD, FEWER)  # ... by spawn or forkserver


@dataclass
class Window:
    """Consecutive files placed alike, and what the consumer measured of them."""

    place: str
    min_s: float
    beaten: float = 0.0  # a window of the trial or a probe whose rate is below this can end early
    handed: List[Tuple[float, int]] = field(default_factory=list)  # (when, samples) of its batches
    waited: List[float] = field(default_factory=list)  # how long the consumer waited for each of them
    closed_at: float = math.inf  # when the next window's first file was placed
    files: int = 0  # placed in it so far
    files_to_enough: Optional[int] = None  # placed in it when it had measured enough

    def measured_s(self) -> float:
        return self.handed[-1][0] - self.handed[0][0] if len(self.handed) > 1 else 0.0

    def enough(self) -> bool:
        if len(self.handed) >= Measured.MIN_BATCHES:
            return self.measured_s() >= self.min_s
        return len(self.handed) >= Measured.MIN_BATCHES // 2 and self.rate() < self.beaten

    def _after_cut(self) -> Tuple[List[int], float, float]:
        """The batches after the window's first quarter, which its figures leave out, when that
        quarter ends, and the span after it."""
        if len(self.handed) < 2:
            return [], 0.0, 0.0
        first, last = self.handed[0][0], self.handed[-1][0]
        cut = first + 0.25 * (last - first)
        return [k for k, (t, _) in enumerate(self.handed) if t > cut], cut, last - cut

    def rate(self) -> float:
        """Samples per second over the window's measured span, less its first quarter (0: no figure yet)."""
        kept, _, span = self._after_cut()
        return sum(self.handed[k][1] for k in kept) / span if kept and span > 0 else 0.0

    def waited_share(self) -> Optional[float]:
        """The share of that span the consumer waited for batches (``None``: no figure yet, or the waits
        were not told); a wait counts from the span's start or the batch before, whichever is later."""
        kept, cut, span = self._after_cut()
        if span <= 0 or not all(map(math.isfinite, self.waited)):
            return None
        return sum(min(self.waited[k], self.handed[k][0] - max(cut, self.handed[k - 1][0])) for k in kept) / span

    def fed(self) -> bool:
        """Whether the consumer waited for batches under ``FED`` of the window: the loading was hidden."""
        share = self.waited_share()
        return share is not None and share < Measured.FED

    def as_dict(self) -> Dict[str, object]:
        rate = self.rate()
        share = self.waited_share()
        return {"place": self.place, "batches": len(self.handed), "seconds": round(self.measured_s(), 3),
                "samples_per_s": round(rate, 1) if rate else None,
                "consumer_waited": None if share is None else round(share, 3)}


class Measured:
    """The places of one loader's files, decided by measuring each (see the module's docstring)."""

    TRIAL_S = 0.25  # the least measured span of a trial window
    STEADY_S = 8.0  # ... of a window of the kept place
    MIN_BATCHES = 8
    MARGIN = 0.05  # a probe is faster when it measured more than this share faster
    CLEAR = 0.15  # the trial leaves threads for a place that measured more than this share faster
    # a window whose consumer waited for batches under this share of it hid the loading: feeding it at once
    # would make the run at most 1 / (1 - FED) = 1 + CLEAR times faster, which is not clearly faster
    FED = CLEAR / (1 + CLEAR)
    PROBE_AFTER = 3  # windows of the kept place between two probes of the other
    _KEPT_WINDOWS = 8  # in ``report()``

    def __init__(self, clock: Callable[[], float] = time.perf_counter, trial: Tuple[str, ...] = WORKERS_FIRST, *,
                 remembered: Optional[str] = None, keep: Optional[Callable[[str], None]] = None) -> None:
        self._clock = clock
        self.trial = trial  # the places: the trial takes the first two, the probes the others first
        self._lock = threading.Lock()
        self.kept: Optional[str] = None  # the place decided on, once the trial is over
        self._keep = _unsaid if keep is None else keep  # told each place kept (``_execution.remembered``)
        self.remembered = remembered if remembered in trial else None  # kept by an earlier run: no trial
        self.changes: List[Dict[str, object]] = []
        self._windows: List[Window] = []
        self._files: Dict[Key, Window] = {}
        self._steady = 0  # windows of the kept place since the last probe
        self._confirming = False  # the current window of the kept place is its first: it confirms the choice
        self._trial: Dict[str, float] = {}  # each place's trial (or winning probe) figure, then its confirming window's
        self._checked: Set[str] = set()  # places whose confirming window measured
        self._probes = 0  # probes so far: they take the other places in turn
        self._trial_windows = 0  # windows of the trial that ended
        self._epoch_files: Optional[int] = None  # how many files an epoch of the run reads
        if self.remembered is not None:  # its first window confirms it, as one confirms a trial's decision
            self.kept, self._confirming = self.remembered, True

    @property
    def current(self) -> Window:
        return self._windows[-1]

    def first_place(self) -> str:
        """The place of an iteration's first files: the trial's first, or where the last one left off."""
        return self.current.place if self._windows else self.kept or self.trial[0]

    def new_run(self, epoch_files: Optional[int] = None) -> None:
        """A new iteration (whose epochs read ``epoch_files`` files): its files are new, the decision and the
        schedule go on."""
        with self._lock:
            self._files.clear()
            self._epoch_files = epoch_files
            self._open(self.first_place())

    def place(self, epoch: int, path: str, pos: Optional[int] = None) -> str:
        """The place of a file whose reading starts now (the ``pos``-th of its epoch)."""
        with self._lock:
            window = self.current
            if window.enough():
                if window.files_to_enough is None:
                    window.files_to_enough = window.files
                    self._remember_provisionally()
                if not self._ending(pos, window.files_to_enough):
                    self._open(self._next_place())
            window = self.current
            window.files += 1
            self._files[(epoch, path)] = window
            return window.place

    def _ending(self, pos: Optional[int], files_to_enough: int) -> bool:
        """The epoch has fewer files left than the current window took to measure enough: the next window
        could not measure as much before the epoch ends, so the current one goes on until then."""
        if pos is None or self._epoch_files is None:
            return False
        return self._epoch_files - pos < files_to_enough

    def window_of(self, keys: Iterable[Key]) -> Optional[str]:
        """The place of files already placed, if they all have the same one."""
        with self._lock:
            places = {self._files[k].place if k in self._files else None for k in keys}
        return places.pop() if len(places) == 1 else None

    def handed(self, epoch: int, paths: Iterable[str], samples: int, waited: float = math.inf) -> None:
        """A batch of ``paths`` (of ``epoch``) was handed over to the consumer, who waited ``waited``
        seconds for it (``inf``: not known)."""
        now = self._clock()
        with self._lock:
            windows = [self._files.get((epoch, p)) for p in paths]
            window = next(iter(windows), None)
            if window is None or any(w is not window for w in windows):
                return  # rows of files placed in different windows, or of no placed file
            if now <= window.closed_at:
                window.handed.append((now, samples))
                window.waited.append(waited)

    def report(self) -> Dict[str, object]:
        with self._lock:
            return {"place": self.current.place, "kept": self.kept, "trial_over": self.kept is not None,
                    "remembered": self.remembered,
                "windows": [w.as_dict() for w in self._windows[-self._KEPT_WINDOWS:]],
                "changes": list(self.changes)}

    def _open(self, place: str) -> None:
        now = self._clock()
        if self._windows:
            self.current.closed_at = now
        self._windows.append(Window(place, self._window_s(place), self._beaten(place)))
        del self._windows[:-2 * self._KEPT_WINDOWS]
        live = {id(w) for w in self._windows[-3:]}  # files of older windows are no longer handed over
        self._files = {k: w for k, w in self._files.items() if id(w) in live}

    def _beaten(self, place: str) -> float:
        """Half the best figure of the windows so far, for a window of the trial or a probe: a place that
        slow cannot be kept, so its window ends after half the batches (0: a window of the kept place)."""
        if place == self.kept:
            return 0.0
        return 0.5 * max((w.rate() for w in self._windows), default=0.0)

    def _window_s(self, place: str) -> float:
        if self._confirming:
            return 2 * self.TRIAL_S
        return self.STEADY_S if place == self.kept else self.TRIAL_S

    def _next_place(self) -> str:
        """The place of the window after the current one (which measured enough)."""
        if self.kept is None:
            return self._trial_step()
        if self.current.place != self.kept:  # a probe ended
            self._after_probe()
            return self.kept
        if self._confirming:
            return self._confirmed()
        self._steady += 1
        if self._steady < self.PROBE_AFTER:
            return self.kept
        self._steady = 0
        return self._next_probe()

    def _next_probe(self) -> str:
        """The place of the next probe: the places other than the kept one, in turn."""
        others = [p for p in _probed(self.trial, self._trial, self.current.fed()) if p != self.kept]
        self._probes += 1
        return others[(self._probes - 1) % len(others)]

    def _trial_step(self) -> str:
        """The trial's next place, or the place kept once it is over. Its windows are its two places,
        then the first again; each place's figure is its best window's (see the module)."""
        rates = _best_rates(self._windows)
        self._trial_windows += 1
        if self._fed_at_once():
            self._change(THERE, rates, "fed")  # the loading is hidden, copies and all: only a probe can do better
            self._trial = dict(rates)
            return FEWER if FEWER in self.trial else THERE  # the consumer is busy: a core of its own may help it
        untried = [p for p in self.trial[:2] if p not in rates]
        if untried:
            return untried[0]
        if self._trial_windows == 2:  # the first place again
            return self.trial[0]
        return self._trial_decided(rates)

    def _remember_provisionally(self) -> None:
        """During the trial, as each of its windows measured enough: the place the next run should start
        in if this one ends before the trial does (a short run, or an epoch's last window going on to
        its end): the first place, unless another measured more than ``CLEAR`` faster."""
        if self.kept is not None:
            return
        self._keep(self._clearly_faster(_best_rates(self._windows), than=self.trial[0]))

    def _clearly_faster(self, rates: Dict[str, float], *, than: str) -> str:
        """The fastest place of ``rates`` if it measured more than ``CLEAR`` faster than ``than``, else ``than``."""
        best = max(rates, key=lambda p: rates[p], default=than)
        return best if rates.get(best, 0.0) > rates.get(than, 0.0) * (1 + self.CLEAR) else than

    def _fed_at_once(self) -> bool:
        """The trial's first window ran in the workers and its consumer was fed (see ``Window.fed``)."""
        return self._trial_windows == 1 and self.current.place == THERE and self.current.fed()

    def _trial_decided(self, rates: Dict[str, float]) -> str:
        """The place the trial keeps: the fastest if it beat ``HERE`` by more than ``CLEAR``, else ``HERE``;
        its first window confirms it."""
        kept = self._clearly_faster(rates, than=HERE)
        self._change(kept, rates, "trial")
        self._trial, self._confirming = dict(rates), True
        return kept

    def _confirmed(self) -> str:
        """The place after the kept place's first window, which replaces the place's trial figure: a
        place whose figure beats it by more than ``CLEAR`` is kept instead, and confirmed in turn unless
        it already was. A window after a change of place can flatter it (files read ahead during the
        window before come out at once); each place is confirmed once."""
        kept = self.kept
        assert kept is not None, "a confirming window follows the trial"
        rate = self.current.rate()
        self._confirming = False
        if not rate:
            return kept
        self._trial[kept] = rate
        self._checked.add(kept)
        best = max(self._trial, key=lambda p: self._trial[p])
        if self._trial[best] <= rate * (1 + self.CLEAR):  # the kept place itself, or not faster enough
            return kept
        self._change(best, {best: self._trial[best], kept: rate}, "confirm")
        self._confirming = best not in self._checked
        return best

    def _after_probe(self) -> None:
        probe, kept = self.current, self._last_of(self.kept)
        if kept is None:
            return
        probe_rate, kept_rate = probe.rate(), kept.rate()
        if kept_rate and probe_rate > kept_rate * (1 + self.MARGIN):
            self._change(probe.place, {probe.place: probe_rate, kept.place: kept_rate}, "probe")
            self._trial.update({probe.place: probe_rate, kept.place: kept_rate})
            self._confirming = True

    def _last_of(self, place: Optional[str]) -> Optional[Window]:
        return next((w for w in reversed(self._windows[:-1]) if w.place == place), None)

    def _change(self, place: str, rates: Dict[str, float], by: str) -> None:
        figures = {p: round(r, 1) for p, r in rates.items()}
        if place != self.kept:
            self.changes.append({"to": place, "by": by, "window": len(self._windows), "samples_per_s": figures})
            _log.info("num_workers='auto': user code now runs in %s (%s measured %s samples/s)", place, by, figures)
            self._keep(place)
        self.kept = place
        self._steady = 0


def _unsaid(place: str) -> None:
    """Where a place kept is told to no one."""


def _best_rates(windows: List[Window]) -> Dict[str, float]:
    """Each place's best window figure (places with none left out)."""
    rates: Dict[str, float] = {}
    for window in windows:
        rates[window.place] = max(rates.get(window.place, 0.0), window.rate())
    return {place: rate for place, rate in rates.items() if rate}


def _probed(trial: Tuple[str, ...], rates: Dict[str, float], fed: bool) -> Tuple[str, ...]:
    """The places probes take, in turn: the mixed ones first, then the whole ones; batches spread
    over the workers only while the workers measured faster than threads (spreading adds a round
    trip of the rows); one worker fewer only while the consumer was ``fed`` (a core of its own can
    only help a consumer that the loading keeps waiting for nothing)."""
    order = trial[2:] + trial[:2]
    left_out = {SPREAD} if rates.get(THERE, 0.0) <= rates.get(HERE, 0.0) else set()
    if not fed:
        left_out.add(FEWER)
    return tuple(p for p in order if p not in left_out)
