#!/usr/bin/env python
"""pyloader's defaults against the loaders users pick instead, on real workloads (issue 30).

    python benchmarks/bench_real.py                 # moderate size, 3 rounds, prints the table
    python benchmarks/bench_real.py --quick         # small data, 1 round: a smoke run
    python benchmarks/bench_real.py --write         # also writes benchmarks/results/bench_real.{json,md}
                                                    # and the "Real workloads" section of benchmarks/README.md
    python benchmarks/bench_real.py --workload tok --contender plain --contender pyloader

Workloads, made at start-up in a temporary folder (nothing downloaded):

* ``tok``: JSON-lines text files; an HF ``tokenizers`` BPE trained on the spot on that text;
  the user code json-parses each line and ``encode_batch``es the texts (Rust, releases the
  GIL, runs its own thread pool), padded to 64 ids;
* ``jpeg``: tar shards of 96x96 JPEGs with a class; decode (Pillow), random 64x64 crop and
  flip (NumPy), scale to float CHW;
* ``parquet``: Parquet files of a string column and an int column; the string is looked
  up in a Python dict (the vocabulary), both become tensors;
* ``text``: text lines of 32 integers parsed by Python ``int()``;
* ``npy``: ``.npy`` float32 chunks, sliced into batches.

Contenders, each in its own process and written the way its own docs teach:
``plain`` (a loop: read a file, cut batches, encode, ``torch.from_numpy``); ``pyloader``
(its defaults: ``num_workers="auto"``, the built-in readers and collators where they
exist); torch ``DataLoader`` with 0 and 2 workers (an ``IterableDataset`` sharded by file
with ``get_worker_info``, the encode in ``collate_fn``); HF ``datasets`` streaming
(``load_dataset(..., streaming=True).map(batched=True)``, ``with_format("torch")``, a torch
``DataLoader`` with 2 workers); Grain (``MapDataset.source(files).map(read)``,
``to_iter_dataset``, a flat map to samples, ``batch``, ``mp_prefetch`` with 2 workers);
webdataset (``WebDataset(...).decode("rgb8")``, ``batched``, ``WebLoader`` with 2 workers)
for the tar shards. A peer that is not installed is left out, saying so.

Every run counts its samples against the data's (a wrong count is shown, not hidden). The
rounds go over every entry in turn; each entry's figure is the median epoch time of its
rounds; ratios are epoch time of the contender / epoch time of pyloader's defaults
(> 1: pyloader faster).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import tarfile
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import _harness as H
from _harness import HERE

RESULTS = os.path.join(HERE, "results")
SIZES = {
    "moderate": dict(files=16, tok_lines=1_000, jpeg_per_shard=250, parquet_rows=50_000, text_lines=10_000,
                     npy_rows=100_000, batch=256),
    "quick": dict(files=4, tok_lines=300, jpeg_per_shard=40, parquet_rows=5_000, text_lines=2_000,
                  npy_rows=10_000, batch=64),
}
WORKLOADS = ["tok", "jpeg", "parquet", "text", "npy"]
CONTENDERS = ["plain", "pyloader", "torch-w0", "torch-w2", "hf", "grain", "wds"]
PEER_MODULE = {"hf": "datasets", "grain": "grain", "wds": "webdataset"}
APPLIES = {"hf": {"tok", "jpeg", "parquet", "text"}, "wds": {"jpeg"}}
LABELS = {"plain": "plain loop", "pyloader": "pyloader defaults", "torch-w0": "torch DataLoader, 0 workers",
          "torch-w2": "torch DataLoader, 2 workers", "hf": "HF datasets streaming + DataLoader(2)",
          "grain": "Grain mp_prefetch(2)", "wds": "webdataset WebLoader(2)"}
SEQ, CROP, WORDS = 64, 64, [f"w{i}{s}" for i in range(300) for s in ("", "ing", "ed")]


# ==================================================================================================
# The data
# ==================================================================================================
def make_data(root: str, cfg: dict, workloads: List[str]) -> Dict[str, int]:
    """Write each workload's files under ``root/<workload>``; the number of samples of each."""
    import numpy as np

    gen = np.random.default_rng(0)
    counts = {}
    for w in workloads:
        folder = os.path.join(root, w)
        os.makedirs(folder)
        counts[w] = {"tok": _make_tok, "jpeg": _make_jpeg, "parquet": _make_parquet, "text": _make_text,
                     "npy": _make_npy}[w](folder, cfg, gen)
    return counts


