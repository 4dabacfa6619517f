"""pyloader demo: make a small chunked dataset, stream it into a small PyTorch model.

    python examples/demo.py [--files 16] [--rows 2000] [--epochs 2] [--workers 2]

Writes JSON-lines chunk files to a temporary folder (nothing is downloaded),
trains a 2-layer MLP on them through pyloader and prints loss and samples/s.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
import torch

import pyloader as pl
from pyloader.collators import TorchCollator
from pyloader.readers import JsonLinesReader

FEATURES, CLASSES = 32, 4


def make_dataset(folder: str, files: int, rows: int, seed: int = 0) -> None:
    """Chunks of {"x": [32 floats], "y": class}; the class is a fixed linear function of x."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(FEATURES, CLASSES))
    for i in range(files):
        x = rng.normal(size=(rows, FEATURES)).round(4)
        y = (x @ weights).argmax(axis=1)
        with open(os.path.join(folder, f"chunk-{i:04d}.jsonl"), "w") as f:
            for xi, yi in zip(x.tolist(), y.tolist()):
                f.write(json.dumps({"x": xi, "y": yi}) + "\n")


class Features(pl.Dataset):
    """Encodes a raw batch: here the fields are already numeric, so it only renames."""

    def batch_encode(self, batch_data):
        return {"inputs": batch_data["x"], "labels": batch_data["y"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2, help="worker processes (0: threads only)")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    with tempfile.TemporaryDirectory(prefix="pyloader-demo-") as folder:
        make_dataset(folder, args.files, args.rows)
        print(f"made {args.files} chunk files x {args.rows} samples in {folder}")
        loader = pl.DataLoader(
            JsonLinesReader(batch_size=args.batch_size, shuffle=True), Features(), TorchCollator(), folder,
            num_epoch=args.epochs, max_queue_size=8, shuffle=True, workers=args.workers)
        seen, start, losses = 0, time.perf_counter(), []
        with loader:
            for step, batch in enumerate(loader):
                loss = torch.nn.functional.cross_entropy(model(batch["inputs"]), batch["labels"])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                seen += len(batch["labels"])
                losses.append(loss.item())
                if step % 50 == 0:
                    rate = seen / (time.perf_counter() - start)
                    print(f"epoch {loader.epoch} step {step:4d}  loss {loss.item():.4f}  {rate:,.0f} samples/s")
        elapsed = time.perf_counter() - start
    print(f"done: {seen} samples in {elapsed:.2f}s = {seen / elapsed:,.0f} samples/s; "
          f"loss {np.mean(losses[:20]):.3f} -> {np.mean(losses[-20:]):.3f}")


if __name__ == "__main__":
    main()
