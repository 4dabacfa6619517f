#!/usr/bin/env python
"""pyloader's defaults against the loaders users pick instead, on real workloads (issue 30).

    python benchmarks/bench_real.py                 # moderate size, 3 rounds, prints the table
    python benchmarks/bench_real.py --quick         # small data, 1 round: a smoke run
    python benchmarks/bench_real.py --write         # also writes benchmarks/results/bench_real.{json,md}
                                                    # and the "Real workloads" section of benchmarks/README.md
    python benchmarks/bench_real.py --workload tok --contender plain --contender pyloader
    python benchmarks/bench_real.py --quick --scale 0.25 --workload tok --contender mosaic --json /tmp/r.json
                                                    # 1 file a workload: seconds; every figure as JSON

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
exist), and ``pyloader-w0``/``-w1``/``-w2`` (the same with 0, 1 or 2 worker processes given: the
settings the default must come within 5% of, issue 50); torch ``DataLoader`` with 0 and 2
workers (an ``IterableDataset`` sharded by file with ``get_worker_info``, the encode in
``collate_fn``); HF ``datasets`` streaming (``load_dataset(..., streaming=True).map(batched=True)``,
``with_format("torch")``, a torch ``DataLoader`` with 2 workers); Grain (``MapDataset.source(files).map(read)``,
``to_iter_dataset``, a flat map to samples, ``batch``, ``mp_prefetch`` with 2 workers);
webdataset (``WebDataset(...).decode("rgb8")``, ``batched``, ``WebLoader`` with 2 workers)
for the tar shards; Mosaic streaming (``StreamingDataset(local=...)`` in a torch ``DataLoader``
with 2 workers, the encode in ``collate_fn``) and LitData (``StreamingDataset`` in its
``StreamingDataLoader`` with 2 workers, likewise), each on a copy of the data in its own format
(MDS written by one ``MDSWriter``; ``litdata.optimize``), written once from the same samples
before the rounds, outside the clock, and kept in the data folder; Ray Data (a local Ray
started before the clock, ``ray.data.read_json/read_webdataset/read_parquet/read_text/read_numpy``
on the files, the encode in ``map_batches``, ``iter_batches``). A peer that is not installed is
left out, saying so (install lines in benchmarks/README.md).

Every run counts its samples against the data's (a wrong count is shown, not hidden). The
rounds go over every entry in turn; each entry's figure is the median epoch time of its
rounds; ratios are epoch time of the contender / epoch time of pyloader's defaults
(> 1: pyloader faster). Beside each time: the peak RSS summed over the contender's process
tree (``_harness.TreeMonitor``: the child and all its descendants, every 20 ms), the largest
of the rounds; the JSON has the PSS too.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import shutil
import statistics
import sys
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
CONTENDERS = ["plain", "pyloader", "pyloader-w0", "pyloader-w1", "pyloader-w2", "torch-w0",
              "torch-w2", "hf", "grain", "wds", "mosaic", "litdata", "ray"]
PEER_MODULE = {"hf": "datasets", "grain": "grain", "wds": "webdataset", "mosaic": "streaming", "litdata": "litdata",
               "ray": "ray"}
APPLIES = {"hf": {"tok", "jpeg", "parquet", "text"}, "wds": {"jpeg"}}
CONVERTED = ("mosaic", "litdata")  # read from their own format, written once from the data before the rounds
LABELS = {"plain": "plain loop", "pyloader": "pyloader defaults", "pyloader-w0": "pyloader, 0 workers (threads)",
          "pyloader-w1": "pyloader, 1 worker", "pyloader-w2": "pyloader, 2 workers",
          "torch-w0": "torch DataLoader, 0 workers",
          "torch-w2": "torch DataLoader, 2 workers", "hf": "HF datasets streaming + DataLoader(2)",
          "grain": "Grain mp_prefetch(2)", "wds": "webdataset WebLoader(2)",
          "mosaic": "Mosaic StreamingDataset + DataLoader(2)", "litdata": "LitData StreamingDataLoader(2)",
          "ray": "Ray Data map_batches + iter_batches"}
RAY_READ = {"tok": "read_json", "jpeg": "read_webdataset", "parquet": "read_parquet", "text": "read_text",
            "npy": "read_numpy"}
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


def collate(work: Work) -> Callable[[List[Dict[str, Any]]], Dict[str, Any]]:
    """The ``collate_fn`` of the torch-style loaders: a list of samples through the workload's encode."""
    return lambda samples: to_torch(work.encode(columns_of(samples)))