def _make_tok(folder: str, cfg: dict, gen) -> int:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    texts = []
    for f in range(cfg["files"]):
        with open(os.path.join(folder, f"part-{f:04d}.jsonl"), "w") as out:
            for i in range(cfg["tok_lines"]):
                text = " ".join(WORDS[k] for k in gen.integers(len(WORDS), size=int(gen.integers(20, 80))))
                texts.append(text)
                out.write(json.dumps({"text": text, "label": int(i % 7)}) + "\n")
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts[:5000], trainers.BpeTrainer(vocab_size=2000, special_tokens=["[UNK]", "[PAD]"],
                                                              show_progress=False))
    tok.save(os.path.join(os.path.dirname(folder), "tokenizer.json"))
    return cfg["files"] * cfg["tok_lines"]


def _make_jpeg(folder: str, cfg: dict, gen) -> int:
    from PIL import Image

    for s in range(cfg["files"]):
        with tarfile.open(os.path.join(folder, f"shard-{s:04d}.tar"), "w") as tar:
            for i in range(cfg["jpeg_per_shard"]):
                pixels = gen.integers(0, 255, size=(96, 96, 3), dtype="uint8")
                out = io.BytesIO()
                Image.fromarray(pixels).save(out, format="JPEG", quality=90)
                for ext, data in (("jpg", out.getvalue()), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"{s:04d}{i:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return cfg["files"] * cfg["jpeg_per_shard"]


def _make_parquet(folder: str, cfg: dict, gen) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = cfg["parquet_rows"]
    for f in range(cfg["files"]):
        cats = [WORDS[k] for k in gen.integers(len(WORDS), size=n)]
        pq.write_table(pa.table({"cat": cats, "value": gen.integers(0, 1000, size=n)}),
                       os.path.join(folder, f"part-{f:04d}.parquet"))
    return cfg["files"] * n


def _make_text(folder: str, cfg: dict, gen) -> int:
    for f in range(cfg["files"]):
        rows = gen.integers(0, 10_000, size=(cfg["text_lines"], 32))
        with open(os.path.join(folder, f"part-{f:04d}.txt"), "w") as out:
            out.write("".join(" ".join(map(str, r)) + "\n" for r in rows.tolist()))
    return cfg["files"] * cfg["text_lines"]


def _make_npy(folder: str, cfg: dict, gen) -> int:
    import numpy as np

    for f in range(cfg["files"]):
        np.save(os.path.join(folder, f"part-{f:04d}.npy"), gen.random((cfg["npy_rows"], 64), dtype=np.float32))
    return cfg["files"] * cfg["npy_rows"]


# ==================================================================================================
# The user code: one read and one encode per workload, shared by the contenders that take user code
# ==================================================================================================
class Work:
    """A workload's user code: ``read(path) -> (columns, n)`` and ``encode(columns) -> arrays``."""

    def __init__(self, name: str, data: str) -> None:
        self.name, self.data = name, data
        self._tokenizer: Any = None
        self.vocab = {w: i for i, w in enumerate(WORDS)}

    def files(self) -> List[str]:
        folder = os.path.join(self.data, self.name)
        return sorted(os.path.join(folder, f) for f in os.listdir(folder))

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(os.path.join(self.data, "tokenizer.json"))
            self._tokenizer.enable_padding(pad_id=1, length=SEQ)
            self._tokenizer.enable_truncation(SEQ)
        return self._tokenizer

    def read(self, path: str) -> Tuple[Dict[str, list], int]:
        return getattr(self, f"read_{self.name}")(path)

    def encode(self, cols: Dict[str, Any]) -> Dict[str, Any]:
        return getattr(self, f"encode_{self.name}")(cols)

    # -- per workload
    def read_tok(self, path: str):
        texts, labels = [], []
        with open(path, encoding="utf-8") as f:
            for line in f:
                obj = json.loads(line)
                texts.append(obj["text"])
                labels.append(obj["label"])
        return {"text": texts, "label": labels}, len(texts)

    def encode_tok(self, cols):
        import numpy as np

        ids = np.array([e.ids for e in self.tokenizer.encode_batch(list(cols["text"]))], dtype=np.int64)
        return {"input_ids": ids, "label": np.asarray(cols["label"], dtype=np.int64)}

    def read_jpeg(self, path: str):
        jpgs, classes = [], []
        with tarfile.open(path) as tar:
            for m in tar:
                data = tar.extractfile(m).read()
                (jpgs if m.name.endswith(".jpg") else classes).append(data)
        return {"jpg": jpgs, "cls": [int(c) for c in classes]}, len(jpgs)

    def encode_jpeg(self, cols):
        import numpy as np
        from PIL import Image

        gen = np.random.default_rng(len(cols["cls"]))
        out = []
        for img in cols["jpg"]:
            a = img if isinstance(img, np.ndarray) else np.asarray(Image.open(io.BytesIO(img)).convert("RGB"))
            out.append(augment(a, gen))
        return {"jpg": np.stack(out), "cls": np.asarray(cols["cls"], dtype=np.int64)}

    def read_parquet(self, path: str):
        import pyarrow.parquet as pq

        t = pq.read_table(path)
        return {"cat": t.column("cat").to_pylist(), "value": t.column("value").to_numpy()}, t.num_rows

    def encode_parquet(self, cols):
        import numpy as np

        vocab = self.vocab
        return {"cat": np.array([vocab[c] for c in cols["cat"]], dtype=np.int64),
                "value": np.asarray(cols["value"], dtype=np.int64)}

    def read_text(self, path: str):
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        return {"text": lines}, len(lines)

    def encode_text(self, cols):
        import numpy as np

        return {"x": np.array([[int(v) for v in line.split()] for line in cols["text"]], dtype=np.int64)}

    def read_npy(self, path: str):
        import numpy as np

        arr = np.load(path)
        return {"x": arr}, len(arr)

    def encode_npy(self, cols):
        import numpy as np

        return {"x": np.asarray(cols["x"])}


def augment(a, gen):
    """Random CROP x CROP crop, random left-right flip, float CHW in [0, 1]."""
    y, x = gen.integers(0, a.shape[0] - CROP + 1), gen.integers(0, a.shape[1] - CROP + 1)
    a = a[y:y + CROP, x:x + CROP]
    if gen.random() < 0.5:
        a = a[:, ::-1]
    return (a.transpose(2, 0, 1) / 255.0).astype("float32")


def to_torch(arrays: Dict[str, Any]) -> Dict[str, Any]:
    import torch

    return {k: torch.from_numpy(v) for k, v in arrays.items()}


def batch_len(batch: Dict[str, Any]) -> int:
    return len(next(iter(batch.values())))


def columns_of(samples: List[Dict[str, Any]]) -> Dict[str, list]:
    return {k: [s[k] for s in samples] for k in samples[0]}


# ==================================================================================================
# The contenders: each returns an iterator of batches (dicts of tensors); set-up not timed
# ==================================================================================================
def plain(work: Work, B: int) -> Callable[[], Iterator[dict]]:
    def run():
        for path in work.files():
            cols, n = work.read(path)
            for s in range(0, n, B):
                yield to_torch(work.encode({k: v[s:s + B] for k, v in cols.items()}))

    return run


def torch_loader(work: Work, B: int, workers: int) -> Callable[[], Iterator[dict]]:
    import torch.utils.data as tud

    class Samples(tud.IterableDataset):
        def __iter__(self):
            info = tud.get_worker_info()
            files = work.files()
            for path in files if info is None else files[info.id::info.num_workers]:
                cols, n = work.read(path)
                for i in range(n):
                    yield {k: v[i] for k, v in cols.items()}

    return lambda: iter(tud.DataLoader(Samples(), batch_size=B, num_workers=workers,
                                       collate_fn=lambda s: to_torch(work.encode(columns_of(s)))))


def pyloader_defaults(work: Work, B: int) -> Callable[[], Iterator[dict]]:
    import pyloader as pl
    from pyloader.collators import Images, TorchCollator
    from pyloader.readers import JsonLinesReader, NumpyReader, ParquetReader, TarReader, TextLinesReader

    class Encode(pl.Dataset):
        def batch_encode(self, batch_data):
            return work.encode(batch_data)

    folder = os.path.join(work.data, work.name)
    if work.name == "jpeg":  # the documented way: TarReader decodes, the collator crops and flips
        parts: tuple = (TarReader(batch_size=B, keep=["jpg", "cls"]), pl.IdentityDataset(),
                        TorchCollator(images=Images(["jpg"], size=(CROP, CROP), flip=True)))
    elif work.name == "npy":
        parts = (NumpyReader(batch_size=B), pl.IdentityDataset(), TorchCollator())
    else:
        reader = {"tok": JsonLinesReader, "parquet": ParquetReader, "text": TextLinesReader}[work.name]
        parts = (reader(batch_size=B), Encode(), TorchCollator())
    holder: dict = {}

    def run():
        holder["loader"] = loader = pl.DataLoader(*parts, folder)
        try:
            yield from loader
        finally:
            loader.close()
            holder["placement"] = loader.stats.get("placement")

    run.holder = holder  # type: ignore[attr-defined]
    return run


def hf_streaming(work: Work, B: int) -> Callable[[], Iterator[dict]]:
    import torch.utils.data as tud
    from datasets import load_dataset

    builder = {"tok": "json", "jpeg": "webdataset", "parquet": "parquet", "text": "text"}[work.name]
    ds = load_dataset(builder, data_files=work.files(), split="train", streaming=True)
    if work.name == "jpeg":  # the webdataset builder decodes "jpg" to PIL images
        ds = ds.map(lambda b: work.encode({"jpg": [__import__("numpy").asarray(i.convert("RGB")) for i in b["jpg"]],
                                           "cls": b["cls"]}), batched=True, batch_size=B, remove_columns=["__key__",
                                                                                                       "__url__"])
    else:
        ds = ds.map(work.encode, batched=True, batch_size=B, remove_columns=list(ds.column_names or []))
    ds = ds.with_format("torch")
    return lambda: iter(tud.DataLoader(ds, batch_size=B, num_workers=2))


def grain_loader(work: Work, B: int) -> Callable[[], Iterator[dict]]:
    import grain

    class Rows(grain.experimental.FlatMapTransform):
        max_fan_out = 10 ** 6

        def flat_map(self, read):
            cols, n = read
            return [{k: v[i] for k, v in cols.items()} for i in range(n)]

    ds = grain.MapDataset.source(work.files()).map(work.read).to_iter_dataset()
    ds = grain.experimental.FlatMapIterDataset(ds, Rows())
    ds = ds.batch(B, batch_fn=lambda s: work.encode(columns_of(s)))
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2))
    return lambda: (to_torch(b) for b in ds)


