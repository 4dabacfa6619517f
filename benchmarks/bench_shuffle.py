#!/usr/bin/env python
"""The shuffle buffer (``shuffle_buffer``): how well it mixes, and what a resume reads.

    python benchmarks/bench_shuffle.py            # 200 files of 100 samples, prints the table
    python benchmarks/bench_shuffle.py --quick    # 50 files, a smoke run
    python benchmarks/bench_shuffle.py --write    # also saves benchmarks/results/bench_shuffle.json

The data: files of numbered samples (sample ``i`` is the ``i``-th of the
epoch's input stream). Each entry runs 3 epochs of pyloader with batches of
``--batch`` samples, files and in-file order unshuffled (only the buffer
mixes), and reports, averaged over the epochs:

* ``displacement``: the mean of ``|place it left - place it came|`` over the
  samples, in units of the buffer size; ``max`` the largest;
* ``files/batch``: the distinct files in a batch (at most ``--batch``);
* ``pairs together``: the share of neighbours in the input (samples ``i`` and
  ``i+1``) that share a batch: 1 - 1/batch unshuffled, about ``batch/N`` for a
  whole-epoch shuffle;
* ``spread``: the standard deviation of the input places of a batch's samples,
  in units of the buffer size;
* ``samples/CPU s``: through the loader, per CPU second of the process (all its
  threads; on a shared machine CPU time moves less than wall time), in a separate
  run over ``--speed-files`` files of 10,000 samples made up by the reader (no
  parsing: the buffer and the batching are most of the work), batches of 256,
  best of 3 epochs.

A resume is then taken at 50% of the epoch and the files the resumed iteration
read again (``stats["iteration"]["resume_files"]``) and the batches it cut
again (``resume_batches``) are reported. Reference rows: no buffer, and a
whole-epoch permutation. Every entry checks each sample arrived exactly once.
Run it against another checkout of pyloader (``PYTHONPATH``, from a folder
without one) to compare two versions.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if os.path.isdir(os.path.join(REPO, "pyloader")) and REPO not in sys.path:
    sys.path.insert(0, REPO)

import pyloader as pl  # noqa: E402

RESULTS_JSON = os.path.join(HERE, "results", "bench_shuffle.json")
EPOCHS = 3
SPEED_SIZE = 10_000


class IdReader(pl.DataReader):
    """One integer id per line."""

    thread_safe = True

    def read_file(self, path: str) -> Tuple[Dict[str, Any], int]:
        with open(path) as f:
            ids = np.array(f.read().split(), dtype=np.int64)
        return {"id": ids}, len(ids)

    def count(self, path: str) -> int:
        with open(path) as f:
            return sum(1 for _ in f)


class Ids(pl.DataCollator):
    thread_safe = True

    def collate_batch(self, features: Dict[str, Any]) -> Dict[str, Any]:
        return {"id": np.asarray(features["id"])}


class MadeUpReader(pl.DataReader):
    """File ``part-K`` holds samples ``K * SPEED_SIZE ..``, made up, not parsed."""

    thread_safe = True

    def read_file(self, path: str) -> Tuple[Dict[str, Any], int]:
        k = int(os.path.basename(path).split("-")[1].split(".")[0])
        return {"id": np.arange(k * SPEED_SIZE, (k + 1) * SPEED_SIZE), "x": np.ones((SPEED_SIZE, 8))}, SPEED_SIZE

    def count(self, path: str) -> int:
        return SPEED_SIZE


def speed(folder: str, buffer: int) -> float:
    """Samples per CPU second of this process (all its threads) through the loader over ``folder``
    (``MadeUpReader``), best of 3 epochs: on a shared machine CPU time moves less than wall time."""
    loader = pl.DataLoader(MadeUpReader(256), pl.IdentityDataset(), Ids(), folder, num_epoch=3,
                           shuffle_buffer=buffer, num_workers=0)
    n = len(os.listdir(folder)) * SPEED_SIZE
    times, began = [], time.process_time()
    epoch = 0
    for _ in loader:
        if loader.epoch != epoch:
            times.append(time.process_time() - began)
            began, epoch = time.process_time(), loader.epoch
    times.append(time.process_time() - began)
    return n / min(times)


def write_data(folder: str, files: int, size: int) -> None:
    for f in range(files):
        with open(os.path.join(folder, f"part-{f:05d}.txt"), "w") as out:
            out.writelines(f"{f * size + j}\n" for j in range(size))


def mixing(batches: List[np.ndarray], n: int, size: int, buffer: int) -> Dict[str, float]:
    """The figures of one epoch's batches (see the module docstring)."""
    order = np.concatenate(batches)
    assert np.array_equal(np.sort(order), np.arange(n)), "a sample was lost or repeated"
    place = np.empty(n, dtype=np.int64)
    place[order] = np.arange(n)
    moved = np.abs(place - np.arange(n))
    batch_of = np.empty(n, dtype=np.int64)
    batch_of[order] = np.repeat(np.arange(len(batches)), [len(b) for b in batches])
    return {"displacement": float(moved.mean()) / buffer, "max": float(moved.max()) / buffer,
            "files_per_batch": float(np.mean([len(np.unique(b // size)) for b in batches])),
            "pairs_together": float(np.mean(batch_of[1:] == batch_of[:-1])),
            "spread": float(np.mean([b.std() for b in batches if len(b) > 1])) / buffer}


def measure(folder: str, n: int, size: int, batch: int, buffer: int) -> Dict[str, Any]:
    def make() -> pl.DataLoader:
        return pl.DataLoader(IdReader(batch), pl.IdentityDataset(), Ids(), folder, num_epoch=EPOCHS,
                             shuffle_buffer=buffer, num_workers=0)

    loader = make()
    epochs: List[List[np.ndarray]] = [[] for _ in range(EPOCHS)]
    for out in loader:
        epochs[loader.epoch].append(out["id"])
    figures = [mixing(b, n, size, max(buffer, 1)) for b in epochs]
    row: Dict[str, Any] = {key: float(np.mean([f[key] for f in figures])) for key in figures[0]}
    half = len(epochs[0]) // 2
    first = make()
    it = iter(first)
    for _ in range(half):
        next(it)
    state = first.state_dict()
    first.close()
    resumed = make()
    resumed.load_state_dict(state)
    next(iter(resumed))
    row["resume_files"] = resumed.stats["iteration"]["resume_files"]
    row["resume_batches"] = resumed.stats["iteration"]["resume_batches"]
    resumed.close()
    return row


def permuted(n: int, size: int, batch: int, buffer: int) -> Dict[str, Any]:
    """A whole-epoch permutation, cut into batches (the reference for full mixing)."""
    rng = np.random.default_rng(0)
    figures = []
    for _ in range(EPOCHS):
        order = rng.permutation(n)
        figures.append(mixing(np.split(order, range(batch, n, batch)), n, size, buffer))
    return {key: float(np.mean([f[key] for f in figures])) for key in figures[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="50 files")
    parser.add_argument("--files", type=int, default=None)
    parser.add_argument("--size", type=int, default=100, help="samples per file")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--buffers", default="256,1000,4096", help="shuffle_buffer sizes, comma-separated")
    parser.add_argument("--speed-files", type=int, default=None, help="files of the speed run (default 100)")
    parser.add_argument("--write", action="store_true", help=f"save the figures to {RESULTS_JSON}")
    args = parser.parse_args()
    files = args.files or (50 if args.quick else 200)
    n = files * args.size
    folder = tempfile.mkdtemp(prefix="pyloader-shuffle-")
    made_up = os.path.join(folder, "made_up")
    os.makedirs(os.path.join(folder, "data"))
    os.makedirs(made_up)
    rows: List[Tuple[str, Dict[str, Any]]] = []
    try:
        write_data(os.path.join(folder, "data"), files, args.size)
        for k in range(args.speed_files or (10 if args.quick else 100)):
            open(os.path.join(made_up, f"part-{k:05d}.txt"), "w").close()
        for buffer in [0] + [int(s) for s in args.buffers.split(",")]:
            row = measure(os.path.join(folder, "data"), n, args.size, args.batch, buffer)
            row["samples_per_s"] = speed(made_up, buffer)
            rows.append((f"shuffle_buffer={buffer}" if buffer else "no buffer", row))
        last = int(args.buffers.split(",")[-1])
        rows.append((f"whole epoch permuted (units of {last})", permuted(n, args.size, args.batch, last)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"pyloader {pl.__version__} from {os.path.dirname(pl.__file__)}: {files} files of {args.size} samples "
          f"({n:,}), batch {args.batch}, {EPOCHS} epochs\n")
    print("| entry | displacement | max | files/batch | pairs together | spread | samples/CPU s | "
          "resume: files, batches |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in rows:
        resume = f"{r['resume_files']}, {r['resume_batches']}" if "resume_files" in r else ""
        rate = f"{r['samples_per_s']:,.0f}" if "samples_per_s" in r else ""
        print(f"| {name} | {r['displacement']:.3f} | {r['max']:.2f} | {r['files_per_batch']:.1f} | "
              f"{r['pairs_together']:.4f} | {r['spread']:.3f} | {rate} | {resume} |")
    if args.write:
        os.makedirs(os.path.dirname(RESULTS_JSON), exist_ok=True)
        with open(RESULTS_JSON, "w") as out:
            json.dump({"files": files, "size": args.size, "batch": args.batch, "epochs": EPOCHS,
                       "rows": dict(rows)}, out, indent=1)


if __name__ == "__main__":
    main()
