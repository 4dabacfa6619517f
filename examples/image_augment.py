"""Images and augmentation: JPEGs in tar shards -> random crop and flip -> float CHW tensors -> a small CNN.

No subclass of pyloader's: ``TarReader`` decodes the JPEGs, ``TorchCollator(images=Images(...))``
crops, flips, scales and normalizes them, drawing from ``pyloader.rng()`` (the same augmentation
with any ``num_workers`` and after a resume). Writes its own data (tiny generated JPEGs)::

    python examples/image_augment.py [folder] [--workers N] [--epochs N]
"""
from __future__ import annotations

import argparse
import io
import os
import tarfile
import tempfile

import numpy as np
import torch
from PIL import Image

import pyloader
from pyloader.collators import Images, TorchCollator
from pyloader.readers import TarReader


def write_shards(folder: str, shards: int = 4, per_shard: int = 32, size: int = 40) -> None:
    """Shards of JPEGs of two classes: a bright bar in the top half (class 0) or the bottom half (class 1);
    a left-right flip keeps the class."""
    gen = np.random.default_rng(0)
    os.makedirs(folder, exist_ok=True)
    for s in range(shards):
        with tarfile.open(os.path.join(folder, f"shard-{s:04d}.tar"), "w") as tar:
            for i in range(per_shard):
                label = int(gen.integers(2))
                pixels = gen.integers(0, 60, size=(size, size, 3), dtype=np.uint8)
                top = 4 if label == 0 else size // 2 + 4
                pixels[top:top + 10, 8:32] = 230
                out = io.BytesIO()
                Image.fromarray(pixels).save(out, format="JPEG", quality=90)
                for ext, data in (("jpg", out.getvalue()), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"{s:04d}{i:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def make_loader(folder: str, workers: int, epochs: int) -> pyloader.DataLoader:
    return pyloader.DataLoader(
        TarReader(batch_size=16, keep=["jpg", "cls"]),
        pyloader.IdentityDataset(),
        TorchCollator(images=Images(["jpg"], size=(32, 32), flip=True, mean=[0.2] * 3, std=[0.3] * 3),
                      passthrough=["__key__"]),
        folder, num_epoch=epochs, shuffle=True, workers=workers)


def train(folder: str, workers: int = 0, epochs: int = 2) -> float:
    """Train a small CNN; returns the last epoch's accuracy on what it trained on."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(4),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loader = make_loader(folder, workers, epochs)
    right = seen = 0
    try:
        for batch in loader:
            images, labels = batch["jpg"], batch["cls"]  # [16, 3, 32, 32] float32, [16] int64
            logits = model(images)
            loss = torch.nn.functional.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if loader.epoch == epochs - 1:
                right += int((logits.argmax(1) == labels).sum())
                seen += len(labels)
    finally:
        loader.close()
    return right / max(seen, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", help="where to write the shards (default: a temporary folder)")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.folder or scratch
        write_shards(folder)
        accuracy = train(folder, args.workers, args.epochs)
    print(f"accuracy {accuracy:.2f}")


if __name__ == "__main__":
    main()
