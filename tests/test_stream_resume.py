"""Stream mode, resumed: only the files in progress are read again, and a state moves across world sizes."""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set

import numpy as np
import pytest
from conftest import few_positions, spread_positions, take_steps, wait_no_children
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_stream import PieceReader, write_streams
from test_stream_more import memory_streams, sliced

import pyloader as pl
from pyloader.collators import NumpyCollator
from pyloader.testing import check_resume

pytestmark = pytest.mark.timeout(180)
FIRST, VALID, REPLAY, STREAM_ID, POSITION = "__first__", "__valid__", "__replay__", "__stream_id__", "__position__"


class LoggedReader(PieceReader):
    """Appends each file it reads to a log (from worker processes too); counts lines without parsing."""

    def __init__(self, rows: int, log: Path, piece: int = 4, arrays: bool = True) -> None:
        super().__init__(rows, piece, arrays)
        self.log = str(log)

    def iter_file(self, path):
        with open(self.log, "a") as f:
            f.write(os.path.basename(path) + "\n")
        yield from super().iter_file(path)

    def count(self, path):
        with open(path) as f:
            return sum(1 for _ in f)


def logged(log: Path) -> Set[str]:
    return set(log.read_text().splitlines()) if log.exists() else set()


def files_of(batches: Sequence[Dict[str, Any]]) -> Set[str]:
    """The files whose samples (real or padding) the batches hold."""
    return {f"s{i // 1000:03d}.txt" for b in batches for i in np.asarray(b["id"]).ravel().tolist() if i >= 0}


def as_lists(batch: Dict[str, Any]) -> Dict[str, Any]:
    return {key: np.asarray(value).tolist() for key, value in batch.items()}


def resume_after(make: Callable[[], pl.DataLoader], k: int, again: Optional[Callable[[], pl.DataLoader]] = None):
    """The first ``k`` batches of a run, and a loader (``again()``, else ``make()``) resumed from the state
    after them."""
    first = make()
    it = iter(first)
    head = [as_lists(next(it)) for _ in range(k)]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = (again or make)()
    resumed.load_state_dict(state)
    return head, resumed


# -- a resume reads only the files in progress -------------------------------------------------------------
class Gate(pl.Dataset):
    """Lets the batch of ``first`` ids through; the others wait (in any process) until the file ``opened``
    exists, so that the pipeline stays a few steps past the first batch while the test looks at what was read."""

    thread_safe = True  # the first batch must not wait behind a held one

    def __init__(self, first: List[int], opened: Path) -> None:
        self.first = first
        self.opened = str(opened)

    def batch_encode(self, batch):
        if np.asarray(batch["id"]).ravel().tolist() != self.first:
            deadline = time.monotonic() + 60
            while not os.path.exists(self.opened) and time.monotonic() < deadline:
                time.sleep(0.005)
        return batch


LENGTHS = [23, 31, 17, 40, 26, 35, 19, 28] * 5  # 40 files: the rows' files end at different steps
ROWS, PREFETCH = 3, 2
AHEAD = 12  # steps the pipeline may cut past the first batch while the others wait: the groups in flight


@pytest.mark.parametrize("where", [0.02, 0.5, 0.97])
@pytest.mark.parametrize("kwargs", [dict(), dict(num_workers=2), dict(ranks=pl.Ranks(rank=1, world_size=2))],
                         ids=["plain", "workers", "ranks"])
