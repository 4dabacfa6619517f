#!/usr/bin/env python
"""The loaders inside a training loop: one epoch of the JSONL data of ``bench_loaders.py`` under a model step.

    python benchmarks/bench_training.py            # full size, prints the table
    python benchmarks/bench_training.py --quick    # small data, a smoke run
    python benchmarks/bench_training.py --write    # also rewrites its section of benchmarks/README.md

The data and the user code (a Python parse of JSON lines, a per-sample Python
encode, ``torch.tensor`` collate) are ``bench_loaders.py``'s, imported from it.
The model step is single-threaded torch (``torch.set_num_threads(1)``): a chain
of small matrix products, sized once by the parent so that one step takes
``--step-ms`` (4 ms) on this machine. Each product releases the GIL and takes it
back, as a real model's short operations do, so a loader whose Python code runs
in threads of the training process slows the step down.

Entries, each in its own process, one epoch each:

* ``load only``: ``bench_loaders``' plain loop, no step (the loading time);
* ``train only``: the step on one prepared batch, once per batch of the epoch;
* ``serial``: the plain loop with the step after each batch (what a script without a loader does);
* torch ``DataLoader`` with 0 and 2 workers, and pyloader with its default
  settings, 0 workers and 2 workers, each with the step after each batch.

The ideal is ``max(load only, train only)``: loading entirely hidden behind the
training. Reported: seconds, speed-up over ``serial``, and time over the ideal.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, List, Tuple

import _harness as H
import bench_loaders as BL
from _harness import HERE, REPO

RESULTS_JSON = os.path.join(HERE, "results", "bench_training.json")
ENTRIES = ["load-only", "train-only", "serial", "torch-w0", "torch-w2", "pyloader-default", "pyloader-w0",
           "pyloader-w2"]
LABELS = {
    "load-only": "loading only: plain loop, no step", "train-only": "training only: the step, no loading",
    "serial": "serial: plain loop, then the step", "torch-w0": "torch DataLoader, 0 workers",
    "torch-w2": "torch DataLoader, 2 workers", "pyloader-default": "pyloader, default settings",
    "pyloader-w0": "pyloader, 0 workers", "pyloader-w2": "pyloader, 2 workers",
}
SIZE = 192  # of the step's square matrices
SIZES = {"full": BL.SIZES["full"], "quick": BL.SIZES["quick"]}


def make_step(products: int) -> Callable[[Dict[str, Any]], float]:
    """A training step of ``products`` chained ``SIZE`` x ``SIZE`` products, single-threaded."""
    import torch

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(SIZE, SIZE, generator=gen) / SIZE ** 0.5

    def step(batch: Dict[str, Any]) -> float:
        x = batch["input_ids"][:, :1].float().mean() * torch.ones(SIZE, SIZE)
        for _ in range(products):
            x = torch.tanh(x @ weight)
        return float(x[0, 0])

    return step


def calibrate(step_ms: float) -> int:
    """The number of products that makes one step take ``step_ms`` here (median of 20 steps)."""
    import torch

    batch = {"input_ids": torch.ones(4, 4, dtype=torch.int64)}
    products = 8
    for _ in range(3):
        step = make_step(products)
        step(batch)
        times = []
        for _ in range(20):
            t = time.perf_counter()
            step(batch)
            times.append(time.perf_counter() - t)
        per = sorted(times)[len(times) // 2] / products
        products = max(1, round(step_ms / 1000 / per))
    return products


def batches_of(entry: str, data: str, cfg: dict) -> Tuple[Callable[[], Any], Callable[[], None]]:
    folder = os.path.join(data, "json")
    files = BL.files_in(folder)
    if entry in ("load-only", "serial", "train-only"):
        return BL.build_plain_json(files, cfg)
    loader = entry.split("+")[0]
    workers = BL.entry_workers(loader)
    if loader.startswith("torch"):
        return BL.build_torch_json(files, cfg, workers)
    return BL.build_pyloader_json(folder, cfg, workers)


def child(entry: str, data: str, cfg: dict) -> None:
    step = make_step(cfg["products"])
    make, close = batches_of(entry, data, cfg)
    baseline = H.own_memory()
    n, steps, first = 0, 0, None
    t0 = time.perf_counter()
    if entry == "train-only":
        batch = next(iter(make()))
        t0 = time.perf_counter()
        for _ in range(cfg["batches"]):
            step(batch)
        n, steps, first = cfg["batches"] * cfg["json_batch"], cfg["batches"], 0.0
    else:
        for batch in make():
            if first is None:
                first = time.perf_counter() - t0
            n += int(batch["label"].shape[0])
            if entry != "load-only":
                step(batch)
                steps += 1
    elapsed = time.perf_counter() - t0
    close()
    expected = cfg["json_files"] * cfg["json_lines"]
    H.report({"entry": entry, "samples": n, "steps": steps, "seconds": elapsed, "samples_per_s": n / elapsed,
              "first_batch_s": first, "baseline": baseline,
              "checks_ok": entry == "train-only" or n == expected,
              "check_detail": f"samples {n}/{expected}"})


def fastest(runs: List[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    return min(ok, key=lambda r: r["seconds"]) if ok else runs[0]


def results_markdown(res: Dict[str, dict], cfg: dict, args: argparse.Namespace, machine: str) -> str:
    secs = {e: (None if "error" in r else r["seconds"]) for e, r in res.items()}
    load, train, serial = secs["load-only"], secs["train-only"], secs["serial"]
    ideal = None if load is None or train is None else max(load, train)
    rows = []
    for e in ENTRIES:
        s = secs[e]
        speedup = "-" if s is None or serial is None or e in ("load-only", "train-only") else f"{serial / s:.2f}x"
        over = "-" if s is None or ideal is None or e in ("load-only", "train-only") else f"{s / ideal:.2f}x"
        rows.append([LABELS[e], "error" if s is None else f"{s:.2f}", speedup, over])
    table = H.markdown_table(["entry", "seconds", "vs serial", "vs ideal"], rows, "lrrr")
    default = secs["pyloader-default"]
    goals = [["pyloader default: speed-up over serial", "-" if default is None or serial is None
              else f"{serial / default:.2f}x", ">= 1.3x"],
             ["pyloader default: time over the ideal", "-" if default is None or ideal is None
              else f"{default / ideal:.2f}x", "<= 1.1x"]]
    return "\n\n".join([
        f"Run of `python benchmarks/bench_training.py{' --quick' if args.quick else ''}` on "
        f"{time.strftime('%Y-%m-%d %H:%M')}; best of {args.repeats} runs per entry. Machine: {machine}; "
        f"load average at the end {os.getloadavg()[0]:.2f}.",
        f"Data: {cfg['json_files']} JSONL files x {cfg['json_lines']:,} lines, batch {cfg['json_batch']} "
        f"({cfg['batches']} steps); step: {cfg['products']} products of {SIZE}x{SIZE} matrices, "
        f"{args.step_ms:g} ms measured by the parent; ideal = max(loading only, training only) = "
        + ("-" if ideal is None else f"{ideal:.2f} s") + ".",
        table, H.markdown_table(["target", "measured", "goal"], goals, "lrr")])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    H.common_args(ap, "rewrite this script's section of benchmarks/README.md", "3 full, 1 quick", RESULTS_JSON)
    ap.add_argument("--step-ms", type=float, default=4.0, help="the duration of one training step (ms)")
    args = ap.parse_args()
    if H.child_or_replot(args, child, RESULTS_JSON, None, None):
        return
    cfg = dict(SIZES["quick" if args.quick else "full"])
    cfg["batches"] = -(-cfg["json_files"] * cfg["json_lines"] // cfg["json_batch"])  # files joined end to end
    cfg["products"] = calibrate(args.step_ms)
    args.repeats = args.repeats or (1 if args.quick else 3)
    machine = H.machine_line() + "; code measured: " + H.source_digest(os.path.join(REPO, "pyloader"))
    print(f"machine: {machine}\nstep: {cfg['products']} products")
    data = tempfile.mkdtemp(prefix="pyloader-bench-train-")
    try:
        BL.generate(data, cfg, print, kinds=("json",))
        runs: Dict[str, List[dict]] = {e: [] for e in ENTRIES}
        for rep in range(args.repeats):
            print(f"-- round {rep + 1}/{args.repeats}")
            for e in ENTRIES:
                argv = [os.path.abspath(__file__), "--child", e, "--data", data, "--cfg", json.dumps(cfg)]
                runs[e].append(H.measure(e, argv, 1, args.timeout))
        res = {e: fastest(rs) for e, rs in runs.items()}
    finally:
        shutil.rmtree(data, ignore_errors=True)
    md = results_markdown(res, cfg, args, machine)
    print()
    print(md)
    if args.write:
        H.write_results("bench_training", md, RESULTS_JSON, {"cfg": cfg, "machine": machine, "results": res},
                        None, None)


if __name__ == "__main__":
    main()
