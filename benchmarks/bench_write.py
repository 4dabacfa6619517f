#!/usr/bin/env python
"""Converting data into chunk files: ``pyloader.write`` against LitData ``optimize``, Mosaic ``MDSWriter`` and
webdataset ``ShardWriter`` (issue 48).

    python benchmarks/bench_write.py            # full size, prints the table
    python benchmarks/bench_write.py --quick    # small data (600 JPEGs, 6,000 documents): a smoke run
    python benchmarks/bench_write.py --write    # also rewrite the bench_write section of benchmarks/README.md
                                                # and benchmarks/results/bench_write.json
    python benchmarks/bench_write.py --quick --writer litdata --json /tmp/w.json   # one writer, figures as JSON
    python benchmarks/bench_write.py --input jpeg --writer pyloader --writer mosaic  # one input, two writers

Two inputs, made here:

* ``jpeg``: 20,000 small JPEGs (96x96, with a ``.cls`` label file each) in a folder; the user
  function decodes each, resizes it to 64x64 and encodes it again as a JPEG (every writer stores
  those bytes: LitData gets them as ``bytes``, since a PIL image made in memory would be encoded
  again by its JPEG serializer).
* ``tok``: 200,000 JSON-lines documents in 8 files; the user function tokenizes each (an HF
  ``tokenizers`` BPE trained here when ``tokenizers`` is installed, else a word-hashing tokenizer,
  said in the table), keeping the token ids.

Each writer converts both with the same number of processes (``--workers``, 2 by default), as its
docs recommend: ``pyloader.write(source=folder, fn=...)``; ``litdata.optimize(fn, inputs, output_dir,
num_workers, chunk_bytes)`` (its ``fn`` a generator for the documents: several samples per input file);
Mosaic's ``MDSWriter`` in one process per worker (a ``multiprocessing.Pool``), each on its share of the
inputs, then ``streaming.base.util.merge_index`` (Mosaic's guide for parallel conversion); webdataset's
``ShardWriter`` in one process per worker likewise. Each entry runs in a fresh interpreter whose process
tree is watched (``_harness``), the writer's package imported before the clocks start: wall time, CPU time
of the tree (the entry's and every process it starts), peak summed RSS, the output's size, then the time
to the first batch of reading the output back with the writer's own loader (64 samples a batch, no worker
process, each batch collated to its samples' keys: nothing decoded), and a full read-back: every key
(image name, document id) must come back exactly once. A writer that is not installed is left out with
a note (``pip install`` lines in benchmarks/README.md: LitData and Mosaic are installed without their
dependencies, which would bring a torchvision or downgrade numpy; Mosaic's ``streaming`` imports
torchvision at start-up, and ``_harness.mosaic_importable`` stands a stub in for it).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import _harness as H  # noqa: I001  (puts this checkout first on sys.path)
from _harness import HERE, REPO

RESULTS_JSON = os.path.join(HERE, "results", "bench_write.json")
SIZES = {"full": dict(images=20_000, docs=200_000, doc_files=8), "quick": dict(images=600, docs=6_000, doc_files=4)}
WRITERS = ("pyloader", "litdata", "mosaic", "webdataset")
INPUTS = ("jpeg", "tok")
PEER_MODULE = {"litdata": "litdata", "mosaic": "streaming", "webdataset": "webdataset"}
SIDE = 64
BATCH = 64
WORDS = ["data", "loader", "stream", "chunk", "file", "token", "model", "train", "batch", "epoch", "shard", "image",
         "text", "write", "index", "sample", "worker", "process", "remote", "local", "merge", "append", "fast"]


# -- the inputs ---------------------------------------------------------------------------------
def make_inputs(root: str, cfg: dict) -> Dict[str, str]:
    import numpy as np

    gen = np.random.default_rng(0)
    images, docs = os.path.join(root, "images"), os.path.join(root, "docs")
    os.makedirs(images)
    os.makedirs(docs)
    from PIL import Image

    for i in range(cfg["images"]):
        pixels = gen.integers(0, 255, size=(96, 96, 3), dtype="uint8")
        Image.fromarray(pixels).save(os.path.join(images, f"{i:06d}.jpg"), format="JPEG", quality=90)
        with open(os.path.join(images, f"{i:06d}.cls"), "w") as f:
            f.write(str(i % 10))
    per_file = cfg["docs"] // cfg["doc_files"]
    texts = []
    for k in range(cfg["doc_files"]):
        with open(os.path.join(docs, f"part-{k:04d}.jsonl"), "w") as out:
            for i in range(k * per_file, (k + 1) * per_file):
                text = " ".join(WORDS[w] for w in gen.integers(len(WORDS), size=int(gen.integers(20, 80))))
                texts.append(text)
                out.write(json.dumps({"id": i, "text": text}) + "\n")
    _train_tokenizer(texts[:5000], os.path.join(root, "tokenizer.json"))
    return {"jpeg": images, "tok": docs}


def _train_tokenizer(texts: List[str], path: str) -> None:
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    except ImportError:
        return
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=2000, special_tokens=["[UNK]"], show_progress=False))
    tok.save(path)


# -- the user functions (module level: picklable by every writer) --------------------------------------
_TOKENIZER: Dict[str, Any] = {}


def tokenizer_kind(root: str) -> str:
    return "BPE (tokenizers)" if os.path.exists(os.path.join(root, "tokenizer.json")) else "word hashing"


def token_ids(text: str) -> List[int]:
    root = os.environ["BENCH_WRITE_ROOT"]
    if "tok" not in _TOKENIZER:
        path = os.path.join(root, "tokenizer.json")
        if os.path.exists(path):
            from tokenizers import Tokenizer

            _TOKENIZER["tok"] = Tokenizer.from_file(path)
        else:
            _TOKENIZER["tok"] = None
    tok = _TOKENIZER["tok"]
    if tok is None:
        import zlib

        return [zlib.crc32(w.encode()) % 2000 for w in text.split()]
    return tok.encode(text).ids


def resized_jpeg(data: bytes) -> bytes:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        small = image.convert("RGB").resize((SIDE, SIDE))
    out = io.BytesIO()
    small.save(out, format="JPEG", quality=90)
    return out.getvalue()


def pyloader_image(sample: dict) -> dict:
    return {"__key__": sample["__key__"], "jpg": resized_jpeg(sample["jpg"]), "cls": sample["cls"]}


def pyloader_doc(sample: dict) -> dict:
    return {"id": int(sample["id"]), "tokens": token_ids(sample["text"])}


def image_pairs(folder: str) -> List[str]:
    """The keys of the image folder (``000012`` for ``000012.jpg`` and ``000012.cls``), in order."""
    return sorted(name[:-4] for name in os.listdir(folder) if name.endswith(".jpg"))


def read_image(folder: str, key: str) -> Dict[str, Any]:
    with open(os.path.join(folder, key + ".jpg"), "rb") as f:
        jpg = resized_jpeg(f.read())
    with open(os.path.join(folder, key + ".cls")) as f:
        return {"key": key, "jpg": jpg, "cls": int(f.read())}


def docs_of(path: str) -> Iterator[Dict[str, Any]]:
    with open(path) as f:
        for line in f:
            doc = json.loads(line)
            yield {"id": doc["id"], "tokens": token_ids(doc["text"])}


# -- the writers: each converts the input of ``workload`` into ``out`` with ``workers`` processes ---------
def write_pyloader(workload: str, src: str, out: str, workers: int) -> None:
    import pyloader

    if workload == "jpeg":
        pyloader.write(source=src, output=out, format="tar", fn=pyloader_image, workers=workers)
    else:
        pyloader.write(source=src, output=out, format="parquet", fn=pyloader_doc, workers=workers)


def _litdata_image(item: str) -> Dict[str, Any]:
    """The resized JPEG as bytes, as every other writer stores it (a PIL image opened from memory would be
    re-encoded by LitData's JPEG serializer, at its own quality)."""
    return read_image(*os.path.split(item))


def _litdata_docs(path: str) -> Iterator[Dict[str, Any]]:
    import numpy as np

    for doc in docs_of(path):
        yield {"id": doc["id"], "tokens": np.asarray(doc["tokens"], dtype=np.int32)}


def write_litdata(workload: str, src: str, out: str, workers: int) -> None:
    from litdata import optimize

    H.litdata_cache_in(os.path.dirname(out))
    if workload == "jpeg":
        inputs = [os.path.join(src, key) for key in image_pairs(src)]
        optimize(fn=_litdata_image, inputs=inputs, output_dir=out, num_workers=workers, chunk_bytes="64MB")
    else:
        optimize(fn=_litdata_docs, inputs=_inputs(workload, src), output_dir=out, num_workers=workers,
                 chunk_bytes="64MB")


def _mosaic_part(args: tuple) -> None:
    H.mosaic_importable()  # a worker started by spawn or forkserver is a fresh interpreter
    from streaming import MDSWriter

    workload, src, out, items = args
    if workload == "jpeg":
        columns = {"key": "str", "jpg": "bytes", "cls": "int"}
        with MDSWriter(out=out, columns=columns) as writer:
            for key in items:
                writer.write(read_image(src, key))
    else:
        with MDSWriter(out=out, columns={"id": "int", "tokens": "ndarray:int32"}) as writer:
            for path in items:
                for doc in _litdata_docs(path):
                    writer.write(doc)


def _shares(items: List[str], workers: int) -> List[List[str]]:
    """``items`` cut into ``workers`` runs of consecutive items (input order kept across the parts)."""
    n = len(items)
    return [items[k * n // workers:(k + 1) * n // workers] for k in range(workers)]


def _inputs(workload: str, src: str) -> List[str]:
    return image_pairs(src) if workload == "jpeg" else sorted(os.path.join(src, f) for f in os.listdir(src))


def write_mosaic(workload: str, src: str, out: str, workers: int) -> None:
    import multiprocessing

    H.mosaic_importable()
    from streaming.base.util import merge_index

    parts = [(workload, src, os.path.join(out, f"part-{k:02d}"), share)
             for k, share in enumerate(_shares(_inputs(workload, src), workers))]
    with multiprocessing.Pool(workers) as pool:  # the default start method, as in its guide
        pool.map(_mosaic_part, parts)
    merge_index(out, keep_local=True)


def _webdataset_part(args: tuple) -> None:
    import webdataset as wds

    workload, src, pattern, items = args
    with wds.ShardWriter(pattern, maxsize=64 * 2**20, verbose=0) as sink:
        for item in items:
            if workload == "jpeg":
                sample = read_image(src, item)
                sink.write({"__key__": sample["key"], "jpg": sample["jpg"], "cls": sample["cls"]})
            else:
                for doc in docs_of(item):
                    sink.write({"__key__": f"{doc['id']:09d}", "json": {"id": doc["id"], "tokens": doc["tokens"]}})


def write_webdataset(workload: str, src: str, out: str, workers: int) -> None:
    import multiprocessing

    os.makedirs(out, exist_ok=True)
    parts = [(workload, src, os.path.join(out, f"shard-{k:02d}-%06d.tar"), share)
             for k, share in enumerate(_shares(_inputs(workload, src), workers))]
    with multiprocessing.Pool(workers) as pool:  # the default start method, as in its guide
        pool.map(_webdataset_part, parts)


# -- reading the output back: the first batch, then every sample ------------------------------------
def read_pyloader(workload: str, out: str) -> Iterator[List[str]]:
    from pyloader import DataLoader, IdentityDataset
    from pyloader.collators import NumpyCollator
    from pyloader.readers import ParquetReader, TarReader

    # bytes, as every peer's read-back gives them (TarReader decodes images by default)
    reader = TarReader(batch_size=BATCH, decode=False) if workload == "jpeg" else ParquetReader(batch_size=BATCH)
    with DataLoader(reader, IdentityDataset(), NumpyCollator(), out, workers=0) as loader:
        for batch in loader:
            yield [str(k) for k in (batch["__key__"] if workload == "jpeg" else batch["id"])]


def _key_batches(dataset: Any, key: str, loader: Optional[Callable[..., Any]] = None) -> Iterator[List[str]]:
    """Batches of ``BATCH`` samples of a map or iterable dataset, each collated to its samples' keys (the
    token arrays differ in length: the default collate cannot stack them; nothing is decoded)."""
    from torch.utils.data import DataLoader

    def keys(samples: List[dict]) -> List[str]:
        return [str(s[key]) for s in samples]

    yield from (loader or DataLoader)(dataset, batch_size=BATCH, num_workers=0, collate_fn=keys)


def read_litdata(workload: str, out: str) -> Iterator[List[str]]:
    from litdata import StreamingDataLoader, StreamingDataset

    yield from _key_batches(StreamingDataset(out), "key" if workload == "jpeg" else "id", StreamingDataLoader)


def read_mosaic(workload: str, out: str) -> Iterator[List[str]]:
    H.mosaic_importable()
    from streaming import StreamingDataset

    dataset = StreamingDataset(local=out, shuffle=False, batch_size=BATCH)
    yield from _key_batches(dataset, "key" if workload == "jpeg" else "id")


def read_webdataset(workload: str, out: str) -> Iterator[List[str]]:
    import webdataset as wds

    shards = sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".tar"))
    yield from _key_batches(wds.WebDataset(shards, shardshuffle=False), "__key__")


def _import_modules(writer: str) -> None:
    """Import the writer's package before the clocks start (torch alone takes seconds to import): the times are
    those of the work. Worker processes a writer spawns import it again, on its clock."""
    import importlib

    if writer == "mosaic":
        H.mosaic_importable()
    for module in ("pyloader",) if writer == "pyloader" else ("torch.utils.data", PEER_MODULE[writer]):
        importlib.import_module(module)


def _keys_of(workload: str, src: str) -> List[str]:
    if workload == "jpeg":
        return image_pairs(src)
    n = 0
    for path in sorted(os.listdir(src)):
        with open(os.path.join(src, path)) as f:
            n += sum(1 for _ in f)
    return [str(i) for i in range(n)]


def _folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def child(entry: str, data: str, cfg: dict) -> None:
    """One writer on one workload: write, then read back (in this fresh interpreter)."""
    writer, workload = entry.split("/")
    os.environ["BENCH_WRITE_ROOT"] = data
    src, out = os.path.join(data, "images" if workload == "jpeg" else "docs"), os.path.join(data, f"out-{writer}")
    shutil.rmtree(out, ignore_errors=True)
    _import_modules(writer)
    started = time.perf_counter()
    with TreeCPU() as cpu_of:
        globals()[f"write_{writer}"](workload, src, out, cfg["workers"])
    wall, cpu = time.perf_counter() - started, cpu_of.seconds
    size = _folder_bytes(out)
    started = time.perf_counter()
    batches = globals()[f"read_{writer}"](workload, out)
    seen = list(next(batches))
    first = time.perf_counter() - started
    for keys in batches:
        seen.extend(keys)
    expected = _keys_of(workload, src)
    normal = (lambda k: k.split("/")[-1]) if workload == "jpeg" else (lambda k: str(int(k)))
    once = sorted(map(normal, seen)) == sorted(expected)
    shutil.rmtree(out, ignore_errors=True)
    H.report({"samples": len(expected), "seconds": wall, "cpu_s": cpu, "bytes": size, "first_batch_s": first,
              "read_samples": len(seen), "checks_ok": once, "samples_per_s": len(expected) / wall,
              "baseline": H.own_memory()})


_WATCH = """
import json, os, select, sys
from pyloader._cli import tree_pids
root, tick, last = int(sys.argv[1]), os.sysconf("SC_CLK_TCK"), {}
def read():
    for pid in tree_pids(root):
        if pid in (root, os.getpid()):
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            last[pid] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
print("ready", flush=True)
while not select.select([sys.stdin], [], [], 0.02)[0]:
    read()
read()
print(json.dumps(sum(last.values())), flush=True)
"""


class TreeCPU:
    """CPU seconds of this process and every process it starts while inside (workers started by a fork
    server are not its children, so ``RUSAGE_CHILDREN`` misses them): each process's user and system
    time read from ``/proc/<pid>/stat`` every 20 ms, its last reading kept, by a watching process. Not a
    thread of this one: a writer that forks its workers only while no other thread runs (pyloader's)
    would start them otherwise, which a user's script, with no thread of its own, does not see."""

    def __enter__(self) -> "TreeCPU":
        self._watcher = subprocess.Popen([sys.executable, "-c", _WATCH, str(os.getpid())], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": REPO})
        assert self._watcher.stdout is not None and self._watcher.stdout.readline().strip() == "ready"
        self._own = resource.getrusage(resource.RUSAGE_SELF)
        return self

    def __exit__(self, *exc: object) -> None:
        own = resource.getrusage(resource.RUSAGE_SELF)
        out, _ = self._watcher.communicate("stop\n", timeout=60)
        self.seconds = own.ru_utime + own.ru_stime - self._own.ru_utime - self._own.ru_stime + json.loads(out)


# -- the parent --------------------------------------------------------------------------------------
def installed(writer: str) -> Optional[str]:
    """Why ``writer`` cannot run here, or None."""
    import importlib.util

    module = PEER_MODULE.get(writer)
    if module is None or importlib.util.find_spec(module) is not None:
        return None
    return f"`{module}` is not installed (see the install lines above)"


def run_all(args: argparse.Namespace, cfg: dict, log: Callable[[str], None]) -> Dict[str, Any]:
    root = tempfile.mkdtemp(prefix="bench_write_")
    results: Dict[str, Any] = {}
    try:
        t = time.perf_counter()
        make_inputs(root, cfg)
        log(f"inputs made in {time.perf_counter() - t:.1f} s under {root}")
        cfg["tokenizer"] = tokenizer_kind(root)
        for workload in args.input or INPUTS:
            for writer in args.writer or WRITERS:
                name = f"{writer}/{workload}"
                why = installed(writer)
                if why:
                    results[name] = {"skipped": why}
                    log(f"  {name:<22} skipped: {why}")
                    continue
                argv = [os.path.join(HERE, "bench_write.py"), "--child", name, "--data", root, "--cfg",
                        json.dumps(cfg)]
                results[name] = H.measure(name, argv, args.repeats or 1, args.timeout, log,
                                          env={"PYTHONPATH": REPO})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


def table(results: Dict[str, Any], cfg: dict) -> str:
    rows = []
    for name, r in results.items():
        if "skipped" in r or "error" in r:
            rows.append([f"`{name}`", r.get("skipped") or f"failed: {r['error']}", "", "", "", "", "", ""])
            continue
        rows.append([f"`{name}`", f"{r['seconds']:.1f}", f"{r['cpu_s']:.1f}", H.fmt_mb(r["peak_rss"]),
                     f"{r['bytes'] / H.MB:,.1f}", f"{r['first_batch_s']:.3f}", f"{r['samples_per_s']:,.0f}",
                     "yes" if r["checks_ok"] else f"NO ({r['read_samples']} of {r['samples']})"])
    header = ["writer/input", "wall s", "CPU s", "peak RSS MB", "output MB", "first batch s", "samples/s",
              "read back once"]
    return (f"{cfg['images']:,} JPEGs resized to {SIDE}x{SIDE}, {cfg['docs']:,} documents tokenized "
            f"({cfg['tokenizer']}), {cfg['workers']} processes each; {H.machine_line()}.\n\n"
            + H.markdown_table(header, rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small data: a smoke run")
    ap.add_argument("--repeats", type=int, default=None, help="runs per entry (default 1)")
    ap.add_argument("--workers", type=int, default=2, help="processes per writer (default 2)")
    ap.add_argument("--writer", action="append", choices=WRITERS, help="only this writer (repeatable)")
    ap.add_argument("--input", action="append", choices=INPUTS, help="only this input (repeatable)")
    ap.add_argument("--json", metavar="PATH",
                    help=f"also write every figure as JSON to PATH (--write writes {os.path.relpath(RESULTS_JSON)})")
    H.child_args(ap, 1800)
    args = ap.parse_args()
    if H.run_child_if_asked(args, child):
        return
    cfg = dict(SIZES["quick" if args.quick else "full"], workers=args.workers)
    results = run_all(args, cfg, print)
    markdown = table(results, cfg)
    print("\n" + markdown)
    payload = {"results": results, "cfg": cfg, "machine": H.machine_line()}
    if args.write:
        H.write_results("bench_write", markdown, RESULTS_JSON, payload, None, None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1, sort_keys=True)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
