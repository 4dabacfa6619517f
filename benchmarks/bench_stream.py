#!/usr/bin/env python
"""Stream mode (``DataLoader(stream=True, seq_len=T)``) against the other ways of streaming B rows.

    python benchmarks/bench_stream.py            # full size, prints the table
    python benchmarks/bench_stream.py --quick    # small data, a smoke run
    python benchmarks/bench_stream.py --write    # also rewrite the stream section of
                                                 # benchmarks/README.md and draw img/bench_stream.png
    python benchmarks/bench_stream.py --files 256 --loader pyloader-w0 --loader psd-w0
                                                 # more data, some loaders only (no --write)
    python benchmarks/bench_stream.py --threads 1 # pyloader with num_threads=1 (no --write)

The same text streams (``--files`` files of ``--tokens`` token ids, one id per
line), parsed by the same user function for every loader, are cut into B rows of
T-token windows, where row ``r`` of batch ``k+1``
continues where row ``r`` of batch ``k`` stopped, by

* pyloader stream mode, 0 and 2 workers (a ``DataReader`` reading one file's ids);
* ``pytorch-stream-dataloader==1.0`` (``StreamDataset`` + ``StreamDataLoader``),
  0 and 2 workers, zero padding; installed with pip if missing (skipped, with a
  message, if that fails);
* a zip of B per-row torch ``DataLoader`` s (the "MultiStreamDataLoader" idea:
  B single-stream iterables, each over files ``r, r+B, ...``, zipped), 0 and 1
  worker per row.

Two parsers of a file's text, each shared by every loader, make two workloads:

* ``numpy``: ``np.fromstring(text, sep="\n")``, about 0.6 ms per file: the loaders'
  own cost of cutting, batching and handing over dominates;
* ``python``: ``np.array(list(map(int, text.split())))``, about 2.5 ms per file: the
  parse dominates (on 2 cores at B = 64 every file must be parsed before the first
  batch, whatever the loader).

Each run lasts at least ``--min-seconds`` (5 s by default): every entry is first timed once
on the ``--files`` files (a calibration run, not reported), then measured on as many files
(the first ones of a larger set) as make that run last the minimum, so start-up does not
dominate what is measured. ``--min-seconds 0`` runs every entry on ``--files`` files.

Every token id is unique (file ``f``, position ``i`` -> ``f * tokens + i``), so
after the timed loop the script checks that every token arrived exactly once
(pyloader: tokens with ``__valid__`` and not ``__replay__``; the others: every
id >= 0 they returned, padding being -1) and that each row's sequence is
coherent (consecutive ids inside a file, a new file only after the previous one
ended). Each entry runs in a fresh subprocess, ``--repeats`` times; the best
throughput is kept. The timed loop is one pass, started after a full garbage
collection (the one the imports owe would otherwise land, ~0.1 s, in whichever
loop allocates enough to trigger it).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any, Dict, List, Optional

import _harness as H
from _harness import HERE, REPO

RESULTS_JSON = os.path.join(HERE, "results", "bench_stream.json")  # every figure of the last --write run

SIZES = {"full": dict(files=64, tokens=20_000, seq_len=32, rows=[8, 64]),
         "quick": dict(files=64, tokens=1_000, seq_len=32, rows=[8, 64])}
# each workload's parse of a file's text, as evaluated by read_tokens and shown in the results
PARSERS = {"numpy": 'np.fromstring(text, dtype=np.int64, sep="\\n")',
           "python": "np.array(list(map(int, text.split())), dtype=np.int64)"}
LOADERS = ["pyloader-w0", "pyloader-w2", "psd-w0", "psd-w2", "zip-w0", "zip-w1"]
LABELS = {"pyloader-w0": "pyloader stream mode, 0 workers", "pyloader-w2": "pyloader stream mode, 2 workers",
          "psd-w0": "pytorch-stream-dataloader 1.0, 0 workers",
          "psd-w2": "pytorch-stream-dataloader 1.0, 2 workers",
          "zip-w0": "zip of B torch DataLoaders, 0 workers each",
          "zip-w1": "zip of B torch DataLoaders, 1 worker each"}
PAD = -1


# -- the user code, shared by every loader ---------------------------------------------------------
def read_tokens(path: str, parser: str):
    """One text file of token ids (one per line) -> an int64 array, parsed as ``PARSERS[parser]``."""
    import numpy as np

    with open(path, encoding="utf-8") as f:
        text = f.read()
    return eval(_PARSE_CODE[parser], {"np": np, "text": text})  # the code shown in the results, and only that


_PARSE_CODE = {name: compile(code, f"<parse {name}>", "eval") for name, code in PARSERS.items()}


def windows(path: str, T: int, parser: str):
    """A file's ids as T-token windows; the last one padded with -1."""
    import numpy as np

    toks = read_tokens(path, parser)
    for s in range(0, len(toks), T):
        w = toks[s:s + T]
        if len(w) < T:
            w = np.concatenate([w, np.full(T - len(w), PAD, dtype=np.int64)])
        yield w


