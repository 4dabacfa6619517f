"""Every stage and mode resumes exactly at every position of a small run (``pyloader.testing.check_resume``).

Each case builds a loader over a few small files; ``check_resume`` records the
uninterrupted run (two iterations), then stops at every batch, saves the state
through JSON, and checks that a new loader and the same loader continue with
exactly the batches that followed. A mode of each kind is checked at every
position; the others, whose every position would repeat those, at the first and
last two, each epoch boundary and the batch after it, and a spread inside each
epoch (``spread_positions``). The last tests check that the check itself finds
what it is for.
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import (
    IdReader,
    ListCollator,
    few_positions,
    spread_positions,
    wait_no_children,
    wait_no_threads,
    write_chunks,
)
from test_stream import PieceReader, write_streams

import pyloader as pl
from pyloader.collators import NumpyCollator, TFCollator, TorchCollator
from pyloader.readers import CSVReader, JsonLinesReader, NumpyReader, ParquetReader, TextLinesReader
from pyloader.testing import check_resume

pytestmark = pytest.mark.timeout(240)

SIZES = [5, 0, 7, 3, 6, 2]  # 23 samples, ids 0..22: with batches of 4, five full batches and a short one
STREAMS = [7, 2, 11, 0, 5, 4]  # stream lengths: sample ids file * 1000 + position
Make = Callable[[], pl.DataLoader]


def ids_loader(folder: Path, batch_size: int = 4, reader: Any = None, **kwargs: Any) -> Make:
    """Loaders over ``SIZES`` written as text files of ids, batches as lists."""
    if not folder.exists():
        write_chunks(folder, SIZES)
    return lambda: pl.DataLoader(reader or IdReader(batch_size), pl.IdentityDataset(), ListCollator(), str(folder),
                                 **kwargs)


ONE_STEP = pl.Stream()  # stream mode's defaults: one sample per step


def stream_loader(folder: Path, rows: int = 2, arrays: bool = True, data: Any = None,
                  stream: pl.Stream = ONE_STEP, **kwargs: Any) -> Make:
    """Stream-mode loaders over ``STREAMS`` read in pieces of 3, as NumPy arrays."""
    if data is None and not folder.exists():
        write_streams(folder, STREAMS)
    return lambda: pl.DataLoader(PieceReader(rows, 3, arrays), pl.IdentityDataset(), NumpyCollator(),
                                 str(folder) if data is None else data, stream=stream, **kwargs)


def even(sample: Dict[str, Any]) -> bool:
    return sample["id"] % 2 == 0


def reverse_order(files: List[str], epoch: int, rng: np.random.Generator) -> List[str]:
    return files[::-1] if epoch % 2 else [files[i] for i in rng.permutation(len(files))]


def curriculum(files: List[str], epoch: int, rng: np.random.Generator) -> List[str]:
    """Epoch 0: the first three files, the first twice; then every file, shuffled."""
    if epoch == 0:
        return [files[0], files[2], files[0], files[3]]
    return [files[i] for i in rng.permutation(len(files))]


curriculum.drops_or_repeats = True  # type: ignore[attr-defined]


# -- the files of each reader format ---------------------------------------------------------------
def jsonl_rows(n: int) -> List[Dict[str, Any]]:
    return [{"id": i, "x": [i, -i], "t": "s" * (i % 3)} for i in range(n)]


def write_jsonl(folder: Path, suffix: str = ".jsonl", opener: Any = open) -> None:
    folder.mkdir(parents=True)
    start = 0
    for f, n in enumerate(SIZES):
        with opener(folder / f"p{f}{suffix}", "wt") as out:
            out.writelines(json.dumps(row) + "\n" for row in jsonl_rows(start + n)[start:])
        start += n


def write_csv(folder: Path) -> None:
    folder.mkdir(parents=True)
    start = 0
    for f, n in enumerate(SIZES):
        lines = ["id,name"] + [f"{i},n{i}" for i in range(start, start + n)]
        (folder / f"p{f}.csv").write_text("\n".join(lines) + "\n")
        start += n


def write_npy(folder: Path) -> None:
    folder.mkdir(parents=True)
    start = 0
    for f, n in enumerate(SIZES):
        np.save(folder / f"p{f}.npy", np.arange(start * 3, (start + n) * 3, dtype=np.float32).reshape(n, 3))
        start += n


def write_parquet(folder: Path) -> None:
    folder.mkdir(parents=True)
    start = 0
    for f, n in enumerate(SIZES):
        ids = list(range(start, start + n))
        table = pa.table({"id": ids, "name": [f"n{i}" for i in ids], "v": [[i, i + 1] for i in ids]})
        pq.write_table(table, folder / f"p{f}.parquet", row_group_size=2)  # several pieces per file
        start += n


def format_loader(folder: Path, write: Callable[[Path], None], reader: pl.DataReader, collator: pl.DataCollator,
                  **kwargs: Any) -> Make:
    write(folder)
    return lambda: pl.DataLoader(reader, pl.IdentityDataset(), collator, str(folder), shuffle=True, **kwargs)


def text_loader(folder: Path) -> Make:
    write_chunks(folder, SIZES)
    return lambda: pl.DataLoader(TextLinesReader(4, shuffle=True), pl.IdentityDataset(), NumpyCollator(),
                                 str(folder), shuffle=True)


def mixed_loader(folder: Path, **kwargs: Any) -> Make:
    """A text source of ids from 0 and a JSONL source of ids from 0 too, told apart by their ``x`` field."""
    write_chunks(folder / "a", [6, 4, 5])
    write_jsonl(folder / "b")

    def make() -> pl.DataLoader:
        sources = [pl.Source(str(folder / "a"), 2.0),
                   pl.Source(str(folder / "b"), 1.0, JsonLinesReader(4, fields=["id"], piece_size=3))]
        return pl.DataLoader(IdReader(4), pl.IdentityDataset(), ListCollator(), sources, shuffle=True, **kwargs)

    return make


def bad_file_loader(folder: Path, **kwargs: Any) -> Make:
    return ids_loader(folder, reader=IdReader(4, fail_on={"part-0003.txt"}), on_error="skip", **kwargs)


def sliced_loader(folder: Path, **kwargs: Any) -> Make:
    write_streams(folder, [20, 6])
    long, short = str(folder / "s000.txt"), str(folder / "s001.txt")
    entries = [(long, 0, 7), (long, 7, 15), short, (long, 15, 20)]
    return lambda: pl.DataLoader(PieceReader(2, 3, True), pl.IdentityDataset(), NumpyCollator(), entries,
                                 stream=pl.Stream(seq_len=3), **kwargs)


class FailingPieceReader(PieceReader):
    """``PieceReader`` whose file ``s002.txt`` fails after its first piece."""

    def iter_file(self, path: str) -> Any:
        for i, piece in enumerate(super().iter_file(path)):
            if i == 1 and path.endswith("s002.txt"):
                raise OSError("the disk says no")
            yield piece


class FailingEncode(pl.Dataset):
    """Fails on the batches holding id 9 (or, in stream mode, 2001)."""

    def batch_encode(self, batch_data: Dict[str, list]) -> Dict[str, list]:
        flat = np.asarray(batch_data["id"]).ravel().tolist()
        if 9 in flat or 2001 in flat:
            raise ValueError("cannot encode this batch")
        return batch_data


def failing_stream_loader(folder: Path, **kwargs: Any) -> Make:
    write_streams(folder, STREAMS)
    return lambda: pl.DataLoader(FailingPieceReader(2, 3, True), pl.IdentityDataset(), NumpyCollator(), str(folder),
                                 stream=pl.Stream(seq_len=3), on_error="skip", **kwargs)


class ArrayIdReader(IdReader):
    """``IdReader``'s ids as one NumPy array per file: full batches of a file travel as one stacked group."""

    def read_file(self, path: str) -> Any:
        columns, n = super().read_file(path)
        return {"id": np.asarray(columns["id"], dtype=np.int64)}, n


