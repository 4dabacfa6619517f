#!/usr/bin/env python
"""pyloader against the usual ways of feeding PyTorch, side by side in one run.

    python benchmarks/bench_loaders.py            # full size, prints the tables
    python benchmarks/bench_loaders.py --quick    # small data, a smoke run (< 2 min)
    python benchmarks/bench_loaders.py --write    # also rewrite benchmarks/README.md's results
                                                  # and draw img/bench_throughput.png

What is measured (see benchmarks/README.md for the discussion):

1. JSONL chunks parsed by Python user code: the same ``read_jsonl`` /
   ``batch_encode`` / ``collate`` functions run by a plain loop, torch
   ``DataLoader`` (IterableDataset sharded by file, 0 and 2 workers),
   ``tf.data`` (``from_generator`` + ``interleave``, 2 parallel calls) and
   pyloader (0 and 2 workers).
2. ``.npy`` float32 chunks: a raw ``np.load`` loop, torch ``DataLoader``
   (``batch_size=None``, slices), pyloader (``NumpyReader`` + ``TorchCollator``).
3. The data of 1 behind 50 ms per file read (``pyloader.testing.LatencyFileSystem``),
   each loader against its own zero-latency figure (same filesystem, latency 0).
4. pyloader's peak memory with 1x and 8x the data of 2 (8x the files).
5. Time to first batch of every loader of 1 and 2.

Each entry runs in a fresh subprocess, ``--repeats`` times (round robin over
the entries, so a burst of load from elsewhere does not hit one entry's runs
only); the table keeps the best throughput and first-batch time, and the
largest peak memory. Data is generated into a temporary folder and removed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import _harness as H
from _harness import HERE, REPO

RESULTS_JSON = os.path.join(HERE, "results", "bench_loaders.json")  # every figure of the last --write run

SIZES = {
    "full": dict(json_files=20, json_lines=10_000, json_ints=32, json_batch=256,
                 npy_files=20, npy_rows=50_000, npy_cols=64, npy_batch=1024, npy_epochs=10, mem_factor=8,
                 latency_ms=50),
    "quick": dict(json_files=6, json_lines=2_000, json_ints=32, json_batch=256,
                  npy_files=6, npy_rows=10_000, npy_cols=64, npy_batch=1024, npy_epochs=2, mem_factor=8,
                  latency_ms=50),
}

SECTIONS = {
    "json": ["json/plain", "json/torch-w0", "json/torch-w2", "json/tf-interleave2", "json/pyloader-default",
             "json/pyloader-w0", "json/pyloader-w0+t1", "json/pyloader-w2"],
    "npy": ["npy/raw-np.load", "npy/torch-w0", "npy/torch-w2", "npy/pyloader-default", "npy/pyloader-w0",
            "npy/pyloader-w2"],
    "latency": ["lat0/pyloader-w2", "latL/pyloader-w2", "lat0/torch-w2", "latL/torch-w2",
                "lat0/pyloader-w0", "latL/pyloader-w0"],
    "memory": ["mem1x/pyloader-w0", "mem8x/pyloader-w0", "mem1x/pyloader-w2", "mem8x/pyloader-w2",
               "mem1x/pyloader-w0+mt", "mem8x/pyloader-w0+mt"],
}

LABELS = {
    "plain": "plain loop (1 process)", "torch-w0": "torch DataLoader, 0 workers",
    "torch-w2": "torch DataLoader, 2 workers", "tf-interleave2": "tf.data from_generator + interleave(2)",
    "pyloader-default": "pyloader, default settings (num_workers=\"auto\")",
    "pyloader-w0": "pyloader, 0 workers", "pyloader-w2": "pyloader, 2 workers",
    "raw-np.load": "raw np.load loop (1 process)",
    "pyloader-w0+mt": "pyloader, 0 workers, MALLOC_MMAP_THRESHOLD_=1 MiB",
    "pyloader-w0+t1": "pyloader, 0 workers, num_threads=1",
}
# "+mt" entries: the same loader with glibc's mmap threshold pinned (a diagnosis of target 4);
# "+t1": with num_threads=1, the setting the README gives Python user code
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2 ** 20)}

# ==================================================================================================
# The user code: written once, run by every loader.
# ==================================================================================================
CLS, SEP = 1, 2


def parse_jsonl(f) -> Tuple[Dict[str, list], int]:
    """One chunk file: ``{"ids": [32 ints], "label": int}`` per line -> columns."""
    ids, labels = [], []
    for line in f:
        obj = json.loads(line)
        ids.append(obj["ids"])
        labels.append(obj["label"])
    return {"ids": ids, "label": labels}, len(labels)


def open_text(path: str):
    """Plain ``open`` for local paths, fsspec for URLs (what the non-pyloader loaders use)."""
    if "://" in path:
        import fsspec

        return fsspec.open(path, "rt", encoding="utf-8").open()
    return open(path, encoding="utf-8")


def read_jsonl(path: str) -> Tuple[Dict[str, list], int]:
    with open_text(path) as f:
        return parse_jsonl(f)


def batch_encode(batch: Dict[str, list]) -> Dict[str, list]:
    """Lists -> per-sample feature lists, as a tokenizer's post-processing would."""
    input_ids = [[CLS] + ids + [SEP] for ids in batch["ids"]]
    return {"input_ids": input_ids, "attention_mask": [[1] * len(x) for x in input_ids],
            "label": list(batch["label"])}