# ==================================================================================================
# The peers' own formats: written once per workload from the same files, before the rounds (not timed)
# ==================================================================================================
def converted(data: str, workload: str, contender: str) -> str:
    return os.path.join(data, f"{workload}.{contender}")


def samples_of(path: str) -> Iterator[Dict[str, Any]]:
    """The samples of one data file (``data/<workload>/<file>``) as the workload's ``read`` gives them, NumPy
    scalars made Python ones: what the peers' writers store, for the same ``encode`` to run on when read."""
    import numpy as np

    folder = os.path.dirname(path)
    cols, n = Work(os.path.basename(folder), os.path.dirname(folder)).read(path)
    for i in range(n):
        yield {k: v[i].item() if isinstance(v[i], np.generic) else v[i] for k, v in cols.items()}


def mds_columns(sample: Dict[str, Any]) -> Dict[str, str]:
    """Mosaic's column encodings for a sample of ``samples_of``."""
    def encoding(value: Any) -> str:
        if isinstance(value, (bytes, str)):
            return type(value).__name__
        return "int" if isinstance(value, int) else f"ndarray:{value.dtype.name}"

    return {k: encoding(v) for k, v in sample.items()}


def convert_mosaic(work: Work, out: str) -> None:
    """One ``MDSWriter`` over the files in order (Mosaic's conversion guide, one process)."""
    H.mosaic_importable()
    from streaming import MDSWriter

    samples = (sample for path in work.files() for sample in samples_of(path))
    first = next(samples)
    with MDSWriter(out=out, columns=mds_columns(first)) as writer:
        writer.write(first)
        for sample in samples:
            writer.write(sample)


def convert_litdata(work: Work, out: str) -> None:
    """``optimize`` with one input per data file (``samples_of`` yields its samples), 2 worker processes."""
    from litdata import optimize

    H.litdata_cache_in(work.data)
    optimize(fn=samples_of, inputs=work.files(), output_dir=out, num_workers=2, chunk_bytes="64MB")


def prepare(workload: str, contender: str, data: str) -> Dict[str, Any]:
    """Convert ``workload`` into ``contender``'s format once (kept in the data folder for every round)."""
    out = converted(data, workload, contender)
    t = time.perf_counter()
    if not os.path.exists(out):
        {"mosaic": convert_mosaic, "litdata": convert_litdata}[contender](Work(workload, data), out)
    return {"entry": f"{workload}/{contender}", "seconds": time.perf_counter() - t}


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

    return lambda: iter(tud.DataLoader(Samples(), batch_size=B, num_workers=workers, collate_fn=collate(work)))


def pyloader_defaults(work: Work, B: int, workers: Optional[int] = None) -> Callable[[], Iterator[dict]]:
    """pyloader's defaults, or with ``workers`` worker processes given (0: threads of this process only)."""
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
        given = {} if workers is None else {"workers": pl.Workers(workers)}
        holder["loader"] = loader = pl.DataLoader(*parts, folder, **given)
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


def mosaic_loader(work: Work, B: int) -> Callable[[], Iterator[dict]]:
    """Mosaic's ``StreamingDataset`` on the MDS copy, in a torch ``DataLoader`` with 2 workers (its docs)."""
    import torch.utils.data as tud

    H.mosaic_importable()
    from streaming import StreamingDataset

    ds = StreamingDataset(local=converted(work.data, work.name, "mosaic"), shuffle=False, batch_size=B)
    return lambda: iter(tud.DataLoader(ds, batch_size=B, num_workers=2, collate_fn=collate(work)))


