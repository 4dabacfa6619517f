#!/usr/bin/env python
"""Cached epochs (``cache_encoded``): epochs read from the cache of encoded batches against epochs
that read and encode the files, with an expensive ``batch_encode``.

    python benchmarks/bench_cache.py            # 20 files x 1,000 samples, 4 epochs per entry
    python benchmarks/bench_cache.py --quick    # 8 files x 500 samples, a smoke run
    python benchmarks/bench_cache.py --write    # also rewrites the bench_cache section of benchmarks/README.md
                                                # and saves benchmarks/results/bench_cache.json

The data: JSON-lines files of samples ``{"id": i, "text": "..."}`` (40 to 120 words of a
5,000-word vocabulary). ``batch_encode`` is a tokenizer written in Python: each word is
looked up, then hashed ``--rounds`` times with BLAKE2b (standing for the sub-word
merges, normalization and augmentation a real one does), giving a ragged list of
token ids per sample, plus the sample's text; ``collate_batch`` pads the ids to
``[B, longest]`` (NumPy). The reader is pyloader's ``JsonLinesReader``.

Entries, each in a fresh child process (``_harness.run_child``), 0 and 2 workers: the
loader without the cache, and with ``cache_encoded={"dir": ..., "update_every": E}``
(epoch 0 reads, encodes and writes the cache; epochs 1..E-1 read it). Each epoch is one
iteration of the loader, timed from ``iter()`` to its last batch; every epoch checks
that each sample arrived exactly once and, for the cached entries, that the batches of
a cached epoch are those of the epoch that wrote the cache (compared by their
collated arrays).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List

import numpy as np
from _harness import (
    HERE,
    MB,
    REPO,
    child_args,
    effective_cores,
    machine_line,
    markdown_table,
    replace_section,
    report,
    run_child,
    run_child_if_asked,
    source_digest,
)

RESULTS_JSON = os.path.join(HERE, "results", "bench_cache.json")
VOCAB = 5000


def write_data(folder: str, files: int, rows: int) -> None:
    rng = np.random.default_rng(0)
    for f in range(files):
        with open(os.path.join(folder, f"part-{f:04d}.jsonl"), "w") as out:
            for j in range(rows):
                words = rng.integers(0, VOCAB, int(rng.integers(40, 121)))
                out.write(json.dumps({"id": f * rows + j, "text": " ".join(f"w{w}" for w in words)}) + "\n")


# -- the child: one entry ------------------------------------------------------------------------
def child(name: str, data: str, cfg: Dict[str, Any]) -> None:
    import pyloader as pl
    from pyloader.readers import JsonLinesReader

    class Tokenizer(pl.Dataset):
        thread_safe = True

        def __init__(self, rounds: int) -> None:
            self.rounds = rounds
            self.vocab = {f"w{i}": i for i in range(VOCAB)}

        def batch_encode(self, batch: Dict[str, Any]) -> Dict[str, Any]:
            out = []
            for text in batch["text"]:
                ids = []
                for word in text.split():
                    digest = word.encode()
                    for _ in range(self.rounds):
                        digest = hashlib.blake2b(digest, digest_size=8).digest()
                    ids.append(self.vocab[word] * 7 + digest[0] % 7)
                out.append(ids)
            return {"id": list(batch["id"]), "ids": out, "text": list(batch["text"])}

    class PadCollator(pl.DataCollator):
        thread_safe = True

        def collate_batch(self, features: Dict[str, Any]) -> Dict[str, Any]:
            lengths = [len(ids) for ids in features["ids"]]
            padded = np.zeros((len(lengths), max(lengths)), dtype=np.int64)
            for row, ids in enumerate(features["ids"]):
                padded[row, :len(ids)] = ids
            return {"id": np.asarray(features["id"]), "ids": padded, "lengths": np.asarray(lengths)}

    n, epochs = cfg["samples"], cfg["epochs"]
    cache = None if not cfg["cache"] else {"dir": cfg["cache"], "update_every": epochs}
    loader = pl.DataLoader(JsonLinesReader(cfg["batch"]), Tokenizer(cfg["rounds"]), PadCollator(), data,
                           shuffle=True, num_workers=cfg["workers"], cache_encoded=cache)
    seconds: List[float] = []
    exact: List[bool] = []
    batches: List[Dict[str, str]] = []
    for _ in range(epochs):
        start = time.perf_counter()
        ids: List[np.ndarray] = []
        digests: Dict[str, str] = {}
        for batch in loader:
            ids.append(batch["id"])
            digests[batch["id"].tobytes().hex()] = hashlib.sha1(batch["ids"].tobytes()).hexdigest()
        seconds.append(time.perf_counter() - start)
        exact.append(bool(np.array_equal(np.sort(np.concatenate(ids)), np.arange(n))))
        batches.append(digests)
    same = all(b == batches[0] for b in batches[1:]) if cache else None  # cached epochs: the writer's batches
    loader.close()
    report({"name": name, "seconds": seconds, "exact": exact, "same_batches_as_writer": same,
            "stats": loader.stats.get("cache_encoded"), "samples": n,
            "samples_per_s": n * epochs / sum(seconds), "first_batch_s": 0.0,
            "checks_ok": all(exact) and same is not False, "baseline": {"rss": 0, "pss": 0}})


# -- the parent ----------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 files x 500 samples")
    ap.add_argument("--files", type=int, default=None)
    ap.add_argument("--rows", type=int, default=None, help="samples per file")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=4, help="epochs per entry (update_every for the cached ones)")
    ap.add_argument("--rounds", type=int, default=2, help="BLAKE2b rounds per word in batch_encode (its cost)")
    child_args(ap, timeout=900)
    args = ap.parse_args()
    if run_child_if_asked(args, child):
        return
    files = args.files or (8 if args.quick else 20)
    rows = args.rows or (500 if args.quick else 1000)
    began, load = time.strftime("%Y-%m-%d %H:%M"), machine_line()
    folder = tempfile.mkdtemp(prefix="pyloader-bench-cache-")
    results: Dict[str, Dict[str, Any]] = {}
    cores: List[float] = []
    try:
        data = os.path.join(folder, "data")
        os.makedirs(data)
        write_data(data, files, rows)
        size = sum(os.path.getsize(os.path.join(data, f)) for f in os.listdir(data))
        print(f"{load}\n{files} files x {rows} samples ({size / MB:.1f} MB of JSONL), batch {args.batch}, "
              f"{args.epochs} epochs per entry", flush=True)
        for workers in (0, 2):
            for cached in (False, True):
                name = f"{'cache_encoded' if cached else 'no cache'}, {workers} workers"
                cache = os.path.join(folder, f"cache-{workers}") if cached else None
                cfg = {"samples": files * rows, "epochs": args.epochs, "batch": args.batch, "rounds": args.rounds,
                       "workers": workers, "cache": cache}
                cores.append(effective_cores())
                results[name] = run_child([os.path.abspath(__file__), "--child", name, "--data", data,
                                           "--cfg", json.dumps(cfg)], args.timeout)
                r = results[name]
                if cache is not None:
                    r["cache_mb"] = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(cache)
                                        for f in fs) / MB
                print(f"  {name}: " + (r["error"] + "\n" + r.get("stderr", "") if "error" in r else
                                       " ".join(f"{s:.2f}" for s in r["seconds"]) + " s per epoch"), flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    cores.append(effective_cores())
    markdown = render(results, args, files, rows, size, began, load, cores)
    print("\n" + markdown)
    if args.write:
        replace_section(os.path.join(HERE, "README.md"), "bench_cache", markdown)
        os.makedirs(os.path.dirname(RESULTS_JSON), exist_ok=True)
        with open(RESULTS_JSON, "w") as f:
            json.dump({"machine": load, "cores": cores, "results": results,
                       "cfg": {"files": files, "rows": rows, "batch": args.batch, "epochs": args.epochs,
                               "rounds": args.rounds}}, f, indent=1, sort_keys=True)
    if any("error" in r or not r["checks_ok"] for r in results.values()):
        sys.exit("an entry failed or lost, repeated or changed samples")


def render(results: Dict[str, Dict[str, Any]], args: Any, files: int, rows: int, size: int, began: str,
           load: str, cores: List[float]) -> str:
    n = files * rows
    table = []
    for workers in (0, 2):
        plain = results[f"no cache, {workers} workers"]
        cached = results[f"cache_encoded, {workers} workers"]
        if "error" in plain or "error" in cached:
            continue
        base = sum(plain["seconds"]) / len(plain["seconds"])  # an uncached epoch, on average
        for label, r, secs in (("no cache", plain, plain["seconds"]),
                               ("cache_encoded: epoch 0 (reads, encodes, writes)", cached, cached["seconds"][:1]),
                               (f"cache_encoded: epochs 1-{args.epochs - 1} (read the cache)", cached,
                                cached["seconds"][1:])):
            mean = sum(secs) / len(secs)
            table.append([workers, label, f"{mean:.2f}", f"{n / mean:,.0f}", f"{base / mean:.2f}x",
                          "yes" if all(r["exact"]) else "NO",
                          "-" if r["same_batches_as_writer"] is None else
                          ("yes" if r["same_batches_as_writer"] else "NO")])
    sizes = ", ".join(f"{name}: {r['cache_mb']:.1f} MB" for name, r in results.items() if "cache_mb" in r)
    return (f"Run of `python benchmarks/bench_cache.py{' --quick' if args.quick else ''} --write` on {began}, one "
            f"run per entry. Machine: {load}; code measured: {source_digest(os.path.join(REPO, 'pyloader'))}. "
            f"**The machine is shared** with other jobs: effective cores free to this run (two spinning "
            f"processes against one) before each entry and at the end: "
            f"{', '.join(f'{c:.2f}' for c in cores)} (2.00 = both cores free).\n\n"
            f"Data: {files} JSONL files x {rows} samples ({size / MB:.1f} MB), batch {args.batch}, `shuffle=True`; "
            f"`batch_encode` a Python tokenizer with {args.rounds} BLAKE2b rounds per word; {args.epochs} epochs "
            f"per entry, `update_every={args.epochs}`. Cache on disk: {sizes}.\n\n"
            + markdown_table(["workers", "epochs", "s per epoch", "samples/s", "vs no cache", "every sample once",
                              "same batches as the writing epoch"], table, align="llrrrrr"))


if __name__ == "__main__":
    main()
