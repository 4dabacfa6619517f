#!/usr/bin/env python
"""What ``loader.trace(path)`` costs: pyloader's entries of bench_loaders.py with tracing off and on, and
(``--baseline DIR``: a checkout of pyloader from before tracing existed) without the tracing code at all.

    python benchmarks/bench_trace.py --baseline /tmp/pyloader-before   # quick data, 5 runs of each
    python benchmarks/bench_trace.py --full --write                    # bench_loaders.py's full data, README

Each run is a fresh process (bench_loaders.py's ``child``), the entries taken round robin, so a burst
of load from elsewhere does not hit one setting's runs only; the table keeps each setting's best
samples/s and the change against tracing off. "on" traces the whole epoch (its file is written after
the timed loop).
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
from typing import Dict, List

import _harness as H
import bench_loaders as BL
from _harness import HERE

RESULTS_JSON = os.path.join(HERE, "results", "bench_trace.json")
ENTRIES = ["json/pyloader-w0", "json/pyloader-w2", "npy/pyloader-w0", "npy/pyloader-w2"]
MODES = ["before", "off", "on"]


def child(entry: str, data: str, cfg: dict) -> None:
    mode, entry = entry.split(":", 1)
    if mode == "on":
        import pyloader as pl

        class Traced(pl.DataLoader):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, **kwargs)
                tracing = self.trace(os.path.join(data, f"trace-{os.getpid()}.json"))
                atexit.register(tracing.close)

        pl.DataLoader = Traced  # type: ignore[misc]  # bench_loaders builds its loader as pl.DataLoader(...)
    BL.child(entry, data, cfg)


MICRO = """
import time
from pyloader._execution.steps import run_each
from pyloader._stats import Busy, timed
import inspect
args = ("read_file", "part-0.jsonl")[:len(inspect.signature(timed).parameters) - 1]  # no path before tracing
busy = Busy()
if {on}:
    from pyloader._trace import Recorder
    busy.trace = Recorder(10_000)
steps = [("batch_encode", lambda d: d), ("collate_batch", lambda d: d)]
datas = [{{"x": 1}}] * 32
best_group = best_timed = float("inf")
for _ in range(7):
    t = time.perf_counter()
    for _ in range(300):
        run_each(steps, datas, busy=busy)
    best_group = min(best_group, (time.perf_counter() - t) / 300 / 32)
    t = time.perf_counter()
    for _ in range(20_000):
        with timed(busy, *args):
            pass
    best_timed = min(best_timed, (time.perf_counter() - t) / 20_000)
counted = [0]


def opcode(frame, event, arg):
    frame.f_trace_opcodes = True
    if event == "opcode":
        counted[0] += 1
    return opcode


def opcodes(fn):
    counted[0] = 0
    sys.settrace(opcode)
    fn()
    sys.settrace(None)
    return counted[0]


def block():
    with timed(busy, *args):
        pass


import sys
import tempfile
import threading

import numpy as np

import pyloader as pl
from pyloader.collators import NumpyCollator
from pyloader.readers import NumpyReader

group_ops = opcodes(lambda: run_each(steps, datas, busy=busy)) / 32
folder = tempfile.mkdtemp()
np.save(folder + "/a.npy", np.zeros((4000, 4), dtype=np.float32))
loader = pl.DataLoader(NumpyReader(batch_size=4), pl.IdentityDataset(), NumpyCollator(), folder, num_workers=0)
if {on}:
    loader.trace(folder + "/t.json")