def collate(features: Dict[str, list]) -> Dict[str, Any]:
    import torch

    return {"input_ids": torch.tensor(features["input_ids"], dtype=torch.long),
            "attention_mask": torch.tensor(features["attention_mask"], dtype=torch.long),
            "label": torch.tensor(features["label"], dtype=torch.long)}


def sample_list_collate(samples: List[Dict[str, Any]]) -> Dict[str, Any]:
    """torch DataLoader's ``collate_fn``: per-sample dicts -> the same encode + collate."""
    return collate(batch_encode({"ids": [s["ids"] for s in samples], "label": [s["label"] for s in samples]}))


# ==================================================================================================
# The loaders. Each ``build_*`` does its imports and set-up (not timed) and returns
# ``(make_iterator, close)``; the timed part starts with ``make_iterator()``.
# ==================================================================================================
def files_in(folder: str) -> List[str]:
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if not f.startswith("."))


def build_plain_json(files: List[str], cfg: dict):
    B = cfg["json_batch"]

    def batches() -> Iterator[Dict[str, Any]]:
        buf_ids: list = []
        buf_lab: list = []
        for path in files:
            cols, _ = read_jsonl(path)
            buf_ids += cols["ids"]
            buf_lab += cols["label"]
            s = 0
            while len(buf_lab) - s >= B:
                yield collate(batch_encode({"ids": buf_ids[s:s + B], "label": buf_lab[s:s + B]}))
                s += B
            buf_ids, buf_lab = buf_ids[s:], buf_lab[s:]
        if buf_lab:
            yield collate(batch_encode({"ids": buf_ids, "label": buf_lab}))

    return batches, lambda: None


def _torch_json_dataset(files: List[str]):
    import torch.utils.data as tud

    class JsonSamples(tud.IterableDataset):
        """Per-sample iterable, sharded by file across workers."""

        def __init__(self, files: List[str]) -> None:
            self.files = files

        def __iter__(self):
            info = tud.get_worker_info()
            mine = self.files if info is None else self.files[info.id::info.num_workers]
            for path in mine:
                cols, n = read_jsonl(path)
                ids, labels = cols["ids"], cols["label"]
                for i in range(n):
                    yield {"ids": ids[i], "label": labels[i]}

    return JsonSamples(files)


def build_torch_json(files: List[str], cfg: dict, workers: int):
    import torch.utils.data as tud

    dataset = _torch_json_dataset(files)
    holder: dict = {}

    def make():
        loader = tud.DataLoader(dataset, batch_size=cfg["json_batch"], num_workers=workers,
                                collate_fn=sample_list_collate)
        holder["it"] = iter(loader)
        return holder["it"]

    return make, lambda: holder.pop("it", None)