def failing_encode_loader(folder: Path, **kwargs: Any) -> Make:
    write_chunks(folder, SIZES)
    return lambda: pl.DataLoader(IdReader(3), FailingEncode(), ListCollator(), str(folder), on_error="skip",
                                 **kwargs)


def own_collator_stream_loader(folder: Path, stream: pl.Stream = ONE_STEP, **kwargs: Any) -> Make:
    write_streams(folder, STREAMS)
    return lambda: pl.DataLoader(PieceReader(2, 3, True), pl.IdentityDataset(), ListCollator(), str(folder),
                                 stream=stream, **kwargs)


def cached_loader(folder: Path, **kwargs: Any) -> Make:
    """Epochs in blocks of two: the first of each writes its encoded batches to disk, the second reads them."""
    write_chunks(folder / "data", SIZES)
    cache = {"dir": str(folder / "encoded"), "update_every": 2}
    return lambda: pl.DataLoader(IdReader(4), pl.IdentityDataset(), ListCollator(), str(folder / "data"),
                                 cache_encoded=cache, **kwargs)


MEMORY = [np.arange(k * 1000, k * 1000 + n) for k, n in enumerate(STREAMS)]

# name (a sentence) -> the loaders of the case, from a fresh folder
CASES: Dict[str, Callable[[Path], Make]] = {
    "a_plain_run": lambda d: ids_loader(d),
    "files_shuffled_each_epoch": lambda d: ids_loader(d, shuffle=True),
    "samples_shuffled_inside_each_file": lambda d: ids_loader(d, reader=IdReader(4, shuffle=True)),
    "a_shuffle_buffer_mixing_files": lambda d: ids_loader(d, shuffle=True, shuffle_buffer=5),
    "the_last_partial_batch_dropped": lambda d: ids_loader(d, shuffle=True, drop_last=True),
    "two_epochs_per_iteration": lambda d: ids_loader(d, shuffle=True, shuffle_buffer=3, num_epoch=2),
    "two_worker_processes": lambda d: ids_loader(d, shuffle=True, num_workers=2),
    "two_persistent_worker_processes": lambda d: ids_loader(d, shuffle=True, num_workers=2, persistent_workers=True),
    "a_shuffle_buffer_with_two_workers": lambda d: ids_loader(d, shuffle=True, shuffle_buffer=5, num_workers=2),
    "rank_1_of_2_padded_to_equal_steps": lambda d: ids_loader(d, shuffle=True, ranks=pl.Ranks(rank=1, world_size=2)),
    "rank_2_of_3_dropping_to_equal_steps": lambda d: ids_loader(
        d, 2, shuffle=True, ranks=pl.Ranks(rank=2, world_size=3, even_batches="drop")),
    "rank_0_of_2_with_two_workers_and_a_shuffle_buffer": lambda d: ids_loader(
        d, shuffle=True, ranks=pl.Ranks(rank=0, world_size=2), num_workers=2, shuffle_buffer=4),
    "stream_mode_one_sample_per_step": lambda d: stream_loader(d, arrays=False),
    "stream_mode_windows_padded_with_zeros": lambda d: stream_loader(
        d, stream=pl.Stream(seq_len=3), shuffle=True, num_epoch=2),
    "stream_mode_windows_padded_with_the_edge": lambda d: stream_loader(
        d, stream=pl.Stream(seq_len=3, padding_mode="edge"), shuffle=True),
    "stream_mode_replaying_data_as_padding": lambda d: stream_loader(
        d, stream=pl.Stream(seq_len=2, padding_mode="data"), rows=3),
    "stream_mode_time_major": lambda d: stream_loader(d, stream=pl.Stream(seq_len=3, time_major=True), shuffle=True),
    "stream_mode_with_two_workers": lambda d: stream_loader(
        d, stream=pl.Stream(seq_len=3), shuffle=True, num_workers=2),
    "stream_mode_rank_1_of_2": lambda d: stream_loader(
        d, stream=pl.Stream(seq_len=2), shuffle=True, ranks=pl.Ranks(rank=1, world_size=2)),
    "stream_mode_edge_padding_list_samples_under_ranks": lambda d: stream_loader(
        d, stream=pl.Stream(seq_len=3, padding_mode="edge"), rows=3, arrays=False,
        ranks=pl.Ranks(rank=0, world_size=2), shuffle=True),
    "stream_mode_over_slices_of_a_file": lambda d: sliced_loader(d, shuffle=True),
    "stream_mode_over_in_memory_streams": lambda d: stream_loader(
        d, stream=pl.Stream(seq_len=3, padding_mode="edge"), data=MEMORY, shuffle=True),
    "a_filter_dropping_odd_ids": lambda d: ids_loader(d, batch_size=3, filter_fn=even, shuffle=True),
    "a_filter_with_two_workers_under_ranks": lambda d: ids_loader(
        d, batch_size=2, filter_fn=even, num_workers=2, ranks=pl.Ranks(rank=1, world_size=2)),
    "a_file_order_function": lambda d: ids_loader(d, file_order=reverse_order, num_epoch=2),
    "a_curriculum_that_drops_and_repeats_files": lambda d: ids_loader(d, file_order=curriculum),
    "bucketing_by_length": lambda d: ids_loader(d, shuffle=True, bucket=pl.Bucket("id", buffer=8)),
    "bucketing_under_ranks": lambda d: ids_loader(
        d, bucket=pl.Bucket("id", buffer=8), ranks=pl.Ranks(rank=0, world_size=2)),
    "weighted_sources_until_the_first_is_exhausted": lambda d: mixed_loader(d),
    "weighted_sources_until_all_are_exhausted": lambda d: mixed_loader(d, stop="all_exhausted"),
    "weighted_sources_under_ranks_with_two_workers": lambda d: mixed_loader(
        d, ranks=pl.Ranks(rank=1, world_size=2), num_workers=2),
    "a_bad_file_skipped": lambda d: bad_file_loader(d, shuffle=True),
    "a_bad_file_skipped_under_ranks_with_two_workers": lambda d: bad_file_loader(
        d, ranks=pl.Ranks(rank=0, world_size=2), num_workers=2),
    "a_batch_that_fails_to_encode_skipped": lambda d: failing_encode_loader(d, shuffle=True),
    "a_batch_that_fails_to_encode_skipped_under_ranks": lambda d: failing_encode_loader(
        d, ranks=pl.Ranks(rank=1, world_size=2)),
    "a_bad_file_skipped_in_stream_mode": lambda d: failing_stream_loader(d),
    "a_bad_file_skipped_in_stream_mode_under_ranks": lambda d: failing_stream_loader(
        d, ranks=pl.Ranks(rank=0, world_size=2), shuffle=True),
    "stream_mode_with_a_collator_of_its_own": lambda d: own_collator_stream_loader(
        d, stream=pl.Stream(seq_len=2), shuffle=True),
    "stream_mode_over_a_file_order": lambda d: stream_loader(d, stream=pl.Stream(seq_len=2), file_order=reverse_order),
    "stream_mode_replaying_data_under_ranks_with_two_workers": lambda d: stream_loader(
        d, stream=pl.Stream(seq_len=2, padding_mode="data"), ranks=pl.Ranks(rank=1, world_size=2), num_workers=2,
        shuffle=True),
    "the_smallest_queue_and_read_ahead": lambda d: ids_loader(
        d, 2, shuffle=True, max_queue_size=1, prefetch_files=1, shuffle_buffer=3),
    "the_last_partial_batch_dropped_under_ranks": lambda d: ids_loader(
        d, 3, shuffle=True, drop_last=True, ranks=pl.Ranks(rank=1, world_size=2)),
    "a_filter_bucketing_and_a_shuffle_buffer_with_two_workers": lambda d: ids_loader(
        d, 2, filter_fn=even, bucket=pl.Bucket("id", buffer=4), shuffle_buffer=3, shuffle=True, num_workers=2),
    "weighted_sources_over_two_epochs_shuffled_in_file": lambda d: mixed_loader(d, num_epoch=2),
    "epochs_read_from_a_cache_of_encoded_batches": lambda d: cached_loader(d, num_epoch=3, shuffle=True),
    "cached_epochs_with_a_shuffle_buffer_under_ranks_with_two_workers": lambda d: cached_loader(
        d, num_epoch=2, shuffle_buffer=3, ranks=pl.Ranks(rank=1, world_size=2), num_workers=2),
    "rotation_serving_each_sample_three_times": lambda d: ids_loader(
        d, rotation=pl.Rotation(3, size=9), shuffle=True, num_epoch=2),
    "rotation_on_disk_with_two_workers": lambda d: ids_loader(
        d, rotation=pl.Rotation(2, size=8, folder=d.parent / "rotation"), num_workers=2, shuffle=True),
    "rotation_under_ranks_with_a_shuffle_buffer_and_a_skipped_encode": lambda d: failing_encode_loader(
        d, rotation=pl.Rotation(2, size=6), ranks=pl.Ranks(rank=1, world_size=2), shuffle_buffer=5, shuffle=True),
    "the_text_lines_reader": text_loader,
    "the_json_lines_reader_in_pieces": lambda d: format_loader(
        d, write_jsonl, JsonLinesReader(4, piece_size=2), TorchCollator()),
    "the_csv_reader": lambda d: format_loader(d, write_csv, CSVReader(4, shuffle=True), NumpyCollator()),
    "the_numpy_reader_memory_mapping_npy_files": lambda d: format_loader(
        d, write_npy, NumpyReader(4, piece_size=2), TorchCollator(), num_workers=2),
    "the_numpy_reader_in_this_process_in_stacked_groups": lambda d: format_loader(
        d, write_npy, NumpyReader(2), TorchCollator(), num_workers=0),
    "the_numpy_reader_in_two_workers_in_stacked_groups": lambda d: format_loader(
        d, write_npy, NumpyReader(2), TorchCollator(), num_workers=2),
    "a_batch_of_a_stacked_group_that_fails_to_encode_skipped": lambda d: (write_chunks(d, SIZES), lambda: pl.DataLoader(
        ArrayIdReader(2), FailingEncode(), NumpyCollator(), str(d), on_error="skip", num_workers=0, shuffle=True))[1],
    "the_parquet_reader_by_row_group": lambda d: format_loader(d, write_parquet, ParquetReader(4), NumpyCollator()),
    "gzip_compressed_json_lines": lambda d: format_loader(
        d, lambda f: write_jsonl(f, ".jsonl.gz", gzip.open), JsonLinesReader(4, piece_size=2), NumpyCollator()),
    "the_tensorflow_collator": lambda d: format_loader(d, write_jsonl, JsonLinesReader(4), TFCollator()),
}


