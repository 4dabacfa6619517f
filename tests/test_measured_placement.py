"""``num_workers="auto"`` with workers started: each file runs where the consumer measured it faster.

The schedule's rules are checked on ``Measured`` alone with a made-up clock; the loader's tests
run real worker processes, with windows shortened so that files change place often, and compare
every batch with a run in threads.
"""
from __future__ import annotations

import logging
import math
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import psutil
import pytest
from conftest import IdReader, ListCollator, _is_mp_infrastructure, write_chunks

import pyloader as pl
from pyloader._execution.auto_workers import cpu_share
from pyloader._execution.measured import FEWER, HERE, SPLIT, SPREAD, THERE, THREADS_FIRST, Measured, Window

needs_workers = pytest.mark.skipif(cpu_share() < 2, reason="'auto' starts no worker on 1 CPU")


@pytest.fixture(autouse=True)
def no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYLOADER_NUM_WORKERS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def measure_window(m: Measured, clock: Clock, file: int, seconds_per_batch: float, batches: int = 20) -> str:
    """Place file ``file``, then hand over ``batches`` of its 10 samples, ``seconds_per_batch`` apart."""
    place = m.place(0, f"f{file}")
    for _ in range(batches):
        clock.now += seconds_per_batch
        m.handed(0, (f"f{file}",), 10)
    return place


def run_schedule(m: Measured, clock: Clock, speed: Dict[str, float], files: int) -> List[str]:
    """The places of ``files`` files, each taking ``speed[place]`` seconds per batch."""
    return run_varying(m, clock, files, lambda place, nth: speed[place])


def run_varying(m: Measured, clock: Clock, files: int, per_batch: Callable[[str, int], float]) -> List[str]:
    """Like ``run_schedule``, each file's batches taking ``per_batch(place, nth file of that place)``."""
    seen: Dict[str, int] = {}
    places = []
    for k in range(files):
        place = m.place(0, f"f{k}")
        places.append(place)
        seconds = per_batch(place, seen.get(place, 0))
        seen[place] = seen.get(place, 0) + 1
        for _ in range(20):
            clock.now += seconds
            m.handed(0, (f"f{k}",), 10)
    return places


