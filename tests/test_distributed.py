"""Multi-node training: disjoint, complete rank shares with equal step counts; torchrun and tf.distribute."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pyloader as pl
from conftest import IdReader, ListCollator, write_chunks
from pyloader.collators import NumpyCollator

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[1]
PADDING = "__padding__"


def rank_runs(data, world_size, **kwargs):
    """Each rank's batches, as if run on ``world_size`` machines."""
    runs = []
    for rank in range(world_size):
        loader = pl.DataLoader(IdReader(kwargs.pop("batch_size", 4)), pl.IdentityDataset(), ListCollator(), data,
                               rank=rank, world_size=world_size, **kwargs)
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


@pytest.mark.parametrize("kwargs", [{"rank": 2, "world_size": 2}, {"rank": -1, "world_size": 2},
                                    {"rank": 0, "world_size": 0}, {"even_batches": "repeat"}])
def test_bad_rank_settings(tmp_path, kwargs):
    write_chunks(tmp_path, [4])
    with pytest.raises(ValueError):
        pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(tmp_path), **kwargs)


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
    runs = rank_runs(str(tmp_path), 2, even_batches="drop", batch_size=5)
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
            loader = pl.DataLoader(PieceReader(2), pl.IdentityDataset(), NumpyCollator(), str(tmp_path), stream=True,
                                   seq_len=3, rank=rank, world_size=3, even_batches=even, shuffle=True)
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
        def make():
            return pl.DataLoader(IdReader(3), pl.IdentityDataset(), ListCollator(), str(tmp_path), rank=rank,
                                 world_size=2, shuffle=True, num_epoch=2, shuffle_buffer=4)
        full = [b["id"] for b in make()]
        first = make()
        it = iter(first)
        head = [next(it)["id"] for _ in range(4)]
        state = json.loads(json.dumps(first.state_dict()))
        first.close()
        resumed = make()
        resumed.load_state_dict(state)
        assert head + [b["id"] for b in resumed] == full
        other = pl.DataLoader(IdReader(3), pl.IdentityDataset(), ListCollator(), str(tmp_path), rank=1 - rank,
                              world_size=2, shuffle=True, num_epoch=2, shuffle_buffer=4)
        with pytest.raises(ValueError, match="rank"):
            other.load_state_dict(state)


# -- torchrun ------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(data: Path, out: Path, *extra: str) -> list:
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(ROOT / "tests" / "ddp_train.py"),
           "--data", str(data), "--out", str(out), *extra]
    scratch = out.parent / "scratch"  # torchrun's own temporary folders (torchelastic_*) go here, not /tmp
    scratch.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("sizes,extra", [
    ([5, 11, 2], ()),                          # 3 files over 2 ranks
    ([17], ()),                                # a single file
    ([1, 40, 3, 0, 2], ("--workers", "2")),    # very different sizes, 2 workers per rank
    ([13, 4, 9, 1], ("--stream",)),            # stream mode
])
def test_torchrun_ddp_equal_steps(tmp_path, sizes, extra):
    if "--stream" in extra:
        from test_stream import write_streams

        write_streams(tmp_path / "data", sizes)
        expected = sorted(f * 1000 + p for f, n in enumerate(sizes) for p in range(n)) * 2
    else:
        write_chunks(tmp_path / "data", sizes)
        expected = list(range(sum(sizes))) * 2
    ranks = torchrun(tmp_path / "data", tmp_path / "out", *extra)
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world_size"] == 2 for r in ranks)
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

    loader = pl.DataLoader(Modest(2), pl.IdentityDataset(), ListCollator(), str(tmp_path), rank=rank, world_size=2)
    with pytest.raises(pl.PipelineError, match="more samples than the 4 DataReader.count said"):
        list(loader)


def test_a_count_that_overstates_the_file_is_an_error(tmp_path):
    write_chunks(tmp_path, [6, 6])

    class Boastful(IdReader):
        def count(self, path):
            return 10

    with pytest.raises(pl.PipelineError, match="DataReader.count"):
        list(pl.DataLoader(Boastful(4), pl.IdentityDataset(), ListCollator(), str(tmp_path), rank=1, world_size=2))