def build_tf_json(files: List[str], cfg: dict):
    import numpy as np
    import tensorflow as tf
    import torch

    B, L = cfg["json_batch"], cfg["json_ints"] + 2
    sig = {"input_ids": tf.TensorSpec([None, L], tf.int64), "attention_mask": tf.TensorSpec([None, L], tf.int64),
           "label": tf.TensorSpec([None], tf.int64)}

    def gen(path: bytes):
        # the same read + encode; np.asarray is the NumPy half of collate (tf.data needs arrays)
        cols, n = read_jsonl(path.decode())
        for s in range(0, n, B):
            enc = batch_encode({k: v[s:s + B] for k, v in cols.items()})
            yield {k: np.asarray(v, dtype=np.int64) for k, v in enc.items()}

    def make():
        ds = tf.data.Dataset.from_tensor_slices(files).interleave(
            lambda p: tf.data.Dataset.from_generator(gen, output_signature=sig, args=(p,)),
            cycle_length=2, num_parallel_calls=2, deterministic=True)
        ds = ds.unbatch().batch(B).prefetch(2)
        return ({k: torch.from_numpy(v.numpy()) for k, v in b.items()} for b in ds)

    return make, lambda: None


def _pyloader_json_classes():
    import pyloader as pl

    class JsonReader(pl.DataReader):
        def read_file(self, path):
            with pl.open_file(path, "rt", encoding="utf-8") as f:
                return parse_jsonl(f)

    class Encode(pl.Dataset):
        def batch_encode(self, batch_data):
            return batch_encode(batch_data)

    class Collate(pl.DataCollator):
        def collate_batch(self, features):
            return collate(features)

    return JsonReader, Encode, Collate


def loader_options(workers: Optional[int], threads: Optional[int] = None) -> Dict[str, Any]:
    """pyloader's options of an entry: none for the default settings (``workers`` None)."""
    return {} if workers is None else dict(num_workers=workers, num_threads=threads)


def entry_workers(loader: str) -> Optional[int]:
    """``pyloader-w2`` -> 2, ``pyloader-default`` -> None (no option given), others -> 0."""
    if loader.endswith("-default"):
        return None
    return int(loader.rsplit("-w", 1)[1]) if "-w" in loader else 0


def build_pyloader_json(data_dir: Any, cfg: dict, workers: Optional[int], threads: Optional[int] = None):
    import torch  # noqa: F401  (imported up front, like every other torch entry)

    import pyloader as pl

    JsonReader, Encode, Collate = _pyloader_json_classes()
    holder: dict = {}

    def make():
        holder["loader"] = pl.DataLoader(JsonReader(batch_size=cfg["json_batch"]), Encode(), Collate(), data_dir,
                                         **loader_options(workers, threads))
        return iter(holder["loader"])

    return make, lambda: holder["loader"].close()


def build_raw_npy(files: List[str], cfg: dict, epochs: int):
    import numpy as np
    import torch

    B = cfg["npy_batch"]

    def batches():
        for _ in range(epochs):
            for path in files:
                arr = np.load(path)
                for s in range(0, len(arr), B):
                    yield {"x": torch.from_numpy(arr[s:s + B])}

    return batches, lambda: None


def build_torch_npy(files: List[str], cfg: dict, workers: int, epochs: int):
    import numpy as np
    import torch
    import torch.utils.data as tud

    B = cfg["npy_batch"]

    class NpySlices(tud.IterableDataset):
        def __iter__(self):
            info = tud.get_worker_info()
            mine = files if info is None else files[info.id::info.num_workers]
            for path in mine:
                arr = np.load(path)
                for s in range(0, len(arr), B):
                    yield {"x": torch.from_numpy(arr[s:s + B])}

    holder: dict = {}

    def make():
        # persistent workers: one start for all the epochs, as pyloader's num_epoch does
        holder["loader"] = tud.DataLoader(NpySlices(), batch_size=None, num_workers=workers,
                                          persistent_workers=workers > 0)
        return (batch for _ in range(epochs) for batch in holder["loader"])

    return make, lambda: holder.pop("loader", None)


def build_pyloader_npy(folder: str, cfg: dict, workers: Optional[int], epochs: int):
    import torch  # noqa: F401

    import pyloader as pl
    from pyloader.collators import TorchCollator
    from pyloader.readers import NumpyReader

    holder: dict = {}

    def make():
        holder["loader"] = pl.DataLoader(NumpyReader(batch_size=cfg["npy_batch"]), pl.IdentityDataset(),
                                         TorchCollator(), folder, num_epoch=epochs, **loader_options(workers))
        return iter(holder["loader"])

    return make, lambda: holder["loader"].close()