list(loader)  # counted once, warmed up
threading.settrace(opcode)
run_ops = opcodes(lambda: list(loader)) / 1000
threading.settrace(None)
print(best_group * 1e9, best_timed * 1e9, group_ops, opcodes(block), run_ops)
"""


def micro(baseline: str, repeats: int) -> str:
    """Nanoseconds per batch of a group's two no-op steps (``run_each``) and per ``timed`` block: the span
    sites alone, before the tracing code, with tracing off and on (the best of 7 rounds in each of
    ``repeats`` processes per setting, the settings taking turns), and the Python bytecodes each runs
    (``sys.settrace``: what a loaded machine cannot blur)."""
    import subprocess

    modes = (("without tracing code", baseline, False), ("tracing off", H.REPO, False), ("tracing on", H.REPO, True))
    best = {name: [float("inf")] * 5 for name, _, _ in modes}
    for _ in range(repeats):
        for name, path, on in modes:
            out = subprocess.run([sys.executable, "-c", MICRO.format(on=on)], capture_output=True, text=True,
                                 check=True, env=dict(os.environ, PYTHONPATH=os.path.abspath(path))).stdout.split()
            best[name] = [min(a, float(b)) for a, b in zip(best[name], out)]
    rows = [[name, f"{group:,.0f}", f"{ops:,.1f}", f"{block:,.0f}", f"{block_ops:,.0f}", f"{run_ops:,.0f}"]
            for name, (group, block, ops, block_ops, run_ops) in best.items()]
    return H.markdown_table(["", "ns per batch (2 no-op steps)", "bytecodes per batch", "ns per timed block (a read)",
                             "bytecodes per timed block", "bytecodes per batch of a whole run (4-row .npy batches)"],
                            rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="bench_loaders.py's full data (default: its quick data)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", default=None, help="a pyloader checkout without tracing: the 'before' rows")
    ap.add_argument("--micro", action="store_true", help="only the cost of the span sites (needs --baseline)")
    H.child_args(ap, 600, "write the results into benchmarks/README.md")
    args = ap.parse_args()
    if H.run_child_if_asked(args, child):
        return
    if args.micro:
        print(micro(args.baseline, args.repeats))
        return
    cfg = dict(BL.SIZES["full" if args.full else "quick"])
    modes = [m for m in MODES if m != "before" or args.baseline]
    root = tempfile.mkdtemp(prefix="pyloader-bench-trace-")
    runs: Dict[str, List[dict]] = {f"{m}:{e}": [] for e in ENTRIES for m in modes}
    try:
        BL.generate(root, cfg, print, kinds=("json", "npy"))
        for i in range(args.repeats):
            for name in runs:
                argv = [__file__, "--child", name, "--data", root, "--cfg", json.dumps(cfg)]
                env = {"PYTHONPATH": os.path.abspath(args.baseline)} if name.startswith("before:") else \
                    {"PYTHONPATH": H.REPO}
                r = H.run_child(argv, args.timeout, env)
                got = f"FAILED {r['error']} {r.get('stderr', '')}" if "error" in r else \
                    f"{r['samples_per_s']:>11,.0f} samples/s"
                print(f"  {name:<24} run {i + 1}/{args.repeats}: {got}", flush=True)
                runs[name].append(r)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    best = {name: H.best_of(rs) for name, rs in runs.items()}
    table = _table(best, modes)
    print(table)
    if args.write:
        H.write_results("bench_trace", table + "\n\n" + H.machine_line(), RESULTS_JSON,
                        {"cfg": cfg, "results": best}, None, None)


def _table(best: Dict[str, dict], modes: List[str]) -> str:
    rows = []
    for entry in ENTRIES:
        off = best[f"off:{entry}"].get("samples_per_s")
        cells = [entry]
        for mode in modes:
            rate = best[f"{mode}:{entry}"].get("samples_per_s")
            change = "" if mode == "off" or not (rate and off) else f" ({100 * (rate / off - 1):+.1f}%)"
            cells.append(f"{H.fmt_rate(rate)}{change}")
        rows.append(cells)
    header = ["entry", *[{"before": "without tracing code", "off": "tracing off", "on": "tracing on"}[m]
                         for m in modes]]
    return H.markdown_table(header, rows)


if __name__ == "__main__":
    sys.exit(main())