def test_a_stream_resume_reads_only_the_files_in_progress_and_the_read_ahead(tmp_path, where, kwargs):
    write_streams(tmp_path / "data", LENGTHS)

    def make(log: str, dataset: Optional[pl.Dataset] = None) -> pl.DataLoader:
        return pl.DataLoader(LoggedReader(ROWS, tmp_path / log, arrays=False), dataset or pl.IdentityDataset(),
                             NumpyCollator(), str(tmp_path / "data"), stream=pl.Stream(seq_len=4), shuffle=True,
                             prefetch_files=PREFETCH, **kwargs)

    full = [as_lists(b) for b in make("full.log")]
    k = max(1, int(where * len(full)))
    gate = Gate(np.asarray(full[k]["id"]).ravel().tolist(), tmp_path / "opened")
    head, resumed = resume_after(lambda: make("first.log"), k, lambda: make("resumed.log", gate))
    it = iter(resumed)
    tail = [as_lists(next(it))]
    read_before_first = logged(tmp_path / "resumed.log")
    (tmp_path / "opened").touch()
    tail += [as_lists(b) for b in it]
    assert head + tail == full
    first, valid = tail[0], np.asarray(tail[0][VALID])[:, 0]
    in_progress = {s for s, f, v in zip(first[STREAM_ID], first[FIRST], valid) if v and not f}
    assert resumed.stats["iteration"]["resume_files"] == len(in_progress)
    # never a file that ended before the position; at most the files in progress, those the rows take in the
    # steps cut meanwhile, and the read-ahead: as many wherever the position is
    assert not read_before_first & (files_of(head) - files_of(tail)), sorted(read_before_first)
    taken = {(s, p) for b in tail[:AHEAD] for s, p, f in zip(b[STREAM_ID], b[POSITION], b[FIRST]) if f}
    assert len(read_before_first) <= len(in_progress) + len(taken) + max(PREFETCH, ROWS), sorted(read_before_first)
    assert len(in_progress) + len(taken) <= ROWS * (1 + AHEAD * 4 // min(LENGTHS) + 1)
    assert wait_no_children() == []


# -- the resumed batches are the uninterrupted run's -------------------------------------------------------
def positions(every: bool, workers: int = 0) -> Optional[Callable[[List[Optional[int]]], List[int]]]:
    """Every position for one setting of each test (``every``); for the others, the positions
    ``spread_positions`` keeps (``few_positions`` with workers, which start again at each): every
    position of theirs would repeat what those show."""
    return None if every else few_positions if workers else spread_positions


# every layout in threads; with workers (which change how pieces travel, not how rows are cut) one layout
# of lists and one of arrays, so that the suite stays short
@pytest.mark.parametrize("ranks", [{}, dict(ranks=pl.Ranks(rank=1, world_size=3))], ids=["one", "ranks"])
@pytest.mark.parametrize("workers,padding_mode,time_major,arrays", [
    (0, "zeros", False, True), (0, "data", False, False), (0, "edge", True, True), (0, "edge", False, False),
    (2, "data", False, False), (2, "edge", True, True)])
def test_a_resumed_stream_run_gives_the_uninterrupted_runs_batches(tmp_path, workers, ranks, padding_mode,
                                                                    time_major, arrays):
    write_streams(tmp_path, [9, 0, 23, 4, 14, 31, 2, 17, 6, 11])

    def make() -> pl.DataLoader:
        return pl.DataLoader(PieceReader(3, 5, arrays), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                             stream=pl.Stream(seq_len=3, padding_mode=padding_mode, time_major=time_major,
                                              pad_value=-1), shuffle=True, num_epoch=2, num_workers=workers, **ranks)

    check_resume(make, positions(not workers and not ranks and padding_mode == "zeros", workers))
    assert wait_no_children() == []


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("ranks", [{}, dict(ranks=pl.Ranks(rank=0, world_size=2))], ids=["one", "ranks"])
@pytest.mark.parametrize("kind", ["slices", "memory"])
def test_resumed_slices_and_in_memory_streams_give_the_uninterrupted_runs_batches(tmp_path, workers, ranks, kind):
    data: Any = sliced(tmp_path)[0] if kind == "slices" else memory_streams([7, 12, 3, 9, 15])

    def make() -> pl.DataLoader:
        return pl.DataLoader(PieceReader(2, 4, arrays=True), pl.IdentityDataset(), NumpyCollator(), data,
                             stream=pl.Stream(seq_len=2, padding_mode="edge"), shuffle=True, num_epoch=2,
                             num_workers=workers, **ranks)

    check_resume(make, positions(not workers and not ranks and kind == "memory", workers))
    assert wait_no_children() == []


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(0, 12), min_size=1, max_size=7), rows=st.integers(1, 4),
       seq_len=st.one_of(st.none(), st.integers(1, 3)), padding_mode=st.sampled_from(["zeros", "data", "edge"]),
       world=st.sampled_from([(0, 1), (0, 2), (1, 2), (2, 3)]), even=st.sampled_from(["pad", "drop"]),
       arrays=st.booleans(), piece=st.integers(1, 5), shuffle=st.booleans())
