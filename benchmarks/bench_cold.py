"""Cold local storage: pyloader's read-ahead against a raw sequential read and other loaders.

Before every entry the data is evicted from the page cache (``posix_fadvise(DONTNEED)`` on
every file), so every byte comes from the disk, as it does the first time real data is read.
Each entry runs in a fresh interpreter (``_harness.run_child``), peak memory of its process
tree included. Two workloads:

- ``light``: ``.npy`` float32 chunks read without mmap (``NumpyReader(mmap=False)``): parsing
  costs little, the disk sets the pace; compared with the raw read bandwidth (``cat``).
- ``heavy``: JSONL parsed line by line by Python's ``json``: parsing sets the pace; compared
  with the same loader on warm data.

and ``latency``: the heavy data with 5 ms of latency before every open of a data file (as on
a network file system), compared with the same loader without it.

    python benchmarks/bench_cold.py [--quick] [--write]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from typing import Any, Dict, Iterator, List

import numpy as np
from _harness import (
    HERE,
    MB,
    child_args,
    machine_line,
    markdown_table,
    own_memory,
    replace_section,
    report,
    run_child,
    run_child_if_asked,
)

RESULTS = os.path.join(HERE, "results", "bench_cold.json")
LATENCY_S = 0.005
LOADERS = ["plain", "torch2", "pyloader0", "pyloader0-off", "pyloader2", "pyloader2-off"]


# -- data -----------------------------------------------------------------------------------------
def make_data(root: str, quick: bool) -> Dict[str, str]:
    light, heavy = os.path.join(root, "light"), os.path.join(root, "heavy")
    os.makedirs(light)
    os.makedirs(heavy)
    rng = np.random.default_rng(0)
    n_light, rows_light = (4, 8192) if quick else (24, 32768)  # 8 MiB a file
    for i in range(n_light):
        np.save(os.path.join(light, f"part-{i:03d}.npy"), rng.random((rows_light, 64), dtype=np.float32))
    n_heavy, rows_heavy = (4, 2000) if quick else (24, 6000)
    for i in range(n_heavy):
        with open(os.path.join(heavy, f"part-{i:03d}.jsonl"), "w") as f:
            for j in range(rows_heavy):
                f.write(json.dumps({"ids": [(i * 7 + j + k) % 30000 for k in range(32)], "label": j % 5}) + "\n")
    return {"light": light, "heavy": heavy}


def files_of(folder: str) -> List[str]:
    return sorted(os.path.join(folder, n) for n in os.listdir(folder))


def evict(folder: str) -> None:
    for path in files_of(folder):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# -- the user code every loader runs --------------------------------------------------------------
def parse_light(path: str, f: Any) -> Dict[str, np.ndarray]:
    from numpy.lib import format as npformat

    return {"x": npformat.read_array(f, allow_pickle=False)}


def parse_heavy(path: str, f: Any) -> Dict[str, np.ndarray]:
    ids, labels = [], []
    for line in f:
        row = json.loads(line)
        ids.append(row["ids"])
        labels.append(row["label"])
    return {"ids": np.asarray(ids, dtype=np.int64), "label": np.asarray(labels, dtype=np.int64)}


PARSE = {"light": (parse_light, "rb", 1024), "heavy": (parse_heavy, "rt", 256)}


def add_latency(folder: str) -> None:
    """``LATENCY_S`` before every open of a file under ``folder``: by readers and by aiofiles alike."""
    import builtins

    import aiofiles.threadpool

    def slow(real: Any) -> Any:
        def opened(file: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(file, str) and file.startswith(folder):
                time.sleep(LATENCY_S)
            return real(file, *args, **kwargs)
        return opened

    builtins.open = slow(builtins.open)
    aiofiles.threadpool.sync_open = slow(aiofiles.threadpool.sync_open)


# -- loaders --------------------------------------------------------------------------------------
def batches_plain(folder: str, workload: str) -> Iterator[Dict[str, np.ndarray]]:
    parse, mode, bs = PARSE[workload]
    for path in files_of(folder):
        with open(path, mode) as f:
            cols = parse(path, f)
        n = len(next(iter(cols.values())))
        for s in range(0, n, bs):
            yield {k: v[s:s + bs] for k, v in cols.items()}


def batches_torch(folder: str, workload: str) -> Iterator[Any]:
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    class Files(IterableDataset):
        def __iter__(self) -> Iterator[Any]:
            info = get_worker_info()
            files = files_of(folder)
            mine = files if info is None else files[info.id::info.num_workers]
            parse, mode, bs = PARSE[workload]
            for path in mine:
                with open(path, mode) as f:
                    cols = parse(path, f)
                n = len(next(iter(cols.values())))
                for s in range(0, n, bs):
                    yield {k: torch.from_numpy(v[s:s + bs]) for k, v in cols.items()}

    return iter(DataLoader(Files(), batch_size=None, num_workers=2))


def batches_pyloader(folder: str, workload: str, workers: int, readahead: bool) -> Iterator[Any]:
    import pyloader as pl
    from pyloader.collators import NumpyCollator

    parse, mode, bs = PARSE[workload]

    class Reader(pl.DataReader):
        thread_safe = True

        def read_file(self, path: str) -> Any:
            with pl.open_file(path, mode) as f:
                cols = parse(path, f)
            return cols, len(next(iter(cols.values())))

    loader = pl.DataLoader(Reader(bs), pl.IdentityDataset(), NumpyCollator(), folder, num_workers=workers,
                           storage=pl.Storage(readahead_bytes=256 * MB if readahead else 0))
    return iter(loader)


def child(entry: str, data: str, cfg: Dict[str, Any]) -> None:
    workload, loader, latency = cfg["workload"], cfg["loader"], cfg["latency"]
    folder = cfg["folder"]
    if latency:
        add_latency(folder)
    baseline = own_memory()
    start = time.perf_counter()
    if loader == "raw":
        total = 0
        for path in files_of(folder):
            with open(path, "rb", buffering=0) as f:
                while True:
                    block = f.read(MB)
                    if not block:
                        break
                    total += len(block)
        elapsed = time.perf_counter() - start
        report({"bytes_per_s": total / elapsed, "samples_per_s": 0, "seconds": elapsed, "baseline": baseline,
                "first_batch_s": 0.0})
        return
    if loader == "plain":
        it = batches_plain(folder, workload)
    elif loader == "torch2":
        it = batches_torch(folder, workload)
    else:
        it = batches_pyloader(folder, workload, int(loader[8]), not loader.endswith("-off"))
    samples, first = 0, None
    for batch in it:
        if first is None:
            first = time.perf_counter() - start
        samples += len(next(iter(batch.values())))
    elapsed = time.perf_counter() - start
    size = sum(os.path.getsize(p) for p in files_of(folder))
    report({"samples_per_s": samples / elapsed, "bytes_per_s": size / elapsed, "seconds": elapsed,
            "samples": samples, "first_batch_s": first or 0.0, "baseline": baseline})


# -- the parent -----------------------------------------------------------------------------------
def run_entry(workload: str, loader: str, folder: str, cold: bool, latency: bool, timeout: float) -> Dict[str, Any]:
    if cold:
        evict(folder)
    cfg = {"workload": workload, "loader": loader, "latency": latency, "folder": folder}
    r = run_child([os.path.abspath(__file__), "--child", loader, "--data", folder, "--cfg", json.dumps(cfg)], timeout)
    tag = f"{workload:<6} {loader:<14} {'cold' if cold else 'warm'}{' +5ms' if latency else ''}"
    if "error" in r:
        print(f"  {tag}: FAILED {r['error']}\n{r.get('stderr', '')}", flush=True)
    else:
        print(f"  {tag}: {r['bytes_per_s'] / MB:8.1f} MB/s  {r['samples_per_s']:>10,.0f} samples/s  "
              f"peak RSS {r['peak_rss'] / MB:,.0f} MB", flush=True)
    return dict(r, workload=workload, loader=loader, cold=cold, latency=latency)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    child_args(ap, timeout=300)
    args = ap.parse_args()
    if run_child_if_asked(args, child):
        return
    root = tempfile.mkdtemp(prefix="pyloader-bench-cold-", dir=os.environ.get("BENCH_DIR"))
    try:
        folders = make_data(root, args.quick)
        print(machine_line(), flush=True)
        results = [run_entry("light", "raw", folders["light"], True, False, args.timeout)]
        for workload in ("light", "heavy"):
            for loader in LOADERS:
                results.append(run_entry(workload, loader, folders[workload], True, False, args.timeout))
        for loader in ("pyloader0", "pyloader2", "plain"):
            results.append(run_entry("heavy", loader, folders["heavy"], False, False, args.timeout))
        for loader in LOADERS:
            results.append(run_entry("heavy", loader, folders["heavy"], True, True, args.timeout))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    markdown = summarize(results)
    print("\n" + markdown)
    if args.write:
        replace_section(os.path.join(HERE, "README.md"), "bench_cold", markdown)
        os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
        with open(RESULTS, "w") as f:
            json.dump({"machine": machine_line(), "results": results}, f, indent=1, sort_keys=True)


def summarize(results: List[Dict[str, Any]]) -> str:
    def find(workload: str, loader: str, cold: bool = True, latency: bool = False) -> Dict[str, Any]:
        return next((r for r in results if (r["workload"], r["loader"], r["cold"], r["latency"]) ==
                     (workload, loader, cold, latency)), {"error": "missing"})

    def mbs(r: Dict[str, Any]) -> str:
        return "-" if "error" in r else f"{r['bytes_per_s'] / MB:,.0f}"

    def rss(r: Dict[str, Any]) -> str:
        return "-" if "error" in r else f"{r['peak_rss'] / MB:,.0f}"

    raw = find("light", "raw")
    rows = [["raw sequential read (`cat`)", mbs(raw), "", "", "", "", ""]]
    for loader in LOADERS:
        light, heavy, warm, slow = (find("light", loader), find("heavy", loader), find("heavy", loader, False),
                                    find("heavy", loader, True, True))
        rows.append([loader, mbs(light), rss(light), mbs(heavy), mbs(warm) if "error" not in warm else "",
                     mbs(slow), rss(heavy)])
    table = markdown_table(["loader", "light cold MB/s", "light peak RSS MB", "heavy cold MB/s", "heavy warm MB/s",
                            "heavy cold +5 ms/open MB/s", "heavy peak RSS MB"], rows)

    def ratio(a: Dict[str, Any], b: Dict[str, Any]) -> str:
        return "-" if "error" in a or "error" in b else f"{a['bytes_per_s'] / b['bytes_per_s']:.2f}x"

    best_light = max((find("light", lo) for lo in ("pyloader0", "pyloader2")),
                     key=lambda r: r.get("bytes_per_s", 0))
    targets = [
        f"- parse-light, cold: best pyloader {ratio(best_light, raw)} the raw read bandwidth (target 0.9x)",
        "- parse-heavy, cold against warm: pyloader 0 workers "
        f"{ratio(find('heavy', 'pyloader0'), find('heavy', 'pyloader0', False))}, "
        f"2 workers {ratio(find('heavy', 'pyloader2'), find('heavy', 'pyloader2', False))} (target 0.9x)",
        f"- 5 ms per open, against none (both cold): pyloader 0 workers "
        f"{ratio(find('heavy', 'pyloader0', True, True), find('heavy', 'pyloader0'))}, 2 workers "
        f"{ratio(find('heavy', 'pyloader2', True, True), find('heavy', 'pyloader2'))}; without the read-ahead "
        f"{ratio(find('heavy', 'pyloader0-off', True, True), find('heavy', 'pyloader0-off'))} and "
        f"{ratio(find('heavy', 'pyloader2-off', True, True), find('heavy', 'pyloader2-off'))} (target 0.9x)",
    ]
    return f"Machine: {machine_line()}\n\n{table}\n\n" + "\n".join(targets)


if __name__ == "__main__":
    main()
