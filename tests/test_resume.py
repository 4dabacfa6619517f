"""Resuming: ``state_dict()`` / ``load_state_dict()`` continue exactly where the consumer was."""
from __future__ import annotations

import copy
import json
import re
import time
from typing import Any, Dict, List, Tuple

import pytest
from conftest import IdReader, ListCollator, ids_of, take, wait_no_threads, write_chunks

import pyloader as pl

pytestmark = pytest.mark.timeout(90)

# 31 samples in 7 files (two of them tiny, one empty): with batch_size 4 an epoch is
# 7 full batches and a short one of 3 (dropped with drop_last).
SIZES = [5, 0, 9, 3, 7, 1, 6]
BATCH = 4

# name -> (DataLoader kwargs, DataReader kwargs)
SETTINGS: Dict[str, Tuple[Dict[str, Any], Dict[str, Any]]] = {
    "plain": ({"num_epoch": 2}, {}),
    "shuffle": ({"num_epoch": 2, "shuffle": True}, {}),
    "reader_shuffle": ({"num_epoch": 2}, {"shuffle": True}),
    "shuffle_buffer": ({"num_epoch": 2, "shuffle_buffer": 7}, {}),
    "all_three": ({"num_epoch": 2, "shuffle": True, "shuffle_buffer": 7}, {"shuffle": True}),
    "drop_last": ({"num_epoch": 2, "drop_last": True}, {}),
    "drop_last_all_three": ({"num_epoch": 2, "drop_last": True, "shuffle": True, "shuffle_buffer": 7},
                            {"shuffle": True}),
    "three_epochs": ({"num_epoch": 3, "shuffle": True, "shuffle_buffer": 5}, {"shuffle": True, "random_seed": 9}),
}

POSITIONS = ["start", "first", "mid_epoch", "epoch_boundary", "after_boundary", "last_epoch_mid",
             "before_end", "end"]


def _loader(folder, loader_kwargs, reader_kwargs, batch_size=BATCH, **extra) -> pl.DataLoader:
    kwargs = dict(loader_kwargs)
    kwargs.update(extra)
    return pl.DataLoader(IdReader(batch_size, **reader_kwargs), pl.IdentityDataset(), ListCollator(),
                         str(folder), **kwargs)


def _run(loader) -> List[Tuple[int, List[int]]]:
    """Every batch of one iteration, with the epoch the loader reports for it."""
    out = []
    for batch in loader:
        out.append((loader.epoch, list(batch["id"])))
    return out


def _position(name: str, per_epoch: List[int]) -> int:
    total = sum(per_epoch)
    first = per_epoch[0]
    last_start = total - per_epoch[-1]
    return {"start": 0, "first": 1, "mid_epoch": first // 2, "epoch_boundary": first,
            "after_boundary": first + 1, "last_epoch_mid": last_start + per_epoch[-1] // 2,
            "before_end": total - 1, "end": total}[name]


def _consume(loader, k: int) -> Tuple[List[Tuple[int, List[int]]], Dict[str, Any]]:
    """Take ``k`` batches from a fresh iteration, then the state (through JSON), then close."""
    got = take(loader, iter(loader), k)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return got, state


def _resumed(data, setting: str, k: int) -> Tuple[List[Tuple[int, List[int]]], Dict[str, Any], pl.DataLoader]:
    """A loader of ``setting`` stopped after ``k`` batches: those, its state, and a new loader it was loaded into."""
    loader_kwargs, reader_kwargs = SETTINGS[setting]
    head, state = _consume(_loader(data, loader_kwargs, reader_kwargs), k)
    resumed = _loader(data, loader_kwargs, reader_kwargs)
    resumed.load_state_dict(state)
    return head, state, resumed


