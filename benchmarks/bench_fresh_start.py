"""The README's usage under default settings in many fresh interpreters (``tests/fresh_start.py``):
how many hang or fail, and how long a start-to-end run takes, per variant.

    python benchmarks/bench_fresh_start.py --runs 200 --parallel 2 [--busy 2]

``--busy N`` keeps N processes spinning on the CPUs meanwhile (a shared CI machine).
The test suite runs about a hundred of these; this script is for larger counts.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "fresh_start.py"
VARIANTS = ("plain", "importing", "tokenizer", "forked", "forked-run", "torch")


def _spin(stop: "multiprocessing.synchronize.Event") -> None:
    while not stop.is_set():
        sum(range(10_000))


def one(variant: str, timeout: float) -> Tuple[str, str, float]:
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("PYLOADER_NUM_WORKERS", None)
        began = time.perf_counter()
        try:
            out = subprocess.run([sys.executable, str(SCRIPT), variant, folder], capture_output=True, text=True,
                                 timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return variant, "hang", time.perf_counter() - began
        ok = out.returncode == 0 and any(line.startswith("OK ") for line in out.stdout.splitlines())
        return variant, "ok" if ok else "fail", time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200, help="runs in all, spread over the variants")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on the CPUs meanwhile")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    try:
        plan = [VARIANTS[k % len(VARIANTS)] for k in range(args.runs)]
        with ThreadPoolExecutor(args.parallel) as pool:
            results = list(pool.map(lambda v: one(v, args.timeout), plan))
    finally:
        stop.set()
        for p in spinners:
            p.join()
    by: Dict[str, List[Tuple[str, float]]] = {}
    for variant, outcome, seconds in results:
        by.setdefault(variant, []).append((outcome, seconds))
    print(f"| variant | runs | ok | failed | hung | median s | max s |  (busy={args.busy}, parallel={args.parallel})")
    print("|---|---|---|---|---|---|---|")
    for variant, rows in by.items():
        times = [s for _, s in rows]
        count = {k: sum(1 for o, _ in rows if o == k) for k in ("ok", "fail", "hang")}
        print(f"| {variant} | {len(rows)} | {count['ok']} | {count['fail']} | {count['hang']} | "
              f"{statistics.median(times):.2f} | {max(times):.2f} |")


if __name__ == "__main__":
    main()
