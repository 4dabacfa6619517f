"""Start-up at scale: the cost of the plan itself, and of counting files before the first batch.

``plan``: the planner (``_stages.source.FileSource``) for 10^6 files and 1,024 ranks with made-up
counts and no I/O: rank 0's shard plan, the equal step count, and an elastic re-split (half an
epoch taken by 1,024 ranks, the rest shared by 512). Time of each, and the peak memory the
planning allocates (``tracemalloc``) beside the process's peak RSS.

``first``: the first batch on rank 0 of 8 over 2,000 remote files (``LatencyFileSystem``, 20 ms per
read), without an index (every file counted first), with the index written next to the data by
``python -m pyloader index``, and in a single process (no counts needed) for reference. Each
setting runs in a fresh process.

    python benchmarks/bench_counts.py [plan|first|all] [--files N]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc
from typing import Any, Dict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def plan(files: int, world_size: int) -> Dict[str, Any]:
    """Timed as it runs; then run again under ``tracemalloc`` (which slows it) for the memory."""
    out = _plan(files, world_size, traced=False)
    out["planning_peak_mib"] = _plan(files, world_size, traced=True)["planning_peak_mib"]
    out["process_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _plan(files: int, world_size: int, traced: bool) -> Dict[str, Any]:
    import numpy as np

    from pyloader._stages.shard import Sharding
    from pyloader._stages.source import Elastic, FileSource

    names = [f"s3://bucket/train/part-{i:07d}.jsonl" for i in range(files)]
    counts = np.random.default_rng(0).integers(500, 1500, files).tolist()
    batch_size = 32
    out: Dict[str, Any] = {"files": files, "world_size": world_size}
    if traced:  # the plan's own allocations, beyond the names and counts it is given
        tracemalloc.start()
    began = time.perf_counter()
    source = FileSource(names, 1, True, 42, Sharding(0, world_size), counts)
    tasks = list(source.tasks(0))
    out["shard_plan_s"] = time.perf_counter() - began
    out["rank0_files"] = len(tasks)
    began = time.perf_counter()
    out["steps"] = source.steps(0, batch_size, None, False)
    out["equal_steps_s"] = time.perf_counter() - began
    began = time.perf_counter()
    elastic = Elastic(0, ((world_size, out["steps"] // 2),), batch_size)
    resplit = FileSource(names, 1, True, 42, Sharding(0, world_size // 2), counts, elastic=elastic)
    resplit_tasks = list(resplit.tasks(0))
    out["resplit_steps"] = resplit.steps(0, batch_size, None, False)
    out["elastic_resplit_s"] = time.perf_counter() - began
    out["resplit_rank0_files"] = len(resplit_tasks)
    if traced:
        out["planning_peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return out


def _write_data(fs_cls: Any, files: int) -> None:
    fs = fs_cls()
    for i in range(files):
        fs.pipe_file(f"/data/part-{i:05d}.jsonl", "".join(json.dumps({"x": i * 10 + j}) + "\n"
                                                          for j in range(10)).encode())


def first_batch(mode: str, files: int) -> Dict[str, Any]:
    """One setting, in this process: ``single``, ``no_index`` or ``index``."""
    import pyloader as pl
    from pyloader._cli import main as cli
    from pyloader.collators import NumpyCollator
    from pyloader.readers import JsonLinesReader
    from pyloader.testing import LatencyFileSystem

    fs_cls = LatencyFileSystem.register("benchcounts", latency=0.0)
    _write_data(fs_cls, files)
    if mode == "index":
        assert cli(["index", "benchcounts://data", "--reader", "jsonl"], out=lambda line: None) == 0
    fs_cls.latency = 0.02
    ranks = {} if mode == "single" else {"ranks": pl.Ranks(rank=0, world_size=8)}
    began = time.perf_counter()
    loader = pl.DataLoader(JsonLinesReader(batch_size=16), pl.IdentityDataset(), NumpyCollator(),
                           "benchcounts://data", num_workers=0, **ranks)
    with loader:
        next(iter(loader))
        seconds = time.perf_counter() - began
        counting = loader.stats["counting"]
    return {"mode": mode, "first_batch_s": seconds, **counting}


def run_first(files: int) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    print(f"first batch, {files} remote files at 20 ms per read, rank 0 of 8 (fresh process each)")
    for mode in ("single", "no_index", "index"):
        done = subprocess.run([sys.executable, __file__, "_first", mode, "--files", str(files)], env=env,
                              capture_output=True, text=True, timeout=600, check=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"  {mode:>9}: first batch {r['first_batch_s']:.2f} s; counted {r['counted']} files in "
              f"{r['seconds']:.2f} s, {r['indexed']} from the index")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["plan", "first", "all", "_first"], nargs="?", default="all")
    parser.add_argument("mode", nargs="?")
    parser.add_argument("--files", type=int, default=0)
    args = parser.parse_args()
    if args.what == "_first":
        print(json.dumps(first_batch(args.mode, args.files)))
        return
    if args.what in ("plan", "all"):
        r = plan(args.files or 10**6, 1024)
        print(f"plan, {r['files']:,} files, {r['world_size']} ranks (no I/O): rank 0's shard plan "
              f"{r['shard_plan_s']:.2f} s ({r['rank0_files']} files), equal steps {r['equal_steps_s']:.2f} s "
              f"({r['steps']} steps), elastic re-split to 512 ranks {r['elastic_resplit_s']:.2f} s "
              f"({r['resplit_rank0_files']} files, {r['resplit_steps']} steps); planning allocates "
              f"{r['planning_peak_mib']:.0f} MiB at its peak, process peak RSS {r['process_peak_rss_mib']:.0f} MiB")
    if args.what in ("first", "all"):
        run_first(args.files or 2000)


if __name__ == "__main__":
    main()