@pytest.fixture
def short(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows measured over a few batches, so that one window is about one file here."""
    monkeypatch.setattr(Measured, "TRIAL_S", 0.05)
    monkeypatch.setattr(Measured, "STEADY_S", 0.1)
    monkeypatch.setattr(Measured, "MIN_BATCHES", 4)


def new_measured(clock: Clock) -> Measured:
    """Threads first, as with workers started by spawn: the schedule's rules read the same either way."""
    m = Measured(clock, trial=THREADS_FIRST)
    m.new_run()
    return m


def test_the_trial_takes_threads_the_workers_then_threads_again_and_the_probes_take_the_mixed_places_first(
        short: None) -> None:
    clock = Clock()
    m = new_measured(clock)
    speed = {HERE: 0.0100, THERE: 0.0098, SPLIT: 0.0110, SPREAD: 0.0110}
    places = run_schedule(m, clock, speed, 16)
    # the trial, the kept place's confirming window, then a probe after every PROBE_AFTER windows
    assert places == [HERE, THERE, HERE, HERE, HERE, HERE, HERE, SPLIT, HERE, HERE, HERE, SPREAD, HERE, HERE, HERE,
                      THERE]
    assert m.kept == HERE and [(c["to"], c["by"]) for c in m.changes] == [(HERE, "trial")]


def test_by_default_the_trial_takes_the_workers_first_and_keeps_a_place_by_the_same_rules(short: None) -> None:
    clock = Clock()
    m = Measured(clock)
    m.new_run()
    assert m.first_place() == THERE
    places = run_schedule(m, clock, {HERE: 0.02, THERE: 0.01, SPLIT: 0.02, SPREAD: 0.02}, 5)
    assert places == [THERE, HERE, THERE, THERE, THERE] and m.kept == THERE
    clock2 = Clock()
    m2 = Measured(clock2)
    m2.new_run()  # workers no faster than threads: threads kept, and no probe spreads batches
    places = run_schedule(m2, clock2, {HERE: 0.0100, THERE: 0.0105, SPLIT: 0.0101, SPREAD: 0.001}, 16)
    assert places == [THERE, HERE, THERE, HERE, HERE, HERE, HERE, SPLIT, HERE, HERE, HERE, THERE, HERE, HERE, HERE,
                      SPLIT]
    assert m2.kept == HERE


def test_a_place_whose_window_after_the_change_of_place_was_held_back_is_judged_by_its_best_window(
        short: None) -> None:
    """JPEG shards of one batch each: the workers' first window measured twice the threads', their second,
    right after the threads' window, as slow as the threads. Judged by its last window, the workers lost
    the trial, and the threads were kept until their confirming window measured them slower."""
    clock = Clock()
    m = Measured(clock)
    m.new_run()
    places = run_varying(m, clock, 5, lambda place, nth: 0.02 if place == HERE else (0.01 if nth == 0 else 0.019))
    assert places[:4] == [THERE, HERE, THERE, THERE]
    assert [(c["to"], c["by"]) for c in m.changes] == [(THERE, "trial")]


def test_a_place_clearly_faster_is_kept_after_the_trial(short: None) -> None:
    clock = Clock()
    m = new_measured(clock)
    places = run_schedule(m, clock, {HERE: 0.02, THERE: 0.01, SPLIT: 0.02, SPREAD: 0.02}, 6)
    assert places == [HERE, THERE, HERE, THERE, THERE, THERE]
    assert m.kept == THERE
    [change] = m.changes
    assert change["to"] == THERE and change["by"] == "trial"
    figures = change["samples_per_s"]
    assert isinstance(figures, dict) and figures[THERE] == pytest.approx(2 * figures[HERE], rel=0.01)


def test_a_place_flattered_by_its_trial_window_gives_way_once_its_first_kept_window_measures(short: None) -> None:
    clock = Clock()
    m = new_measured(clock)
    # the workers' trial window came out fast (files read ahead during the window before it)
    places = run_varying(m, clock, 7, lambda place, nth: 0.02 if place == HERE else (0.005 if nth == 0 else 0.03))
    assert places == [HERE, THERE, HERE, THERE, HERE, HERE, HERE]
    assert [(c["to"], c["by"]) for c in m.changes] == [(THERE, "trial"), (HERE, "confirm")]
    assert m.kept == HERE


def test_a_probe_flattered_by_its_window_gives_way_once_its_first_kept_window_measures(short: None) -> None:
    clock = Clock()
    m = new_measured(clock)
    speed = {HERE: 0.01, THERE: 0.02}
    places = run_varying(m, clock, 11, lambda place, nth: speed.get(place, 0.005 if nth == 0 else 0.03))
    assert places == [HERE, THERE, HERE, HERE, HERE, HERE, HERE, SPLIT, SPLIT, HERE, HERE]
    assert [(c["to"], c["by"]) for c in m.changes] == [(HERE, "trial"), (SPLIT, "probe"), (HERE, "confirm")]


@pytest.mark.parametrize("then", [0.0124, 0.0130])  # 3% and 8% slower than the threads' figure
def test_a_kept_place_whose_first_window_is_within_clear_of_another_s_figure_stays(short: None, then: float) -> None:
    """The other figures were measured after a change of place (which can flatter them), the confirming
    window was not: under ``CLEAR`` apart, a confirming window does not change the place."""
    clock = Clock()
    m = new_measured(clock)
    # the workers measured 20% faster in the trial, then slower than the threads' figure
    places = run_varying(m, clock, 7, lambda place, nth: 0.0120 if place == HERE else (0.0100 if nth == 0 else then))
    assert places == [HERE, THERE, HERE, THERE, THERE, THERE, THERE]
    assert [(c["to"], c["by"]) for c in m.changes] == [(THERE, "trial")]


@pytest.mark.parametrize("seconds_per_batch, ends_early", [(0.05, True), (0.016, False)])
def test_a_trial_window_measuring_under_half_the_best_figure_ends_after_half_its_batches(
        short: None, seconds_per_batch: float, ends_early: bool) -> None:
    clock = Clock()
    m = Measured(clock)
    m.new_run()
    assert measure_window(m, clock, 0, 0.01) == THERE  # 1,000 samples/s
    half = Measured.MIN_BATCHES // 2
    assert measure_window(m, clock, 1, seconds_per_batch, batches=half) == HERE
    # 5 times slower: it cannot be kept, so its window ends now (the workers' second one opens); at 0.6 times
    # it measures on
    assert m.place(0, "f2") == (THERE if ends_early else HERE)
    assert len(m.report()["windows"]) == (3 if ends_early else 2)  # type: ignore[arg-type]


def fed_window(m: Measured, clock: Clock, file: int, waited_share: float) -> str:
    """Place file ``file``; hand over 20 batches 10 ms apart, the consumer waiting ``waited_share`` of each gap."""
    place = m.place(0, f"f{file}")
    for _ in range(20):
        clock.now += 0.01
        m.handed(0, (f"f{file}",), 10, waited=0.01 * waited_share)
    return place


@pytest.mark.parametrize("waited_share, fed", [(0.0, True), (0.5 * Measured.FED, True), (2 * Measured.FED, False),
                                               (0.5, False)])
def test_workers_that_keep_the_consumer_fed_in_their_first_window_are_kept_without_trying_threads(
        short: None, waited_share: float, fed: bool) -> None:
    """A training step slower than the loading: the consumer hardly waits, so the loading is hidden, and
    threads, sharing the GIL with the step, could only slow it down; their window would cost a run of a few
    seconds most of what it lasted (the files read ahead of a slow consumer all went to the window's place)."""
    clock = Clock()
    m = Measured(clock)
    m.new_run()
    places = [fed_window(m, clock, k, waited_share) for k in range(4)]
    if fed:  # then a window in one worker fewer, no faster here: the workers again
        assert places == [THERE, FEWER, THERE, THERE] and m.kept == THERE
        assert [(c["to"], c["by"]) for c in m.changes] == [(THERE, "fed")]
    else:
        assert places[:3] == [THERE, HERE, THERE] and m.kept is not None


def fed_windows(m: Measured, clock: Clock, files: range, seconds: Dict[str, float], waited_share: float) -> List[str]:
    """``fed_window`` for each file, a batch of each place taking ``seconds[place]``."""
    places = []
    for k in files:
        places.append(m.place(0, f"f{k}"))
        for _ in range(20):
            clock.now += seconds[places[-1]]
            m.handed(0, (f"f{k}",), 10, waited=seconds[places[-1]] * waited_share)
    return places


def test_a_fed_consumer_that_one_worker_fewer_serves_faster_gets_a_core_of_its_own(short: None) -> None:
    """A training step that shares the cores with the workers: with one worker fewer the step runs faster and
    the loading still keeps up. The window right after the workers' fed one tries it; it is kept, then confirmed."""
    clock = Clock()
    m = Measured(clock)
    m.new_run()
    seconds = {THERE: 0.011, FEWER: 0.010, HERE: 0.02, SPLIT: 0.02, SPREAD: 0.02}
    places = fed_windows(m, clock, range(6), seconds, 0.0)
    assert places == [THERE, FEWER, FEWER, FEWER, FEWER, FEWER] and m.kept == FEWER
    assert [(c["to"], c["by"]) for c in m.changes] == [(THERE, "fed"), (FEWER, "probe")]


def test_one_worker_fewer_is_probed_only_while_the_consumer_is_fed(short: None) -> None:
    """Fewer workers can only help a consumer that does not wait for the loading: a consumer that waits
    never sees that probe, one that is fed sees it in the probes' turn."""
    for waited_share, probes in ((0.5, [SPLIT, SPREAD, HERE] * 2), (0.0, [SPLIT, SPREAD, FEWER, HERE, SPLIT, SPREAD])):
        clock = Clock()
        m = Measured(clock)
        m.new_run()
        seconds = {THERE: 0.01, FEWER: 0.012, HERE: 0.02, SPLIT: 0.02, SPREAD: 0.02}
        fed_windows(m, clock, range(4), seconds, 0.5)  # the trial: the consumer waits; the workers are kept
        assert m.kept == THERE
        places = fed_windows(m, clock, range(4, 30), seconds, waited_share)
        assert [p for p in places if p != THERE] == probes, waited_share


def test_the_consumer_s_waits_count_within_the_window_s_measured_span() -> None:
    """A wait counts from the end of the window's first quarter or the batch before, whichever is later:
    a batch of a group is handed at once after the long wait for the group."""
    window = Window(THERE, 0.1)
    window.handed = [(t, 10) for t in (0.0, 1.0, 2.0, 3.0, 4.0)]
    window.waited = [0.0, 5.0, 5.0, 0.5, 0.0]
    assert window.waited_share() == pytest.approx((1.0 + 0.5) / 3.0)  # the quarter ends at 1 s
    assert window.as_dict()["consumer_waited"] == 0.5
    window.waited = [math.inf] * 5  # not told
    assert window.waited_share() is None and not window.fed()


def test_threads_that_keep_the_consumer_fed_still_go_through_the_trial(short: None) -> None:
    """Threads slow a training step down by sharing its GIL, whether or not the consumer waits."""
    clock = Clock()
    m = new_measured(clock)
    assert [fed_window(m, clock, k, 0.0) for k in range(3)] == [HERE, THERE, HERE]


def test_a_window_of_the_kept_place_never_ends_early(short: None) -> None:
    clock = Clock()
    m = new_measured(clock)
    run_schedule(m, clock, {HERE: 0.02, THERE: 0.01, SPLIT: 0.02, SPREAD: 0.02}, 4)
    assert m.kept == THERE
    measure_window(m, clock, 10, 0.1, batches=Measured.MIN_BATCHES - 1)  # 10 times slower now
    window = m.current
    assert m.place(0, "f11") == THERE and m.current is window  # the same window measures on


def test_probes_leave_batches_spread_out_when_the_workers_measured_no_faster_than_threads(short: None) -> None:
    clock = Clock()
    m = new_measured(clock)
    places = run_schedule(m, clock, {HERE: 0.0100, THERE: 0.0110, SPLIT: 0.0100, SPREAD: 0.0010}, 16)
    assert SPREAD not in places and m.kept == HERE
    assert [p for p in places[2:] if p != HERE] == [SPLIT, THERE, SPLIT]


@pytest.mark.parametrize("lead", [0.02, 0.8 * Measured.CLEAR])  # within the noise: kept where nothing is copied
def test_threads_are_kept_when_no_place_measured_clearly_faster(short: None, lead: float) -> None:
    clock = Clock()
    m = new_measured(clock)
    places = run_schedule(m, clock, {HERE: 0.01 * (1 + lead), THERE: 0.0100, SPLIT: 0.0101, SPREAD: 0.0102}, 5)
    assert places == [HERE, THERE, HERE, HERE, HERE] and m.kept == HERE
    assert [c["to"] for c in m.changes] == [HERE]


def test_a_mixed_place_faster_than_both_whole_ones_is_found_by_a_probe_and_kept(short: None) -> None:
    clock = Clock()
    m = new_measured(clock)
    places = run_schedule(m, clock, {HERE: 0.02, THERE: 0.0105, SPLIT: 0.0090, SPREAD: 0.02}, 11)
    assert places == [HERE, THERE, HERE, THERE, THERE, THERE, THERE, SPLIT, SPLIT, SPLIT, SPLIT] and m.kept == SPLIT
    assert [(c["to"], c["by"]) for c in m.changes] == [(THERE, "trial"), (SPLIT, "probe")]


def test_a_probe_that_measures_faster_changes_the_place(short: None) -> None:
    clock = Clock()
    m = new_measured(clock)
    speed = {HERE: 0.01, THERE: 0.02, SPLIT: 0.04, SPREAD: 0.04}
    places = run_schedule(m, clock, speed, 5)
    assert m.kept == HERE and places == [HERE, THERE, HERE, HERE, HERE]
    speed.update({HERE: 0.03, THERE: 0.01})  # the workload changed: threads got slower
    later = run_schedule(m, clock, speed, 3 * (Measured.PROBE_AFTER + 1) + 2)
    assert THERE in later and m.kept == THERE
    assert [c["to"] for c in m.changes] == [HERE, THERE] and m.changes[1]["by"] == "probe"


def test_a_probe_that_is_slower_keeps_the_place(short: None) -> None:
    clock = Clock()
    m = new_measured(clock)
    places = run_schedule(m, clock, {HERE: 0.01, THERE: 0.02, SPLIT: 0.02, SPREAD: 0.02},
                          4 + 3 * (Measured.PROBE_AFTER + 1))
    assert [p for p in places if p != HERE] == [THERE, SPLIT, THERE, SPLIT]  # the trial, then probes
    # after every PROBE_AFTER windows, of the other places in turn (not spread: the workers were slower)
    assert m.kept == HERE and len(m.changes) == 1


def test_batches_of_files_in_two_windows_or_after_the_next_window_opened_are_not_counted(short: None) -> None:
    clock = Clock()
    m = new_measured(clock)
    measure_window(m, clock, 0, 0.01, batches=2)
    first = m.current
    clock.now += 5.0
    m.handed(0, ("f0", "f1"), 10)  # f1 was not placed: a batch of two places says nothing of either
    assert len(first.handed) == 2
    measure_window(m, clock, 0, 0.01, batches=10)  # the same file again, long enough: the next file opens a window
    m.place(0, "f1")
    assert m.current is not first
    clock.now += 0.01
    m.handed(0, ("f0",), 10)  # handed after the next window opened: the other place's work overlaps it
    assert len(first.handed) == 12


def test_the_first_quarter_of_a_window_is_left_out() -> None:
    clock = Clock()
    m = new_measured(clock)
    m.place(0, "f0")
    for gap in [0.001] * 10 + [0.01] * 30:  # a backlog handed at once, then the place's own pace
        clock.now += gap
        m.handed(0, ("f0",), 10)
    assert m.current.rate() == pytest.approx(1000, rel=0.05)


def test_a_new_iteration_goes_on_from_the_decision(short: None) -> None:
    clock = Clock()
    m = new_measured(clock)
    run_schedule(m, clock, {HERE: 0.02, THERE: 0.01, SPLIT: 0.02, SPREAD: 0.02}, 5)
    m.new_run()
    assert m.place(1, "f0") == THERE
    report = m.report()
    assert report["trial_over"] is True and report["place"] == report["kept"] == THERE


class SlowSomewhere(pl.DataReader):
    """Reads ids; ``read_file`` sleeps ``delay`` seconds in the process ``slow_in`` ("main", "worker" or "both")."""

    def __init__(self, batch_size: int, main_pid: int, slow_in: str, delay: float) -> None:
        super().__init__(batch_size)
        self.main_pid, self.slow_in, self.delay = main_pid, slow_in, delay

    def read_file(self, path: str) -> Any:
        if self.slow_in == "both" or (os.getpid() == self.main_pid) == (self.slow_in == "main"):
            time.sleep(self.delay)
        with open(path) as f:
            ids = [int(line) for line in f]
        return {"id": ids, "pid": [os.getpid()] * len(ids)}, len(ids)


def pids_by_file(batches: List[Dict[str, list]]) -> Dict[int, int]:
    return {i // 20: p for b in batches for i, p in zip(b["id"], b["pid"])}


@needs_workers
@pytest.mark.timeout(240)
@pytest.mark.parametrize("slow_in, expected", [("main", (THERE, SPLIT, SPREAD)), ("worker", (HERE,))])
def test_the_place_that_delivers_faster_is_kept(tmp_path: Path, short: None, monkeypatch: pytest.MonkeyPatch,
                                                slow_in: str, expected: Tuple[str, ...]) -> None:
    monkeypatch.setattr(Measured, "PROBE_AFTER", 1000)  # no probe: each would read many files in the slow place
    if slow_in == "worker":  # threads are fast: a longer window, so a pause of a busy machine does not decide
        monkeypatch.setattr(Measured, "TRIAL_S", 0.1)
    files = 600  # the trial must end within them: a window of fast workers takes 300 or more batches
    write_chunks(tmp_path, [20] * files)
    loader = pl.DataLoader(SlowSomewhere(5, os.getpid(), slow_in, delay=0.05), pl.IdentityDataset(), ListCollator(),
                           str(tmp_path))
    batches = [b for b in loader]  # not list(): it asks len(), which reads every file here
    assert sorted(i for b in batches for i in b["id"]) == list(range(20 * files))
    measured = loader.stats["placement"]["measured"]
    in_main = sum(p == os.getpid() for p in pids_by_file(batches).values())  # files read here
    assert measured["trial_over"] and measured["kept"] in expected, measured
    assert measured["changes"][0]["to"] in expected, measured
    # the rest: the trial's windows, and the files read ahead as each window closes
    assert in_main >= 0.7 * files if expected == (HERE,) else in_main <= 0.3 * files, (in_main, measured)


@needs_workers
@pytest.mark.timeout(240)
def test_behind_a_slow_training_step_the_workers_are_kept_after_their_first_window(
        tmp_path: Path, short: None) -> None:
    files = 40
    write_chunks(tmp_path, [20] * files)
    loader = pl.DataLoader(SlowSomewhere(5, os.getpid(), "both", delay=0.0), pl.IdentityDataset(), ListCollator(),
                           str(tmp_path))
    batches = []
    for batch in loader:
        time.sleep(0.01)  # the step: 10 ms a batch, far slower than reading 5 ids
        batches.append(batch)
    assert sorted(i for b in batches for i in b["id"]) == list(range(20 * files))
    measured = loader.stats["placement"]["measured"]
    # kept after the first window; then one worker fewer is tried: as fast here (the step sleeps), so either
    assert [(c["to"], c["by"], c["window"]) for c in measured["changes"]][0] == (THERE, "fed", 1), measured
    assert measured["kept"] in (THERE, FEWER), measured
    assert all(p != os.getpid() for p in pids_by_file(batches).values()), "no file was read in threads"


@needs_workers
@pytest.mark.timeout(240)
def test_files_placed_in_one_worker_fewer_are_all_read_by_the_other_workers_with_the_batches_of_threads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_chunks(tmp_path, [20] * 12)
    monkeypatch.setattr(Measured, "place", lambda self, epoch, path, pos=None: FEWER)
    loader = pl.DataLoader(SlowSomewhere(7, os.getpid(), "both", delay=0.0), pl.IdentityDataset(), ListCollator(),
                           str(tmp_path))
    batches = [b for b in loader]
    expected = [list(b["id"]) for b in pl.DataLoader(SlowSomewhere(7, os.getpid(), "both", delay=0.0),
                                                     pl.IdentityDataset(), ListCollator(), str(tmp_path),
                                                     num_workers=0)]
    assert [list(b["id"]) for b in batches] == expected
    readers = set(pids_by_file(batches).values())
    assert len(readers) == 1 and os.getpid() not in readers, readers  # 2 workers here: one of them read them all


def reference(folder: Path, num_workers: int, **options: Any) -> List[List[int]]:
    loader = pl.DataLoader(IdReader(7, shuffle=True), pl.IdentityDataset(), ListCollator(), str(folder),
                           num_workers=num_workers, shuffle=True, num_epoch=2, **options)
    return [list(b["id"]) for b in loader]


@needs_workers
@pytest.mark.timeout(240)
@pytest.mark.parametrize("options", [{}, {"shuffle_buffer": 30}, {"drop_last": True}],
                         ids=["files", "shuffle_buffer", "drop_last"])
def test_files_changing_place_give_the_batches_of_a_run_in_threads(tmp_path: Path, short: None,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   options: Dict[str, Any]) -> None:
    monkeypatch.setattr(Measured, "PROBE_AFTER", 1)  # every other window a probe: places change all along
    monkeypatch.setattr(Measured, "MIN_BATCHES", 2)
    write_chunks(tmp_path, [13, 7, 22, 9, 16, 11, 5, 18, 14, 10] * 3)
    expected = reference(tmp_path, 0, **options)
    loader = pl.DataLoader(IdReader(7, shuffle=True, delay=0.005), pl.IdentityDataset(), ListCollator(),
                           str(tmp_path), shuffle=True, num_epoch=2, **options)
    got = [list(b["id"]) for b in loader]
    assert got == expected
    windows = loader.stats["placement"]["measured"]["windows"]
    assert len({w["place"] for w in windows}) >= 2


@needs_workers
@pytest.mark.timeout(240)
def test_a_run_resumed_after_its_files_changed_place_goes_on_exactly(tmp_path: Path, short: None,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Measured, "PROBE_AFTER", 1)
    monkeypatch.setattr(Measured, "MIN_BATCHES", 2)
    write_chunks(tmp_path, [13, 7, 22, 9, 16, 11, 5, 18, 14, 10] * 3)
    expected = reference(tmp_path, 0)

    def make() -> pl.DataLoader:
        return pl.DataLoader(IdReader(7, shuffle=True), pl.IdentityDataset(), ListCollator(), str(tmp_path),
                             shuffle=True, num_epoch=2)

    for stop_at in (9, 40):
        first = make()
        it = iter(first)
        head = [list(next(it)["id"]) for _ in range(stop_at)]
        state = first.state_dict()
        first.close()
        second = make()
        second.load_state_dict(state)
        assert head + [list(b["id"]) for b in second] == expected
        second.close()


@needs_workers
@pytest.mark.timeout(240)
def test_files_placed_in_threads_run_in_this_process_and_the_others_in_workers(tmp_path: Path, short: None,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Measured, "TRIAL_S", 0.0)  # a window measures two batches: the trial ends early
    monkeypatch.setattr(Measured, "MIN_BATCHES", 2)
    write_chunks(tmp_path, [20] * 60)
    loader = pl.DataLoader(SlowSomewhere(5, os.getpid(), "both", 0.01), pl.IdentityDataset(), ListCollator(),
                           str(tmp_path))
    pids = pids_by_file([b for b in loader])
    assert os.getpid() in pids.values() and set(pids.values()) - {os.getpid()}
    assert pids[0] != os.getpid()  # the trial starts in the workers (started by fork)


@needs_workers
@pytest.mark.timeout(240)
@pytest.mark.parametrize("options", [{"num_workers": 2}, {"worker_init_fn": print}, {"stream": True}],
                         ids=["num_workers_given", "worker_init_fn", "stream"])
def test_an_explicit_choice_or_stream_mode_is_not_measured(tmp_path: Path, options: Dict[str, Any]) -> None:
    write_chunks(tmp_path, [20] * 4)
    loader = pl.DataLoader(IdReader(5), pl.IdentityDataset(), ListCollator(), str(tmp_path), **options)
    for _ in loader:
        pass
    assert "measured" not in loader.stats["placement"]


def test_a_change_of_place_is_logged_with_its_figures(short: None, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    m = new_measured(clock)
    with caplog.at_level(logging.INFO, logger="pyloader"):
        run_schedule(m, clock, {HERE: 0.02, THERE: 0.01, SPLIT: 0.02, SPREAD: 0.02}, 5)
    [record] = [r.getMessage() for r in caplog.records]
    assert "user code now runs in workers (trial measured" in record and "'threads': 526.3" in record


@needs_workers
@pytest.mark.timeout(240)
def test_a_worker_dying_while_files_run_in_threads_is_reported(tmp_path: Path, short: None) -> None:
    write_chunks(tmp_path, [20] * 200)
    loader = pl.DataLoader(SlowSomewhere(5, os.getpid(), "worker", delay=0.1), pl.IdentityDataset(), ListCollator(),
                           str(tmp_path))
    it = iter(loader)
    measured: Dict[str, Any] = {}
    while not (measured.get("trial_over") and measured["place"] == HERE):
        next(it)
        measured = loader.stats["placement"]["measured"]
    [worker, _] = [p for p in psutil.Process().children() if not _is_mp_infrastructure(p)]
    os.kill(worker.pid, signal.SIGKILL)
    with pytest.raises(pl.WorkerDied, match="killed by SIGKILL"):
        for _ in it:
            pass
    loader.close()


class Timeline(pl.DataReader):
    """Records when each file's read began and ended (in this process: workers not started by fork make
    the trial start in threads); the
    first file takes ``first_s``."""

    thread_safe = True  # reads may overlap: nothing here serializes them

    def __init__(self, batch_size: int, first_s: float) -> None:
        super().__init__(batch_size)
        self.first_s = first_s
        self.spans: Dict[str, List[float]] = {}

    def read_file(self, path: str) -> Any:
        name = os.path.basename(path)
        self.spans[name] = [time.monotonic()]
        if name == "part-0000.txt":
            time.sleep(self.first_s)
        with open(path) as f:
            ids = [int(line) for line in f]
        self.spans[name].append(time.monotonic())
        return {"id": ids}, len(ids)


@needs_workers
@pytest.mark.timeout(120)
def test_with_workers_started_by_forkserver_the_trial_starts_in_threads_reading_the_first_file_alone(
        tmp_path: Path) -> None:
    """Beside a first file read in threads, no second one is read (in workers the second goes to another
    worker): it would share the cores, and with a reader that is not thread-safe the first file's read
    could wait for the whole read of the second (a stalled file held the first batch up for a minute)."""
    write_chunks(tmp_path, [8] * 6)
    reader = Timeline(4, first_s=0.3)
    loader = pl.DataLoader(reader, pl.IdentityDataset(), ListCollator(), str(tmp_path), start_method="forkserver")
    assert [b["id"] for b in loader][0] == [0, 1, 2, 3]
    assert loader.stats["placement"]["measured"]["windows"][0]["place"] == HERE
    first_done = reader.spans["part-0000.txt"][1]
    early = {name: span[0] - first_done for name, span in reader.spans.items() if span[0] < first_done}
    assert set(early) == {"part-0000.txt"}, early


def test_an_epoch_s_last_files_stay_in_the_window_when_fewer_are_left_than_it_took_to_measure() -> None:
    """16 files an epoch, read ahead: the first window measured enough once 12 were placed. A window of
    threads for the last 4 could not measure as much before the epoch ends (in a run of one epoch, its
    files would only run in the place not yet measured), so the workers go on; the next epoch's first
    file opens it."""
    clock = Clock()
    m = Measured(clock)
    m.new_run(16)
    places = []
    for pos in range(16):
        places.append(m.place(0, f"f{pos}", pos))
        if pos >= 4:  # four files read ahead: each file's batches are handed as the file four later is placed
            for _ in range(3):
                clock.now += 0.012
                m.handed(0, (f"f{pos - 4}",), 10)
    assert m.current.files_to_enough == 12  # eight files handed over: 24 batches in 0.28 s
    assert places == [THERE] * 16  # enough before the epoch's end, too late to change
    assert m.place(1, "f0", 0) == HERE  # the next epoch has enough files left: the trial goes on
    m2 = Measured(Clock())
    m2.new_run()  # the files of an epoch not told: places change as soon as a window measured enough
    assert m2._ending(3, files_to_enough=1) is False
