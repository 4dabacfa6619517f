#!/usr/bin/env python
"""Small, reproducible diagnoses behind the targets that bench_loaders.py reports as missed.

    python benchmarks/diagnose.py timeline   # are pyloader's 2 workers busy at the same time? (target 1)
    python benchmarks/diagnose.py overhead   # pyloader's cost per batch against batch size (target 2)
    python benchmarks/diagnose.py exit       # does the process abort when it exits right after close()?
    python benchmarks/diagnose.py firstbatch # first-batch time of the JSONL loaders against prefetch_files (target 5)
    python benchmarks/diagnose.py all

Data is generated into a temporary folder (the JSONL and .npy chunks of
bench_loaders.py, full size) and removed afterwards.

* ``timeline`` runs the JSONL entries with 2 workers (pyloader and torch) in a
  child process and samples every worker's CPU time from /proc every 50 ms:
  one character per 50 ms, ``A``/``B`` when only one worker was busy (>= 50 %
  of the step), ``2`` when both were, ``.`` when neither.
* ``overhead`` runs, in this process, a raw ``np.load`` loop and pyloader
  (NumpyReader + TorchCollator, 0 and 2 workers) over the .npy chunks at batch
  sizes 256 .. 16384 and prints microseconds per batch.
* ``firstbatch`` times the first JSONL batch of pyloader (0 and 2 workers) with
  ``prefetch_files`` 1 and 4 (the default), best of 3 fresh processes each.
* ``exit`` runs a loader built only from pyloader's own pieces
  (``JsonLinesReader`` + ``IdentityDataset`` + ``TorchCollator``) for one
  epoch, calls ``close()`` and exits, ``--runs`` times; then again waiting for
  the leftover threads before exiting. It counts abnormal exits.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for p in (HERE, REPO):
    if p not in sys.path:
        sys.path.insert(0, p)

import _harness as H  # noqa: E402
import bench_loaders as BL  # noqa: E402

_TCK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TCK
    except (OSError, IndexError, ValueError):
        return -1.0


def timeline(data: str, cfg: dict, step: float = 0.05) -> None:
    for entry in ("json/pyloader-w2", "json/torch-w2"):
        argv = [sys.executable, os.path.join(HERE, "bench_loaders.py"), "--child", entry, "--data", data,
                "--cfg", json.dumps(cfg)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        busy: Dict[int, List[float]] = {}
        prev: Dict[int, float] = {}
        steps = 0
        while proc.poll() is None:
            kids = [p for p in H.tree_pids(proc.pid) if p != proc.pid]
            now = {p: _cpu_s(p) for p in kids}
            for p, c in now.items():
                if p in prev and c >= 0 and prev[p] >= 0:
                    busy.setdefault(p, [0.0] * steps).append((c - prev[p]) / step)
            prev = now
            steps += 1
            for series in busy.values():
                series.extend([0.0] * (steps - len(series)))
            time.sleep(step)
        out, _ = proc.communicate()
        result = next((json.loads(line[len(H.RESULT_TAG):]) for line in out.splitlines()
                       if line.startswith(H.RESULT_TAG)), {})
        workers = sorted(busy, key=lambda p: -sum(busy[p]))[:2]
        if len(workers) < 2:
            print(f"{entry}: fewer than 2 worker processes seen")
            continue
        a, b = busy[workers[0]], busy[workers[1]]
        active = [i for i in range(min(len(a), len(b))) if a[i] >= 0.5 or b[i] >= 0.5]
        line = "".join("2" if a[i] >= 0.5 and b[i] >= 0.5 else "A" if a[i] >= 0.5 else "B" if b[i] >= 0.5
                       else "." for i in range(active[0], active[-1] + 1)) if active else ""
        both = line.count("2")
        span = len(line) * step
        print(f"{entry}: {result.get('samples_per_s', 0):,.0f} samples/s; worker CPU "
              f"{sum(a) * step:.2f} s + {sum(b) * step:.2f} s over {span:.2f} s of activity; "
              f"both workers busy in {both} of {len(line)} steps")
        print(f"  {line}")


def overhead(data: str, cfg: dict) -> None:
    import torch  # noqa: F401

    files = BL.files_in(os.path.join(data, "npy"))
    for bs in (256, 1024, 4096, 16384):
        c = dict(cfg, npy_batch=bs)
        parts = []
        for name, build in (("raw np.load", lambda c=c: BL.build_raw_npy(files, c, 3)),
                            ("pyloader w0", lambda c=c: BL.build_pyloader_npy(os.path.join(data, "npy"), c, 0, 3)),
                            ("pyloader w2", lambda c=c: BL.build_pyloader_npy(os.path.join(data, "npy"), c, 2, 3))):
            make, close = build()
            t, n, nb = time.perf_counter(), 0, 0
            for batch in make():
                n += batch["x"].shape[0]
                nb += 1
            el = time.perf_counter() - t
            close()
            parts.append(f"{name} {n / el / 1e6:5.1f}M rows/s = {el / nb * 1e6:6.0f} us/batch")
        print(f"batch {bs:>5}: " + "; ".join(parts), flush=True)
    BL.wait_for_threads()


_EXIT_SCRIPT = """
import sys, threading
sys.path.insert(0, {repo!r})
import torch
import pyloader as pl
from pyloader.collators import TorchCollator
from pyloader.readers import JsonLinesReader
loader = pl.DataLoader(JsonLinesReader(batch_size=256), pl.IdentityDataset(), TorchCollator(), {folder!r})
for batch in loader:
    pass