# modes checked at every position: one of each kind (files, shuffling, epochs, ranks, workers, stream
# windows and padding, filters, buckets, sources, skipped errors); the others at ``spread_positions``
EVERY_POSITION = {
    "a_plain_run", "a_shuffle_buffer_mixing_files", "two_epochs_per_iteration", "two_worker_processes",
    "rank_2_of_3_dropping_to_equal_steps", "stream_mode_windows_padded_with_the_edge",
    "stream_mode_replaying_data_as_padding", "a_filter_dropping_odd_ids", "bucketing_by_length",
    "a_curriculum_that_drops_and_repeats_files", "weighted_sources_until_the_first_is_exhausted",
    "a_bad_file_skipped", "a_batch_that_fails_to_encode_skipped", "a_bad_file_skipped_in_stream_mode",
    "the_last_partial_batch_dropped_under_ranks", "the_numpy_reader_in_this_process_in_stacked_groups",
}


# modes whose every resume starts worker processes, not in EVERY_POSITION: checked at ``few_positions``
WITH_WORKERS = {"the_numpy_reader_memory_mapping_npy_files", "the_numpy_reader_in_two_workers_in_stacked_groups",
                "a_filter_bucketing_and_a_shuffle_buffer_with_two_workers", "a_filter_with_two_workers_under_ranks",
                "cached_epochs_with_a_shuffle_buffer_under_ranks_with_two_workers", "stream_mode_with_two_workers",
                "stream_mode_replaying_data_under_ranks_with_two_workers", "rotation_on_disk_with_two_workers",
                "a_shuffle_buffer_with_two_workers", "two_persistent_worker_processes",
                "a_bad_file_skipped_under_ranks_with_two_workers", "weighted_sources_under_ranks_with_two_workers",
                "rank_0_of_2_with_two_workers_and_a_shuffle_buffer"}