def wds_loader(work: Work, B: int) -> Callable[[], Iterator[dict]]:
    import webdataset as wds

    ds = (wds.WebDataset(work.files(), shardshuffle=False, empty_check=False).decode("rgb8").to_tuple("jpg", "cls")
          .batched(B, partial=True).map(lambda b: to_torch(work.encode({"jpg": list(b[0]), "cls": list(b[1])}))))
    return lambda: iter(wds.WebLoader(ds, batch_size=None, num_workers=2))


def build(contender: str, work: Work, B: int) -> Callable[[], Iterator[dict]]:
    if contender.startswith("torch-w"):
        return torch_loader(work, B, int(contender[-1]))
    return {"plain": plain, "pyloader": pyloader_defaults, "hf": hf_streaming, "grain": grain_loader,
            "wds": wds_loader}[contender](work, B)


# ==================================================================================================
# A child run and the parent
# ==================================================================================================
def child(entry: str, data: str, cfg: dict) -> None:
    import gc

    import torch  # noqa: F401  (every contender hands torch tensors to the loop)

    workload, contender = entry.split("/")
    make = build(contender, Work(workload, data), cfg["batch"])
    baseline = H.own_memory()
    gc.collect()
    n = batches = 0
    first = None
    t0 = time.perf_counter()
    for batch in make():
        if first is None:
            first = time.perf_counter() - t0
        n += batch_len(batch)
        batches += 1
    elapsed = time.perf_counter() - t0
    placement = getattr(make, "holder", {}).get("placement")
    H.report({"entry": entry, "samples": n, "batches": batches, "seconds": elapsed, "samples_per_s": n / elapsed,
              "first_batch_s": first or 0.0, "baseline": baseline, "checks_ok": n == cfg["expected"][workload],
              "placement": placement})