# -- the loaders: each returns an iterator of (tokens [B, T], valid [B, T]) as NumPy arrays ---------
def run_pyloader(files_dir: Any, B: int, T: int, workers: int, parser: str, threads: Optional[int] = None):
    import torch  # noqa: F401

    import pyloader as pl
    from pyloader.collators import TorchCollator

    class TokenReader(pl.DataReader):
        def read_file(self, path):
            toks = read_tokens(path, parser)
            return {"tok": toks}, len(toks)

    def make():
        loader = pl.DataLoader(TokenReader(batch_size=B), pl.IdentityDataset(), TorchCollator(), files_dir,
                               stream=pl.Stream(seq_len=T), num_workers=workers, num_threads=threads)
        try:
            for batch in loader:
                # zero padding never replays a file (the exactly-once check would see it): valid is enough
                yield batch["tok"], batch["__valid__"]
        finally:
            loader.close()

    return make


def run_psd(files: List[str], B: int, T: int, workers: int, parser: str):
    import numpy as np
    import torch
    from pytorch_stream_dataloader.stream_dataloader import StreamDataLoader
    from pytorch_stream_dataloader.stream_dataset import StreamDataset

    def streamer(path):
        return windows(path, T, parser)

    def make():
        dataset = StreamDataset(list(files), streamer, B, "zeros", np.full(T, PAD, dtype=np.int64))
        loader = StreamDataLoader(dataset, num_workers=workers,
                                  collate_fn=lambda rows: torch.from_numpy(np.stack(list(rows))))
        for tok in loader:
            yield tok, tok >= 0

    return make


def run_zip(files: List[str], B: int, T: int, workers: int, parser: str):
    import torch
    import torch.utils.data as tud

    class RowStream(tud.IterableDataset):
        """One row: its files' windows, one after the other."""

        def __init__(self, files: List[str]) -> None:
            self.files = files

        def __iter__(self):
            for path in self.files:
                yield from windows(path, T, parser)

    def make():
        loaders = [tud.DataLoader(RowStream(files[r::B]), batch_size=None, num_workers=workers) for r in range(B)]
        for rows in zip(*loaders):
            tok = torch.stack(rows)
            yield tok, tok >= 0

    return make


def check_streams(toks, valids, n_files: int, N: int) -> Dict[str, Any]:
    """Exactly once: the valid ids are 0 .. n_files*N-1, each once. Order: per row, ids go up by one
    inside a file, and a row starts a new file (id % N == 0) only after its previous one ended."""
    import numpy as np

    tok = np.stack(toks) if toks else np.zeros((0, 1, 1), dtype=np.int64)
    valid = np.stack(valids) if valids else np.zeros((0, 1, 1), dtype=bool)
    got = tok[valid]
    total = n_files * N
    outside = (got < 0) | (got >= total)
    counts = np.bincount(got[~outside], minlength=total)  # linear: the data may hold 10^8 tokens
    missing = int((counts == 0).sum())
    duplicated = int((counts > 1).sum())
    foreign = int(len(np.unique(got[outside])))
    breaks = 0
    for r in range(tok.shape[1]):
        seq = tok[:, r, :][valid[:, r, :]]
        if len(seq) < 2:
            continue
        prev, nxt = seq[:-1], seq[1:]
        ok = (nxt == prev + 1) & (prev % N != N - 1) | (nxt % N == 0) & (prev % N == N - 1)
        breaks += int((~ok).sum())
        if seq[0] % N != 0:
            breaks += 1
    return {"delivered": int(len(got)), "expected": total, "missing": missing, "duplicated": duplicated,
            "foreign": foreign, "order_breaks": breaks,
            "exactly_once": missing == 0 and duplicated == 0 and foreign == 0 and len(got) == total}


