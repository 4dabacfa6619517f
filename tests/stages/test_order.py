"""``_stages.order``: the user's ``file_order``, checked before the source follows it."""
from __future__ import annotations

from typing import Any, List

import pytest

from pyloader._stages.order import FileOrder, check_file_order
from pyloader._stages.source import FileSource

pytestmark = pytest.mark.timeout(30)

FILES = ["a", "b", "c", "d"]


def test_the_source_reads_the_files_in_the_order_file_order_gives():
    def newest_first(files: List[str], epoch: int, rng: Any) -> List[str]:
        return files[::-1] if epoch % 2 else files

    source = FileSource(FILES, 2, False, 0, file_order=newest_first)
    assert [t.path for t in source.tasks(0)] == FILES
    assert [t.path for t in source.tasks(1)] == FILES[::-1]


def test_file_orders_rng_is_the_one_shuffle_draws_its_permutation_from():
    def like_shuffle(files: List[str], epoch: int, rng: Any) -> List[str]:
        return [files[i] for i in rng.permutation(len(files))]

    files = [f"part-{i}" for i in range(12)]
    ordered = FileSource(files, 3, False, 9, file_order=like_shuffle)
    shuffled = FileSource(files, 3, True, 9)
    assert [ordered.order(e) for e in range(3)] == [shuffled.order(e) for e in range(3)]


def test_file_order_gets_its_own_copy_of_the_files():
    def vandal(files: List[str], epoch: int, rng: Any) -> List[str]:
        order = list(files)
        files.clear()
        return order

    order = FileOrder(vandal, FILES, 0)
    assert order(0) == [0, 1, 2, 3] and order(1) == [0, 1, 2, 3]


def test_an_order_that_leaves_out_a_file_is_refused_naming_it():
    order = FileOrder(lambda files, epoch, rng: files[:-1], FILES, 0)
    with pytest.raises(ValueError, match=r"epoch 0 leaves out 'd'.*drops_or_repeats"):
        order(0)


def test_an_order_that_repeats_a_file_is_refused_naming_it():
    order = FileOrder(lambda files, epoch, rng: files + ["b"], FILES, 0)
    with pytest.raises(ValueError, match="repeats 'b'"):
        order(0)


def test_an_order_that_declares_it_may_drop_and_repeat_files_is_followed():
    def curriculum(files: List[str], epoch: int, rng: Any) -> List[str]:
        return ["c", "c", "a"]

    curriculum.drops_or_repeats = True
    assert FileOrder(curriculum, FILES, 0)(0) == [2, 2, 0]


def test_a_file_listed_twice_takes_its_places_in_turn():
    assert FileOrder(lambda files, epoch, rng: ["x", "y", "x"], ["x", "y", "x"], 0)(0) == [0, 1, 2]


def test_an_order_that_changes_from_one_call_to_the_next_is_refused():
    calls = []

    def impure(files: List[str], epoch: int, rng: Any) -> List[str]:
        calls.append(epoch)
        return files if len(calls) % 2 else files[::-1]

    with pytest.raises(ValueError, match="two different orders for epoch 0"):
        FileOrder(impure, FILES, 0)(0)


def test_an_epochs_order_is_asked_for_once_per_instance():
    calls = []

    def counted(files: List[str], epoch: int, rng: Any) -> List[str]:
        calls.append(epoch)
        return files

    order = FileOrder(counted, FILES, 0)
    order(0), order(0), order(1)
    assert calls == [0, 0, 1, 1], "twice (to catch an impure order) per epoch, then remembered"


def test_a_path_that_is_not_one_of_the_files_is_refused():
    with pytest.raises(ValueError, match="'z' for epoch 3, which is not one of the loader's files"):
        FileOrder(lambda files, epoch, rng: ["z"], FILES, 0)(3)


def test_a_string_returned_for_the_order_is_a_type_error():
    with pytest.raises(TypeError, match="must return a list"):
        FileOrder(lambda files, epoch, rng: "abcd", FILES, 0)(0)


def test_an_error_raised_by_file_order_keeps_its_type_and_says_where():
    def broken(files: List[str], epoch: int, rng: Any) -> List[str]:
        raise KeyError("curriculum table")

    with pytest.raises(KeyError) as caught:
        FileOrder(broken, FILES, 0)(2)
    assert any("file_order(files, epoch=2, rng)" in note for note in caught.value.__notes__)


def test_file_order_must_be_callable_and_replaces_shuffle():
    check_file_order(None, shuffle=True)
    with pytest.raises(TypeError, match="callable"):
        check_file_order(["a"], shuffle=False)
    with pytest.raises(ValueError, match="replaces shuffle"):
        check_file_order(lambda files, epoch, rng: files, shuffle=True)
