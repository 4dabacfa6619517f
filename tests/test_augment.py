"""``pyloader.rng()`` / ``pyloader.rng_seed()``: user randomness keyed by the seed, the epoch and the place.

Every test that depends on where user code runs names ``num_workers`` itself.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest
from conftest import spread_positions, wait_no_threads, write_chunks

import pyloader as pl
from pyloader.testing import check_resume

pytestmark = pytest.mark.timeout(240)

SIZES = [5, 0, 9, 3, 7, 1, 6]  # 31 samples in 7 files: with batch_size 4, 8 batches an epoch


class DrawingReader(pl.DataReader):
    """Reads one id per line in pieces of 2; each sample gets a draw of ``pyloader.rng()`` as it is read."""

    def read_file(self, path: str) -> Tuple[Dict[str, Any], int]:
        ids = _ids(path)
        return {"id": ids, "read": pl.rng().integers(1 << 30, size=len(ids)).tolist()}, len(ids)

    def iter_file(self, path: str) -> Iterator[Dict[str, Any]]:
        ids = _ids(path)
        for start in range(0, len(ids), 2):
            part = ids[start:start + 2]
            yield {"id": part, "read": pl.rng().integers(1 << 30, size=len(part)).tolist()}


class DrawingDataset(pl.Dataset):
    """An augmentation in ``batch_encode``: a random draw per sample, two calls continuing one stream."""

    def batch_encode(self, batch_data: Dict[str, Any]) -> Dict[str, Any]:
        out = dict(batch_data)
        n = len(batch_data["id"])
        out["encode"] = [int(pl.rng().integers(1 << 30)) for _ in range(n)]
        return out


class DrawingCollator(pl.DataCollator):
    def collate_batch(self, features: Dict[str, Any]) -> Dict[str, Any]:
        out = {key: list(values) for key, values in features.items()}
        out["collate"] = pl.rng().integers(1 << 30, size=len(features["id"])).tolist()
        out["seed"] = [pl.rng_seed()]
        return out


def _ids(path: str) -> List[int]:
    with open(path) as f:
        return [int(line) for line in f if line.strip()]


def _make(folder: Path, reader_kwargs: Optional[Dict[str, Any]] = None, **kwargs: Any) -> pl.DataLoader:
    return pl.DataLoader(DrawingReader(4, **(reader_kwargs or {})), DrawingDataset(), DrawingCollator(), str(folder),
                         **kwargs)


def _run(loader: pl.DataLoader) -> List[Dict[str, list]]:
    try:
        return [dict(batch) for batch in loader]
    finally:
        loader.close()


def _by_id(batches: List[Dict[str, list]], key: str) -> Dict[Tuple[int, int], int]:
    """Each sample's draw under ``key``, keyed by (its epoch's turn, its id)."""
    out: Dict[Tuple[int, int], int] = {}
    seen: Dict[int, int] = {}
    for batch in batches:
        for i, value in zip(batch["id"], batch[key]):
            turn = seen.get(i, 0)
            seen[i] = turn + 1
            out[(turn, i)] = value
    return out


@pytest.fixture
def data(tmp_path: Path) -> Path:
    write_chunks(tmp_path / "data", SIZES)
    return tmp_path / "data"


SETTINGS = {
    "plain": ({}, {}),
    "shuffled": ({"shuffle": True, "shuffle_buffer": 5}, {"shuffle": True}),
}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_every_draw_is_the_same_with_workers_and_threads_as_in_one_thread(data: Path, setting: str) -> None:
    loader_kwargs, reader_kwargs = SETTINGS[setting]
    one = _run(_make(data, reader_kwargs, num_epoch=2, num_workers=0, num_threads=1, **loader_kwargs))
    assert len(one) == 16 and len({s for b in one for s in b["seed"]}) == 16
    for placement in ({"num_workers": 0, "num_threads": 4}, {"num_workers": 2}, {"num_workers": 2, "num_threads": 3}):
        assert _run(_make(data, reader_kwargs, num_epoch=2, **placement, **loader_kwargs)) == one, placement


def test_each_epoch_draws_anew(data: Path) -> None:
    batches = _run(_make(data, num_epoch=2, num_workers=0))
    first, second = batches[:8], batches[8:]
    assert [b["id"] for b in first] == [b["id"] for b in second]  # the same samples in the same batches
    for key in ("read", "encode", "collate", "seed"):
        assert [b[key] for b in first] != [b[key] for b in second], key


def test_the_random_seed_changes_every_draw(data: Path) -> None:
    base = _run(_make(data, num_workers=0))
    other = _run(_make(data, num_workers=0, random_seed=7))
    for key in ("read", "encode", "collate", "seed"):
        assert [b[key] for b in base] != [b[key] for b in other], key


def test_batch_encode_and_collate_batch_draw_from_different_streams(data: Path) -> None:
    batch = _run(_make(data, num_workers=0))[0]
    assert batch["encode"] != batch["collate"]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_a_resumed_run_draws_what_the_uninterrupted_one_drew_at_every_position(data: Path, setting: str,
                                                                               num_workers: int) -> None:
    loader_kwargs, reader_kwargs = SETTINGS[setting]
    positions = None if num_workers == 0 else spread_positions
    n = check_resume(lambda: _make(data, reader_kwargs, num_epoch=2, num_workers=num_workers, **loader_kwargs),
                     positions)
    assert n == 16


@pytest.mark.parametrize("num_workers", [0, 2])
def test_under_ranks_a_sample_gets_the_read_draws_it_gets_alone_and_ranks_draw_apart(data: Path,
                                                                                      num_workers: int) -> None:
    alone = _by_id(_run(_make(data, num_workers=num_workers)), "read")
    ranks = [_run(_make(data, num_workers=num_workers, ranks=pl.Ranks(rank=r, world_size=2, even_batches="drop")))
             for r in range(2)]
    for batches in ranks:
        for (turn, i), value in _by_id(batches, "read").items():
            assert value == alone[(turn, i)], i
    # batch k of rank 0 and batch k of rank 1 do not share their batch_encode / collate_batch draws
    assert ranks[0][0]["collate"] != ranks[1][0]["collate"]
    assert ranks[0][0]["seed"] != ranks[1][0]["seed"]


def test_rng_outside_a_user_call_is_a_runtime_error() -> None:
    with pytest.raises(RuntimeError, match=r"pyloader.rng\(\) is only valid inside read_file"):
        pl.rng()
    with pytest.raises(RuntimeError, match=r"pyloader.rng_seed\(\) is only valid inside"):
        pl.rng_seed()


def test_rng_in_a_thread_of_the_users_own_during_a_run_is_still_an_error(data: Path) -> None:
    """The generator belongs to the user call's own thread: another thread running meanwhile gets none."""
    errors: List[BaseException] = []

    class Peeking(DrawingDataset):
        def batch_encode(self, batch_data: Dict[str, Any]) -> Dict[str, Any]:
            def peek() -> None:
                try:
                    pl.rng()
                except RuntimeError as exc:
                    errors.append(exc)
            thread = threading.Thread(target=peek)
            thread.start()
            thread.join(10)
            return super().batch_encode(batch_data)

    loader = pl.DataLoader(DrawingReader(4), Peeking(), DrawingCollator(), str(data), num_workers=0)
    assert len(_run(loader)) == 8
    assert len(errors) == 8
    assert wait_no_threads() == []


