"""Multi-node training: disjoint, complete rank shares with equal step counts; torchrun and tf.distribute."""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
from conftest import IdReader, ListCollator, take_steps, write_chunks

import pyloader as pl
from pyloader.collators import NumpyCollator
from pyloader.readers import JsonLinesReader

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[1]
PADDING = "__padding__"


def rank_runs(data, world_size, **kwargs):
    """Each rank's batches, as if run on ``world_size`` machines."""
    runs = []
    ranks = kwargs.pop("ranks", pl.Ranks())  # its even_batches
    for rank in range(world_size):
        loader = pl.DataLoader(IdReader(kwargs.pop("batch_size", 4)), pl.IdentityDataset(), ListCollator(), data,
                               ranks=dataclasses.replace(ranks, rank=rank, world_size=world_size), **kwargs)
        runs.append(list(loader))
    return runs


def real_ids(batches):
    return [i for b in batches for i, pad in zip(b["id"], b.get(PADDING, [False] * len(b["id"]))) if not pad]


# -- who am I --------------------------------------------------------------------------
def test_rank_from_environment(tmp_path, monkeypatch):
    write_chunks(tmp_path, [4])
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(tmp_path))
    assert (loader.sharding.rank, loader.sharding.world_size) == (1, 3)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    loader = pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(tmp_path))
    assert (loader.sharding.rank, loader.sharding.world_size) == (0, 1)
    assert PADDING not in next(iter(loader))  # a single process gets batches as they are
    loader.close()


@pytest.mark.parametrize("kwargs, match", [
    ({"rank": 2, "world_size": 2}, r"Ranks needs 0 <= rank < world_size, got rank=2, world_size=2"),
    ({"rank": -1, "world_size": 2}, r"Ranks.rank must be an integer >= 0, got -1"),
    ({"rank": 0, "world_size": 0}, r"Ranks.world_size must be an integer >= 1, got 0"),
    ({"even_batches": "repeat"}, r"Ranks.even_batches must be one of \('pad', 'drop'\), got 'repeat'")])
def test_bad_rank_settings(tmp_path, kwargs, match):
    write_chunks(tmp_path, [4])
    with pytest.raises(ValueError, match=match):
        pl.Ranks(**kwargs)
    with pytest.raises(ValueError, match=r"need 0 <= rank < world_size, got rank=3, world_size=1"):
        pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(tmp_path), ranks=pl.Ranks(rank=3))


# -- shares --------------------------------------------------------------------------------
@pytest.mark.parametrize("sizes", [[10, 7, 13], [31], [1, 50, 2, 2, 0, 9], [3, 3, 3]])
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("settings", [{}, {"shuffle": True}, {"shuffle_buffer": 5, "shuffle": True},
                                      {"drop_last": True}])
def test_pad_mode_shares_are_disjoint_complete_and_equal_in_steps(tmp_path, sizes, world_size, settings):
    write_chunks(tmp_path, sizes)
    runs = rank_runs(str(tmp_path), world_size, num_epoch=2, **settings)
    assert len({len(r) for r in runs}) == 1, [len(r) for r in runs]
    total = sum(sizes)
    got = sorted(i for r in runs for i in real_ids(r))
    if settings.get("drop_last"):  # each rank drops its own tail (< one batch) per epoch
        counts = np.bincount(got, minlength=total)
        assert counts.max() <= 2 and len(got) >= 2 * (total - world_size * 3)
    else:
        assert got == sorted(list(range(total)) * 2)


def test_drop_mode_stops_every_rank_at_the_shortest(tmp_path):
    write_chunks(tmp_path, [10, 1])  # 11 samples: shares of 6 and 5
    runs = rank_runs(str(tmp_path), 2, ranks=pl.Ranks(even_batches="drop"), batch_size=5)
    assert [sum(len(b["id"]) for b in r) for r in runs] == [5, 5]
    assert not any(b[PADDING].any() for r in runs for b in r)  # flagged on every batch under ranks: none here
    ids = real_ids(runs[0]) + real_ids(runs[1])
    assert len(set(ids)) == 10  # one sample is left out this epoch: the documented trade-off