loader.close()
if {wait}:
    left = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    print("threads alive right after close():", len(left))
    for t in threading.enumerate():
        if t is not threading.main_thread():
            t.join()
"""


def exit_check(data: str, runs: int) -> None:
    for wait in (False, True):
        code = _EXIT_SCRIPT.format(repo=REPO, folder=os.path.join(data, "json"), wait=wait)
        bad, alive, messages = 0, [], set()
        for _ in range(runs):
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            alive += [int(x) for x in p.stdout.split(":")[-1].split()] if "close()" in p.stdout else []
            if p.returncode != 0:
                bad += 1
                messages.add((p.returncode, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""))
        how = "then waits for the threads still alive" if wait else "then exits at once"
        print(f"close() {how}: {bad} of {runs} runs exited abnormally {sorted(messages)}"
              + (f"; threads alive right after close(): {sorted(set(alive))}" if wait else ""))


_FIRST_SCRIPT = """
import sys, time
sys.path.insert(0, {repo!r}); sys.path.insert(0, {here!r})
import torch
import pyloader as pl
import bench_loaders as BL
JsonReader, Encode, Collate = BL._pyloader_json_classes()
t = time.perf_counter()
loader = pl.DataLoader(JsonReader(batch_size=256), Encode(), Collate(), {folder!r}, num_workers={workers},
                       prefetch_files={prefetch})
next(iter(loader))
print(time.perf_counter() - t)
loader.close()
BL.wait_for_threads()
"""


def first_batch(data: str) -> None:
    for workers in (0, 2):
        parts = []
        for prefetch in (1, 4):
            code = _FIRST_SCRIPT.format(repo=REPO, here=HERE, folder=os.path.join(data, "json"), workers=workers,
                                        prefetch=prefetch)
            times = []
            for _ in range(3):
                p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
                if p.returncode == 0:
                    times.append(float(p.stdout.split()[-1]))
            parts.append(f"prefetch_files={prefetch}: " + (f"{min(times):.3f} s" if times else "failed"))
        print(f"pyloader, {workers} workers, first batch (best of 3): " + "; ".join(parts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["timeline", "overhead", "exit", "firstbatch", "all"])
    ap.add_argument("--runs", type=int, default=20, help="runs of the exit check")
    args = ap.parse_args()
    cfg = BL.SIZES["full"]
    data = tempfile.mkdtemp(prefix="pyloader-diag-")
    try:
        kinds = ("json", "npy") if args.what in ("overhead", "all") else ("json",)
        BL.generate(data, cfg, print, kinds=kinds)
        print(f"effective cores free now: {H.effective_cores():.2f} (2.00 = both)")
        if args.what in ("timeline", "all"):
            print("\n== timeline: JSONL, 2 workers")
            timeline(data, cfg)
        if args.what in ("overhead", "all"):
            print("\n== overhead: .npy, per batch")
            overhead(data, cfg)
        if args.what in ("firstbatch", "all"):
            print("\n== first batch against prefetch_files: JSONL")
            first_batch(data)
        if args.what in ("exit", "all"):
            print("\n== exit right after close()")
            exit_check(data, args.runs)
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