def test_a_stream_run_resumed_anywhere_gives_the_uninterrupted_runs_batches(lengths, rows, seq_len, padding_mode,
                                                                            world, even, arrays, piece, shuffle):
    if sum(lengths) == 0:
        return
    rank, world_size = world
    with tempfile.TemporaryDirectory() as tmp:
        write_streams(Path(tmp), lengths)

        def make() -> pl.DataLoader:
            return pl.DataLoader(PieceReader(rows, piece, arrays), pl.IdentityDataset(), NumpyCollator(), tmp,
                                 stream=pl.Stream(seq_len=seq_len, padding_mode=padding_mode, pad_value=-1),
                                 shuffle=shuffle, num_epoch=2,
                                 ranks=pl.Ranks(rank=rank, world_size=world_size, even_batches=even),
                                 num_workers=0)  # the shapes vary here; workers: the tests above

        if len(make()):  # runs of up to 168 batches: the examples vary the settings, spread_positions the place
            check_resume(make, spread_positions)


@pytest.mark.parametrize("padding_mode", ["zeros", "edge"])
def test_steps_where_no_row_has_a_file_pad_list_samples_with_their_shape_and_resume_exactly(tmp_path, padding_mode):
    """Rank 2 of 3 has no file of its own among 2: it replays one, then pads with no row in a file."""
    write_streams(tmp_path, [7, 11])

    def make() -> pl.DataLoader:
        return pl.DataLoader(PieceReader(2, 2, arrays=False), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                             stream=pl.Stream(seq_len=2, padding_mode=padding_mode, pad_value=-1),
                             ranks=pl.Ranks(rank=2, world_size=3))

    batches = [as_lists(b) for b in make()]
    idle = [b for b in batches if not np.asarray(b[VALID]).any()]
    assert idle, "steps where no row has a file"
    assert {np.asarray(b["pair"]).shape for b in batches} == {(2, 2, 2)}
    if padding_mode == "zeros":
        assert all((np.asarray(b["pair"]) == -1).all() for b in idle)
    check_resume(make)


# -- elastic: a stream state saved under one world size resumes under another -----------------------------
def real_ids(batch: Dict[str, Any]) -> List[int]:
    """The samples a stream batch delivers: valid, not replayed."""
    ids, valid = np.asarray(batch["id"]), np.asarray(batch[VALID])
    replay = np.asarray(batch[REPLAY])
    keep = valid & ~(replay[:, None] if valid.ndim == 2 else replay)
    return ids[keep].tolist()


def elastic_make(folder: Path, **kwargs: Any) -> Callable[[int, int], pl.DataLoader]:
    def make(rank: int, world_size: int) -> pl.DataLoader:
        settings = {**dict(stream=pl.Stream(seq_len=3), shuffle=True, num_epoch=2), **kwargs}
        return pl.DataLoader(PieceReader(2, 4, arrays=True), pl.IdentityDataset(), NumpyCollator(), str(folder),
                             ranks=pl.Ranks(rank=rank, world_size=world_size), **settings)
    return make


def the_rest(make: Callable[[int, int], pl.DataLoader], world_size: int, state: Dict[str, Any]) -> tuple:
    """Every rank of ``world_size`` resumed from ``state`` to the end: the samples of epoch 0 they
    delivered, each rank's steps in epoch 0, and each rank's epoch 1."""
    rest: List[int] = []
    steps, later = [], []
    for rank in range(world_size):
        loader = make(rank, world_size)
        loader.load_state_dict(state)
        epochs: Dict[int, List[Dict[str, Any]]] = {}
        for batch in loader:
            epochs.setdefault(loader.epoch, []).append(as_lists(batch))
        rest += [i for b in epochs.get(0, []) for i in real_ids(b)]
        steps.append(len(epochs.get(0, [])))
        later.append(epochs[1])
    return rest, steps, later


LENGTHS_ELASTIC = [9, 0, 23, 4, 14, 31, 2, 17, 6, 11, 20, 8]
ALL_IDS = sorted(f * 1000 + p for f, n in enumerate(LENGTHS_ELASTIC) for p in range(n))