def test_padding_flags_mark_repeated_samples(tmp_path):
    write_chunks(tmp_path, [5])  # 5 samples over 2 ranks: 2 + 1 padding, and 3
    runs = rank_runs(str(tmp_path), 2, batch_size=3)
    assert [[b[PADDING].tolist() for b in r] for r in runs] == [[[False, False, True]], [[False, False, False]]]
    assert [b["id"] for b in runs[0]] == [[0, 1, 2]] and [b["id"] for b in runs[1]] == [[2, 3, 4]]


def test_ranks_with_workers_match_ranks_without(tmp_path):
    write_chunks(tmp_path, [9, 4, 15, 2, 7])
    plain = rank_runs(str(tmp_path), 2, shuffle=True, num_epoch=2)
    workers = rank_runs(str(tmp_path), 2, shuffle=True, num_epoch=2, num_workers=2)
    assert [[b["id"] for b in r] for r in plain] == [[b["id"] for b in r] for r in workers]


def test_stream_mode_under_ranks(tmp_path):
    from test_stream import PieceReader, write_streams

    lengths = [7, 30, 3, 12, 5]
    write_streams(tmp_path, lengths)
    for even in ("pad", "drop"):
        steps, seen = [], []
        for rank in range(3):
            loader = pl.DataLoader(PieceReader(2), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                                   stream=pl.Stream(seq_len=3),
                                   ranks=pl.Ranks(rank=rank, world_size=3, even_batches=even), shuffle=True)
            batches = list(loader)
            steps.append(len(batches))
            seen += [int(i) for b in batches for i in b["id"][b["__valid__"] & ~b["__replay__"][:, None]]]
        assert len(set(steps)) == 1, steps
        assert len(seen) == len(set(seen))
        if even == "pad":
            assert sorted(seen) == sorted(f * 1000 + p for f, n in enumerate(lengths) for p in range(n))


def test_resume_under_ranks(tmp_path):
    write_chunks(tmp_path, [9, 4, 15, 2, 7])
    for rank in range(2):
        def make(rank: int = rank) -> pl.DataLoader:
            return pl.DataLoader(IdReader(3), pl.IdentityDataset(), ListCollator(), str(tmp_path),
                                 ranks=pl.Ranks(rank=rank, world_size=2), shuffle=True, num_epoch=2, shuffle_buffer=4)
        full = [b["id"] for b in make()]
        first = make()
        it = iter(first)
        head = [next(it)["id"] for _ in range(4)]
        state = json.loads(json.dumps(first.state_dict()))
        first.close()
        resumed = make()
        resumed.load_state_dict(state)
        assert head + [b["id"] for b in resumed] == full
        # every rank took as many batches: one rank's state resumes the others too, each its own share
        other = pl.DataLoader(IdReader(3), pl.IdentityDataset(), ListCollator(), str(tmp_path),
                              ranks=pl.Ranks(rank=1 - rank, world_size=2), shuffle=True, num_epoch=2, shuffle_buffer=4)
        other_full = [b["id"] for b in pl.DataLoader(IdReader(3), pl.IdentityDataset(), ListCollator(), str(tmp_path),
                                                      ranks=pl.Ranks(rank=1 - rank, world_size=2), shuffle=True,
                                                      num_epoch=2,
                                                      shuffle_buffer=4)]
        other.load_state_dict(state)
        assert [b["id"] for b in other] == other_full[4:]


# -- torchrun ------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(folder: Path, runs: List[Dict[str, Any]]) -> None:
    """One torchrun launch of 2 ranks running ``tests/ddp_train.py``'s ``train(**run)`` for each of ``runs``."""
    spec = folder / "runs.json"
    spec.write_text(json.dumps(runs))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(ROOT / "tests" / "ddp_train.py"),
           "--runs", str(spec)]
    scratch = folder / "scratch"  # torchrun's own temporary folders (torchelastic_*) go here, not /tmp
    scratch.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=200, env=env)
    assert done.returncode == 0, done.stderr[-3000:]