@pytest.mark.parametrize("case", list(CASES))
def test_a_run_resumes_exactly_at_every_position(tmp_path, case, monkeypatch):
    # a case that gives no num_workers runs in threads: the default's workers start again at every resume,
    # and are the next test's (cases giving workers are in WITH_WORKERS)
    monkeypatch.setenv("PYLOADER_NUM_WORKERS", "0")
    make = CASES[case](tmp_path / "data")
    n = check_resume(make, None if case in EVERY_POSITION else few_positions if case in WITH_WORKERS else
                     spread_positions)
    assert n >= 3, "too few batches for the positions to mean anything"
    assert wait_no_threads() == []
    assert wait_no_children() == []


def test_a_run_with_the_workers_chosen_automatically_resumes_exactly_at_every_position(tmp_path, monkeypatch):
    monkeypatch.setenv("PYLOADER_NUM_WORKERS", "auto")  # whatever the environment says
    make = ids_loader(tmp_path / "data", shuffle=True, shuffle_buffer=3)
    assert make().workers.processes == "auto"
    assert check_resume(make) == 6
    assert wait_no_children() == []


# -- the check finds what it is for ----------------------------------------------------------------
class OffByOne(pl.DataLoader):
    """Resumes one batch late from states saved after ``late_from`` batches."""

    late_from = 3

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if state["batches_in_epoch"] >= self.late_from:
            state = {**state, "batches_in_epoch": state["batches_in_epoch"] + 1}
        super().load_state_dict(state)


