#!/usr/bin/env python
"""Rotation (``rotation=R``): what serving each encoded sample R times buys when ``batch_encode`` is slow,
and what the stage costs when it is not.

    python benchmarks/bench_rotation.py            # 4,096 samples, prints the table
    python benchmarks/bench_rotation.py --quick    # 1,024 samples, a smoke run
    python benchmarks/bench_rotation.py --write    # also saves benchmarks/results/bench_rotation.json

The data: text files of sample ids (16 files). ``batch_encode`` spends ``--encode-ms`` per
sample in Python code (holding the GIL, as an augmentation written in Python does) and
returns a 256-float vector per sample; ``collate_batch`` stacks the vectors. The consumer
sleeps ``--step-ms`` per batch (a training step on an accelerator, which releases the GIL).

Reported per entry: the samples served per second (over one epoch, which with rotation
holds R times the samples), the share of the consumer's time spent waiting for data,
``batch_encode`` calls per sample served, and the peak number of samples the rotation held
on disk (with ``rotation_dir``). A last group runs a cheap ``batch_encode`` (the identity)
with no step, to show the stage's own cost per sample. Every entry checks that each sample
was served exactly R times. On a shared 2-core machine the figures are indicative only.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from typing import Any, Dict, List

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import pyloader as pl  # noqa: E402
from pyloader.readers import TextLinesReader  # noqa: E402

RESULTS_JSON = os.path.join(HERE, "results", "bench_rotation.json")


class SlowEncode(pl.Dataset):
    """``ms`` of Python work per sample; one 256-float vector per sample."""

    thread_safe = True

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def batch_encode(self, batch_data: Dict[str, Any]) -> Dict[str, Any]:
        ids = [int(line) for line in batch_data["line"]]
        for _ in ids:
            end = time.perf_counter() + self.ms / 1000
            while time.perf_counter() < end:
                pass
        return {"id": ids, "x": [np.full(256, i, dtype=np.float32) for i in ids]}


class Cheap(pl.Dataset):
    thread_safe = True

    def batch_encode(self, batch_data: Dict[str, Any]) -> Dict[str, Any]:
        ids = [int(line) for line in batch_data["line"]]
        return {"id": ids, "x": [np.full(256, i, dtype=np.float32) for i in ids]}


class Stack(pl.DataCollator):
    thread_safe = True

    def collate_batch(self, features: Dict[str, Any]) -> Dict[str, Any]:
        return {"id": np.asarray(features["id"]), "x": np.stack(features["x"])}


def write_data(folder: str, samples: int, files: int = 16) -> None:
    per_file = samples // files
    for f in range(files):
        with open(os.path.join(folder, f"part-{f:04d}.txt"), "w") as out:
            out.writelines(f"{f * per_file + j}\n" for j in range(per_file))


def samples_on_disk(folder: str) -> int:
    total = 0
    for top, _, names in os.walk(folder):
        for name in names:
            if name == "c0.npy":  # the first field, "id" (``_codec``'s names)
                try:
                    total += np.load(os.path.join(top, name), allow_pickle=False).shape[0]
                except (OSError, ValueError):
                    pass
    return total


def entry(data: str, samples: int, rotation: int, workers: int, encode_ms: float, step_ms: float,
          batch: int, disk: bool) -> Dict[str, Any]:
    scratch = tempfile.mkdtemp(prefix="bench-rotation-")
    dataset = SlowEncode(encode_ms) if encode_ms else Cheap()
    rotated = None if rotation == 1 else pl.Rotation(rotation, size=rotation * 1024, folder=scratch if disk else None)
    loader = pl.DataLoader(TextLinesReader(batch, field="line"), dataset, Stack(), data, shuffle=True,
                           num_workers=workers, rotation=rotated)
    served: Counter = Counter()
    most = 0
    began = time.perf_counter()
    with loader:
        for k, b in enumerate(loader):
            served.update(b["id"].tolist())
            if step_ms:
                time.sleep(step_ms / 1000)
            if disk and k % 8 == 0:
                most = max(most, samples_on_disk(scratch))
    seconds = time.perf_counter() - began
    stats = loader.stats["iteration"]
    shutil.rmtree(scratch, ignore_errors=True)
    assert served == Counter({i: rotation for i in range(samples)}), "each sample exactly R times"
    encoded = samples  # batch_encode ran once per sample (the stage never encodes twice)
    return {"rotation": rotation, "workers": workers, "disk": disk, "encode_ms": encode_ms, "step_ms": step_ms,
            "samples_per_s": sum(served.values()) / seconds, "stall": stats["stall_share"],
            "encodes_per_served": encoded / sum(served.values()), "held_on_disk": most if disk else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--encode-ms", type=float, default=0.5)
    parser.add_argument("--step-ms", type=float, default=4.0)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    samples = 1024 if args.quick else 4096
    data = tempfile.mkdtemp(prefix="bench-rotation-data-")
    rows: List[Dict[str, Any]] = []
    try:
        write_data(data, samples)
        plan = [(r, w, args.encode_ms, args.step_ms, False) for w in (0, 2) for r in (1, 2, 4)]
        plan += [(4, 0, args.encode_ms, args.step_ms, True), (4, 2, args.encode_ms, args.step_ms, True)]
        plan += [(r, 0, 0.0, 0.0, d) for r, d in ((1, False), (4, False), (4, True))]
        for rotation, workers, encode_ms, step_ms, disk in plan:
            row = entry(data, samples, rotation, workers, encode_ms, step_ms, args.batch, disk)
            rows.append(row)
            print(f"R={rotation} workers={workers} {'disk  ' if disk else 'memory'} encode {encode_ms} ms/sample, "
                  f"step {step_ms} ms/batch: {row['samples_per_s']:9.0f} samples/s, stall {100 * row['stall']:5.1f}%, "
                  f"{row['encodes_per_served']:.2f} encodes per sample served"
                  + (f", at most {row['held_on_disk']} samples on disk" if disk else ""), flush=True)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    if args.write:
        os.makedirs(os.path.dirname(RESULTS_JSON), exist_ok=True)
        with open(RESULTS_JSON, "w") as f:
            json.dump({"samples": samples, "batch": args.batch, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