EQUAL_STEPS = {  # name: file sizes, train() arguments
    "three_files": ([5, 11, 2], {}),
    "a_single_file": ([17], {}),
    "very_different_sizes_two_workers": ([1, 40, 3, 0, 2], {"workers": 2}),
    "stream_mode": ([13, 4, 9, 1], {"stream": True}),
}
BAD_FILE = {"files": {}, "stream_mode": {"stream": True}}  # name: train() arguments
BAD_SIZES = [5, 11, 2, 8]


def write_ids(folder: Path, sizes: List[int], stream: bool) -> List[int]:
    """Files of ``sizes`` samples: the ids of each sample, twice (two epochs)."""
    if stream:
        from test_stream import write_streams

        write_streams(folder, sizes)
        return sorted(f * 1000 + p for f, n in enumerate(sizes) for p in range(n)) * 2
    write_chunks(folder, sizes)
    return list(range(sum(sizes))) * 2


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, tuple]:
    """Every torchrun case of this file in one launch (each a loader and a model of its own, one after the
    other): name -> (the ids expected, each rank's result). Each launch spends most of its time starting."""
    folder = tmp_path_factory.mktemp("ddp")
    runs, expected = [], {}
    for name, (sizes, kwargs) in EQUAL_STEPS.items():
        expected[name] = write_ids(folder / name, sizes, kwargs.get("stream", False))
        runs.append({"data": str(folder / name), "out": str(folder / f"{name}.out"), **kwargs})
    for name, kwargs in BAD_FILE.items():
        stream = kwargs.get("stream", False)
        data = folder / f"bad_{name}"
        ids = write_ids(data, BAD_SIZES, stream)
        expected[f"bad_{name}"] = [i for i in ids if not (i // 1000 == 1 if stream else 5 <= i < 16)]
        bad = data / ("s001.txt" if stream else "part-0001.txt")
        bad.write_text(bad.read_text().replace("\n", "\nnot a number\n", 1))  # counted as a sample; fails to parse
        runs.append({"data": str(data), "out": str(folder / f"bad_{name}.out"), "on_error": "skip", **kwargs})
    for run in runs:
        os.mkdir(run["out"])
    torchrun(folder, runs)
    return {name: (expected[name], [json.loads((Path(run["out"]) / f"rank{r}.json").read_text()) for r in range(2)])
            for name, run in zip(expected, runs)}


@pytest.mark.parametrize("case", list(EQUAL_STEPS))
def test_torchrun_ddp_equal_steps(ddp_runs, case):
    expected, ranks = ddp_runs[case]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world_size"] == 2 for r in ranks)
    assert ranks[0]["steps"] == ranks[1]["steps"] > 0
    assert sorted(ranks[0]["seen"] + ranks[1]["seen"]) == sorted(expected)


@pytest.mark.parametrize("case", list(BAD_FILE))
def test_torchrun_ddp_keeps_equal_steps_after_a_skipped_bad_file(ddp_runs, case):
    """A file that fails to parse is skipped on the rank that reads it; that rank pads, so the
    all-reduce of every step finds the other rank there (unequal steps would hang it)."""
    expected, ranks = ddp_runs[f"bad_{case}"]
    assert ranks[0]["steps"] == ranks[1]["steps"] > 0
    assert sorted(ranks[0]["seen"] + ranks[1]["seen"]) == sorted(expected)


# -- tf.distribute ---------------------------------------------------------------------------
def test_tf_distribute_input_pipelines(tmp_path):
    import tensorflow as tf

    write_chunks(tmp_path, [9, 4, 15, 2])
    loader = pl.DataLoader(IdReader(4), pl.IdentityDataset(), NumpyCollator(), str(tmp_path), shuffle=True)
    shares = []
    for pipeline in range(2):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2)
        ds = loader.to_tf_dataset(input_context=ctx)
        shares.append([int(i) for b in ds for i, pad in zip(b["id"].numpy(), b[PADDING].numpy()) if not pad])
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(30))

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    dist_ds = strategy.distribute_datasets_from_function(lambda ctx: loader.to_tf_dataset(input_context=ctx))
    assert sum(int(tf.shape(b["id"])[0]) for b in dist_ds) == 30


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("piece", [None, 2])
def test_a_count_that_understates_the_file_is_an_error(tmp_path, rank, piece):
    """Rows beyond the count would be read by no rank: the rank whose share ends the file says so."""
    write_chunks(tmp_path, [6, 6])

    class Modest(IdReader):
        def count(self, path):
            return 4

        def iter_file(self, path):
            columns, n = self.read_file(path)
            step = piece or n
            for start in range(0, n, step):
                yield {"id": columns["id"][start:start + step]}

    loader = pl.DataLoader(Modest(2), pl.IdentityDataset(), ListCollator(), str(tmp_path),
                           ranks=pl.Ranks(rank=rank, world_size=2))
    with pytest.raises(pl.PipelineError, match="more samples than the 4 DataReader.count said"):
        list(loader)


