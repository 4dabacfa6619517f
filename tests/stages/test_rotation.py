"""``_stages.rotation``: the planning of rotation alone — each window's round orders, and the option rules."""
from __future__ import annotations

from typing import Any, Dict

import numpy as np
import pytest

import pyloader as pl
from pyloader._compose import check_rotation
from pyloader._rng import derive_rng
from pyloader._stages.rotation import WINDOW_BATCHES, held_samples, round_orders

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("n, rotation", [(1, 3), (2, 2), (7, 3), (64, 4), (1000, 5)])
def test_every_round_serves_each_sample_of_the_window_once(n: int, rotation: int):
    orders = round_orders(n, rotation, derive_rng(1, 2))
    assert len(orders) == rotation
    assert orders[0].tolist() == list(range(n)), "round 0 is the arrival order"
    assert all(sorted(order.tolist()) == list(range(n)) for order in orders)


@pytest.mark.parametrize("n", [2, 3, 10, 101, 1000])
def test_a_sample_moves_fewer_than_half_a_window_from_one_round_to_the_next(n: int):
    orders = round_orders(n, 6, derive_rng(3, n))
    for before, after in zip(orders, orders[1:]):
        place_before = np.argsort(before)
        place_after = np.argsort(after)
        assert np.abs(place_after - place_before).max() < max(1, n // 2)


def test_rounds_do_move_samples_so_that_a_batch_mixes_others():
    orders = round_orders(100, 3, derive_rng(0))
    assert orders[1].tolist() != orders[0].tolist() and orders[2].tolist() != orders[1].tolist()


def test_the_round_orders_are_a_pure_function_of_the_generator_they_draw_from():
    one = round_orders(50, 4, derive_rng(7, 1))
    assert all(np.array_equal(a, b) for a, b in zip(one, round_orders(50, 4, derive_rng(7, 1))))
    assert not all(np.array_equal(a, b) for a, b in zip(one, round_orders(50, 4, derive_rng(7, 2))))


def options(**given: Any) -> Dict[str, Any]:
    a: Dict[str, Any] = {"rotation": pl.Rotation(2), "stream": False, "bucket": None, "cache_encoded": None}
    a.update(given)
    return a


def test_rotation_holds_r_windows_of_32_batches_by_default_or_its_size():
    assert held_samples(3, None, 4) == 3 * WINDOW_BATCHES * 4
    assert held_samples(3, 50, 4) == 50


@pytest.mark.parametrize("given, error, message", [
    ({"size": 2}, ValueError, r"Rotation.size \(the samples held\) must be >= times \(3\), got 2"),
    ({"times": 1}, ValueError, r"Rotation.times must be an integer >= 2 .*got 1"),
    ({"folder": 3}, TypeError, "Rotation.folder must be a folder's path, got 3"),
    ({"size": 0}, ValueError, "Rotation.size must be an integer >= 1, got 0"),
])
def test_a_rotation_refuses_a_bad_value_naming_its_field(given: Dict[str, Any], error: type, message: str):
    with pytest.raises(error, match=message):
        pl.Rotation(**{"times": 3, **given})


@pytest.mark.parametrize("given, message", [
    ({"stream": pl.Stream()}, "stream mode"),
    ({"bucket": pl.Bucket("text")}, "bucket"),
    ({"cache_encoded": "/tmp/c"}, "cache_encoded"),
])
def test_rotation_refuses_the_options_it_cannot_go_with(given: Dict[str, Any], message: str):
    with pytest.raises(ValueError, match=message):
        check_rotation(options(**given))


def test_rotation_with_its_own_options_passes_the_checks():
    check_rotation(options(rotation=pl.Rotation(3, size=12, folder="/tmp/rot")))
    check_rotation(options(rotation=None, stream=pl.Stream()))