def test_the_check_names_the_position_and_the_first_batch_and_key_that_differ(tmp_path):
    write_chunks(tmp_path, SIZES)

    def make() -> pl.DataLoader:
        return OffByOne(IdReader(4), pl.IdentityDataset(), NumpyCollator(), str(tmp_path))

    with pytest.raises(AssertionError, match=r"position 3 of 6, its state loaded into a new loader: iteration 1, "
                                             r"batch 0: key 'id': values differ at \(0,\): expected 12, got 16"):
        check_resume(make)
    check_resume(make, positions=[0, 1, 2])  # before the fault


class Unserializable(pl.DataLoader):
    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "where": {1, 2}}


def test_the_check_refuses_a_state_that_json_cannot_carry(tmp_path):
    write_chunks(tmp_path, SIZES)
    with pytest.raises(AssertionError, match="state_dict.. at position 0 of 6 is not JSON-serializable"):
        check_resume(lambda: Unserializable(IdReader(4), pl.IdentityDataset(), ListCollator(), str(tmp_path)))


class Offset(pl.Dataset):
    """Adds its own offset to every id: loaders built with other offsets differ."""

    def __init__(self, offset: int) -> None:
        self.offset = offset

    def batch_encode(self, batch_data: Dict[str, list]) -> Dict[str, list]:
        return {"id": [i + self.offset for i in batch_data["id"]]}