@pytest.mark.parametrize("old, new", [(2, 3), (4, 2), (3, 1)])
@pytest.mark.parametrize("where", [0.1, 0.5, 0.9])
def test_a_stream_state_resumes_under_another_world_size_delivering_every_sample_once(tmp_path, old, new, where):
    write_streams(tmp_path, LENGTHS_ELASTIC)
    make = elastic_make(tmp_path)
    k = max(1, int(where * len(make(0, old)) / 2))
    delivered, state = take_steps(make, old, k, real_ids)
    rest, steps, later = the_rest(make, new, state)
    assert len(set(steps)) == 1, f"unequal steps {steps}"
    assert sorted(delivered + rest) == ALL_IDS, "lost or repeated samples"
    for rank in range(new):  # later epochs split as usual under the new world size
        fresh = make(rank, new)
        fresh.set_epoch(1)
        assert later[rank] == [as_lists(b) for b in fresh if fresh.epoch == 1]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_state_saved_under_more_ranks_than_files_resumes_under_fewer(tmp_path, workers):
    """Issue 47: 3 ranks over 2 files, rank 2 streaming padding only; its state (as any rank's) resumes
    under 2 ranks and under 1: every sample once, equal steps, later epochs as usual, and a resume of
    the resumed run gives what it would have given."""
    lengths = [9, 5]
    write_streams(tmp_path, lengths)
    make = elastic_make(tmp_path, num_workers=workers)
    delivered, _ = take_steps(make, 3, 1, real_ids)
    head, padding_rank = resume_after(lambda: make(2, 3), 1)
    assert real_ids(head[0]) == [] and (len(make(0, 3)) // 2) == 3
    state = padding_rank.state_dict()
    for new in (2, 1):
        rest, steps, later = the_rest(make, new, state)
        assert steps == [2] * new
        assert sorted(delivered + rest) == sorted(f * 1000 + p for f, n in enumerate(lengths) for p in range(n))
        for rank in range(new):
            fresh = make(rank, new)
            fresh.set_epoch(1)
            assert later[rank] == [as_lists(b) for b in fresh if fresh.epoch == 1]

    def resumed_under_two() -> pl.DataLoader:
        loader = make(0, 2)
        loader.load_state_dict(state)
        return loader

    uninterrupted = [as_lists(b) for b in resumed_under_two()]
    again, resumed = resume_after(resumed_under_two, 1, lambda: make(0, 2))
    assert again + [as_lists(b) for b in resumed] == uninterrupted
    # ranks past the files add nothing but padding: under 2**62 ranks the state is the same one
    wide = {**state, "settings": {**state["settings"], "world_size": 2**62}}
    assert the_rest(make, 2, wide) == the_rest(make, 2, state)


def test_a_file_in_progress_goes_on_from_its_rows_position_as_a_new_stream(tmp_path):
    write_streams(tmp_path, [10, 10, 10])
    make = elastic_make(tmp_path, num_epoch=1, shuffle=False)  # 2 ranks of 2 rows: rank 0 has files 0 and 2
    delivered, state = take_steps(make, 2, 2, real_ids)  # 2 steps of 3 samples: 6 of each file
    assert len(delivered) == 18
    loader = make(0, 1)
    loader.load_state_dict(state)
    batches = [as_lists(b) for b in loader]
    starts = [(s, p) for b in batches for s, p, f in zip(b[STREAM_ID], b[POSITION], b[FIRST]) if f]
    assert starts == [(0, 6), (1, 6), (2, 6)], "each from its row's position, as a new stream (__first__)"
    assert sorted(delivered + [i for b in batches for i in real_ids(b)]) == sorted(
        f * 1000 + p for f in range(3) for p in range(10))


@pytest.mark.parametrize("workers", [0, 2])
def test_an_elastic_stream_resume_resumes_again_under_the_same_and_a_third_world_size(tmp_path, workers):
    write_streams(tmp_path, LENGTHS_ELASTIC)
    make = elastic_make(tmp_path, num_workers=workers, stream=pl.Stream(seq_len=3, padding_mode="data"))
    delivered, state = take_steps(make, 2, 3, real_ids)
    # under the new world size, a resume mid-way gives the batches of the run it interrupts
    for rank in range(3):
        full = make(rank, 3)
        full.load_state_dict(state)
        uninterrupted = [as_lists(b) for b in full]

        def resumed_from_elastic(rank: int = rank) -> pl.DataLoader:
            loader = make(rank, 3)
            loader.load_state_dict(state)
            return loader

        head, resumed = resume_after(resumed_from_elastic, 2, lambda rank=rank: make(rank, 3))
        assert head + [as_lists(b) for b in resumed] == uninterrupted
    more, state = take_steps(make, 3, 2, real_ids, state)  # 3 ranks take 2 steps each, then 1 rank takes the rest
    rest, _, _ = the_rest(make, 1, state)
    assert sorted(delivered + more + rest) == ALL_IDS
    assert wait_no_children() == []