def child(entry: str, data: str, cfg: dict) -> None:
    import gc
    import threading

    import torch  # noqa: F401

    parser, bpart, loader = entry.split("/")
    B, T = int(bpart[1:]), cfg["seq_len"]
    workers = int(loader.rsplit("-w", 1)[1])
    files = sorted(os.path.join(data, f) for f in os.listdir(data))[:cfg["use_files"]]
    if loader.startswith("pyloader"):
        make = run_pyloader(files, B, T, workers, parser, cfg.get("threads"))
    else:
        make = (run_psd if loader.startswith("psd") else run_zip)(files, B, T, workers, parser)
    baseline = H.own_memory()
    # the imports above leave ~170k objects no full collection has seen yet: the first one (~0.1 s with
    # torch loaded) would fall inside whichever timed loop happens to allocate enough, so run it now
    gc.collect()
    toks, valids, first, n = [], [], None, 0
    cpu0 = os.times()
    t0 = time.perf_counter()
    for tok, valid in make():
        if first is None:
            first = time.perf_counter() - t0
        v = valid.numpy()
        toks.append(tok.numpy().copy())
        valids.append(v.copy())
        n += int(v.sum())
    elapsed = time.perf_counter() - t0
    for t in [t for t in threading.enumerate() if t is not threading.main_thread()]:
        t.join(10)  # let loader threads end before the interpreter does (see bench_loaders.py)
    cpu1 = os.times()
    checks = check_streams(toks, valids, len(files), cfg["tokens"])
    H.report({"entry": entry, "files": len(files), "samples": n, "batches": len(toks), "seconds": elapsed,
              "samples_per_s": n / elapsed,
              "first_batch_s": first, "baseline": baseline, "cpu_s": sum(cpu1[i] - cpu0[i] for i in range(4)),
              "checks_ok": checks["exactly_once"], "checks": checks})


# -- parent ------------------------------------------------------------------------------------------
def ensure_psd(log=print) -> Optional[str]:
    """None if pytorch_stream_dataloader imports (installing it if needed), else why not."""
    probe = [sys.executable, "-c", "import pytorch_stream_dataloader"]
    if subprocess.run(probe, capture_output=True).returncode == 0:
        return None
    log("pytorch_stream_dataloader is not installed: pip install pytorch-stream-dataloader==1.0")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "pytorch-stream-dataloader==1.0"],
                       capture_output=True, text=True)
    if p.returncode == 0 and subprocess.run(probe, capture_output=True).returncode == 0:
        log("installed pytorch-stream-dataloader==1.0")
        return None
    why = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["unknown error"]
    log(f"could not install pytorch-stream-dataloader==1.0 ({why[0]}): its column is skipped")
    return why[0]


def calibrate(entries: List[str], data: str, cfg: dict, args) -> Dict[str, int]:
    """The files each entry is given so that its run lasts at least ``cfg["min_seconds"]``: a run on
    ``cfg["files"]`` files, scaled (plus 20 %), at most ``--max-files``."""
    if not cfg["min_seconds"]:
        return {e: cfg["files"] for e in entries}
    print(f"-- calibration: one run per entry on {cfg['files']} files, for runs of at least "
          f"{cfg['min_seconds']:g} s")
    sizes = {}
    for e in entries:
        argv = [os.path.abspath(__file__), "--child", e, "--data", data, "--cfg",
                json.dumps(dict(cfg, use_files=cfg["files"]))]
        r = H.run_child(argv, args.timeout)
        seconds = r.get("seconds") or cfg["min_seconds"]  # a failed run is measured (and fails) at the base size
        scale = max(1.0, 1.2 * cfg["min_seconds"] / max(seconds, 1e-3))
        sizes[e] = min(args.max_files, max(cfg["files"], int(cfg["files"] * scale)))
        print(f"  {e:<34} {seconds:.2f} s on {cfg['files']} files -> {sizes[e]} files")
    return sizes


def generate(root: str, cfg: dict, first: int, end: int) -> None:
    """Files ``first`` .. ``end - 1``: file ``f`` holds the ids ``f * tokens`` .. ``(f + 1) * tokens - 1``."""
    N = cfg["tokens"]
    for f in range(first, end):
        with open(os.path.join(root, f"stream-{f:05d}.txt"), "w", encoding="utf-8") as out:
            out.write("\n".join(str(f * N + i) for i in range(N)) + "\n")


def faster_peer(res: Dict[str, dict], parser: str, B: int) -> Optional[float]:
    """The best tokens/s of the non-pyloader entries (the issue's yardstick), None if none ran."""
    rates = [res.get(f"{parser}/B{B}/{n}", {}).get("samples_per_s") for n in LOADERS if not n.startswith("pyloader")]
    return max((r for r in rates if r is not None), default=None)


