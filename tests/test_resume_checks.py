"""``load_state_dict`` refuses states that the loader's data and settings cannot have, before any iteration.

A state is checked for its types and ranges, its nesting, and its consistency with the data (the
epoch's batches, the world sizes it was taken under); a refused state leaves the loader as it was,
and the error repeats saved values cut short. A state saved under another ``num_epoch`` resumes
its iteration up to the loader's ``num_epoch``.
"""
from __future__ import annotations

import copy
import json
from typing import Any, Dict, List, Tuple

import pytest
from conftest import IdReader, ListCollator, take, write_chunks

import pyloader as pl

pytestmark = pytest.mark.timeout(120)

SIZES = [5, 0, 9, 3, 7, 1, 6]  # 31 samples: 8 batches of 4 per epoch, the last of 3
BATCH = 4
EPOCH_BATCHES = 8


@pytest.fixture
def data(tmp_path):
    write_chunks(tmp_path / "data", SIZES)
    return str(tmp_path / "data")


def loader_of(data: str, **kwargs: Any) -> pl.DataLoader:
    kwargs.setdefault("num_workers", 0)
    return pl.DataLoader(IdReader(BATCH), pl.IdentityDataset(), ListCollator(), data, **kwargs)


def run(loader: pl.DataLoader) -> List[Tuple[int, List[int]]]:
    with loader:
        return [(loader.epoch, list(batch["id"])) for batch in loader]


def saved_after(data: str, k: int, **kwargs: Any) -> Dict[str, Any]:
    """The state (through JSON) after ``k`` batches of a loader's first iteration."""
    loader = loader_of(data, **kwargs)
    take(loader, iter(loader), k)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return state


def assert_refused_and_unchanged(data: str, state: Dict[str, Any], match: str, **kwargs: Any) -> str:
    """``state`` is refused with a ``ValueError`` matching ``match``, and the loader runs as it would have."""
    full = run(loader_of(data, **kwargs))
    loader = loader_of(data, **kwargs)
    with pytest.raises(ValueError, match=match) as refused:
        loader.load_state_dict(state)
    assert run(loader) == full
    return str(refused.value)


# -- a position past the end of its epoch ---------------------------------------------------------
@pytest.mark.parametrize("skip", [EPOCH_BATCHES + 1, 14, 2**63 - 1])
def test_a_state_whose_batches_in_epoch_is_past_the_end_of_the_epoch_is_refused(data, skip):
    state = {**saved_after(data, 3, num_epoch=2), "batches_in_epoch": skip}
    message = assert_refused_and_unchanged(data, state, "batches_in_epoch", num_epoch=2)
    assert f"{EPOCH_BATCHES} batches" in message


@pytest.mark.parametrize("skip", [2**63, 10**30])
def test_a_state_whose_batches_in_epoch_is_beyond_any_epoch_is_refused_as_out_of_range(data, skip):
    state = {**saved_after(data, 3), "batches_in_epoch": skip}
    assert_refused_and_unchanged(data, state, "batches_in_epoch must be an integer")


def test_a_state_at_the_very_end_of_an_epoch_still_resumes_with_the_next_one(data):
    full = run(loader_of(data, num_epoch=2))
    state = saved_after(data, EPOCH_BATCHES, num_epoch=2)
    assert state["batches_in_epoch"] == EPOCH_BATCHES
    loader = loader_of(data, num_epoch=2)
    loader.load_state_dict(state)
    assert run(loader) == full[EPOCH_BATCHES:]


def test_a_state_past_the_end_of_an_epoch_under_ranks_is_refused_by_the_ranks_steps(data):
    steps = len(loader_of(data, ranks=pl.Ranks(rank=1, world_size=2)))  # 16 samples (padded) of 31: 4 batches
    state = {**saved_after(data, 2, ranks=pl.Ranks(rank=1, world_size=2)), "batches_in_epoch": steps + 1}
    message = assert_refused_and_unchanged(data, state, "past the end of epoch 0", ranks=pl.Ranks(rank=1, world_size=2))
    assert f"{steps} batches on this rank" in message


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_past_the_end_of_an_epoch_whose_length_filter_fn_hides_fails_its_run_with_a_value_error(
        data, workers):
    """With ``filter_fn`` the epoch's length is known only once read: the resumed run finds it, and says so
    rather than skip the rest of the epoch."""
    kwargs = {"num_epoch": 2, "filter_fn": keep_even, "num_workers": workers}
    full = run(loader_of(data, **kwargs))
    per_epoch = sum(1 for epoch, _ in full if epoch == 0)
    loader = loader_of(data, **kwargs)
    loader.load_state_dict({**saved_after(data, 1, **kwargs), "batches_in_epoch": per_epoch + 1})
    with pytest.raises(ValueError, match=f"batches_in_epoch {per_epoch + 1} is past the end of epoch 0"):
        run(loader)
    loader.load_state_dict({**saved_after(data, 1, **kwargs), "batches_in_epoch": per_epoch})
    assert run(loader) == full[per_epoch:]


def keep_even(sample: Dict[str, Any]) -> bool:
    return sample["id"] % 2 == 0


# -- another num_epoch ----------------------------------------------------------------------------
def test_a_state_loaded_with_a_larger_num_epoch_continues_to_the_new_num_epoch(data):
    fresh = run(loader_of(data, num_epoch=4))
    assert sorted({epoch for epoch, _ in fresh}) == [0, 1, 2, 3]
    loader = loader_of(data, num_epoch=4)
    loader.load_state_dict(saved_after(data, 3, num_epoch=2))
    assert run(loader) == fresh[3:]