def installed(contender: str) -> Optional[str]:
    """None when the contender's package imports, else why not."""
    module = PEER_MODULE.get(contender)
    if module is None:
        return None
    import importlib.util

    return None if importlib.util.find_spec(module) else f"{module} is not installed (pip install pyloader-ml[bench])"


def table(res: Dict[str, dict], workloads: List[str], contenders: List[str], skipped: Dict[str, str]) -> str:
    def cell(w: str, c: str) -> str:
        r = res.get(f"{w}/{c}")
        if c in skipped:
            return "n/a (not installed)"
        if r is None:
            return "n/a"
        if "error" in r:
            return "failed"
        mine = res.get(f"{w}/pyloader", {}).get("median_s")
        ratio = f" ({r['median_s'] / mine:.2f}x)" if mine and c != "pyloader" else ""
        count = "" if r["checks_ok"] else f" **count {r['samples']:,} != {r['expected']:,}**"
        return f"{r['median_s']:.2f} s{ratio}{count}"

    rows = [[w] + [cell(w, c) for c in contenders] for w in workloads]
    return H.markdown_table(["workload"] + [LABELS[c] for c in contenders], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small data, 1 round: a smoke run")
    ap.add_argument("--repeats", type=int, help="rounds (default 3; 1 with --quick); the median is kept")
    ap.add_argument("--workload", action="append", choices=WORKLOADS, help="repeatable; default: all")
    ap.add_argument("--contender", action="append", choices=CONTENDERS, help="repeatable; default: all")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the number of files (default 1)")
    H.child_args(ap, 600, "write benchmarks/results/bench_real.{json,md} and the README's Real workloads section")
    args = ap.parse_args()
    if H.run_child_if_asked(args, child):
        return
    cfg = dict(SIZES["quick" if args.quick else "moderate"])
    cfg["files"] = max(1, round(cfg["files"] * args.scale))
    repeats = args.repeats or (1 if args.quick else 3)
    workloads = args.workload or WORKLOADS
    skipped = {c: why for c in CONTENDERS if (why := installed(c))}
    for c, why in skipped.items():
        print(f"left out: {LABELS[c]}: {why}")
    contenders = [c for c in args.contender or CONTENDERS]
    entries = [f"{w}/{c}" for w in workloads for c in contenders
               if c not in skipped and w in APPLIES.get(c, set(WORKLOADS))]
    machine = H.machine_line()
    print(f"machine: {machine}")
    data = tempfile.mkdtemp(prefix="pyloader-real-bench-")
    runs: Dict[str, List[dict]] = {e: [] for e in entries}
    t_all = time.perf_counter()
    try:
        t = time.perf_counter()
        cfg["expected"] = make_data(data, cfg, workloads)
        print(f"data made in {time.perf_counter() - t:.1f} s: {cfg['expected']}")
        cores = []
        for rep in range(repeats):
            cores.append(H.effective_cores())
            print(f"-- round {rep + 1}/{repeats} (effective cores free: {cores[-1]:.2f})")
            for e in entries:
                argv = [os.path.abspath(__file__), "--child", e, "--data", data, "--cfg", json.dumps(cfg)]
                r = H.run_child(argv, args.timeout)
                runs[e].append(r)
                print(f"  {e:<22} " + (f"FAILED: {r['error']}\n{r.get('stderr', '')[-1500:]}" if "error" in r else
                                       f"{r['seconds']:7.2f} s  {r['samples']:>8,} samples"
                                       f"{'' if r['checks_ok'] else ' WRONG COUNT'}"
                                       + (f"  placement {r['placement']}" if r.get("placement") else "")))
    finally:
        shutil.rmtree(data, ignore_errors=True)
    res: Dict[str, dict] = {}
    for e, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            res[e] = rs[-1]
            continue
        res[e] = dict(ok[-1], median_s=statistics.median(r["seconds"] for r in ok),
                      all_s=[round(r["seconds"], 3) for r in ok], checks_ok=all(r["checks_ok"] for r in ok),
                      expected=cfg["expected"][e.split("/")[0]])
    shown = [c for c in contenders if c in skipped or any(f"{w}/{c}" in res for w in workloads)]
    md = "\n\n".join([
        f"Run of `python benchmarks/bench_real.py{' --quick' if args.quick else ''}` on "
        f"{time.strftime('%Y-%m-%d %H:%M')} ({repeats} rounds, median epoch time; "
        f"{(time.perf_counter() - t_all) / 60:.1f} min in all).",
        f"Machine: {machine}; effective cores before each round: {', '.join(f'{c:.2f}' for c in cores)}.",
        f"Data: {cfg['files']} files per workload, batch {cfg['batch']}; samples: "
        + ", ".join(f"{w} {n:,}" for w, n in cfg["expected"].items()) + ". Each cell: median epoch time, and in "
        "brackets that time over pyloader's (> 1: pyloader faster).",
        table(res, workloads, shown, skipped),
    ])
    print()
    print(md)
    if args.write:
        os.makedirs(RESULTS, exist_ok=True)
        with open(os.path.join(RESULTS, "bench_real.json"), "w") as f:
            json.dump({"cfg": cfg, "machine": machine, "results": res}, f, indent=1, sort_keys=True)
        with open(os.path.join(RESULTS, "bench_real.md"), "w") as f:
            f.write(md + "\n")
        H.replace_section(os.path.join(HERE, "README.md"), "bench_real", md)
        print("\nwrote benchmarks/results/bench_real.{json,md} and benchmarks/README.md (bench_real section)")


if __name__ == "__main__":
    main()