def litdata_loader(work: Work, B: int) -> Callable[[], Iterator[dict]]:
    """LitData's ``StreamingDataset`` on the ``optimize``d copy, in its ``StreamingDataLoader`` with 2 workers."""
    from litdata import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(converted(work.data, work.name, "litdata"))
    return lambda: iter(StreamingDataLoader(ds, batch_size=B, num_workers=2, collate_fn=collate(work)))


def ray_loader(work: Work, B: int) -> Callable[[], Iterator[dict]]:
    """Ray Data on a local Ray (started here, not timed) reading the files with its own reader, the encode in
    ``map_batches`` (tasks on the 2 cores), batches from ``iter_batches``."""
    import ray.data

    ray.init(log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False  # bars on a pipe: cost, no reader

    def encode(batch: Dict[str, Any]) -> Dict[str, Any]:  # read_numpy names its column "data"
        return work.encode({"x": batch["data"]} if work.name == "npy" else batch)

    ds = getattr(ray.data, RAY_READ[work.name])(work.files()).map_batches(encode, batch_size=B, batch_format="numpy")
    return lambda: (to_torch(b) for b in ds.iter_batches(batch_size=B, batch_format="numpy"))


def build(contender: str, work: Work, B: int) -> Callable[[], Iterator[dict]]:
    if contender.startswith("torch-w"):
        return torch_loader(work, B, int(contender[-1]))
    if contender.startswith("pyloader-w"):
        return pyloader_defaults(work, B, int(contender[-1]))
    makers = {"plain": plain, "pyloader": pyloader_defaults, "hf": hf_streaming, "grain": grain_loader,
              "wds": wds_loader, "mosaic": mosaic_loader, "litdata": litdata_loader, "ray": ray_loader}
    return makers[contender](work, B)


# ==================================================================================================
# A child run and the parent
# ==================================================================================================
def child(entry: str, data: str, cfg: dict) -> None:
    import gc

    import torch  # noqa: F401  (every contender hands torch tensors to the loop)

    parts = entry.split("/")
    if parts[0] == "prepare":
        H.report(prepare(parts[1], parts[2], data))
        return
    workload, contender = parts
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

    return None if importlib.util.find_spec(module) else f"{module} is not installed (see benchmarks/README.md)"


def cell(r: Optional[dict], mine: Optional[float], pyloader: bool) -> str:
    """One contender on one workload: median time, its ratio to pyloader's, a wrong count."""
    if r is None:
        return "n/a"
    if "error" in r:
        return "failed"
    ratio = f" ({r['median_s'] / mine:.2f}x)" if mine and not pyloader else ""
    count = "" if r["checks_ok"] else f" **count {r['samples']:,} != {r['expected']:,}**"
    return f"{r['median_s']:.2f} s{ratio}{count}"


def memory_cell(r: Optional[dict]) -> str:
    """One contender on one workload: the peaks of its tree, summed RSS / summed PSS, in MB."""
    if r is None or "error" in r:
        return "n/a" if r is None else "failed"
    return f"{H.fmt_mb(r['peak_rss'])} / {H.fmt_mb(r['peak_pss'])}"


def table(res: Dict[str, dict], workloads: List[str], contenders: List[str], skipped: Dict[str, str]) -> str:
    """The time table, then the memory table."""
    def row(w: str) -> List[str]:
        mine = res.get(f"{w}/pyloader", {}).get("median_s")
        return [w] + ["n/a (not installed)" if c in skipped else cell(res.get(f"{w}/{c}"), mine, c == "pyloader")
                      for c in contenders]

    def memory_row(w: str) -> List[str]:
        return [w] + ["n/a" if c in skipped else memory_cell(res.get(f"{w}/{c}")) for c in contenders]

    header = ["workload"] + [LABELS[c] for c in contenders]
    return (H.markdown_table(header, [row(w) for w in workloads]) + "\n\nPeak memory of each process tree, "
            "MB: summed RSS / summed PSS.\n\n" + H.markdown_table(header, [memory_row(w) for w in workloads]))


def child_argv(entry: str, data: str, cfg: dict) -> List[str]:
    return [os.path.abspath(__file__), "--child", entry, "--data", data, "--cfg", json.dumps(cfg)]


def prepare_all(entries: List[str], data: str, cfg: dict, timeout: float) -> Dict[str, dict]:
    """Write the peers' own formats (one child each, before the rounds); the entries whose writing failed."""
    failed = {}
    for e in entries:
        if e.split("/")[1] not in CONVERTED:
            continue
        r = H.run_child(child_argv(f"prepare/{e}", data, cfg), timeout)
        if "error" in r:
            failed[e] = r
            print(f"  {e:<22} conversion FAILED: {r['error']}\n{r.get('stderr', '')[-1500:]}")
        else:
            print(f"  {e:<22} converted in {r['seconds']:.1f} s (not timed)")
    return failed


def log_run(e: str, r: dict) -> None:
    if "error" in r:
        print(f"  {e:<22} FAILED: {r['error']}\n{r.get('stderr', '')[-1500:]}")
        return
    print(f"  {e:<22} {r['seconds']:7.2f} s  {r['samples']:>8,} samples{'' if r['checks_ok'] else ' WRONG COUNT'}"
          f"  peak RSS {H.fmt_mb(r['peak_rss'])} MB" + (f"  placement {r['placement']}" if r.get("placement") else ""))


def run_rounds(entries: List[str], data: str, cfg: dict, repeats: int, timeout: float
               ) -> Tuple[Dict[str, List[dict]], List[float]]:
    """Every entry once a round, ``repeats`` rounds; the runs of each entry and the free cores of each round."""
    runs: Dict[str, List[dict]] = {e: [] for e in entries}
    cores = []
    for rep in range(repeats):
        cores.append(H.effective_cores())
        print(f"-- round {rep + 1}/{repeats} (effective cores free: {cores[-1]:.2f})")
        for e in entries:
            runs[e].append(H.run_child(child_argv(e, data, cfg), timeout))
            log_run(e, runs[e][-1])
    return runs, cores


def summarize(runs: Dict[str, List[dict]], expected: Dict[str, int]) -> Dict[str, dict]:
    """Each entry: its median time over the rounds that worked, its largest peaks, the count checks of them all."""
    res: Dict[str, dict] = {}
    for e, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            res[e] = rs[-1]
            continue
        res[e] = dict(ok[-1], median_s=statistics.median(r["seconds"] for r in ok),
                      all_s=[round(r["seconds"], 3) for r in ok], checks_ok=all(r["checks_ok"] for r in ok),
                      expected=expected[e.split("/")[0]], peak_rss=max(r["peak_rss"] for r in ok),
                      peak_pss=max(r["peak_pss"] for r in ok), all_peak_rss=[r["peak_rss"] for r in ok])
    return res


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small data, 1 round: a smoke run")
    ap.add_argument("--repeats", type=int, help="rounds (default 3; 1 with --quick); the median is kept")
    ap.add_argument("--workload", action="append", choices=WORKLOADS, help="repeatable; default: all")
    ap.add_argument("--contender", action="append", choices=CONTENDERS, help="repeatable; default: all")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply the number of files (default 1; at least 1 file: --quick --scale 0.25 is 1)")
    ap.add_argument("--json", metavar="PATH", help="also write every figure as JSON to PATH")
    H.child_args(ap, 600, "write benchmarks/results/bench_real.{json,md} and the README's Real workloads section")
    return ap.parse_args()


def describe(args: argparse.Namespace, cfg: dict, repeats: int, machine: str, cores: List[float],
             minutes: float) -> List[str]:
    return [
        f"Run of `{shlex.join(['python', 'benchmarks/bench_real.py', *sys.argv[1:]])}` on "
        f"{time.strftime('%Y-%m-%d %H:%M')} ({repeats} rounds, median epoch time; {minutes:.1f} min in all).",
        f"Machine: {machine}; effective cores before each round: {', '.join(f'{c:.2f}' for c in cores)}.",
        f"Data: {cfg['files']} files per workload, batch {cfg['batch']}; samples: "
        + ", ".join(f"{w} {n:,}" for w, n in cfg["expected"].items()) + ". Each cell: median epoch time, in "
        "brackets that time over pyloader's (> 1: pyloader faster). Memory, in the second table: the peaks of the "
        "contender's process tree (its process and every process it starts: loader workers, Ray's processes), "
        f"the largest of the rounds: RSS summed (sampled every {H.RSS_EVERY_S * 1000:.0f} ms; it counts a page "
        "shared by forked processes once in each) and PSS summed (each shared page split between its sharers: "
        f"what the tree takes; sampled every {H.PSS_EVERY_S * 1000:.0f} ms). Mosaic and LitData read their own format, "
        "written from the same files before the rounds (not timed); every contender runs the same encode.",
    ]


def write_outputs(path: Optional[str], cfg: dict, machine: str, res: Dict[str, dict], md: Optional[str]) -> None:
    """The JSON of every figure at ``path``; with ``md`` (``--write``) also the .md and the README section."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"cfg": cfg, "machine": machine, "results": res}, f, indent=1, sort_keys=True)
    print(f"wrote {path}")
    if md is not None:
        with open(os.path.join(RESULTS, "bench_real.md"), "w") as f:
            f.write(md + "\n")
        H.replace_section(os.path.join(HERE, "README.md"), "bench_real", md)
        print("wrote benchmarks/results/bench_real.md and benchmarks/README.md (bench_real section)")


def plan(args: argparse.Namespace) -> Tuple[dict, List[str], List[str], Dict[str, str], List[str]]:
    """The sizes, workloads, contenders, the contenders left out (and why) and the entries to run."""
    cfg = dict(SIZES["quick" if args.quick else "moderate"])
    cfg["files"] = max(1, round(cfg["files"] * args.scale))
    workloads = args.workload or WORKLOADS
    contenders = args.contender or CONTENDERS
    skipped = {c: why for c in contenders if (why := installed(c))}
    for c, why in skipped.items():
        print(f"left out: {LABELS[c]}: {why}")
    entries = [f"{w}/{c}" for w in workloads for c in contenders
               if c not in skipped and w in APPLIES.get(c, set(WORKLOADS))]
    return cfg, workloads, contenders, skipped, entries


def measure_all(entries: List[str], cfg: dict, workloads: List[str], repeats: int, timeout: float
                ) -> Tuple[Dict[str, dict], List[float]]:
    """Make the data, the peers' copies, run the rounds (all in a temporary folder, removed after)."""
    data = tempfile.mkdtemp(prefix="pyloader-real-bench-")
    try:
        t = time.perf_counter()
        cfg["expected"] = make_data(data, cfg, workloads)
        print(f"data made in {time.perf_counter() - t:.1f} s: {cfg['expected']}")
        failed = prepare_all(entries, data, cfg, timeout)
        runs, cores = run_rounds([e for e in entries if e not in failed], data, cfg, repeats, timeout)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    return dict(failed, **summarize(runs, cfg["expected"])), cores


def main() -> None:
    args = parse_args()
    if H.run_child_if_asked(args, child):
        return
    cfg, workloads, contenders, skipped, entries = plan(args)
    repeats = args.repeats or (1 if args.quick else 3)
    machine = H.machine_line()
    print(f"machine: {machine}")
    t_all = time.perf_counter()
    res, cores = measure_all(entries, cfg, workloads, repeats, args.timeout)
    shown = [c for c in contenders if c in skipped or any(f"{w}/{c}" in res for w in workloads)]
    md = "\n\n".join(describe(args, cfg, repeats, machine, cores, (time.perf_counter() - t_all) / 60)
                      + [table(res, workloads, shown, skipped)])
    print()
    print(md)
    if args.json:
        write_outputs(args.json, cfg, machine, res, None)
    if args.write:
        write_outputs(os.path.join(RESULTS, "bench_real.json"), cfg, machine, res, md)


if __name__ == "__main__":
    main()