def test_a_state_loaded_with_a_smaller_num_epoch_ends_its_iteration_there(data):
    fresh = run(loader_of(data, num_epoch=4))
    loader = loader_of(data, num_epoch=2)
    loader.load_state_dict(saved_after(data, 3, num_epoch=4))
    assert run(loader) == [b for b in fresh[3:] if b[0] < 2]
    assert run(loader)[0] == fresh[2 * EPOCH_BATCHES]  # the next iteration: epoch 2


def test_a_state_in_an_epoch_past_a_smaller_num_epoch_is_refused_saying_what_num_epoch_resumes_it(data):
    state = saved_after(data, 3 * EPOCH_BATCHES + 1, num_epoch=4)  # in epoch 3
    assert state["epoch"] == 3
    assert_refused_and_unchanged(data, state, r"num_epoch=2 .*resume it with num_epoch >= 4", num_epoch=2)


def test_a_state_saved_before_states_recorded_num_epoch_runs_to_the_end_it_was_saved_with(data):
    fresh = run(loader_of(data, num_epoch=2))
    state = saved_after(data, 3, num_epoch=2)
    del state["num_epoch"]
    loader = loader_of(data, num_epoch=4)
    loader.load_state_dict(state)
    assert run(loader) == fresh[3:]


@pytest.mark.parametrize("change", [{"num_epoch": 0}, {"num_epoch": "2"}, {"num_epoch": 5},
                                    {"end_epoch": 1, "epoch": 1}])
def test_a_state_whose_epochs_disagree_is_refused(data, change):
    state = {**saved_after(data, 3, num_epoch=2), **change}
    assert_refused_and_unchanged(data, state, "num_epoch|end_epoch", num_epoch=2)


# -- world sizes and ranks ------------------------------------------------------------------------
def with_world(state: Dict[str, Any], world_size: Any, rank: Any = 0) -> Dict[str, Any]:
    state = copy.deepcopy(state)
    state["settings"].update(world_size=world_size, rank=rank)
    return state


@pytest.mark.parametrize("world_size", [10**30, 2**63, 0, -1, "2", 1.5, None])
def test_a_state_whose_world_size_is_not_a_world_size_is_refused_before_any_iteration(data, world_size):
    assert_refused_and_unchanged(data, with_world(saved_after(data, 3), world_size), "world_size")


@pytest.mark.parametrize("world_size", [10**6, 2**62, 32])
def test_a_state_taken_under_more_ranks_than_the_epoch_has_samples_is_refused(data, world_size):
    """The planner would share the epoch out among every one of those ranks (with 10**6, and the steps
    of a state from 2 batches, the epoch would pass for delivered)."""
    state = with_world(saved_after(data, 2), world_size)
    assert_refused_and_unchanged(data, state, f"world_size={world_size}, more ranks than its 31 samples")


@pytest.mark.parametrize("splits", [[[10**6, 1]], [[2**62, 1]], [[2, 0]], [[2, 1], [1, -1]], [[10**30, 1]]])
def test_a_state_whose_splits_cannot_be_this_datas_is_refused(data, splits):
    state = {**saved_after(data, 3), "splits": splits}
    assert_refused_and_unchanged(data, state, "splits|world_size")


@pytest.mark.parametrize("rank", [2, -1, "0", None])
def test_a_state_whose_rank_is_not_one_of_its_world_size_is_refused(data, rank):
    assert_refused_and_unchanged(data, with_world(saved_after(data, 3), 2, rank), "rank")


def test_an_elastic_resume_from_a_state_within_the_data_still_delivers_every_sample(data):
    """What the checks let through: two ranks took 2 batches each, one rank takes the rest."""
    state = saved_after(data, 2, ranks=pl.Ranks(rank=0, world_size=2))
    loader = loader_of(data)
    loader.load_state_dict(state)
    delivered = [i for _, ids in run(loader) for i in ids]
    taken = [i for rank in range(2) for _, ids in take_first(data, 2, rank) for i in ids]
    assert sorted(delivered + taken) == list(range(sum(SIZES)))


def take_first(data: str, k: int, rank: int) -> List[Tuple[int, List[int]]]:
    loader = loader_of(data, ranks=pl.Ranks(rank=rank, world_size=2))
    try:
        return take(loader, iter(loader), k)
    finally:
        loader.close()


# -- nesting and long values ----------------------------------------------------------------------
def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("where", ["splits", "settings", "setting", "extra", "cached_from"])
def test_a_state_nested_deeper_than_the_recursion_limit_is_a_value_error(data, where):
    state = saved_after(data, 3)
    deep = nested(100_000)
    if where == "settings":
        state["settings"] = {"files": deep}
    elif where == "setting":
        state["settings"]["batch_size"] = {"a": deep}
    else:
        state[where] = deep
    assert_refused_and_unchanged(data, state, "nested more than")


LONG = "x" * 5_000_000


@pytest.mark.parametrize("where", ["setting", "epoch", "splits", "world_size", "nested_setting"])
def test_a_refused_states_message_cuts_a_long_saved_value_and_says_how_long_it_was(data, where):
    state = saved_after(data, 3)
    if where == "setting":
        state["settings"]["files"] = LONG
    elif where == "nested_setting":
        state["settings"]["cache_encoded"] = {"dir": LONG}
    elif where == "world_size":
        state["settings"]["world_size"] = LONG
    else:
        state[where] = LONG
    message = assert_refused_and_unchanged(data, state, "the state")
    assert len(message) < 1000, message[:300]
    if where != "nested_setting":  # there the dict holding it is shown, cut
        assert "(cut: 5,000,000 characters in all)" in message