def test_the_check_tells_a_loader_that_differs_from_run_to_run(tmp_path):
    write_chunks(tmp_path, SIZES)
    offsets = iter(range(100))

    def make() -> pl.DataLoader:
        return pl.DataLoader(IdReader(4), Offset(next(offsets)), ListCollator(), str(tmp_path))

    with pytest.raises(AssertionError, match="position 0 of 6, its state loaded into a new loader: iteration 1, "
                                             "batch 0: key 'id': item 0: expected 0, got 2"):
        check_resume(make)
    with pytest.raises(AssertionError, match="position 2 of 6: the first 2 batches of a new loader"):
        check_resume(make, positions=[2])


@pytest.mark.parametrize("collator", [NumpyCollator(), TorchCollator(), TFCollator()], ids=["numpy", "torch", "tf"])
def test_the_check_compares_dtypes_as_well_as_values(tmp_path, collator):
    write_chunks(tmp_path, SIZES)

    class Cast(pl.Dataset):  # after a resume, the batches come as another dtype
        def __init__(self) -> None:
            self.dtype = np.int64

        def batch_encode(self, batch_data: Dict[str, list]) -> Dict[str, Any]:
            return {"id": np.asarray(batch_data["id"], dtype=self.dtype)}

    class Resumed(pl.DataLoader):
        def load_state_dict(self, state: Dict[str, Any]) -> None:
            self.dataset.dtype = np.int32
            super().load_state_dict(state)

    with pytest.raises(AssertionError, match=r"position 0 of 6.*key 'id': expected .*int64 \(4,\), got .*int32"):
        check_resume(lambda: Resumed(IdReader(4), Cast(), collator, str(tmp_path)))