def setup_latency_fs(json_dir: str, latency_s: float) -> List[str]:
    """Copy the JSONL chunks into a ``slow://`` LatencyFileSystem; their URLs, sorted."""
    import fsspec

    from pyloader.testing import LatencyFileSystem

    LatencyFileSystem.register("slow", latency=latency_s)
    fs = fsspec.filesystem("slow")
    for path in files_in(json_dir):
        with open(path, "rb") as f:
            fs.pipe(f"/bench/json/{os.path.basename(path)}", f.read())
    return [f"slow:///bench/json/{os.path.basename(p)}" for p in files_in(json_dir)]


def wait_for_threads(timeout: float = 10.0) -> Tuple[List[str], float]:
    """Join the threads a loader left running after ``close()`` (their names, and the wait).

    Exiting while pyloader's executor threads are still winding down can abort
    the interpreter ("terminate called without an active exception", exit code
    -6, seen with torch collators), so the child waits for them before it exits;
    what was left is reported.
    """
    import threading

    left = [t for t in threading.enumerate() if t is not threading.main_thread()]
    t0 = time.perf_counter()
    for t in left:
        t.join(max(0.0, timeout - (time.perf_counter() - t0)))
    return [t.name for t in left], time.perf_counter() - t0


def child(entry: str, data: str, cfg: dict) -> None:
    kind, loader = entry.split("/")
    loader, *options = loader.split("+")
    workers = entry_workers(loader)
    if kind == "json":
        folder = os.path.join(data, "json")
        files, key, n_expected = files_in(folder), "label", cfg["json_files"] * cfg["json_lines"]
        if loader == "plain":
            make, close = build_plain_json(files, cfg)
        elif loader.startswith("torch"):
            make, close = build_torch_json(files, cfg, workers)
        elif loader.startswith("tf"):
            make, close = build_tf_json(files, cfg)
        else:
            make, close = build_pyloader_json(folder, cfg, workers, 1 if "t1" in options else None)
    elif kind.startswith("lat"):
        latency = cfg["latency_ms"] / 1000 if kind == "latL" else 0.0
        urls = setup_latency_fs(os.path.join(data, "json"), latency)
        key, n_expected = "label", cfg["json_files"] * cfg["json_lines"]
        if loader.startswith("torch"):
            make, close = build_torch_json(urls, cfg, workers)
        else:
            make, close = build_pyloader_json("slow:///bench/json", cfg, workers)
    else:  # npy: throughput over npy_epochs passes; mem1x / mem8x: one pass over 1x / 8x the files
        factor = cfg["mem_factor"] if kind == "mem8x" else 1
        epochs = cfg["npy_epochs"] if kind == "npy" else 1
        folder = os.path.join(data, "npy8x" if kind == "mem8x" else "npy")
        files, key = files_in(folder), "x"
        n_rows = factor * cfg["npy_files"] * cfg["npy_rows"]
        n_expected = epochs * n_rows
        if loader == "raw-np.load":
            make, close = build_raw_npy(files, cfg, epochs)
        elif loader.startswith("torch"):
            make, close = build_torch_npy(files, cfg, workers, epochs)
        else:
            make, close = build_pyloader_npy(folder, cfg, workers, epochs)
    import torch

    baseline = H.own_memory()
    # memory entries: the tree's RSS each time another quarter of the 1x data has gone by
    every = cfg["npy_files"] * cfg["npy_rows"] // 4 if kind.startswith("mem") else 0
    checkpoints: List[int] = []
    n, check, batches, first = 0, 0, 0, None
    cpu0 = os.times()
    t0 = time.perf_counter()
    for batch in make():
        if first is None:
            first = time.perf_counter() - t0
        t = batch[key]
        n += int(t.shape[0])
        # the consumer's only work: a checksum proving every sample came exactly once
        check += int(t.sum()) if key == "label" else int(t[:, 0].sum(dtype=torch.float64))
        batches += 1
        if every and n >= (len(checkpoints) + 1) * every:
            checkpoints.append(H.tree_rss())
    elapsed = time.perf_counter() - t0
    close()
    threads_left, exit_wait = wait_for_threads()
    cpu1 = os.times()  # children's times count once they are reaped (close() joined the workers)
    cpu_s = sum(cpu1[i] - cpu0[i] for i in range(4))
    if key == "label":
        expected = n_expected * (n_expected - 1) // 2
    else:
        expected = epochs * (n_rows * (n_rows - 1) // 2)
    H.report({"entry": entry, "samples": n, "batches": batches, "seconds": elapsed,
              "samples_per_s": n / elapsed, "first_batch_s": first, "baseline": baseline, "cpu_s": cpu_s,
              "checks_ok": n == n_expected and check == expected,
              "threads_left_after_close": threads_left, "thread_exit_wait_s": exit_wait,
              "rss_checkpoints": checkpoints,
              "check_detail": f"samples {n}/{n_expected}, checksum {'ok' if check == expected else 'WRONG'}"})


# ==================================================================================================
# Data generation (parent)
# ==================================================================================================
def generate(root: str, cfg: dict, log: Callable[[str], None], kinds=("json", "npy", "npy8x")) -> None:
    import numpy as np

    t = time.perf_counter()
    rng = np.random.default_rng(0)
    L = cfg["json_lines"]
    if "json" in kinds:
        os.makedirs(os.path.join(root, "json"))
    for i in range(cfg["json_files"] if "json" in kinds else 0):
        ids = rng.integers(3, 30_000, size=(L, cfg["json_ints"])).tolist()
        with open(os.path.join(root, "json", f"part-{i:05d}.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"ids": row, "label": i * L + j}) + "\n" for j, row in enumerate(ids))
    R, C = cfg["npy_rows"], cfg["npy_cols"]
    for kind, count in (("npy", cfg["npy_files"]), ("npy8x", cfg["npy_files"] * cfg["mem_factor"])):
        if kind not in kinds:
            continue
        os.makedirs(os.path.join(root, kind))
        for i in range(count):
            arr = rng.random((R, C), dtype=np.float32)
            arr[:, 0] = np.arange(i * R, (i + 1) * R, dtype=np.float32)  # global row id: the checksum
            np.save(os.path.join(root, kind, f"part-{i:05d}.npy"), arr)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
    log(f"generated {size / H.MB:,.0f} MB of data in {root} in {time.perf_counter() - t:.1f} s")


# ==================================================================================================
# Reporting (parent)
# ==================================================================================================
def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a and b else None


def fmt_x(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.2f}x"


def rate(res: Dict[str, dict], entry: str) -> Optional[float]:
    r = res.get(entry, {})
    return r.get("samples_per_s") if "error" not in r else None


def section_table(res: Dict[str, dict], entries: List[str], base: str, base_label: str) -> str:
    rows = []
    for e in entries:
        r = res[e]
        name = LABELS.get(e.split("/")[1], e)
        if "error" in r:
            rows.append([name, "FAILED: " + r["error"]] + ["-"] * 7)
            continue
        rows.append([name, H.fmt_rate(r["samples_per_s"]), fmt_x(ratio(r["samples_per_s"], rate(res, base))),
                     f"{r['first_batch_s']:.3f}", f"{r['cpu_s']:.1f} / {r['seconds']:.1f}", H.fmt_mb(r["peak_rss"]),
                     H.fmt_mb(r["peak_pss"]), str(r["peak_procs"]), "ok" if r["checks_ok"] else "WRONG"])
    return H.markdown_table(["loader", "samples/s", f"vs {base_label}", "first batch (s)", "CPU s / wall s",
                             "peak RSS, tree (MB)", "peak PSS, tree (MB)", "processes", "exactly once"], rows)


def latency_table(res: Dict[str, dict], cfg: dict) -> str:
    rows = []
    for name in ("pyloader-w2", "torch-w2", "pyloader-w0"):
        z, s = rate(res, f"lat0/{name}"), rate(res, f"latL/{name}")
        ok = all(res[f"{k}/{name}"].get("checks_ok") for k in ("lat0", "latL"))
        rows.append([LABELS[name], H.fmt_rate(z), H.fmt_rate(s), fmt_x(ratio(s, z)), "ok" if ok else "WRONG"])
    return H.markdown_table(["loader", "0 ms / file: samples/s", f"{cfg['latency_ms']} ms / file: samples/s",
                             "ratio", "exactly once"], rows)


def memory_table(res: Dict[str, dict], cfg: dict) -> str:
    rows = []
    for name in ("pyloader-w0", "pyloader-w2", "pyloader-w0+mt"):
        a, b = res[f"mem1x/{name}"], res[f"mem8x/{name}"]
        if "error" in a or "error" in b:
            rows.append([LABELS[name], "FAILED"] + ["-"] * 7)
            continue
        rows.append([LABELS[name], H.fmt_mb(a["peak_rss"]), H.fmt_mb(b["peak_rss"]),
                     fmt_x(ratio(b["peak_rss"], a["peak_rss"])), H.fmt_mb(a["peak_pss"]), H.fmt_mb(b["peak_pss"]),
                     fmt_x(ratio(b["peak_pss"], a["peak_pss"])),
                     f"{H.fmt_mb(a['growth_rss'])} / {H.fmt_mb(b['growth_rss'])}",
                     f"{H.fmt_rate(a['samples_per_s'])} / {H.fmt_rate(b['samples_per_s'])}"])
    f = cfg["mem_factor"]
    table = H.markdown_table(["loader", "1x peak RSS (MB)", f"{f}x peak RSS (MB)", "ratio", "1x peak PSS (MB)",
                              f"{f}x peak PSS (MB)", "ratio", f"RSS growth over baseline 1x / {f}x (MB)",
                              f"samples/s 1x / {f}x"], rows)
    lines = [table, "", f"Tree RSS (MB) read by the consumer each time another quarter of the 1x data has gone by, "
             f"in the fastest {f}x run (does memory keep growing with the data, or level off?):", ""]
    for name in ("pyloader-w0", "pyloader-w2", "pyloader-w0+mt"):
        b = res[f"mem8x/{name}"]
        cps = b.get("rss_checkpoints") or []
        lines.append(f"- {LABELS[name]}: " + (" ".join(f"{c / H.MB:.0f}" for c in cps) if cps else "-"))
    return "\n".join(lines)


def first_batch_table(res: Dict[str, dict]) -> str:
    rows = []
    for e in SECTIONS["json"] + SECTIONS["npy"]:
        r = res[e]
        fb = "-" if "error" in r else f"{r['first_batch_s']:.3f}"
        rows.append([e.split("/")[0], LABELS.get(e.split("/")[1], e), fb])
    return H.markdown_table(["data", "loader", "first batch (s)"], rows, "llr")


def targets(res: Dict[str, dict], cfg: dict) -> List[Tuple[str, Optional[float], str, Optional[bool]]]:
    """(what, measured, goal, met) for each of the issue's targets."""
    out: List[Tuple[str, Optional[float], str, Optional[bool]]] = []

    def add(what: str, value: Optional[float], goal: float, at_least: bool = True, unit: str = "x") -> None:
        met = None if value is None else (value >= goal if at_least else value <= goal)
        out.append((what, value, f"{'>=' if at_least else '<='} {goal}{unit}", met))

    py2 = rate(res, "json/pyloader-w2")
    add("(1) JSONL: pyloader default settings / plain loop", ratio(rate(res, "json/pyloader-default"),
                                                                   rate(res, "json/plain")), 1.0)
    add("(1) JSONL: pyloader 2 workers / plain loop", ratio(py2, rate(res, "json/plain")), 1.8)
    add("(1) JSONL: pyloader 2 workers / torch DataLoader 2 workers", ratio(py2, rate(res, "json/torch-w2")), 2.0)
    add("(2) npy: pyloader default settings / raw np.load loop",
        ratio(rate(res, "npy/pyloader-default"), rate(res, "npy/raw-np.load")), 0.9)
    for w in ("w0", "w2"):
        add(f"(2) npy: pyloader {w[1]} workers / raw np.load loop",
            ratio(rate(res, f"npy/pyloader-{w}"), rate(res, "npy/raw-np.load")), 0.9)
    add(f"(3) {cfg['latency_ms']} ms/file: pyloader 2 workers / its 0 ms figure",
        ratio(rate(res, "latL/pyloader-w2"), rate(res, "lat0/pyloader-w2")), 0.8)
    for w in ("w0", "w2"):
        a, b = res[f"mem1x/pyloader-{w}"], res[f"mem8x/pyloader-{w}"]
        for m in ("rss", "pss"):
            v = None if "error" in a or "error" in b else ratio(b[f"peak_{m}"], a[f"peak_{m}"])
            add(f"(4) pyloader {w[1]} workers: {cfg['mem_factor']}x-data peak {m.upper()} / 1x", v, 1.1, False)
    a, b = res["mem1x/pyloader-w0+mt"], res["mem8x/pyloader-w0+mt"]
    for m in ("rss", "pss"):
        v = None if "error" in a or "error" in b else ratio(b[f"peak_{m}"], a[f"peak_{m}"])
        add(f"(4, diagnosis, not the default set-up) pyloader 0 workers with MALLOC_MMAP_THRESHOLD_=1 MiB: "
            f"{cfg['mem_factor']}x peak {m.upper()} / 1x", v, 1.1, False)
    for e in ("json/pyloader-w0", "json/pyloader-w2", "npy/pyloader-w0", "npy/pyloader-w2"):
        r = res[e]
        add(f"(5) first batch, {e}", None if "error" in r else r["first_batch_s"], 0.5, False, " s")
    return out


def targets_table(ts) -> str:
    rows = []
    for what, value, goal, met in ts:
        v = "-" if value is None else (f"{value:.3f} s" if goal.endswith(" s") else f"{value:.2f}x")
        rows.append([what, v, goal, {True: "yes", False: "**no**", None: "-"}[met]])
    return H.markdown_table(["target", "measured", "goal", "met"], rows, "lrrc")


def results_markdown(res: Dict[str, dict], cfg: dict, args: argparse.Namespace, machine: str,
                     wall: float, cores: List[float]) -> str:
    size = "quick (smoke-run sizes)" if args.quick else "full"
    parts = [
        f"Run of `python benchmarks/bench_loaders.py{' --quick' if args.quick else ''}"
        f"{' --write' if args.write else ''}` "
        f"on {time.strftime('%Y-%m-%d %H:%M')} ({size}; {args.repeats} runs per entry, best throughput "
        f"and first batch, largest peak memory; {wall / 60:.1f} min in all).",
        f"Machine: {machine}; load average at the end {os.getloadavg()[0]:.2f} (the machine is shared "
        "with other jobs: see the README's caveats). Effective cores free to this run (two spinning "
        "processes against one), before each round and at the end: "
        + ", ".join(f"{c:.2f}" for c in cores) + " (2.00 = both cores free).",
        f"Data: (1) {cfg['json_files']} JSONL files x {cfg['json_lines']:,} lines x {cfg['json_ints']} ints, "
        f"batch {cfg['json_batch']}, one pass; (2) {cfg['npy_files']} `.npy` files x {cfg['npy_rows']:,} rows x "
        f"{cfg['npy_cols']} float32, batch {cfg['npy_batch']}, {cfg['npy_epochs']} passes (one pass takes "
        f"only a fraction of a second); (4) one pass over the files of (2) and over {cfg['mem_factor']}x as many "
        f"({cfg['npy_files'] * cfg['mem_factor']} files of the same size).",
        "### (1) JSONL parsed by Python user code", section_table(res, SECTIONS["json"], "json/plain", "plain loop"),
        "### (2) `.npy` float32 chunks", section_table(res, SECTIONS["npy"], "npy/raw-np.load", "raw np.load"),
        f"### (3) {cfg['latency_ms']} ms latency per file read (data of 1, `LatencyFileSystem`)",
        latency_table(res, cfg),
        "### (4) Peak memory of the whole process tree, 1x and "
        f"{cfg['mem_factor']}x the data of (2)", memory_table(res, cfg),
        "### (5) Time to first batch (from building the loader to holding its first batch)",
        first_batch_table(res),
        "### Targets", targets_table(targets(res, cfg)),
        "Throughput samples of every run (samples/s): " + "; ".join(
            f"{e}: {', '.join(f'{x:,.0f}' for x in r.get('all_samples_per_s', []))}" for e, r in res.items()) + ".",
    ]
    return "\n\n".join(parts)


def plot(res: Dict[str, dict], cfg: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8), gridspec_kw={"width_ratios": [1.2, 1.2, 1]})
    for ax, sec, title in ((axes[0], "json", "(1) JSONL + Python user code"),
                           (axes[1], "npy", "(2) .npy float32 chunks")):
        names = [LABELS[e.split("/")[1]] for e in SECTIONS[sec]]
        vals = [rate(res, e) or 0 for e in SECTIONS[sec]]
        colors = ["tab:orange" if "pyloader" in e else "tab:gray" for e in SECTIONS[sec]]
        ax.barh(range(len(vals)), vals, color=colors)
        ax.set_yticks(range(len(vals)), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("samples/s (higher is better)")
        ax.set_title(title, fontsize=10)
        for i, v in enumerate(vals):
            ax.text(v, i, f" {v:,.0f}" + ("  (FAILED)" if not v else ""), va="center", fontsize=7)
        ax.set_xlim(0, max(vals + [1]) * 1.25)
        scale, unit = (1e6, "M") if max(vals + [1]) >= 2e6 else (1e3, "k")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
            lambda x, _, scale=scale, unit=unit: f"{x / scale:g}{unit}"))
    ax = axes[2]
    names = ["pyloader-w2", "torch-w2", "pyloader-w0"]
    zero = [rate(res, f"lat0/{n}") or 0 for n in names]
    slow = [rate(res, f"latL/{n}") or 0 for n in names]
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], zero, 0.4, label="0 ms / file", color="tab:blue")
    ax.bar([x + 0.2 for x in xs], slow, 0.4, label=f"{cfg['latency_ms']} ms / file", color="tab:red")
    ax.set_xticks(list(xs), [LABELS[n].replace(", ", "\n") for n in names], fontsize=8)
    ax.set_ylabel("samples/s")
    ax.set_title(f"(3) JSONL behind {cfg['latency_ms']} ms per file read", fontsize=10)
    ax.legend(fontsize=8)
    fig.suptitle("pyloader benchmarks (2-core CPU machine, shared): samples/s, best of runs", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ==================================================================================================
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    H.common_args(ap, "rewrite benchmarks/README.md results, draw the plot", "3 full, 1 quick", RESULTS_JSON)
    ap.add_argument("--only", default=None, help="comma-separated sections: json,npy,latency,memory")
    args = ap.parse_args()
    if H.child_or_replot(args, child, RESULTS_JSON, plot, os.path.join(REPO, "img", "bench_throughput.png")):
        return
    cfg = SIZES["quick" if args.quick else "full"]
    args.repeats = args.repeats or (1 if args.quick else 3)
    sections = args.only.split(",") if args.only else list(SECTIONS)
    if args.write and args.only:
        ap.error("--write needs every section (leave out --only)")
    machine = H.machine_line() + "; code measured: " + H.source_digest(os.path.join(REPO, "pyloader"))
    print(f"machine: {machine}")
    t_all = time.perf_counter()
    data = tempfile.mkdtemp(prefix="pyloader-bench-")
    res: Dict[str, dict] = {}
    cores: List[float] = []
    try:
        generate(data, cfg, print)
        entries = [e for s in sections for e in SECTIONS[s]]
        runs: Dict[str, List[dict]] = {e: [] for e in entries}
        for rep in range(args.repeats):
            cores.append(H.effective_cores())
            print(f"-- round {rep + 1}/{args.repeats} (effective cores free now: {cores[-1]:.2f})")
            for e in entries:
                argv = [os.path.abspath(__file__), "--child", e, "--data", data, "--cfg", json.dumps(cfg)]
                pss_every = 0.02 if e.startswith("mem") else H.PSS_EVERY_S
                env = MALLOC_ENV if e.endswith("+mt") else None
                runs[e].append(H.measure(e, argv, 1, args.timeout, env=env, pss_every=pss_every))
        res = {e: H.best_of(rs) if len(rs) > 1 else rs[0] for e, rs in runs.items()}
        for e, r in res.items():
            r.setdefault("all_samples_per_s", [round(x["samples_per_s"], 1) for x in runs[e] if "error" not in x])
        cores.append(H.effective_cores())
    finally:
        shutil.rmtree(data, ignore_errors=True)
    wall = time.perf_counter() - t_all
    for e in [e for s in SECTIONS for e in SECTIONS[s]]:
        res.setdefault(e, {"error": "not run"})
    md = results_markdown(res, cfg, args, machine, wall, cores)
    print()
    print(md)
    if args.write:
        H.write_results("bench_loaders", md, RESULTS_JSON, {"cfg": cfg, "machine": machine, "results": res}, plot,
                        os.path.join(REPO, "img", "bench_throughput.png"))


if __name__ == "__main__":
    main()