@pytest.fixture
def data(tmp_path):
    write_chunks(tmp_path / "data", SIZES)
    return tmp_path / "data"


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_resume_continues_exactly(data, setting, position):
    loader_kwargs, reader_kwargs = SETTINGS[setting]
    full = _run(_loader(data, loader_kwargs, reader_kwargs))
    num_epoch = loader_kwargs["num_epoch"]
    per_epoch = [sum(1 for e, _ in full if e == epoch) for epoch in range(num_epoch)]
    assert all(n > 0 for n in per_epoch)
    k = _position(position, per_epoch)

    head, state = _consume(_loader(data, loader_kwargs, reader_kwargs), k)
    assert head == full[:k]
    assert isinstance(state, dict)

    resumed_loader = _loader(data, loader_kwargs, reader_kwargs)
    resumed_loader.load_state_dict(state)
    tail = _run(resumed_loader)
    if k < len(full):
        assert head + tail == full, f"resume after {k} of {len(full)} batches"
    else:  # after the last batch the iteration is over: resuming gives the next one
        uninterrupted = _loader(data, loader_kwargs, reader_kwargs)
        _run(uninterrupted)
        assert tail == _run(uninterrupted)
    assert wait_no_threads() == []


@pytest.mark.parametrize("setting", ["plain", "all_three"])
def test_state_of_a_finished_iteration_resumes_with_the_next_one(data, setting):
    loader_kwargs, reader_kwargs = SETTINGS[setting]
    loader = _loader(data, loader_kwargs, reader_kwargs)
    _run(loader)
    state = json.loads(json.dumps(loader.state_dict()))
    second, third = _run(loader), _run(loader)
    other = _loader(data, loader_kwargs, reader_kwargs)
    other.load_state_dict(state)
    assert _run(other) == second
    assert _run(other) == third


def test_state_before_any_iteration_resumes_at_the_start(data):
    loader_kwargs, reader_kwargs = SETTINGS["all_three"]
    full = _run(_loader(data, loader_kwargs, reader_kwargs))
    state = json.loads(json.dumps(_loader(data, loader_kwargs, reader_kwargs).state_dict()))
    other = _loader(data, loader_kwargs, reader_kwargs)
    other.load_state_dict(state)
    assert _run(other) == full


def test_state_is_small_plain_json(data):
    loader_kwargs, reader_kwargs = SETTINGS["all_three"]
    loader = _loader(data, loader_kwargs, reader_kwargs)
    _, state = _consume(loader, 9)
    text = json.dumps(loader.state_dict())
    assert json.loads(text) == state
    assert len(text) < 2000


