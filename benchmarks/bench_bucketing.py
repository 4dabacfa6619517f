#!/usr/bin/env python
"""Length bucketing (``bucket_by``, ``bucket_buffer``): how much padding it saves on skewed lengths.

    python benchmarks/bench_bucketing.py            # 50,000 samples, prints the table
    python benchmarks/bench_bucketing.py --quick    # 5,000 samples, a smoke run
    python benchmarks/bench_bucketing.py --write    # also saves benchmarks/results/bench_bucketing.json
    python benchmarks/bench_bucketing.py --dist zipf --workers 2

The data: JSON-lines files of samples ``{"id": i, "tokens": [...]}`` whose
lengths follow a skewed distribution (``lognormal``: mu 3, sigma 1, most samples
short and a long tail, as sentences of a text corpus; ``zipf``: a = 1.6), cut
to 1..512 tokens. Each entry is one epoch of pyloader with ``shuffle=True``
and batches of ``--batch`` samples, collated by padding every sample to the
longest of its batch (``[B, longest]``), as a model's input would be.

Reported per entry: the padding fraction (padded slots / all slots of the
``[B, longest]`` inputs), how many times less padding than without bucketing,
the batches, and the samples per second through the loader (on a shared 2-core
machine: indicative only). A last row gives the floor, the whole epoch sorted
by length before cutting it into batches (no randomness left at all). Every
entry checks that each sample arrived exactly once.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import pyloader as pl  # noqa: E402
from pyloader.readers import JsonLinesReader  # noqa: E402

RESULTS_JSON = os.path.join(HERE, "results", "bench_bucketing.json")
MAX_LEN = 512


def lengths_of(dist: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(3.0, 1.0, n) if dist == "lognormal" else rng.zipf(1.6, n)
    return np.clip(raw.astype(np.int64), 1, MAX_LEN)


def write_data(folder: str, lengths: np.ndarray, files: int) -> None:
    per_file = -(-len(lengths) // files)
    for f in range(files):
        ids = range(f * per_file, min(len(lengths), (f + 1) * per_file))
        with open(os.path.join(folder, f"part-{f:04d}.jsonl"), "w") as out:
            out.writelines(json.dumps({"id": i, "tokens": [i % 97] * int(lengths[i])}) + "\n" for i in ids)


class PadCollator(pl.DataCollator):
    """Pads every sample to the longest of its batch: ``tokens`` ``[B, longest]`` and the real lengths."""

    thread_safe = True

    def collate_batch(self, features: Dict[str, List]) -> Dict[str, Any]:
        lengths = np.fromiter(map(len, features["tokens"]), dtype=np.int64, count=len(features["tokens"]))
        tokens = np.zeros((len(lengths), int(lengths.max())), dtype=np.int64)
        for row, seq in enumerate(features["tokens"]):
            tokens[row, :len(seq)] = seq
        return {"id": np.asarray(features["id"]), "tokens": tokens, "lengths": lengths}


def measure(folder: str, n: int, batch: int, workers: int, **kwargs: Any) -> Dict[str, Any]:
    loader = pl.DataLoader(JsonLinesReader(batch), pl.IdentityDataset(), PadCollator(), folder, shuffle=True,
                           num_workers=workers, **kwargs)
    padded = real = batches = 0
    seen: List[np.ndarray] = []
    start = time.perf_counter()
    for out in loader:
        padded += out["tokens"].size
        real += int(out["lengths"].sum())
        batches += 1
        seen.append(out["id"])
    seconds = time.perf_counter() - start
    ids = np.sort(np.concatenate(seen))
    return {"padding": 1 - real / padded, "batches": batches, "samples_per_s": n / seconds,
            "exactly_once": bool(np.array_equal(ids, np.arange(n)))}


def sorted_floor(lengths: np.ndarray, batch: int) -> float:
    """The padding fraction of the whole epoch sorted by length, then cut into batches."""
    ordered = np.sort(lengths)
    padded = sum(len(chunk) * int(chunk.max()) for chunk in np.array_split(ordered, range(batch, len(ordered), batch)))
    return 1 - int(lengths.sum()) / padded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5,000 samples")
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--buffers", default="64,256,1024,4096", help="bucket_buffer sizes, comma-separated")
    parser.add_argument("--dist", choices=["lognormal", "zipf"], default="lognormal")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", action="store_true", help=f"save the figures to {RESULTS_JSON}")
    args = parser.parse_args()
    n = args.samples or (5_000 if args.quick else 50_000)
    lengths = lengths_of(args.dist, n, args.seed)
    folder = tempfile.mkdtemp(prefix="pyloader-bucketing-")
    try:
        write_data(folder, lengths, args.files)
        rows = [("no bucketing", measure(folder, n, args.batch, args.workers))]
        for size in (int(s) for s in args.buffers.split(",")):
            rows.append((f"bucket_by='tokens', bucket_buffer={size}",
                         measure(folder, n, args.batch, args.workers, bucket=pl.Bucket("tokens", buffer=size))))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    plain = rows[0][1]["padding"]
    print(f"{n:,} samples, {args.dist} lengths (mean {lengths.mean():.1f}, median {np.median(lengths):.0f}, "
          f"max {lengths.max()}), batch {args.batch}, {args.workers} workers\n")
    print(f"| {'entry':<42} | padding | less padding | batches | samples/s | each sample once |")
    print(f"| {'-' * 42} | ------- | ------------ | ------- | --------- | ---------------- |")
    for name, r in rows:
        print(f"| {name:<42} | {r['padding']:7.3f} | {plain / r['padding']:11.1f}x | {r['batches']:7d} | "
              f"{r['samples_per_s']:9,.0f} | {'yes' if r['exactly_once'] else 'NO'} |")
    floor = sorted_floor(lengths, args.batch)
    print(f"| {'floor: the whole epoch sorted by length':<42} | {floor:7.3f} | {plain / floor:11.1f}x | "
          f"{-(-n // args.batch):7d} | {'':9} | {'':16} |")
    if args.write:
        os.makedirs(os.path.dirname(RESULTS_JSON), exist_ok=True)
        with open(RESULTS_JSON, "w") as out:
            json.dump({"samples": n, "dist": args.dist, "batch": args.batch, "workers": args.workers,
                       "rows": dict(rows), "sorted_floor": floor}, out, indent=1)
    if not all(r["exactly_once"] for _, r in rows):
        sys.exit("a sample was lost or repeated")


if __name__ == "__main__":
    main()
