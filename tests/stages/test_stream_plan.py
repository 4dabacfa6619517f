"""``_stages.stream_plan.Schedule``: where stream mode's rows are at a step, from the files' lengths alone.

Checked against a step-by-step simulation of the rules the module docstring states: at each step a
row whose file has ended takes the next unread file that has samples (lower rows first), a file of
``n`` samples holds its row for ``ceil(n / width)`` steps, and the epoch ends once no row holds a file.
"""
from __future__ import annotations

import random
from typing import List, Optional, Sequence, Tuple

import pytest

from pyloader._stages.stream_plan import Schedule, leftover, stream_steps

pytestmark = pytest.mark.timeout(30)

Place = Optional[Tuple[int, int]]  # (file, samples it delivered) a row holds; None: no file with samples left


def simulate(lengths: Sequence[int], rows: int, width: int) -> Tuple[List[List[Place]], List[int]]:
    """For every step, where each row is before it takes files; and how many files were started then."""
    held: List[Place] = [None] * rows
    places, started, next_file, step = [], [], 0, 0
    while True:
        places.append([h if h is not None and h[1] < lengths[h[0]] else None for h in held])
        started.append(next_file)
        for r in range(rows):
            if held[r] is None or held[r][1] >= lengths[held[r][0]]:  # type: ignore[index]
                held[r] = None
                while next_file < len(lengths) and held[r] is None:
                    if lengths[next_file]:
                        held[r] = (next_file, 0)
                    next_file += 1
        if all(h is None for h in held):
            return places, started
        held = [None if h is None else (h[0], min(lengths[h[0]], h[1] + width)) for h in held]
        step += 1


CASES = [([4, 8, 2], 2, 2), ([5, 0, 3, 9, 1, 1, 6], 3, 2), ([7], 4, 3), ([0, 0], 2, 1), ([], 2, 1)]
rng = random.Random(5)
CASES += [([rng.randrange(0, 30) for _ in range(rng.randrange(1, 25))], rng.randrange(1, 6), rng.randrange(1, 5))
          for _ in range(20)]


@pytest.mark.parametrize("lengths, rows, width", CASES)
def test_the_epochs_steps_are_those_a_step_by_step_run_takes(lengths: List[int], rows: int, width: int):
    places, _ = simulate(lengths, rows, width)
    assert stream_steps(lengths, rows, width) == len(places) - 1


@pytest.mark.parametrize("lengths, rows, width", CASES)
def test_where_the_rows_are_at_a_step_is_what_a_step_by_step_run_says(lengths: List[int], rows: int, width: int):
    places, started = simulate(lengths, rows, width)
    items = [(k, n) for k, n in enumerate(lengths)]
    for step in range(len(places)):
        at = Schedule(items, rows, width).run(step).at()
        assert at.step == step
        assert [None if h is None else (h.item, h.offset) for h in at.rows] == places[step], f"step {step}"
        assert at.started == started[step]
        assert at.ended == (step == len(places) - 1)


@pytest.mark.parametrize("lengths, rows, width", CASES)
def test_what_is_left_after_some_steps_is_the_files_in_progress_from_their_rows_then_those_not_started(
        lengths: List[int], rows: int, width: int):
    places, started = simulate(lengths, rows, width)
    items = [(k, n) for k, n in enumerate(lengths)]
    for step in range(len(places)):
        going = sorted(place for place in places[step] if place is not None)
        want = [(k, done, lengths[k]) for k, done in going] + [(k, 0, lengths[k]) for k in range(started[step],
                                                                                                  len(lengths))]
        assert leftover(items, rows, width, step) == want, f"step {step}"


def test_a_rank_with_a_target_gives_exactly_the_target_steps_replaying_delivered_files():
    schedule = Schedule([("a", 4), ("b", 2)], rows=2, width=2, replay=True, target=6).run()
    assert schedule.step == 6
    # b ends after step 0: from step 1 on its row replays the delivered files in turn, a first
    at = Schedule([("a", 4), ("b", 2)], rows=2, width=2, replay=True, target=6).run(2).at()
    assert [None if h is None else (h.item, h.replay) for h in at.rows] == [None, ("a", True)]
    assert at.delivered == [("a", 4), ("b", 2)] and at.replays == 1


def test_a_rank_with_no_file_of_its_own_replays_the_fallback_to_give_its_target():
    at = Schedule([], rows=1, width=2, target=3, fallback=[("first", 5)]).run(1).at()
    assert at.rows[0] is not None and at.rows[0].item == "first" and at.rows[0].replay
    assert Schedule([], rows=1, width=2, target=3, fallback=[("first", 5)]).run().step == 3