def test_resume_twice_in_a_row(data):
    """Resume, consume some more, checkpoint again, resume again: still the uninterrupted run."""
    loader_kwargs, reader_kwargs = SETTINGS["three_epochs"]
    full = _run(_loader(data, loader_kwargs, reader_kwargs))
    head, _, second = _resumed(data, "three_epochs", 3)
    middle = take(second, iter(second), len(full) // 2)
    state2 = json.loads(json.dumps(second.state_dict()))
    second.close()
    third = _loader(data, loader_kwargs, reader_kwargs)
    third.load_state_dict(state2)
    assert head + middle + _run(third) == full


def test_state_after_load_and_before_iterating_is_the_loaded_one(data):
    _, state, other = _resumed(data, "shuffle", 10)
    assert json.loads(json.dumps(other.state_dict())) == state


@pytest.mark.parametrize("shuffled", [False, True])
def test_state_counts_consumed_batches_not_read_ahead(tmp_path, shuffled):
    """With a huge hand-over queue and read-ahead, the pipeline runs far past the consumer;
    the state is still where the consumer is."""
    write_chunks(tmp_path / "data", [10] * 30)
    loader_kwargs = {"num_epoch": 2, "max_queue_size": 1000, "prefetch_files": 16}
    reader_kwargs: Dict[str, Any] = {}
    if shuffled:
        loader_kwargs.update(shuffle=True, shuffle_buffer=11)
        reader_kwargs.update(shuffle=True)
    full = _run(_loader(tmp_path / "data", loader_kwargs, reader_kwargs, batch_size=3))
    assert len(full) == 200

    k = 5
    loader = _loader(tmp_path / "data", loader_kwargs, reader_kwargs, batch_size=3)
    it = iter(loader)
    head = take(loader, it, k)
    deadline = time.monotonic() + 10
    while loader.stats["samples_read"] < 600 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loader.stats["samples_read"] == 600, "the whole run should have been read ahead"
    state = json.loads(json.dumps(loader.state_dict()))
    assert state == json.loads(json.dumps(loader.state_dict()))
    loader.close()

    resumed = _loader(tmp_path / "data", loader_kwargs, reader_kwargs, batch_size=3)
    resumed.load_state_dict(state)
    assert head + _run(resumed) == full


def _iterations(data, setting: str, n: int) -> List[List[Tuple[int, List[int]]]]:
    loader_kwargs, reader_kwargs = SETTINGS[setting]
    loader = _loader(data, loader_kwargs, reader_kwargs)
    return [_run(loader) for _ in range(n)]


def test_after_a_resumed_iteration_the_next_ones_go_on_with_the_next_epochs(data):
    full, second, third = _iterations(data, "all_three", 3)
    _, _, loader = _resumed(data, "all_three", 11)
    assert _run(loader) == full[11:]
    assert _run(loader) == second
    assert _run(loader) == third


def test_break_in_a_resumed_iteration_then_iterate_again_starts_the_next_epoch(data):
    loader_kwargs, reader_kwargs = SETTINGS["shuffle_buffer"]
    full = _run(_loader(data, loader_kwargs, reader_kwargs))
    _, _, loader = _resumed(data, "shuffle_buffer", 4)
    for batch in loader:
        assert list(batch["id"]) == full[4][1]
        break
    after_break = _run(loader)
    assert after_break[0][0] == full[4][0] + 1  # the epoch after the one left early
    fresh = _loader(data, loader_kwargs, reader_kwargs)
    fresh.set_epoch(after_break[0][0])
    assert _run(fresh) == after_break


# -- refusing foreign states -----------------------------------------------------------
def _named(key: str, message: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(key)}(?![A-Za-z0-9_])", message) is not None


BASE = ({"num_epoch": 2, "shuffle": True, "shuffle_buffer": 7}, {"shuffle": True, "random_seed": 5})


@pytest.mark.parametrize("what,loader_change,reader_change,batch_size", [
    ("batch_size", {}, {}, BATCH + 1),
    ("random_seed", {"random_seed": 43}, {}, BATCH),
    ("reader_seed", {}, {"random_seed": 6}, BATCH),
    ("shuffle", {"shuffle": False}, {}, BATCH),
    ("reader_shuffle", {}, {"shuffle": False}, BATCH),
    ("shuffle_buffer", {"shuffle_buffer": 8}, {}, BATCH),
    ("drop_last", {"drop_last": True}, {}, BATCH),
])
def test_state_from_other_settings_is_refused(data, what, loader_change, reader_change, batch_size):
    loader_kwargs, reader_kwargs = BASE
    full = _run(_loader(data, loader_kwargs, reader_kwargs))
    _, state = _consume(_loader(data, loader_kwargs, reader_kwargs), 6)
    other = _loader(data, {**loader_kwargs, **loader_change}, {**reader_kwargs, **reader_change},
                    batch_size=batch_size)
    with pytest.raises(ValueError) as info:
        other.load_state_dict(state)
    message = str(info.value)
    assert _named(what, message), message
    for unrelated in ("batch_size", "random_seed", "shuffle", "drop_last", "files"):
        if unrelated != what:
            assert not _named(unrelated, message), message
    # the refused state changed nothing: the loader still starts at the beginning
    same = _loader(data, loader_kwargs, reader_kwargs)
    with pytest.raises(ValueError):
        same.load_state_dict({**state, "settings": other.state_dict()["settings"]})
    assert _run(same) == full


def test_state_from_other_files_is_refused(tmp_path):
    write_chunks(tmp_path / "a", SIZES)
    write_chunks(tmp_path / "b", SIZES, prefix="other")  # the same samples under other names
    write_chunks(tmp_path / "c", [n + 1 for n in SIZES])  # the same names, other sizes
    loader_kwargs, reader_kwargs = BASE
    _, state = _consume(_loader(tmp_path / "a", loader_kwargs, reader_kwargs), 3)
    for other_data in (str(tmp_path / "b"), str(tmp_path / "c"), sorted(pl.list_files(str(tmp_path / "a")))[:-1]):
        other = pl.DataLoader(IdReader(BATCH, **reader_kwargs), pl.IdentityDataset(), ListCollator(),
                              other_data, **loader_kwargs)
        with pytest.raises(ValueError) as info:
            other.load_state_dict(state)
        assert _named("files", str(info.value)), str(info.value)
        assert not _named("batch_size", str(info.value))


def _valid_state(folder) -> Dict[str, Any]:
    loader_kwargs, reader_kwargs = SETTINGS["plain"]
    _, state = _consume(_loader(folder, loader_kwargs, reader_kwargs), 3)
    return state


def _without(key):
    def change(state):
        del state[key]
    return change


def _setting(key, value):
    def change(state):
        state[key] = value
    return change


GARBAGE_STATES = {
    "none": lambda folder: None,
    "list": lambda folder: [1, 2, 3],
    "string": lambda folder: json.dumps(_valid_state(folder)),
    "int": lambda folder: 7,
    "empty_dict": lambda folder: {},
    "other_format": lambda folder: {**_valid_state(folder), "format": "pyloader.state/999"},
}
GARBAGE_CHANGES = {
    "settings_missing": _without("settings"),
    "settings_not_a_dict": _setting("settings", "fingerprint"),
    "settings_a_list": _setting("settings", [1, 2]),
    "epoch_missing": _without("epoch"),
    "batches_missing": _without("batches_in_epoch"),
    "epoch_none": _setting("epoch", None),
    "epoch_text": _setting("epoch", "zero"),
    "epoch_list": _setting("epoch", [0]),
    "batches_none": _setting("batches_in_epoch", None),
    "epoch_negative": _setting("epoch", -1),
    "batches_negative": _setting("batches_in_epoch", -3),
}


@pytest.mark.parametrize("name", list(GARBAGE_STATES) + list(GARBAGE_CHANGES))
def test_garbage_state_is_a_value_error(data, name):
    if name in GARBAGE_STATES:
        state = GARBAGE_STATES[name](data)
    else:
        state = copy.deepcopy(_valid_state(data))
        GARBAGE_CHANGES[name](state)
    loader_kwargs, reader_kwargs = SETTINGS["plain"]
    full = _run(_loader(data, loader_kwargs, reader_kwargs))
    loader = _loader(data, loader_kwargs, reader_kwargs)
    with pytest.raises(ValueError):
        loader.load_state_dict(state)
    assert _run(loader) == full  # refused: nothing changed


def test_a_garbage_state_does_not_undo_a_good_one(data):
    loader_kwargs, reader_kwargs = SETTINGS["shuffle"]
    full = _run(_loader(data, loader_kwargs, reader_kwargs))
    _, _, loader = _resumed(data, "shuffle", 5)
    with pytest.raises(ValueError):
        loader.load_state_dict({"format": "nope"})
    assert _run(loader) == full[5:]


def test_ids_helper_consistency(data):
    """The uninterrupted runs used above really are the loader's plain output."""
    loader_kwargs, reader_kwargs = SETTINGS["plain"]
    loader = _loader(data, loader_kwargs, reader_kwargs)
    assert ids_of(loader) == list(range(sum(SIZES))) * 2


@pytest.mark.parametrize("position", ["mid_epoch", "after_boundary"])
def test_resume_with_workers_matches_without(data, position):
    """A state saved with 2 workers resumes exactly, with or without workers."""
    loader_kwargs, reader_kwargs = SETTINGS["all_three"]
    full = _run(_loader(data, loader_kwargs, reader_kwargs))
    per_epoch = [sum(1 for e, _ in full if e == epoch) for epoch in range(2)]
    k = _position(position, per_epoch)
    head, state = _consume(_loader(data, loader_kwargs, reader_kwargs, num_workers=2), k)
    assert head == full[:k]
    for workers in (0, 2):
        resumed = _loader(data, loader_kwargs, reader_kwargs, num_workers=workers)
        resumed.load_state_dict(state)
        assert head + _run(resumed) == full
