"""Composing data: a per-sample filter, a custom file order, length bucketing.

Every feature keeps the loader's promises: each sample exactly once per epoch (or
as declared), batches that depend on the seed and the epoch alone, exact resume
at every position, equal steps under ranks, and the same batches with workers.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from typing import Any, Dict, List, Tuple

import pytest
from conftest import IdReader, ListCollator, wait_no_children, wait_no_threads, write_chunks

import pyloader as pl
from pyloader._rng import FILE_ORDER, derive_rng
from pyloader.readers import JsonLinesReader
from pyloader.testing import check_resume

pytestmark = pytest.mark.timeout(180)
PADDING = "__padding__"
SIZES = [9, 4, 15, 2, 7, 0, 11]  # 48 samples, ids 0..47
# for the checks at every position (each position is a few runs): 26 samples, ids 0..25; file 3 (id 15) has
# no even id, so a filter keeps nothing of it
RESUME_SIZES = [5, 2, 8, 1, 4, 0, 6]


def loader_over(folder, batch_size: int = 4, reader: Any = None, **kwargs: Any) -> pl.DataLoader:
    if kwargs.get("num_workers"):  # the filters and orders here are local functions: fork, never pickle
        kwargs.setdefault("start_method", "fork")
    return pl.DataLoader(reader or IdReader(batch_size), pl.IdentityDataset(), ListCollator(), str(folder), **kwargs)


def run(loader: pl.DataLoader) -> List[Tuple[int, List[int], List[bool]]]:
    """Every batch of one iteration: (epoch, ids, padding flags)."""
    out = []
    for batch in loader:
        flags = batch[PADDING].tolist() if PADDING in batch else [False] * len(batch["id"])
        out.append((loader.epoch, list(batch["id"]), flags))
    return out


def real_ids(batches) -> List[int]:
    return [i for _, ids, flags in batches for i, pad in zip(ids, flags) if not pad]


def even(sample: Dict[str, Any]) -> bool:
    return sample["id"] % 2 == 0


def _not_in_process(pid: int, sample: Dict[str, Any]) -> bool:
    return os.getpid() != pid


# -- filter_fn -----------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("settings", [{}, {"shuffle": True, "shuffle_buffer": 5}])
def test_a_filter_that_drops_half_the_samples_leaves_every_batch_full(tmp_path, workers, settings):
    write_chunks(tmp_path, SIZES)
    loader = loader_over(tmp_path, filter_fn=even, num_workers=workers, num_epoch=2, **settings)
    batches = run(loader)
    for epoch in (0, 1):
        sizes = [len(ids) for e, ids, _ in batches if e == epoch]
        assert sizes == [4, 4, 4, 4, 4, 4], "24 kept samples: six full batches, none short"
        assert sorted(real_ids(b for b in batches if b[0] == epoch)) == list(range(0, 48, 2))
    assert loader.stats["filtered_samples"] == 48 and loader.stats["samples_read"] == 48
    assert wait_no_children() == []


def test_with_workers_the_filter_runs_in_the_workers(tmp_path):
    """A filter that keeps a sample only outside the loader's process keeps everything with
    workers and nothing without."""
    write_chunks(tmp_path, [6, 6])
    outside = functools.partial(_not_in_process, os.getpid())
    assert real_ids(run(loader_over(tmp_path, filter_fn=outside, num_workers=2))) == list(range(12))
    assert run(loader_over(tmp_path, filter_fn=outside, num_workers=0)) == []


def on_rank(settings: Dict[str, Any], rank: int, world_size: int) -> Dict[str, Any]:
    """``settings`` on ``rank`` of ``world_size`` (keeping their ``Ranks.even_batches``)."""
    ranks = dataclasses.replace(settings.get("ranks", pl.Ranks()), rank=rank, world_size=world_size)
    return {**settings, "ranks": ranks}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("settings", [{}, {"shuffle": True, "num_epoch": 2}, {"drop_last": True},
                                      {"ranks": pl.Ranks(even_batches="drop"), "shuffle_buffer": 6}])
def test_under_ranks_a_filter_leaves_every_rank_the_planned_steps(tmp_path, workers, settings):
    """Whatever the filter drops on each rank, every rank gives the steps planned from the counts
    (``len``), topping a share that lost samples up with flagged padding batches."""
    write_chunks(tmp_path, SIZES)
    runs, lengths = [], []
    for rank in range(2):
        def keep(sample: Dict[str, Any]) -> bool:
            return sample["id"] < 20 or sample["id"] % 3 == 0  # rank 1's share loses far more
        loader = loader_over(tmp_path, filter_fn=keep, num_workers=workers, **on_rank(settings, rank, 2))
        lengths.append(len(loader))
        runs.append(run(loader))
    unfiltered = [run(loader_over(tmp_path, **on_rank(settings, rank, 2))) for rank in range(2)]
    assert [len(r) for r in runs] == lengths == [len(r) for r in unfiltered]
    got = sorted(i for r in runs for i in real_ids(r))
    planned = sorted(i for r in unfiltered for i in real_ids(r))
    kept = [i for i in planned if i < 20 or i % 3 == 0]
    if settings.get("drop_last"):  # each rank drops its own short last batch: a different one once filtered
        assert set(got) <= set(kept) and len(got) == len(set(got)) and len(kept) - len(got) < 2 * 4
    else:
        assert got == kept
    assert all(pad for _, ids, flags in runs[1][-2:] for pad in flags), "rank 1 ends with padding steps"


def test_a_rank_whose_filter_leaves_no_full_batch_with_drop_last_says_so(tmp_path):
    write_chunks(tmp_path, [4, 4])  # rank 0: ids 0..3, one planned step; the filter keeps 0 and 2
    loader = loader_over(tmp_path, 3, filter_fn=even, ranks=pl.Ranks(rank=0, world_size=2), drop_last=True)
    with pytest.raises(RuntimeError, match=r"filter_fn left too few samples for one\): there is nothing to pad the 1 "
                                           "steps this rank still owes"):
        list(loader)


def test_the_length_of_a_filtered_loader_is_unknown_without_ranks(tmp_path):
    write_chunks(tmp_path, [5, 5])
    with pytest.raises(TypeError, match="length is unknown: filter_fn"):
        len(loader_over(tmp_path, filter_fn=even))
    assert len(list(loader_over(tmp_path, filter_fn=even))) == 2  # list() takes the TypeError as "no hint"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_filter_that_raises_names_the_file_and_the_sample_and_keeps_the_type(tmp_path, workers):
    paths = write_chunks(tmp_path, [4, 6])

    def fussy(sample: Dict[str, Any]) -> bool:
        if sample["id"] == 7:
            raise KeyError("no label")
        return True

    with pytest.raises(KeyError) as info:
        list(loader_over(tmp_path, filter_fn=fussy, num_workers=workers))
    assert isinstance(info.value, pl.PipelineError)
    assert "filter_fn (sample 3)" in str(info.value) and paths[1] in str(info.value)
    assert "no label" in str(info.value)


def test_a_filter_that_returns_anything_but_a_bool_is_a_type_error_naming_the_file(tmp_path):
    paths = write_chunks(tmp_path, [4])

    def forgets_to_return(sample: Dict[str, Any]) -> bool:
        sample["id"] % 2 == 0  # noqa: B015  (the bug: no return)
        return None  # type: ignore[return-value]

    with pytest.raises(TypeError, match=r"filter_fn \(sample 0\) failed on .*part-0000.*must return a bool, got "
                                        r"NoneType") as info:
        list(loader_over(tmp_path, filter_fn=forgets_to_return))
    assert paths[0] in str(info.value)


def test_a_failing_filter_under_the_skip_policy_drops_the_rest_of_that_file(tmp_path, caplog):
    write_chunks(tmp_path, [4, 6, 3])  # ids 0-3, 4-9, 10-12

    def fussy(sample: Dict[str, Any]) -> bool:
        if sample["id"] == 6:
            raise ValueError("bad sample")
        return True

    loader = loader_over(tmp_path, filter_fn=fussy, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="pyloader"):
        got = real_ids(run(loader))
    assert got == [0, 1, 2, 3, 10, 11, 12]  # the failing piece is the whole file here: none of it arrives
    assert loader.stats["skipped_files"] == 1 and "part-0001" in loader.stats["errors"][0]
    assert "filter_fn (sample 2)" in caplog.text


@pytest.mark.parametrize("settings", [{"shuffle": True, "num_epoch": 2},
                                      {"shuffle": True, "shuffle_buffer": 5, "num_epoch": 2, "drop_last": True},
                                      {"ranks": pl.Ranks(rank=1, world_size=2), "shuffle": True, "num_epoch": 2}])
def test_a_filtered_run_resumes_exactly_at_every_position(tmp_path, settings):
    write_chunks(tmp_path, RESUME_SIZES)
    check_resume(lambda: loader_over(tmp_path, 3, IdReader(3, shuffle=True), filter_fn=even, **settings))
    assert wait_no_threads() == []


def keep_all(sample: Dict[str, Any]) -> bool:
    return True


def test_a_state_saved_with_another_filter_is_refused(tmp_path):
    write_chunks(tmp_path, SIZES)
    loader = loader_over(tmp_path, filter_fn=even)
    next(iter(loader))
    state = loader.state_dict()
    loader.close()
    with pytest.raises(ValueError, match="filter_fn"):
        loader_over(tmp_path, filter_fn=keep_all).load_state_dict(state)
    with pytest.raises(ValueError, match="filter_fn"):
        loader_over(tmp_path).load_state_dict(state)
    loader_over(tmp_path, filter_fn=even).load_state_dict(state)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"filter_fn": "id > 3"}, TypeError, "filter_fn must be a callable"),
    ({"filter_fn": even, "stream": True}, ValueError, "filter_fn applies outside stream mode"),
])
def test_composing_arguments_are_checked(tmp_path, kwargs, error, match):
    write_chunks(tmp_path, [4])
    with pytest.raises(error, match=match):
        loader_over(tmp_path, **kwargs)


# -- file_order --------------------------------------------------------------------------------
def reversed_order(files: List[str], epoch: int, rng: Any) -> List[str]:
    return files[::-1]


def drawn_order(files: List[str], epoch: int, rng: Any) -> List[str]:
    return [files[i] for i in rng.permutation(len(files))]


def curriculum(files: List[str], epoch: int, rng: Any) -> List[str]:
    """Epoch e reads the first e + 2 files, shuffled, then the first file once more."""
    grown = files[:epoch + 2]
    return [grown[i] for i in rng.permutation(len(grown))] + files[:1]


curriculum.drops_or_repeats = True  # type: ignore[attr-defined]


def ids_of_files(sizes: List[int], which: List[int]) -> List[int]:
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [starts[f] + k for f in which for k in range(sizes[f])]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_file_order_sets_the_order_files_are_read_in(tmp_path, workers):
    write_chunks(tmp_path, SIZES)
    loader = loader_over(tmp_path, file_order=reversed_order, num_workers=workers, num_epoch=2)
    planned = len(loader)
    batches = run(loader)
    want = ids_of_files(SIZES, list(range(len(SIZES)))[::-1])
    for epoch in (0, 1):
        assert real_ids(b for b in batches if b[0] == epoch) == want
    assert planned == len(batches) == 24


def test_a_file_order_drawing_from_its_rng_is_the_shuffle(tmp_path):
    """The rng is the one shuffle=True draws from: the same permutation, a function of seed and epoch."""
    write_chunks(tmp_path, SIZES)
    drawn = run(loader_over(tmp_path, file_order=drawn_order, num_epoch=3, random_seed=5))
    assert drawn == run(loader_over(tmp_path, shuffle=True, num_epoch=3, random_seed=5))
    assert drawn != run(loader_over(tmp_path, file_order=drawn_order, num_epoch=3, random_seed=6))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_curriculum_that_declares_drops_and_repeats_reads_what_it_orders(tmp_path, workers):
    sizes = [3, 5, 2, 4]
    paths = write_chunks(tmp_path, sizes)
    loader = loader_over(tmp_path, 2, file_order=curriculum, num_epoch=3, num_workers=workers)
    planned = len(loader)
    batches = run(loader)
    assert planned == len(batches)
    assert planned == 6 + 7 + 9  # 11, 13 and 17 samples in batches of 2
    assert len(loader) == 3 * 9  # the next iteration's epochs 3-5 read every file, and the first again
    for epoch in range(3):
        order = curriculum(list(paths), epoch, derive_rng(42, FILE_ORDER, epoch))
        assert real_ids(b for b in batches if b[0] == epoch) == ids_of_files(sizes, [paths.index(p) for p in order])


@pytest.mark.parametrize("order,match", [
    (lambda files, epoch, rng: files[1:], "leaves out .*part-0000"),
    (lambda files, epoch, rng: files + files[2:3], "repeats .*part-0002"),
    (lambda files, epoch, rng: files[:-1] + ["elsewhere.txt"], "'elsewhere.txt'.* not one of the loader's files"),
])
def test_an_order_that_drops_repeats_or_invents_files_without_saying_so_is_refused(tmp_path, order, match):
    write_chunks(tmp_path, [2, 2, 2])
    with pytest.raises(ValueError, match=match):
        list(loader_over(tmp_path, file_order=order))


def test_an_order_that_changes_from_call_to_call_is_refused(tmp_path):
    write_chunks(tmp_path, [2, 2, 2])
    calls = []

    def restless(files: List[str], epoch: int, rng: Any) -> List[str]:
        calls.append(epoch)
        return files if len(calls) % 2 else files[::-1]

    with pytest.raises(ValueError, match="two different orders for epoch 0.*pure function"):
        list(loader_over(tmp_path, file_order=restless))


def test_an_order_that_raises_keeps_its_error_and_says_where(tmp_path):
    write_chunks(tmp_path, [2, 2])

    def broken(files: List[str], epoch: int, rng: Any) -> List[str]:
        raise LookupError("no curriculum for this epoch")

    with pytest.raises(LookupError, match="no curriculum") as info:
        list(loader_over(tmp_path, file_order=broken))
    assert any("file_order(files, epoch=0, rng)" in note for note in info.value.__notes__)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("order", [reversed_order, curriculum])
def test_under_ranks_a_file_order_splits_its_samples_with_equal_steps(tmp_path, workers, order):
    sizes = [3, 5, 2, 4]
    paths = write_chunks(tmp_path, sizes)
    runs = [run(loader_over(tmp_path, 2, file_order=order, num_epoch=2, ranks=pl.Ranks(rank=rank, world_size=2),
                            num_workers=workers)) for rank in range(2)]
    lengths = [len(loader_over(tmp_path, 2, file_order=order, num_epoch=2, ranks=pl.Ranks(rank=rank, world_size=2)))
               for rank in range(2)]
    assert [len(r) for r in runs] == lengths and lengths[0] == lengths[1]
    for epoch in range(2):
        ordered = order(list(paths), epoch, derive_rng(42, FILE_ORDER, epoch))
        want = ids_of_files(sizes, [paths.index(p) for p in ordered])
        got = [i for r in runs for i in real_ids(b for b in r if b[0] == epoch)]
        assert got == want, "rank 0's share, then rank 1's: the epoch's samples in the order's order"


@pytest.mark.parametrize("settings", [{"num_epoch": 3, "shuffle_buffer": 4},
                                      {"num_epoch": 3, "ranks": pl.Ranks(rank=0, world_size=2)},
                                      {"num_epoch": 2, "drop_last": True, "ranks": pl.Ranks(rank=1, world_size=2)}])
def test_a_run_with_a_file_order_resumes_exactly_at_every_position(tmp_path, settings):
    write_chunks(tmp_path, [3, 5, 2, 4])
    check_resume(lambda: loader_over(tmp_path, 2, IdReader(2, shuffle=True), file_order=curriculum, **settings))
    assert wait_no_threads() == []


def test_a_state_saved_with_another_file_order_is_refused(tmp_path):
    write_chunks(tmp_path, [3, 5])
    loader = loader_over(tmp_path, file_order=reversed_order)
    next(iter(loader))
    state = loader.state_dict()
    loader.close()
    with pytest.raises(ValueError, match="file_order"):
        loader_over(tmp_path, file_order=drawn_order).load_state_dict(state)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"file_order": ["a", "b"]}, TypeError, "file_order must be a callable"),
    ({"file_order": reversed_order, "shuffle": True}, ValueError, "file_order replaces shuffle"),
])
def test_file_order_arguments_are_checked(tmp_path, kwargs, error, match):
    write_chunks(tmp_path, [4])
    with pytest.raises(error, match=match):
        loader_over(tmp_path, **kwargs)


@pytest.mark.parametrize("workers", [0, 2])
def test_stream_rows_take_the_files_in_the_file_order(tmp_path, workers):
    from test_stream import PieceReader, write_streams

    from pyloader.collators import NumpyCollator

    lengths = [3, 5, 2, 4]
    write_streams(tmp_path, lengths)
    for rank, world_size in ((0, 1), (0, 2), (1, 2)):
        loader = pl.DataLoader(PieceReader(1), pl.IdentityDataset(), NumpyCollator(), str(tmp_path), stream=True,
                               file_order=curriculum, num_epoch=2, num_workers=workers,
                               ranks=pl.Ranks(rank=rank, world_size=world_size))
        planned = len(loader)
        got: Dict[int, List[int]] = {}
        steps = 0
        for batch in loader:
            steps += 1
            if batch["__valid__"][0] and not batch["__replay__"][0]:
                got.setdefault(loader.epoch, []).append(int(batch["id"][0]))
        assert steps == planned
        for epoch in (0, 1):
            files = sorted(str(p) for p in tmp_path.iterdir())
            order = [files.index(p) for p in curriculum(files, epoch, derive_rng(42, FILE_ORDER, epoch))]
            mine = order[rank::world_size]  # stream mode splits whole files: every world_size-th of the order
            assert got[epoch] == [f * 1000 + k for f in mine for k in range(lengths[f])]


# -- length bucketing ------------------------------------------------------------------------------
def skewed_lengths(n: int, seed: int = 0) -> List[int]:
    """Many short samples and a long tail (lognormal), as text corpora have."""
    import numpy as np

    return [1 + int(min(500, x)) for x in np.random.default_rng(seed).lognormal(3.0, 1.0, n)]


LENGTHS = skewed_lengths(2000)


def length_of(sample: Dict[str, Any]) -> int:
    return LENGTHS[sample["id"]]


def write_tokens(folder, sizes: List[int]) -> None:
    """JSON lines with an id and a list of LENGTHS[id] tokens."""
    folder.mkdir(parents=True, exist_ok=True)
    next_id = 0
    for f, size in enumerate(sizes):
        lines = [json.dumps({"id": i, "tokens": [i % 7] * LENGTHS[i]}) for i in range(next_id, next_id + size)]
        (folder / f"part-{f:03d}.jsonl").write_text("".join(line + "\n" for line in lines))
        next_id += size


def padding_fraction(batches) -> float:
    """The share of a padded [B, longest] layout that is padding."""
    padded = real = 0
    for _, ids, _ in batches:
        lengths = [LENGTHS[i] for i in ids]
        padded += len(lengths) * max(lengths)
        real += sum(lengths)
    return 1 - real / padded


BUCKET_SETTINGS = [{"bucket": pl.Bucket(length_of, buffer=32)},
                   {"bucket": pl.Bucket(length_of), "shuffle": True, "shuffle_buffer": 20, "drop_last": True},
                   {"bucket": pl.Bucket(length_of, buffer=13), "shuffle": True, "num_workers": 2}]


@pytest.mark.parametrize("settings", BUCKET_SETTINGS)
def test_bucketing_delivers_every_sample_once_in_as_many_batches(tmp_path, settings):
    sizes = [40, 3, 65, 0, 27, 11]  # 146 samples: 36 full batches of 4 and one of 2
    write_chunks(tmp_path, sizes)
    loader = loader_over(tmp_path, num_epoch=2, **settings)
    planned = len(loader)
    batches = run(loader)
    plain = run(loader_over(tmp_path, num_epoch=2, **{k: v for k, v in settings.items() if "bucket" not in k}))
    assert planned == len(batches) == len(plain)
    for epoch in (0, 1):
        ids = [b[1] for b in batches if b[0] == epoch]
        assert all(len(b) == 4 for b in ids[:-1])
        got = sorted(i for b in ids for i in b)
        if settings.get("drop_last"):  # another short batch is dropped: 144 of the 146, each once
            assert len(got) == len(set(got)) == 144 and set(got) <= set(range(146))
        else:
            assert got == list(range(146)), "every sample, once"
    assert [b[1] for b in batches if b[0] == 0] != [b[1] for b in batches if b[0] == 1], "a new order each epoch"
    assert run(loader_over(tmp_path, num_epoch=2, **settings)) == batches, "a function of the seed"
    assert run(loader_over(tmp_path, num_epoch=2, random_seed=7, **settings)) != batches


def test_bucketing_cuts_the_padding_of_skewed_lengths_at_least_threefold(tmp_path):
    write_tokens(tmp_path, [250] * 8)
    reader = JsonLinesReader(32)
    plain = padding_fraction(run(loader_over(tmp_path, reader=reader, shuffle=True)))
    bucketed_batches = run(loader_over(tmp_path, reader=JsonLinesReader(32), shuffle=True,
                                       bucket=pl.Bucket("tokens", buffer=1024)))
    bucketed = padding_fraction(bucketed_batches)
    assert sorted(real_ids(bucketed_batches)) == list(range(2000))
    assert plain > 0.6, plain  # the skew makes most of a plain batch padding
    assert bucketed * 3 <= plain, (plain, bucketed)


def test_bucketing_by_a_field_of_lengths_is_bucketing_by_a_field_of_sequences(tmp_path):
    write_tokens(tmp_path / "tokens", [90, 70])
    folder = tmp_path / "lengths"
    folder.mkdir()
    for f, (start, size) in enumerate(((0, 90), (90, 70))):
        (folder / f"part-{f:03d}.jsonl").write_text("".join(json.dumps({"id": i, "n": LENGTHS[i]}) + "\n"
                                                            for i in range(start, start + size)))
    by_tokens = run(loader_over(tmp_path / "tokens", reader=JsonLinesReader(8), bucket=pl.Bucket("tokens")))
    by_lengths = run(loader_over(folder, reader=JsonLinesReader(8), bucket=pl.Bucket("n")))
    by_callable = run(loader_over(folder, reader=JsonLinesReader(8), bucket=pl.Bucket(length_of)))
    assert [b[1] for b in by_tokens] == [b[1] for b in by_lengths] == [b[1] for b in by_callable]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("even_batches", ["pad", "drop"])
def test_bucketing_under_ranks_keeps_shares_and_steps(tmp_path, workers, even_batches):
    sizes = [40, 3, 65, 0, 27, 11]
    write_chunks(tmp_path, sizes)
    runs, plain = [], []
    for rank in range(2):
        common = dict(ranks=pl.Ranks(rank=rank, world_size=2, even_batches=even_batches), shuffle=True, num_epoch=2)
        loader = loader_over(tmp_path, bucket=pl.Bucket(length_of, buffer=16), num_workers=workers, **common)
        planned = len(loader)
        runs.append(run(loader))
        assert len(runs[-1]) == planned
        plain.append(run(loader_over(tmp_path, **common)))
    assert len(runs[0]) == len(runs[1]) == len(plain[0])
    for rank in range(2):  # each rank buckets its own share
        assert sorted(real_ids(runs[rank])) == sorted(real_ids(plain[rank]))


@pytest.mark.parametrize("settings", [{"shuffle": True, "num_epoch": 2},
                                      {"shuffle": True, "shuffle_buffer": 6, "num_epoch": 2, "drop_last": True},
                                      {"ranks": pl.Ranks(rank=1, world_size=2), "shuffle": True, "num_epoch": 2}])
def test_a_bucketed_run_resumes_exactly_at_every_position(tmp_path, settings):
    write_chunks(tmp_path, RESUME_SIZES)
    check_resume(lambda: loader_over(tmp_path, 3, IdReader(3, shuffle=True), bucket=pl.Bucket(length_of, buffer=10),
                                     **settings))
    assert wait_no_threads() == []


@pytest.mark.parametrize("workers", [0, 2])
def test_a_bucketing_key_a_file_lacks_names_the_file_and_keeps_the_error_type(tmp_path, workers):
    paths = write_chunks(tmp_path, [4, 4])
    with pytest.raises(KeyError, match=r"bucket_by failed on .*part-0000.*'tokens' is not a field of the file"):
        list(loader_over(tmp_path, bucket=pl.Bucket("tokens"), num_workers=workers))
    assert paths


@pytest.mark.parametrize("bucket_by,error,match", [
    (lambda sample: 1 / (sample["id"] - 5), ZeroDivisionError, r"bucket_by \(sample 1\) failed on .*part-0001"),
    (lambda sample: "long", TypeError, r"bucket_by \(sample 0\) failed on .*part-0000.*expected a length"),
    ("id", None, None),
])
def test_a_length_that_cannot_be_worked_out_names_the_file_and_sample(tmp_path, bucket_by, error, match):
    write_chunks(tmp_path, [4, 4])
    if error is None:  # a field of numbers is a field of lengths
        assert len(real_ids(run(loader_over(tmp_path, bucket=pl.Bucket(bucket_by))))) == 8
        return
    with pytest.raises(error, match=match):
        list(loader_over(tmp_path, bucket=pl.Bucket(bucket_by)))


def test_a_failing_length_under_the_skip_policy_leaves_that_file_out(tmp_path, caplog):
    write_chunks(tmp_path, [4, 4, 4])

    def fussy(sample: Dict[str, Any]) -> int:
        if sample["id"] == 5:
            raise ValueError("no length")
        return 1

    loader = loader_over(tmp_path, bucket=pl.Bucket(fussy), on_error="skip")
    with caplog.at_level(logging.WARNING, logger="pyloader"):
        got = sorted(real_ids(run(loader)))
    assert got == [0, 1, 2, 3, 8, 9, 10, 11]
    assert loader.stats["skipped_files"] == 1 and "bucket_by (sample 1)" in caplog.text


def test_a_state_saved_with_other_bucketing_is_refused(tmp_path):
    write_chunks(tmp_path, SIZES)
    loader = loader_over(tmp_path, bucket=pl.Bucket(length_of, buffer=8))
    next(iter(loader))
    state = loader.state_dict()
    loader.close()
    with pytest.raises(ValueError, match="bucket_buffer"):
        loader_over(tmp_path, bucket=pl.Bucket(length_of, buffer=12)).load_state_dict(state)
    with pytest.raises(ValueError, match="bucket_by"):
        loader_over(tmp_path, bucket=pl.Bucket("id", buffer=8)).load_state_dict(state)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"bucket": lambda: pl.Bucket("id", buffer=3)}, ValueError,
     r"Bucket.buffer must be an integer >= batch_size \(4\)"),
    ({"bucket": lambda: pl.Bucket(3)}, TypeError, "Bucket.by must be a field name or a callable"),
    ({"bucket": lambda: pl.Bucket("id"), "stream": True}, ValueError, "stream mode keeps each row in file order"),
    ({"bucket": lambda: "id"}, TypeError, "bucket must be a pyloader.Bucket, got str"),
])
def test_bucketing_arguments_are_checked(tmp_path, kwargs, error, match):
    write_chunks(tmp_path, [4])
    with pytest.raises(error, match=match):
        loader_over(tmp_path, **{k: v() if callable(v) else v for k, v in kwargs.items()})


# -- all together ----------------------------------------------------------------------------------
def every_feature(tmp_path, **kwargs: Any) -> pl.DataLoader:
    return loader_over(tmp_path, 3, IdReader(3, shuffle=True), filter_fn=even, file_order=curriculum,
                       bucket=pl.Bucket(length_of, buffer=7), shuffle_buffer=5, num_epoch=2, **kwargs)


@pytest.mark.parametrize("ranks", [{}, {"ranks": pl.Ranks(rank=0, world_size=2)},
                                   {"ranks": pl.Ranks(rank=1, world_size=2)}])
def test_filter_order_and_bucketing_together_give_the_same_batches_with_workers(tmp_path, ranks):
    write_chunks(tmp_path, SIZES)
    plain = run(every_feature(tmp_path, **ranks))
    assert plain and plain == run(every_feature(tmp_path, num_workers=2, **ranks))
    assert all(i % 2 == 0 for i in real_ids(plain))


def test_filter_order_and_bucketing_together_resume_exactly_under_ranks(tmp_path):
    write_chunks(tmp_path, SIZES)
    steps = [len(run(every_feature(tmp_path, ranks=pl.Ranks(rank=rank, world_size=2)))) for rank in range(2)]
    assert steps[0] == steps[1]
    check_resume(lambda: every_feature(tmp_path, ranks=pl.Ranks(rank=1, world_size=2)))
    assert wait_no_threads() == []
