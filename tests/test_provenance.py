"""What the loader knows about each row (its file, its padding flag, its length) travels beside the
user's columns, never among them: columns of any name come back as the reader gave them."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
from conftest import IdReader, ListCollator, write_chunks

import pyloader as pl

# names the loader once used for columns of its own, mixed in with the user's
ODD_NAMES = ["\x00src", "\x00pad", "\x00len", "\x00paths", "\x00meta:__padding__"]


class OddNamesReader(IdReader):
    """Each sample's id, and beside it columns named like the loader's private ones, each a multiple of the id."""

    def read_file(self, path: str) -> Any:
        columns, n = super().read_file(path)
        ids = columns["id"]
        columns.update({name: [i * (k + 2) for i in ids] for k, name in enumerate(ODD_NAMES)})
        return columns, n


def run(loader: pl.DataLoader) -> List[Dict[str, Any]]:
    with loader:
        return [dict(batch) for batch in loader]


def check_columns_came_back(batches: List[Dict[str, Any]]) -> None:
    assert batches
    for batch in batches:
        ids = np.asarray(batch["id"])  # [B], or stream windows [B, T]
        for k, name in enumerate(ODD_NAMES):
            assert np.array_equal(np.asarray(batch[name]), ids * (k + 2)), name


SETTINGS = [
    {},
    {"shuffle": True, "shuffle_buffer": 16},
    {"bucket": pl.Bucket("id", buffer=16)},
    {"rotation": pl.Rotation(2)},
    {"rotation": pl.Rotation(2, folder="ROTATION_DIR")},
    {"shuffle_buffer": 8, "ranks": pl.Ranks(rank=1, world_size=2, even_batches="pad")},
    {"rotation": pl.Rotation(2), "ranks": pl.Ranks(rank=1, world_size=2, even_batches="pad")},
    {"stream": True},
    {"stream": pl.Stream(seq_len=3)},
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("settings", SETTINGS)
def test_user_columns_named_like_private_ones_come_back_unchanged(tmp_path: Path, settings: Dict[str, Any],
                                                                  num_workers: int) -> None:
    write_chunks(tmp_path / "data", [7, 0, 12, 5, 9])
    rotation = settings.get("rotation")
    if rotation is not None and rotation.folder:
        settings = {**settings, "rotation": dataclasses.replace(rotation, folder=str(tmp_path / "rotation"))}
    loader = pl.DataLoader(OddNamesReader(4), pl.IdentityDataset(), ListCollator(), str(tmp_path / "data"),
                           num_workers=num_workers, **settings)
    batches = run(loader)
    check_columns_came_back(batches)
    if "ranks" in settings:
        assert all("__padding__" in batch for batch in batches)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_user_columns_named_like_private_ones_come_back_unchanged_from_mixed_sources(tmp_path: Path,
                                                                                   num_workers: int) -> None:
    write_chunks(tmp_path / "a", [6, 9])
    write_chunks(tmp_path / "b", [11, 4])
    sources = [pl.Source(str(tmp_path / "a"), 1.0), pl.Source(str(tmp_path / "b"), 2.0)]
    loader = pl.DataLoader(OddNamesReader(4), pl.IdentityDataset(), ListCollator(), sources,
                           num_workers=num_workers, shuffle=True)
    check_columns_came_back(run(loader))
