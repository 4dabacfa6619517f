"""Code written for the original PyLoader: the names it used that cost nothing to keep still work
(docs/guides/migrating.md lists them, and what replaces the others)."""
from __future__ import annotations

import collections.abc
import importlib
from pathlib import Path

import pytest
from conftest import IdReader, ListCollator, write_chunks

import pyloader as pl

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[1]


def loader(folder: Path, **kwargs) -> pl.DataLoader:
    return pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(folder), **kwargs)


@pytest.mark.parametrize("module, name", [("datareader", "DataReader"), ("dataset", "Dataset"),
                                          ("datacollator", "DataCollator"), ("dataloader", "DataLoader")])
def test_the_original_module_paths_import_the_same_classes(module, name):
    assert getattr(importlib.import_module(f"pyloader.{module}"), name) is getattr(pl, name)


@pytest.mark.parametrize("workers", [0, 2])
def test_get_batch_hands_out_the_iterations_batches_then_stop_iteration_then_the_next_iteration(tmp_path, workers):
    write_chunks(tmp_path, [3, 2])
    made = loader(tmp_path, workers=workers, num_epoch=2, shuffle=True)
    expected = [b["id"] for b in loader(tmp_path, workers=workers, num_epoch=4, shuffle=True)]
    with made:
        assert made.get_epoch() == 0
        got = [made.get_batch()["id"]]
        assert made.get_epoch() == 1 and made.epoch == 0  # counted from 1, as the original did
        while True:
            try:
                got.append(made.get_batch()["id"])
            except StopIteration:
                break
        assert made.get_epoch() == 2
        got.append(made.get_batch()["id"])  # the next iteration: epochs 2 and 3
        assert made.get_epoch() == 3
    assert got == expected[:len(got)] and len(got) == 3 + 3 + 1


def test_get_batch_takes_the_next_batch_of_the_running_iteration(tmp_path):
    write_chunks(tmp_path, [4])
    made = loader(tmp_path, workers=0)
    it = iter(made)
    assert next(it)["id"] == [0, 1] and made.get_batch()["id"] == [2, 3]
    with pytest.raises(StopIteration):
        next(it)
    made.close()


def test_root_dir_is_data_dir_with_a_future_warning(tmp_path):
    write_chunks(tmp_path, [4])
    with pytest.warns(FutureWarning, match=r"root_dir= is now data_dir=") as caught:
        made = pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), root_dir=str(tmp_path), workers=0)
    assert caught[0].filename == __file__
    assert made.data_dir == str(tmp_path) and [b["id"] for b in made] == [[0, 1], [2, 3]]


def test_the_loader_is_not_an_iterator_so_frameworks_iterate_it_again_each_epoch(tmp_path):
    write_chunks(tmp_path, [2])
    assert not isinstance(loader(tmp_path, workers=0), collections.abc.Iterator)


def test_the_migration_guide_is_in_the_site_and_names_each_kept_name():
    assert "guides/migrating.md" in (ROOT / "mkdocs.yml").read_text()
    page = (ROOT / "docs" / "guides" / "migrating.md").read_text()
    for name in ("pyloader.datareader", ".dataset", ".datacollator", ".dataloader", "root_dir", "next(loader)",
                 "get_batch()", "get_epoch()", "counted from 1"):
        assert name in page, name