def test_rng_seed_seeds_a_torch_generator_the_same_with_workers(data: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch is the torch extra's")

    class TorchCrop(pl.DataCollator):
        def collate_batch(self, features: Dict[str, Any]) -> Dict[str, Any]:
            generator = torch.Generator().manual_seed(pl.rng_seed())
            return {"id": list(features["id"]), "noise": torch.rand(len(features["id"]), generator=generator)}

    def noise(num_workers: int) -> List[List[float]]:
        loader = pl.DataLoader(DrawingReader(4), pl.IdentityDataset(), TorchCrop(), str(data), num_epoch=2,
                               num_workers=num_workers, start_method="fork")
        return [b["noise"].tolist() for b in _run(loader)]

    zero = noise(0)
    assert zero == noise(2)
    assert zero[:8] != zero[8:]


def test_a_count_that_reads_through_a_drawing_iter_file_works(data: Path) -> None:
    """``DataReader.count`` defaults to reading through ``iter_file``: under ranks it may meet ``pyloader.rng()``."""
    loader = _make(data, num_workers=0, ranks=pl.Ranks(rank=0, world_size=2))
    try:
        assert len(loader) == 4
    finally:
        loader.close()
    assert np.sum([len(b["id"]) for b in _run(_make(data, num_workers=0, ranks=pl.Ranks(rank=1, world_size=2)))]) == 16