def test_a_count_that_overstates_the_file_is_an_error(tmp_path):
    write_chunks(tmp_path, [6, 6])

    class Boastful(IdReader):
        def count(self, path):
            return 10

    with pytest.raises(pl.PipelineError, match="DataReader.count"):
        list(pl.DataLoader(Boastful(4), pl.IdentityDataset(), ListCollator(), str(tmp_path),
                           ranks=pl.Ranks(rank=1, world_size=2)))


class CountsOneFileEmpty(IdReader):
    """Says part-0001 holds no samples (it holds 3)."""

    def count(self, path):
        return 0 if path.endswith("part-0001.txt") else super().count(path)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_file_counted_empty_that_holds_samples_is_an_error_under_ranks(tmp_path, num_workers):
    """No rank's share holds a row of a file counted 0: one rank reads it to check (it would vanish unseen)."""
    write_chunks(tmp_path, [3, 3, 3, 3])
    errors = []
    for rank in range(2):
        with pl.DataLoader(CountsOneFileEmpty(2), pl.IdentityDataset(), ListCollator(), str(tmp_path),
                           ranks=pl.Ranks(rank=rank, world_size=2), num_workers=num_workers) as loader:
            try:
                list(loader)
            except pl.PipelineError as exc:
                errors.append(str(exc))
    assert len(errors) == 1
    assert "part-0001.txt" in errors[0] and "more samples than the 0 DataReader.count said" in errors[0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_file_counted_empty_that_holds_samples_is_skipped_with_equal_steps_when_errors_are_skipped(
        tmp_path, num_workers):
    write_chunks(tmp_path, [3, 3, 3, 3])
    runs = []
    for rank in range(2):
        with pl.DataLoader(CountsOneFileEmpty(2), pl.IdentityDataset(), ListCollator(), str(tmp_path),
                           ranks=pl.Ranks(rank=rank, world_size=2), num_workers=num_workers, on_error="skip") as loader:
            runs.append((list(loader), loader.stats["skipped_files"]))
    assert len(runs[0][0]) == len(runs[1][0])
    assert sorted(i for batches, _ in runs for i in real_ids(batches)) == [0, 1, 2, 6, 7, 8, 9, 10, 11]
    assert sum(skipped for _, skipped in runs) == 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_empty_files_under_ranks_are_read_and_every_sample_is_delivered_once(tmp_path, num_workers):
    write_chunks(tmp_path, [0, 3, 0, 0, 5, 0])
    runs = [list(pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(tmp_path),
                               ranks=pl.Ranks(rank=rank, world_size=3), num_workers=num_workers)) for rank in range(3)]
    assert len({len(r) for r in runs}) == 1
    assert sorted(i for r in runs for i in real_ids(r)) == list(range(8))


# -- errors skipped under ranks: the steps stay those planned ----------------------------------
def write_jsonl(folder: Path, sizes, bad=None) -> None:
    """One JSON-lines file per size, ids running on across files; ``bad=(file, line)`` breaks that line."""
    folder.mkdir(parents=True, exist_ok=True)
    next_id = 0
    for i, size in enumerate(sizes):
        lines = [json.dumps({"id": next_id + j}) for j in range(size)]
        if bad is not None and bad[0] == i:
            lines[bad[1]] = "{broken"
        (folder / f"part-{i:04d}.jsonl").write_text("".join(line + "\n" for line in lines))
        next_id += size


