"""Images without subclassing: ``collators.Images`` (crop, flip, scale, normalize, channels first) and the
``examples/image_augment.py`` recipe (JPEGs in tar shards, augmented with ``pyloader.rng()``, a small CNN)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List

import numpy as np
import pytest
from conftest import few_positions, spread_positions

import pyloader as pl
from pyloader.collators import Images, NumpyCollator
from pyloader.testing import check_resume

pytestmark = pytest.mark.timeout(300)

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "image_augment.py"


def images(n: int, h: int = 6, w: int = 8, c: int = 3) -> List[np.ndarray]:
    return [np.arange(h * w * c, dtype=np.uint8).reshape(h, w, c) + i for i in range(n)]


def test_images_become_channels_first_floats_scaled_and_normalized() -> None:
    batch = NumpyCollator(images=Images(["img"], mean=[0.5, 0.5, 0.5], std=[0.25, 0.5, 1.0])).collate_batch(
        {"img": images(2), "label": [0, 1]})
    out = batch["img"]
    assert out.dtype == np.float32 and out.shape == (2, 3, 6, 8) and out.flags["C_CONTIGUOUS"]
    expected = (np.stack(images(2)).astype(np.float32) / 255 - 0.5) / np.array([0.25, 0.5, 1.0], np.float32)
    np.testing.assert_allclose(out, expected.transpose(0, 3, 1, 2), rtol=1e-6)
    assert batch["label"].tolist() == [0, 1]


@pytest.mark.parametrize("mean, std", [([0.5, 0.25, 0.0], [0.25, 0.5, 2.0]), ([0.5], None), (None, [0.5])])
@pytest.mark.parametrize("channels_first", [True, False])
def test_each_channel_is_normalized_with_its_own_values_in_either_layout(
        channels_first: bool, mean: Any, std: Any) -> None:
    out = NumpyCollator(images=Images(["img"], mean=mean, std=std, channels_first=channels_first)).collate_batch(
        {"img": images(3, c=3)})["img"]
    expected = np.stack(images(3, c=3)).astype(np.float32) / 255  # [B, H, W, C]
    expected = (expected - np.array(mean or [0.0], np.float32)) / np.array(std or [1.0], np.float32)
    assert out.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(out, expected.transpose(0, 3, 1, 2) if channels_first else expected, rtol=1e-6)


def test_one_channel_images_get_a_channel_axis_and_channels_last_is_kept_on_request() -> None:
    gray = [np.full((4, 5), 255, np.uint8)] * 3
    assert NumpyCollator(images=Images(["g"])).collate_batch({"g": gray})["g"].shape == (3, 1, 4, 5)
    last = NumpyCollator(images=Images(["g"], channels_first=False)).collate_batch({"g": images(2)})["g"]
    assert last.shape == (2, 6, 8, 3) and float(last.max()) <= 1.0


def test_a_centre_crop_needs_no_loader_run() -> None:
    out = NumpyCollator(images=Images(["img"], size=(2, 4), crop="center")).collate_batch({"img": images(1)})["img"]
    np.testing.assert_allclose(out[0], (images(1)[0][2:4, 2:6].astype(np.float32) / 255).transpose(2, 0, 1))


def test_images_of_different_sizes_or_too_small_or_random_outside_a_run_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"image key 'img': the images differ in size"):
        NumpyCollator(images=Images(["img"])).collate_batch({"img": images(1) + images(1, h=7)})
    with pytest.raises(ValueError, match=r"image key 'img': an image of 6x8 is smaller than size 7x7"):
        NumpyCollator(images=Images(["img"], size=(7, 7), crop="center")).collate_batch({"img": images(1)})
    with pytest.raises(ValueError, match=r"image key 'img' is not in the batch"):
        NumpyCollator(images=Images(["img"])).collate_batch({"x": [1]})
    with pytest.raises(ValueError, match=r"mean has 2 values for 3 channels"):
        NumpyCollator(images=Images(["img"], mean=[0.1, 0.2])).collate_batch({"img": images(1)})
    with pytest.raises(RuntimeError, match=r"pyloader.rng\(\) is only valid inside"):
        NumpyCollator(images=Images(["img"], flip=True)).collate_batch({"img": images(1)})
    with pytest.raises(ValueError, match="crop"):
        Images(["img"], crop="middle")
    with pytest.raises(ValueError, match="size"):
        Images(["img"], size=(0, 3))


class ImageReader(pl.DataReader):
    """Ten numbered 6x8 images a file, one file per line of ids."""

    def read_file(self, path: str):
        with open(path) as f:
            ids = [int(line) for line in f if line.strip()]
        return {"img": [np.full((6, 8, 3), i, np.uint8) + np.arange(8, dtype=np.uint8)[None, :, None] for i in ids],
                "id": ids}, len(ids)


def _augmenting(folder: Path, **kwargs: Any) -> pl.DataLoader:
    collator = NumpyCollator(images=Images(["img"], size=(4, 4), flip=True))
    return pl.DataLoader(ImageReader(4), pl.IdentityDataset(), collator, str(folder), **kwargs)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    from conftest import write_chunks

    write_chunks(tmp_path / "data", [5, 7, 3, 6])
    return tmp_path / "data"


def _batches(loader: pl.DataLoader) -> List[Dict[str, Any]]:
    try:
        return [{k: np.array(v) for k, v in b.items()} for b in loader]
    finally:
        loader.close()


def test_random_crops_and_flips_are_the_same_with_workers_and_threads_and_new_each_epoch(data: Path) -> None:
    base = _batches(_augmenting(data, num_epoch=2, num_workers=0, num_threads=1))
    for placement in ({"num_workers": 0, "num_threads": 4}, {"num_workers": 2}):
        got = _batches(_augmenting(data, num_epoch=2, **placement))
        assert len(got) == len(base)
        for a, b in zip(base, got):
            np.testing.assert_array_equal(a["img"], b["img"])
    first, second = base[:len(base) // 2], base[len(base) // 2:]
    assert all((a["id"] == b["id"]).all() for a, b in zip(first, second))
    assert any(not np.array_equal(a["img"], b["img"]) for a, b in zip(first, second))
    flipped = [bool(img[0, 0, 0] > img[0, 0, -1]) for b in base for img in b["img"]]
    assert any(flipped) and not all(flipped)  # some images flipped, some not


@pytest.mark.parametrize("num_workers", [0, 2])
def test_random_crops_and_flips_resume_exactly(data: Path, num_workers: int) -> None:
    check_resume(lambda: _augmenting(data, num_epoch=2, shuffle=True, num_workers=num_workers),
                 few_positions if num_workers else spread_positions)


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_augment_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # worker processes unpickle by module name
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_image_recipe_trains_a_small_cnn_on_generated_jpegs(tmp_path: Path, num_workers: int) -> None:
    pytest.importorskip("torch", reason="torch is the torch extra's")
    example = _example()
    example.write_shards(str(tmp_path / "shards"))
    loader = example.make_loader(str(tmp_path / "shards"), num_workers, 1)
    try:
        batch = next(iter(loader))
        assert tuple(batch["jpg"].shape) == (16, 3, 32, 32) and str(batch["jpg"].dtype) == "torch.float32"
    finally:
        loader.close()
    assert example.train(str(tmp_path / "shards"), num_workers, epochs=3) >= 0.9
