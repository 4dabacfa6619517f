"""``_stages.mix``: the mixing plan of weighted sources and the file ranges each rank reads, built alone."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np
import pytest

from pyloader._stages.mix import MixSource, check_stop, draw_plan
from pyloader._stages.shard import Sharding
from pyloader._stages.source import EpochEnd, FileTask
from pyloader._stages.sources import Mix, Source

pytestmark = pytest.mark.timeout(30)


def made_mix(files_per_source: Sequence[int], weights: Sequence[float]) -> Mix:
    """A mix of made-up sources (nothing is listed or read), source ``k``'s files named ``s{k}-{i}``."""
    files: List[str] = []
    spans: List[Tuple[int, int]] = []
    for k, n in enumerate(files_per_source):
        spans.append((len(files), len(files) + n))
        files.extend(f"s{k}-{i}" for i in range(n))
    sources = tuple(Source(f"/made/up/{k}", weight=w) for k, w in enumerate(weights))
    return Mix(sources, files, tuple(spans), readers=None)  # type: ignore[arg-type]


MIX_FILES = (2, 3)
MIX_COUNTS = [30, 20, 40, 25, 35]  # source 0: 50 samples, source 1: 100


ONE = Sharding()


def mix_source(stop: str = "first_exhausted", shuffle: bool = False, sharding: Sharding = ONE,
               weights: Sequence[float] = (1.0, 3.0)) -> MixSource:
    return MixSource(made_mix(MIX_FILES, weights), MIX_COUNTS, stop, shuffle, 5, 2, sharding)


def test_any_window_of_the_plan_matches_the_weights_within_sampling_error():
    plan = draw_plan([0.25, 0.75], [10 ** 6, 10 ** 6], "first_exhausted", seed=3, epoch=0)
    window = 4000
    shares = [np.mean(plan[a:a + window] == 0) for a in range(0, 200_000, window)]
    sigma = (0.25 * 0.75 / window) ** 0.5
    assert all(abs(share - 0.25) < 5 * sigma for share in shares)


def test_first_exhausted_ends_with_the_draw_that_takes_a_sources_last_sample():
    plan = draw_plan([0.5, 0.5], [40, 1000], "first_exhausted", seed=1, epoch=0)
    assert plan[-1] == 0 and np.count_nonzero(plan == 0) == 40
    assert np.count_nonzero(plan == 1) < 1000


def test_all_exhausted_goes_on_until_every_source_gave_all_its_samples():
    plan = draw_plan([0.5, 0.5], [40, 60], "all_exhausted", seed=1, epoch=0)
    taken = [np.count_nonzero(plan == k) for k in range(2)]
    last = int(plan[-1])
    assert taken[last] == [40, 60][last], "the epoch ends with the last source's last sample"
    assert taken[1 - last] >= [40, 60][1 - last], "the other one ran out first and started again"


def test_the_plan_is_a_pure_function_of_the_seed_and_the_epoch():
    args = ([0.3, 0.7], [500, 500], "first_exhausted")
    plan = draw_plan(*args, seed=4, epoch=1)
    assert np.array_equal(plan, draw_plan(*args, seed=4, epoch=1))
    assert not np.array_equal(plan[:100], draw_plan(*args, seed=4, epoch=2)[:100])
    assert not np.array_equal(plan[:100], draw_plan(*args, seed=5, epoch=1)[:100])


def test_an_unknown_stop_rule_is_refused():
    check_stop("all_exhausted")
    with pytest.raises(ValueError, match="stop must be one of"):
        check_stop("longest")


def test_a_source_with_no_samples_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"source 1 \(Source\('/made/up/1'.*has no samples"):
        MixSource(made_mix((1, 1), (1.0, 1.0)), [5, 0], "first_exhausted", False, 0, 1)


def read_rows(source: MixSource, tasks: Sequence[FileTask]) -> Dict[int, List[Tuple[int, int]]]:
    """Per source, the (file, row) pairs the tasks read, in the order read."""
    out: Dict[int, List[Tuple[int, int]]] = {0: [], 1: []}
    for task in tasks:
        assert task.end is not None
        out[source.source_of[task.index]].extend((task.index, r) for r in range(task.start, task.end))
    return out


@pytest.mark.parametrize("stop", ["first_exhausted", "all_exhausted"])
def test_each_source_gives_the_samples_the_plan_takes_from_it_in_its_own_order(stop: str):
    source = mix_source(stop)
    plan = source.plan(0)
    rows = read_rows(source, list(source.tasks(0)))
    for k, (a, b) in enumerate(source.mix.spans):
        one_pass = [(i, r) for i in range(a, b) for r in range(MIX_COUNTS[i])]
        taken = int(np.count_nonzero(plan == k))
        assert rows[k] == (one_pass * 3)[:taken], "files in listed order, starting again once run out"


def test_tasks_are_ordered_by_the_first_position_that_needs_them():
    source = mix_source()
    plan = source.plan(0)
    firsts = []
    taken = {0: 0, 1: 0}
    for task in source.tasks(0):
        k = source.source_of[task.index]
        firsts.append(int(np.flatnonzero(plan == k)[taken[k]]))
        assert task.end is not None
        taken[k] += task.end - task.start
    assert firsts == sorted(firsts)


def test_a_shuffled_sources_file_order_is_drawn_from_the_seed_the_epoch_and_the_source():
    source = mix_source(shuffle=True)
    orders = {(e, k): source.order(e, k) for e in range(4) for k in range(2)}
    assert orders == {(e, k): mix_source(shuffle=True).order(e, k) for e in range(4) for k in range(2)}
    assert all(sorted(o) == list(range(*source.mix.spans[k])) for (_, k), o in orders.items())
    assert len({tuple(orders[e, 1]) for e in range(4)}) > 1


@pytest.mark.parametrize("even_batches", ["pad", "drop"])
def test_the_ranks_take_contiguous_shares_of_one_plan_and_deliver_as_many_samples(even_batches: str):
    plan = mix_source().plan(0)
    shares, samples = [], []
    for rank in range(3):
        source = mix_source(sharding=Sharding(rank, 3, even_batches))
        shares.append(source.share(0))
        samples.append(source.samples(0))
        assert np.array_equal(source.plan(0), plan)
    assert len(set(samples)) == 1
    if even_batches == "pad":
        assert np.array_equal(np.concatenate(shares), plan), "every planned sample once across ranks"
        assert samples[0] == -(-len(plan) // 3)
    else:
        assert all(len(share) == len(plan) // 3 for share in shares)


def test_the_ranks_read_disjoint_rows_that_together_are_what_the_plan_takes():
    whole = mix_source()
    everything = read_rows(whole, list(whole.tasks(0)))
    parts: Dict[int, List[Tuple[int, int]]] = {0: [], 1: []}
    for rank in range(3):
        source = mix_source(sharding=Sharding(rank, 3, "pad"))
        for k, rows in read_rows(source, list(source.tasks(0))).items():
            parts[k].extend(rows)
    assert parts == everything


def test_steps_and_len_come_from_the_plan_alone():
    source = mix_source()
    n = len(source.plan(1))
    assert source.steps(1, 8, None, drop_last=False) == -(-n // 8)
    assert source.batches(1, 8, drop_last=True, rotation=2) == n // 8 * 2


def test_iterate_gives_each_epochs_tasks_then_its_end():
    source = mix_source()
    items = list(source.iterate())
    ends = [i for i, item in enumerate(items) if isinstance(item, EpochEnd)]
    assert [items[i].epoch for i in ends] == [0, 1] and ends[-1] == len(items) - 1
    assert items[:ends[0]] == list(source.tasks(0))