def results_markdown(res: Dict[str, dict], cfg: dict, args, machine: str, wall: float, skipped: Optional[str],
                     cores: List[float]) -> str:
    rows = []
    for parser in cfg["parsers"]:
        for B in cfg["rows"]:
            peer = faster_peer(res, parser, B)
            for name in LOADERS:
                r = res.get(f"{parser}/B{B}/{name}")
                head = [parser, str(B), LABELS[name]]
                if r is None:
                    if skipped and name.startswith("psd"):
                        rows.append(head + [f"skipped: {skipped}"] + ["-"] * 9)
                    continue  # else not asked for (--loader)
                if "error" in r:
                    rows.append(head + ["FAILED: " + r["error"]] + ["-"] * 9)
                    continue
                c = r["checks"]
                once = "yes" if c["exactly_once"] else (f"**no**: {c['delivered']:,} of {c['expected']:,} "
                                                         f"({c['missing']:,} missing, {c['duplicated']:,} twice)")
                rows.append(head + [f"{r.get('files', cfg['files']):,}", f"{r['seconds']:.1f}",
                                    H.fmt_rate(r["samples_per_s"]),
                                    f"{r['samples_per_s'] / peer:.2f}x" if peer else "-", f"{r['batches']:,}",
                                    f"{r['first_batch_s']:.3f}", f"{r['cpu_s']:.2f} / {r['seconds']:.2f}",
                                    H.fmt_mb(r["peak_pss"]), once,
                                    "ok" if c["order_breaks"] == 0 else f"{c['order_breaks']} breaks"])
    table = H.markdown_table(["parse", "B", "loader", "files", "run (s)", "tokens/s", "vs the faster peer", "batches",
                              "first batch (s)", "CPU s / wall s", "peak PSS, tree (MB)",
                              "every token exactly once", "rows coherent"], rows, "lllrrrrrrrrll")
    size = "quick (smoke-run sizes)" if args.quick else "full"
    return "\n\n".join([
        f"Run of `python benchmarks/bench_stream.py{' --quick' if args.quick else ''}"
        f"{' --write' if args.write else ''}` on {time.strftime('%Y-%m-%d %H:%M')} ({size}; {args.repeats} "
        f"runs per entry, best throughput; {wall / 60:.1f} min in all).",
        f"Machine: {machine}; load average at the end {os.getloadavg()[0]:.2f} (shared with other jobs). "
        "Effective cores free to this run (two spinning processes against one), before each round and at the "
        "end: " + ", ".join(f"{c:.2f}" for c in cores) + " (2.00 = both cores free).",
        f"Data: text files of {cfg['tokens']:,} token ids each (one per line), T = {cfg['seq_len']}; each entry "
        f"reads as many files (\"files\", at least {cfg['files']}) as make its run last at least "
        f"{cfg.get('min_seconds', 0):g} s (scaled from a calibration run; \"run (s)\": the best run's loop); "
        f"B rows per batch. tokens/s counts delivered tokens (padding excluded). Parse: the user function every "
        "loader calls on a file's text, " + "; ".join(f"`{k}` = `{v}`" for k, v in PARSERS.items()
                                                      if k in cfg["parsers"]) + ". \"The faster peer\" is the "
        "fastest of the pytorch-stream-dataloader and zip entries for the same parse and B."
        + (f" pyloader runs with num_threads={cfg['threads']}." if cfg.get("threads") else ""),
        table,
        "Throughput of every run (tokens/s): " + "; ".join(
            f"{e}: {', '.join(f'{x:,.0f}' for x in r.get('all_samples_per_s', []))}" for e, r in res.items()) + ".",
    ])