def test_the_check_fails_under_python_dash_o_too(tmp_path):
    """It raises its AssertionErrors, not ``assert``s them: ``python -O`` would drop those."""
    script = tmp_path / "check.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import pyloader as pl
        from pyloader.readers import TextLinesReader
        from pyloader.collators import NumpyCollator
        from pyloader.testing import check_resume

        class Late(pl.DataLoader):
            def load_state_dict(self, state):
                super().load_state_dict({{**state, "batches_in_epoch": state["batches_in_epoch"] + 1}})

        with open({str(tmp_path / "a.txt")!r}, "w") as f:
            f.write("".join(f"{{i}}\\n" for i in range(12)))
        try:
            check_resume(lambda: Late(TextLinesReader(4), pl.IdentityDataset(), NumpyCollator(),
                                      {str(tmp_path / "a.txt")!r}, num_workers=0))
        except AssertionError as exc:
            sys.exit(0 if "position 0 of 3" in str(exc) else 2)
        sys.exit(1)
        """))
    root = str(Path(pl.__file__).resolve().parent.parent)
    done = subprocess.run([sys.executable, "-O", str(script)], env={**os.environ, "PYTHONPATH": root},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_positions_outside_the_run_are_refused(tmp_path):
    make = ids_loader(tmp_path / "data")
    with pytest.raises(ValueError, match=r"positions \[7, -1\] are outside the uninterrupted iteration's 0..6"):
        check_resume(make, positions=[0, 7, -1])


def test_positions_may_be_a_function_of_the_epochs_of_the_run(tmp_path):
    make = ids_loader(tmp_path / "data", num_epoch=2)
    seen: List[List[Any]] = []

    def pick(epochs: List[Any]) -> List[int]:
        seen.append(list(epochs))
        return [0, len(epochs)]

    assert check_resume(make, pick) == 12
    assert seen == [[0] * 6 + [1] * 6]  # loader.epoch after each batch of the uninterrupted first iteration
    assert spread_positions(seen[0]) == [0, 1, 3, 6, 7, 9, 11, 12]
    write_chunks(tmp_path / "late", SIZES)
    with pytest.raises(AssertionError, match="position 3 of 6"):  # a spread position fails as any other
        check_resume(lambda: OffByOne(IdReader(4), pl.IdentityDataset(), NumpyCollator(), str(tmp_path / "late")),
                     spread_positions)