class FailOn(pl.Dataset):
    """``batch_encode`` fails on the batches holding sample ``bad``."""

    def __init__(self, bad):
        self.bad = bad

    def batch_encode(self, batch):
        if self.bad in np.ravel(np.asarray(batch["id"])).tolist():
            raise ValueError(f"cannot encode sample {self.bad}")
        return batch


def each_rank(folder, world_size=2, dataset=None, **kwargs):
    """Each rank's batches (JSON lines, 3 samples or rows), as ``flagged`` gives them."""
    stream = kwargs.get("stream", False)
    ranks = kwargs.pop("ranks", pl.Ranks())  # its even_batches
    runs = []
    for rank in range(world_size):
        loader = pl.DataLoader(JsonLinesReader(3, piece_size=2), dataset or pl.IdentityDataset(),
                               NumpyCollator() if stream else ListCollator(), str(folder),
                               ranks=dataclasses.replace(ranks, rank=rank, world_size=world_size), **kwargs)
        runs.append([flagged(b, stream) for b in loader])
    return runs


def flagged(batch, stream):
    """A batch as (ids, padding flags); in stream mode (with ``seq_len``) a sample is flagged
    when it is not real data: ``__valid__`` false, or replayed."""
    if not stream:
        return list(batch["id"]), batch[PADDING].tolist()
    not_real = ~batch["__valid__"] | batch["__replay__"][:, None]
    return np.asarray(batch["id"]).tolist(), not_real.tolist()


def real(run, stream):
    """The ids of a run's real samples (not flagged), in order."""
    if stream:
        return [i for ids, pads in run for row, flags in zip(ids, pads) for i, pad in zip(row, flags) if not pad]
    return [i for ids, pads in run for i, pad in zip(ids, pads) if not pad]


SKIP_SETTINGS = [{}, {"shuffle": True, "shuffle_buffer": 5}, {"num_workers": 2},
                 {"drop_last": True}, {"ranks": pl.Ranks(even_batches="drop")}, {"stream": pl.Stream(seq_len=2),
                                                                                 "shuffle": True}]


@pytest.mark.parametrize("settings", SKIP_SETTINGS)
def test_a_file_skipped_after_a_bad_line_leaves_every_rank_the_planned_steps(tmp_path, settings):
    sizes = [9, 4, 15, 2, 7]
    write_jsonl(tmp_path / "clean", sizes)
    write_jsonl(tmp_path / "bad", sizes, bad=(2, 6))  # ids 13..27: 13..18 arrive before the bad line
    stream = settings.get("stream", False)
    clean = each_rank(tmp_path / "clean", **settings)
    runs = each_rank(tmp_path / "bad", on_error="skip", **settings)
    assert [len(r) for r in runs] == [len(r) for r in clean]
    assert len({len(r) for r in runs}) == 1
    for run, plan in zip(runs, clean):
        got, planned = real(run, stream), real(plan, stream)
        assert len(got) == len(set(got)) and set(got) <= set(planned)
        assert set(planned) - set(got) <= set(range(13, 28)), "only the bad file's samples are missing"
        if set(planned) - set(got):  # the rank that lost samples makes up their steps with padding
            assert any(np.all(pads) for _, pads in run)


@pytest.mark.parametrize("settings", [{}, {"num_workers": 2}, {"stream": pl.Stream(seq_len=3)}])
def test_a_batch_skipped_after_batch_encode_failed_becomes_a_padding_batch(tmp_path, settings):
    """The failed batch's step is kept: a copy of the next batch, flagged as padding."""
    write_jsonl(tmp_path, [9, 4, 15, 2, 7])
    clean = each_rank(tmp_path, dataset=FailOn(-1), **settings)
    runs = each_rank(tmp_path, dataset=FailOn(14), on_error="skip", **settings)
    assert [len(r) for r in runs] == [len(r) for r in clean]
    failed = [(rank, k) for rank, run in enumerate(clean) for k, (ids, _) in enumerate(run) if 14 in np.ravel(ids)]
    assert len(failed) == 1
    rank, k = failed[0]
    for r, (run, plan) in enumerate(zip(runs, clean)):
        for step, (got, want) in enumerate(zip(run, plan)):
            if (r, step) != (rank, k):
                assert got == want
    ids, pads = runs[rank][k]
    assert ids == clean[rank][k + 1][0] and np.all(pads)


