#!/usr/bin/env python
"""Document packing (``pack=Pack(...)``): how full the packed sequences are, and how fast the packers run.

    python benchmarks/bench_pack.py            # 10,000 documents, prints the table
    python benchmarks/bench_pack.py --quick    # 2,000 documents, a smoke run
    python benchmarks/bench_pack.py --write    # also writes the table into benchmarks/README.md

The documents: lengths drawn from a log-normal with median 300 tokens (sigma 1.1), clipped to
1..20,000 (a long tail), tokens random int32; sequences of 2,048 tokens. Each entry packs the same
documents a window at a time and reports the packing efficiency (real tokens over all the tokens of
the sequences), the tokens kept (Grain's packers drop what does not fit a sequence; ours cut such a
document into sequences of its own) and the tokens packed per second, best of ``--repeats``:

* pyloader's packers (``pyloader._stages.pack.pack_columns``, what ``Pack`` runs on each batch):
  ``concat``, ``first_fit`` and ``best_fit``, each window of ``--window`` documents one batch;
* a plain Python packer: the straightforward loop (first fit and best fit over a list of open
  sequences, tokens, segment ids and positions appended to Python lists), on the same windows;
* Grain's ``FirstFitPackIterDataset`` and ``BestFitPackIterDataset`` with as many packing bins as
  pyloader's window fills on average, fed the documents already cut into pieces of at most a
  sequence (Grain refuses longer ones; the cutting is not timed), timed once (it is slow), when
  ``grain`` is importable (not a dependency: put it on ``PYTHONPATH`` to compare; the table says
  so when it was missing).

Single-threaded, in this process: the figures are the packers' own cost, not the loader's.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from _harness import machine_line, markdown_table, replace_section  # noqa: E402

from pyloader._stages.pack import PackSpec, pack_columns  # noqa: E402

SEQ_LEN = 2048
SECTION = "bench_pack"


def documents(n: int, seed: int = 0) -> List[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(300), 1.1, n).astype(np.int64), 1, 20_000)
    return [rng.integers(1, 50_000, k, dtype=np.int32) for k in lengths.tolist()]


def windows(docs: List[np.ndarray], size: int) -> List[List[np.ndarray]]:
    return [docs[i:i + size] for i in range(0, len(docs), size)]


# -- the packers measured ---------------------------------------------------------------------
def ours(method: str) -> Callable[[List[np.ndarray]], Dict[str, np.ndarray]]:
    spec = PackSpec("tokens", SEQ_LEN, method, 0, None)
    return lambda window: pack_columns({"tokens": window}, spec)


def plain_python(best: bool) -> Callable[[List[np.ndarray]], Dict[str, np.ndarray]]:
    """The straightforward packer: documents longest first, each into the first (or fullest) sequence with
    room, a longer one cut into whole sequences first; lists of tokens, segment ids and positions."""
    def pack(window: List[np.ndarray]) -> Dict[str, np.ndarray]:
        items = []
        for doc in window:
            tokens = doc.tolist()
            while len(tokens) > SEQ_LEN:
                items.append(tokens[:SEQ_LEN])
                tokens = tokens[SEQ_LEN:]
            items.append(tokens)
        items.sort(key=len, reverse=True)
        bins: List[List[List[int]]] = []
        room: List[int] = []
        for item in items:
            fits = [j for j in range(len(bins)) if room[j] >= len(item)]
            if not fits:
                bins.append([])
                room.append(SEQ_LEN)
                fits = [len(bins) - 1]
            j = min(fits, key=lambda b: room[b]) if best else fits[0]
            bins[j].append(item)
            room[j] -= len(item)
        rows, segments, positions = [], [], []
        for b in bins:
            row: List[int] = []
            seg: List[int] = []
            pos: List[int] = []
            for s, item in enumerate(b, 1):
                row += item
                seg += [s] * len(item)
                pos += list(range(len(item)))
            pad = SEQ_LEN - len(row)
            rows.append(row + [0] * pad)
            segments.append(seg + [0] * pad)
            positions.append(pos + [0] * pad)
        seg_array = np.array(segments, dtype=np.int32)
        return {"tokens": np.array(rows, dtype=np.int32), "segment_ids": seg_array,
                "positions": np.array(positions, dtype=np.int32), "loss_mask": seg_array > 0}
    return pack


def grain_packer(best: bool, bins: int) -> Optional[Callable[[List[Dict[str, np.ndarray]]], List[Dict[str, Any]]]]:
    try:
        from grain._src.python.dataset import dataset
        from grain._src.python.dataset.transformations.packing import BestFitPackIterDataset, FirstFitPackIterDataset
    except ImportError:
        return None
    kind = BestFitPackIterDataset if best else FirstFitPackIterDataset

    def pack(pieces: List[Dict[str, np.ndarray]]) -> List[Dict[str, Any]]:
        source = dataset.MapDataset.source(pieces).to_iter_dataset()
        return list(kind(source, length_struct={"tokens": SEQ_LEN}, num_packing_bins=bins, shuffle_bins=False))
    return pack


# -- measuring --------------------------------------------------------------------------------
def measure(name: str, run: Callable[[], List[Dict[str, Any]]], total: int, repeats: int) -> Dict[str, Any]:
    best = float("inf")
    out: List[Dict[str, Any]] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - t0)
    real = sum(int(_real(o).sum()) for o in out)
    cells = sum(int(np.asarray(o["tokens"]).size) for o in out)
    return {"entry": name, "efficiency": real / cells, "kept": real / total, "tokens_per_s": total / best,
            "sequences": cells // SEQ_LEN}


def _real(packed: Dict[str, Any]) -> np.ndarray:
    if "loss_mask" in packed:
        return np.asarray(packed["loss_mask"])
    return np.asarray(packed["tokens_segment_ids"]) > 0  # Grain's


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=10_000)
    ap.add_argument("--window", default="64,512", help="documents packed at a time (pyloader: a batch), e.g. 64,512")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/README.md")
    args = ap.parse_args()
    if args.quick:
        args.docs, args.repeats = 2_000, 1
    docs = documents(args.docs)
    total = int(sum(d.size for d in docs))
    entries: List[Dict[str, Any]] = []
    missing: List[str] = []
    for size in [int(w) for w in args.window.split(",")]:
        entries += _entries(docs, total, size, args.repeats, missing)
    markdown = _markdown(entries, args, total, missing)
    print(markdown)
    if args.write:
        replace_section(os.path.join(HERE, "README.md"), SECTION, markdown)
        print("\nwrote benchmarks/README.md (bench_pack section)")


def _entries(docs: List[np.ndarray], total: int, size: int, repeats: int, missing: List[str]) -> List[Dict[str, Any]]:
    """Every packer on windows of ``size`` documents (Grain: as many bins as such a window fills)."""
    chunks = windows(docs, size)
    bins = max(1, round(total / len(chunks) / SEQ_LEN))
    out: List[Dict[str, Any]] = []
    for method in ("concat", "first_fit", "best_fit"):
        pack = ours(method)
        out.append(measure(f"pyloader `{method}`", lambda pack=pack: [pack(w) for w in chunks], total, repeats))
    for best in (False, True):
        plain = plain_python(best)
        name = "best_fit" if best else "first_fit"
        out.append(measure(f"plain Python {name}", lambda plain=plain: [plain(w) for w in chunks], total, repeats))
    for best in (False, True):
        grain = grain_packer(best, bins)
        name = f"Grain {'BestFit' if best else 'FirstFit'}PackIterDataset ({bins} bins)"
        if grain is None:
            missing.append(name)
            continue
        pieces = [{"tokens": d[i:i + SEQ_LEN]} for d in docs for i in range(0, d.size, SEQ_LEN)]
        out.append(measure(name, lambda grain=grain, pieces=pieces: grain(pieces), total, 1))
    for entry in out:
        entry["window"] = size
    return out


def _markdown(entries: List[Dict[str, Any]], args: Any, total: int, missing: List[str]) -> str:
    rows = [[e["window"], e["entry"], f"{e['efficiency']:.1%}", f"{e['kept']:.1%}", f"{e['sequences']:,}",
             f"{e['tokens_per_s'] / 1e6:,.1f}M"] for e in entries]
    lines = [f"{args.docs:,} documents ({total:,} tokens: log-normal lengths, median 300, clipped to 1..20,000), "
             f"sequences of {SEQ_LEN}, windows of {args.window} documents (Grain: as many packing bins as a "
             f"window fills on average), best of {args.repeats}; {machine_line()}.", "",
             markdown_table(["window", "packer", "efficiency", "tokens kept", "sequences", "tokens/s"], rows)]
    if missing:
        lines += ["", "Not measured (`grain` not importable here): " + ", ".join(missing) + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