def plot(res: Dict[str, dict], cfg: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parsers = cfg.get("parsers", ["numpy"])
    fig, axes = plt.subplots(1, len(parsers), figsize=(7 * len(parsers), 4.8), squeeze=False)
    width = 0.8 / len(cfg["rows"])
    for ax, parser in zip(axes[0], parsers):
        for k, B in enumerate(cfg["rows"]):
            vals, marks = [], []
            for name in LOADERS:
                r = res.get(f"{parser}/B{B}/{name}", {})
                vals.append(r.get("samples_per_s", 0) if "error" not in r else 0)
                ok = r.get("checks", {}).get("exactly_once")
                marks.append("" if ok else (" lost/duplicated" if ok is False else " n/a"))
            xs = [i + (k - (len(cfg["rows"]) - 1) / 2) * width for i in range(len(LOADERS))]
            ax.bar(xs, [v / 1e6 for v in vals], width, label=f"B = {B}")
            for x, v, m in zip(xs, vals, marks):
                ax.text(x, v / 1e6, f"{v / 1e6:.1f}{m}", ha="center", va="bottom", fontsize=7,
                        rotation=90 if m else 0)
        ax.set_xticks(range(len(LOADERS)), [textwrap.fill(LABELS[n], 18) for n in LOADERS], fontsize=6)
        ax.set_ylabel("million tokens/s (higher is better)")
        ax.set_title(f"parse = {parser}: {PARSERS[parser]}", fontsize=8)
        ax.legend(fontsize=8)
    fig.suptitle(f"Stream mode: {cfg['files']} streams x {cfg['tokens']:,} tokens, T = {cfg['seq_len']} "
                 "(2-core CPU machine, shared; best of runs)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    H.common_args(ap, "rewrite benchmarks/README.md's stream section, draw the plot", "2 full, 1 quick", RESULTS_JSON)
    ap.add_argument("--parse", action="append", choices=list(PARSERS),
                    help="a workload to run (repeatable; default: all of them)")
    ap.add_argument("--files", type=int, help="number of text files (default: the size's)")
    ap.add_argument("--tokens", type=int, help="token ids per file (default: the size's)")
    ap.add_argument("--loader", action="append", choices=LOADERS, help="a loader to run (repeatable; default: all)")
    ap.add_argument("--threads", type=int, help="pyloader's num_threads (default: pyloader's default)")
    ap.add_argument("--min-seconds", type=float, help="each entry's run lasts at least this: its data is scaled "
                    "from a calibration run on --files files (default 5; 0 with --quick: no calibration)")
    ap.add_argument("--max-files", type=int, default=4096,
                    help="the most files an entry is given to reach --min-seconds (default 4096: 82M tokens)")
    args = ap.parse_args()
    if args.write and (args.loader or args.files or args.tokens or args.threads):
        ap.error("--write records the full set-up: leave out --loader, --files, --tokens and --threads")
    if H.child_or_replot(args, child, RESULTS_JSON, plot, os.path.join(REPO, "img", "bench_stream.png")):
        return
    cfg = dict(SIZES["quick" if args.quick else "full"], parsers=args.parse or list(PARSERS))
    cfg.update({k: getattr(args, k) for k in ("files", "tokens", "threads") if getattr(args, k)})
    cfg["min_seconds"] = args.min_seconds if args.min_seconds is not None else (0.0 if args.quick else 5.0)
    args.repeats = args.repeats or (1 if args.quick else 2)
    machine = H.machine_line() + "; code measured: " + H.source_digest(os.path.join(REPO, "pyloader"))
    print(f"machine: {machine}")
    skipped = ensure_psd()
    loaders = [n for n in args.loader or LOADERS if not (skipped and n.startswith("psd"))]
    entries = [f"{p}/B{B}/{n}" for p in cfg["parsers"] for B in cfg["rows"] for n in loaders]
    t_all = time.perf_counter()
    data = tempfile.mkdtemp(prefix="pyloader-stream-bench-")
    runs: Dict[str, List[dict]] = {e: [] for e in entries}
    cores: List[float] = []
    try:
        generate(data, cfg, 0, cfg["files"])
        sizes = calibrate(entries, data, cfg, args)
        generate(data, cfg, cfg["files"], max(sizes.values()))
        for rep in range(args.repeats):
            cores.append(H.effective_cores())
            print(f"-- round {rep + 1}/{args.repeats} (effective cores free now: {cores[-1]:.2f})")
            for e in entries:
                argv = [os.path.abspath(__file__), "--child", e, "--data", data, "--cfg",
                        json.dumps(dict(cfg, use_files=sizes[e]))]
                r = H.measure(e, argv, 1, args.timeout)
                if "checks" in r and not r["checks_ok"]:
                    print(f"    checks: {r['checks']}")
                runs[e].append(r)
        cores.append(H.effective_cores())
    finally:
        shutil.rmtree(data, ignore_errors=True)
    res = {}
    for e, rs in runs.items():
        r = H.best_of(rs) if len(rs) > 1 else rs[0]
        r["all_samples_per_s"] = [round(x["samples_per_s"], 1) for x in rs if "error" not in x]
        res[e] = r
    md = results_markdown(res, cfg, args, machine, time.perf_counter() - t_all, skipped, cores)
    print()
    print(md)
    if args.write:
        H.write_results("bench_stream", md, RESULTS_JSON, {"cfg": cfg, "machine": machine, "results": res}, plot,
                        os.path.join(REPO, "img", "bench_stream.png"))


if __name__ == "__main__":
    main()