@pytest.mark.parametrize("stream", [False, True])
def test_a_count_that_fails_is_skipped_under_the_skip_policy(tmp_path, stream):
    write_chunks(tmp_path, [6, 6, 6])

    class NoCount(IdReader):
        def count(self, path):
            if path.endswith("part-0001.txt"):
                raise OSError("the index is gone")
            return super().count(path)

        def iter_file(self, path):
            columns, _ = self.read_file(path)
            yield columns

    settings = {"stream": pl.Stream(seq_len=2)} if stream else {}
    with pytest.raises(pl.PipelineError, match="count failed on .*part-0001.txt"):
        list(pl.DataLoader(NoCount(2), pl.IdentityDataset(), ListCollator(), str(tmp_path),
                           ranks=pl.Ranks(rank=0, world_size=2),
                           **settings))
    runs, stats = [], []
    for rank in range(2):
        loader = pl.DataLoader(NoCount(2), pl.IdentityDataset(), NumpyCollator() if stream else ListCollator(),
                               str(tmp_path), ranks=pl.Ranks(rank=rank, world_size=2), on_error="skip", **settings)
        runs.append([flagged(b, stream) for b in loader])
        stats.append(loader.stats)
    assert len({len(r) for r in runs}) == 1
    assert sorted(i for r in runs for i in real(r, stream)) == list(range(6)) + list(range(12, 18))
    assert all(s["skipped_files"] == 1 and "part-0001.txt" in s["errors"][0] for s in stats)


@pytest.mark.parametrize("settings", [{"shuffle": True, "num_epoch": 2}, {"stream": pl.Stream(seq_len=2)}])
def test_resume_after_errors_skipped_under_ranks_is_exact(tmp_path, settings):
    """Wherever the checkpoint falls (among padding too), the rest is what the run would have given."""
    write_jsonl(tmp_path, [9, 4, 15, 2, 7], bad=(2, 6))

    def make(rank):
        return pl.DataLoader(JsonLinesReader(3, piece_size=2), FailOn(3), ListCollator() if not settings.get("stream")
                             else NumpyCollator(), str(tmp_path), ranks=pl.Ranks(rank=rank, world_size=2),
                             on_error="skip", **settings)

    stream = settings.get("stream", False)
    steps = []
    for rank in range(2):
        full = [flagged(b, stream) for b in make(rank)]
        steps.append(len(full))
        for taken in range(1, len(full)):
            first = make(rank)
            it = iter(first)
            head = [flagged(next(it), stream) for _ in range(taken)]
            state = json.loads(json.dumps(first.state_dict()))
            first.close()
            resumed = make(rank)
            resumed.load_state_dict(state)
            assert head + [flagged(b, stream) for b in resumed] == full, taken
    assert steps[0] == steps[1]


def test_an_epoch_left_without_batches_is_padded_from_the_next_real_batch(tmp_path):
    """Rank 0's only file fails in epoch 0 (and reads in epoch 1): its one step of epoch 0 is padding."""
    write_chunks(tmp_path, [3, 3])

    class FailsOnce(IdReader):
        failed = False

        def count(self, path):
            return 3

        def read_file(self, path):
            if path.endswith("part-0000.txt") and not self.failed:
                self.failed = True
                raise OSError("flaky disk")
            return super().read_file(path)

    # FailsOnce keeps its state on self: one copy, in this process
    loader = pl.DataLoader(FailsOnce(3), pl.IdentityDataset(), ListCollator(), str(tmp_path),
                           ranks=pl.Ranks(rank=0, world_size=2),
                           num_epoch=2, on_error="skip", num_workers=0)
    got = [(loader.epoch, b["id"], b[PADDING].tolist()) for b in loader]
    assert got == [(0, [0, 1, 2], [True] * 3), (1, [0, 1, 2], [False] * 3)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_rank_left_without_samples_at_the_run_end_pads_with_flagged_copies(tmp_path, num_workers):
    """Issue 47: in epoch 1 filter_fn leaves rank 0 no sample; its step is a copy of its last batch (of
    epoch 0), which must be flagged as padding in full, not delivered as the real data it was copied from."""
    write_chunks(tmp_path, [7, 1])

    def order(files, epoch, rng):
        return [files[i] for i in rng.permutation(len(files))]

    epochs: Dict[int, List[int]] = {}
    steps = []
    for rank in range(3):
        loader = pl.DataLoader(IdReader(3, shuffle=True, random_seed=0), pl.IdentityDataset(), ListCollator(),
                               str(tmp_path), num_epoch=2, random_seed=0, shuffle_buffer=11, file_order=order,
                               filter_fn=lambda sample: sample["id"] % 2 == 0, num_workers=num_workers,
                               ranks=pl.Ranks(rank=rank, world_size=3))
        got = [(loader.epoch, _real(batch)) for batch in loader]
        steps.append(len(got))
        for epoch, ids in got:
            epochs.setdefault(epoch, []).extend(ids)
    assert len(set(steps)) == 1
    assert {epoch: sorted(ids) for epoch, ids in epochs.items()} == {0: [0, 2, 4, 6], 1: [0, 2, 4, 6]}


def test_a_rank_whose_every_batch_fails_raises_rather_than_give_fewer_steps(tmp_path):
    write_chunks(tmp_path, [3, 3])
    loader = pl.DataLoader(IdReader(3), FailOn(4), ListCollator(), str(tmp_path), ranks=pl.Ranks(rank=1, world_size=2),
                           on_error="skip")
    with pytest.raises(RuntimeError, match="nothing to pad"):
        list(loader)


# -- stream mode under ranks ------------------------------------------------------------------
@pytest.mark.parametrize("count,match", [(2, "more samples than the 2 DataReader.count said"),
                                         (12, "has 10 samples but DataReader.count said 12")])
def test_stream_mode_under_ranks_checks_each_file_against_its_count(tmp_path, count, match):
    """Files of 2, 2, 2 and 10 samples, the last counted wrong: an error naming it, on the rank that reads it."""
    from test_stream import PieceReader, write_streams

    write_streams(tmp_path, [2, 2, 2, 10])

    class Miscounted(PieceReader):
        def count(self, path):
            return count if path.endswith("s003.txt") else 2

    with pytest.raises(pl.PipelineError, match=rf"s003\.txt.*{match}"):
        list(pl.DataLoader(Miscounted(1), pl.IdentityDataset(), NumpyCollator(), str(tmp_path), stream=True,
                           ranks=pl.Ranks(rank=1, world_size=2)))
    runs = [list(pl.DataLoader(Miscounted(1), pl.IdentityDataset(), NumpyCollator(), str(tmp_path), stream=True,
                               ranks=pl.Ranks(rank=rank, world_size=2), on_error="skip")) for rank in range(2)]
    assert len(runs[0]) == len(runs[1])  # the bad file is skipped, and the steps still agree


def test_a_stream_rank_without_files_pads_every_epoch_alike(tmp_path):
    """Two files over three ranks: rank 2 owns none in any epoch; its padding steps are the same in
    every epoch, and a resumed run gives them again."""
    from test_stream import PieceReader, write_streams

    write_streams(tmp_path, [5, 3])

    def make():
        return pl.DataLoader(PieceReader(2), pl.IdentityDataset(), NumpyCollator(), str(tmp_path),
                             stream=pl.Stream(seq_len=2), ranks=pl.Ranks(rank=2, world_size=3), num_epoch=3)

    def as_lists(batch):
        return {key: np.asarray(value).tolist() for key, value in batch.items()}

    loader = make()
    epochs = {}
    for batch in loader:
        epochs.setdefault(loader.epoch, []).append(as_lists(batch))
    assert sorted(epochs) == [0, 1, 2] and epochs[0] == epochs[1] == epochs[2]
    full = [b for e in sorted(epochs) for b in epochs[e]]
    first = make()
    it = iter(first)
    head = [as_lists(next(it)) for _ in range(len(epochs[0]) + 1)]  # into epoch 1
    state = first.state_dict()
    first.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + [as_lists(b) for b in resumed] == full


# -- elastic resume: a state saved under one world size, loaded under another ---------------------
def _real(batch) -> List[int]:
    return [i for i, pad in zip(batch["id"], batch.get(PADDING, [False] * len(batch["id"]))) if not pad]


@pytest.mark.parametrize("old, new", [(2, 3), (4, 2), (3, 1), (1, 2)])
@pytest.mark.parametrize("where", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("shuffled", [False, True])
def test_a_state_resumes_exactly_under_another_world_size(tmp_path, old, new, where, shuffled):
    sizes = [5, 0, 9, 3, 7, 1, 6, 11, 4, 8]  # 54 samples
    write_chunks(tmp_path / "data", sizes)

    def make(rank, world_size):
        return pl.DataLoader(IdReader(3, shuffle=shuffled, random_seed=4), pl.IdentityDataset(), ListCollator(),
                             str(tmp_path / "data"), num_epoch=2, shuffle=shuffled,
                             ranks=pl.Ranks(rank=rank, world_size=world_size))

    per_epoch = len(make(0, old)) // 2
    k = max(1, int(where * per_epoch))
    delivered, state = take_steps(make, old, k, _real)  # every old rank took k batches of epoch 0

    rest, steps = [], []
    for rank in range(new):  # one rank's state resumes every new rank
        loader = make(rank, new)
        loader.load_state_dict(state)
        epochs: Dict[int, List] = {}
        for batch in loader:
            epochs.setdefault(loader.epoch, []).append(batch)
        rest.extend(i for b in epochs.get(0, []) for i in _real(b))
        steps.append(len(epochs.get(0, [])))
        fresh = make(rank, new)  # later epochs split as usual under the new world size
        fresh.set_epoch(1)
        assert [b["id"] for b in epochs[1]] == [b["id"] for b in fresh if fresh.epoch == 1]
    assert len(set(steps)) == 1, f"unequal steps {steps}"
    assert sorted(delivered + rest) == list(range(54)), "lost or repeated samples"


def test_an_elastic_resume_is_refused_where_delivered_samples_are_not_a_prefix(tmp_path):
    write_chunks(tmp_path / "data", [6] * 6)
    loader = pl.DataLoader(IdReader(3), pl.IdentityDataset(), ListCollator(), str(tmp_path / "data"),
                           shuffle_buffer=5, ranks=pl.Ranks(rank=0, world_size=2))
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    it.close()
    other = pl.DataLoader(IdReader(3), pl.IdentityDataset(), ListCollator(), str(tmp_path / "data"),
                          shuffle_buffer=5, ranks=pl.Ranks(rank=0, world_size=3))
    with pytest.raises(ValueError, match="world_size=2"):
        other.load_state_dict(state)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_elastic_resume_can_be_resumed_again_under_a_third_world_size(tmp_path, num_workers):
    write_chunks(tmp_path / "data", [5, 0, 9, 3, 7, 1, 6, 11, 4, 8])

    def make(rank, world_size):
        return pl.DataLoader(IdReader(3), pl.IdentityDataset(), ListCollator(), str(tmp_path / "data"),
                             shuffle=True, ranks=pl.Ranks(rank=rank, world_size=world_size), num_workers=num_workers)

    delivered, state = take_steps(make, 2, 3, _real)  # 2 ranks take 3 batches each, then 3 ranks take 2 each
    more, state = take_steps(make, 3, 2, _real, state)
    delivered += more
    last = make(0, 1)
    last.load_state_dict(state)
    rest = [i for b in last for i in _real(b)]
    assert sorted(delivered + rest) == list(range(54))
