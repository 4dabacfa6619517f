"""Shuffle quality of the global order (``shuffle=Shuffle(block=...)``) against the other ways to shuffle.

Data sorted the worst way: 100 files of 1,000 samples, one class per file. Batch 256, two epochs. For each
order, over every batch of both epochs:

- ``balance``: the mean total-variation distance between a batch's class histogram and the global one,
  normalised so that 0 is a uniform random permutation (measured on 20 of them) and 1 is no shuffle;
- ``spearman``: the mean |Spearman correlation| between a sample's place in the data and in the epoch;
- ``held``: the samples the shuffle holds in memory (all ranks together);
- ``same 1v2`` / ``same 1v4``: the share of global batches holding the same samples under 1 and 2 (or 4) ranks.

Peers (Mosaic streaming, Grain) are measured when installed (``pip install mosaicml-streaming grain``), each
on the same data; missing ones are listed. Usage: ``python benchmarks/bench_order.py`` (under a minute).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Callable, Dict, List, Optional, Tuple

import _harness as H  # noqa: I001  (puts this checkout first on sys.path)
import numpy as np

import pyloader as pl
from pyloader.readers import JsonLinesReader

FILES, PER_FILE, BATCH, EPOCHS = 100, 1000, 256, 2
N = FILES * PER_FILE


def write_data(folder: str) -> None:
    for f in range(FILES):
        with open(os.path.join(folder, f"class-{f:03d}.jsonl"), "w") as out:
            out.writelines(json.dumps({"id": f * PER_FILE + i}) + "\n" for i in range(PER_FILE))


class Ids(pl.DataCollator):
    def collate_batch(self, features):
        return {"id": np.asarray(features["id"])}


def pyloader_epochs(folder: str, world_size: int = 1, **options) -> List[List[np.ndarray]]:
    """Every global batch of each epoch (the ranks' slices joined), padding left out."""
    per_rank = []
    for rank in range(world_size):
        loader = pl.DataLoader(JsonLinesReader(batch_size=BATCH // world_size), pl.IdentityDataset(), Ids(), folder,
                               num_epoch=EPOCHS, workers=0, ranks=pl.Ranks(rank=rank, world_size=world_size),
                               **options)
        epochs: List[List[np.ndarray]] = [[] for _ in range(EPOCHS)]
        for batch in loader:
            ids = batch["id"] if "__padding__" not in batch else batch["id"][~np.asarray(batch["__padding__"])]
            epochs[loader.epoch].append(ids)
        per_rank.append(epochs)
    return [[np.concatenate([per_rank[r][e][k] for r in range(world_size)]) for k in range(len(per_rank[0][e]))]
            for e in range(EPOCHS)]


def tv(batch: np.ndarray) -> float:
    hist = np.bincount(batch // PER_FILE, minlength=FILES) / len(batch)
    return 0.5 * float(np.abs(hist - 1 / FILES).sum())


def balance(epochs: List[List[np.ndarray]]) -> float:
    return float(np.mean([tv(b) for e in epochs for b in e]))


def spearman(epochs: List[List[np.ndarray]]) -> float:
    out = []
    for e in epochs:
        order = np.concatenate(e)
        ranks = np.empty(len(order))
        ranks[np.argsort(order)] = np.arange(len(order))
        out.append(abs(np.corrcoef(ranks, np.arange(len(order)))[0, 1]))
    return float(np.mean(out))


def same(a: List[List[np.ndarray]], b: List[List[np.ndarray]]) -> float:
    pairs = [(x, y) for ea, eb in zip(a, b) for x, y in zip(ea, eb)]
    return float(np.mean([set(x.tolist()) == set(y.tolist()) for x, y in pairs])) if pairs else 0.0


def ideal_epochs(seed: int) -> List[List[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [np.array_split(p, range(BATCH, N, BATCH)) for p in (rng.permutation(N) for _ in range(EPOCHS))]


Orders = Callable[[int], List[List[np.ndarray]]]  # world size -> every global batch of each epoch


def peers() -> Dict[str, Orders]:
    """Orders of other loaders, where installed (none of them is a dependency of pyloader), made by their own
    functions on the same sample counts."""
    found: Dict[str, Orders] = {}
    try:
        import grain.python as grain
    except ImportError:
        print("grain not installed: left out")
    else:
        def grain_epochs(world_size: int) -> List[List[np.ndarray]]:
            out = []
            for e in range(EPOCHS):  # a global index shuffle, then each rank a slice of every global batch
                sampler = grain.IndexSampler(N, shuffle=True, seed=e, shard_options=grain.NoSharding(), num_epochs=1)
                ids = np.fromiter((sampler[i].record_key for i in range(N)), dtype=np.int64)
                out.append(np.array_split(ids, range(BATCH, N, BATCH)))
            return out
        found["Grain, global index shuffle"] = grain_epochs
    shuffle = _mosaic()
    if shuffle is None:
        print("mosaicml-streaming not installed: left out")
        return found
    for algo in ("py1e", "py1br"):
        for block in (10_000, 1 << 18):
            found[f"Mosaic {algo}, block {block:,}, 4 canonical nodes"] = _mosaic_epochs(*shuffle, algo, block)
    return found


def _mosaic() -> Optional[Tuple[Callable, Callable]]:
    """Mosaic streaming's shuffle and partition functions (its torchvision import stubbed where needed)."""
    H.mosaic_importable()
    try:
        from streaming.base.partition import get_partitions
        from streaming.base.shuffle import get_shuffle
    except ImportError:
        return None
    return get_shuffle, get_partitions


def _mosaic_epochs(get_shuffle: Callable, get_partitions: Callable, algo: str, block: int) -> Orders:
    def epochs(world_size: int) -> List[List[np.ndarray]]:
        out = []
        for e in range(EPOCHS):
            order = get_shuffle(algo, np.full(FILES, PER_FILE, dtype=np.int64), 4, 1, e, block)
            ids = get_partitions("orig", N, 4, 1, world_size, 1, BATCH // world_size, 0)[0, :, 0]  # [rank, batch, row]
            batches = [np.concatenate([order[r[r >= 0]] for r in ids[:, k]]) for k in range(ids.shape[1])]
            out.append([b for b in batches if len(b)])
        return out
    return epochs


class Words(pl.Dataset):
    """A Python ``batch_encode`` of about the cost of a tokenizer's pre-split: words to hashed ids."""

    def batch_encode(self, batch):
        return {"ids": [[hash(w) % 50_000 for w in text.split()] for text in batch["text"]]}


class Lengths(pl.DataCollator):
    def collate_batch(self, features):
        return {"n": np.asarray([len(x) for x in features["ids"]])}


def throughput(rounds: int) -> None:
    """Samples per second of one epoch of 200,000 JSON lines (a Python ``batch_encode``) with the default
    placement: unshuffled, file shuffle, the global order's default block; on local disk and on storage
    answering each read in 20 ms (``pyloader.testing.LatencyFileSystem``), each indexed first
    (``python -m pyloader index``). Medians of ``rounds``."""
    import time

    from pyloader.testing import LatencyFileSystem

    text = " ".join(["lorem ipsum dolor sit amet consectetur"] * 5)
    files = {f"part-{f:03d}.jsonl": "".join(json.dumps({"text": f"{i} {text}"}) + "\n" for i in range(2_000)).encode()
             for f in range(100)}
    slow = LatencyFileSystem.register("benchorder", latency=0.02)
    for name, data in files.items():
        slow().pipe(f"/data/{name}", data)
    with tempfile.TemporaryDirectory() as folder:
        for name, data in files.items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
        from pyloader import _cli

        for data_dir in (folder, "benchorder://data/"):  # the index of counts and sample places, as users make it
            _cli.main(["index", data_dir, "--reader", "jsonl"], out=lambda line: None)
        print("| storage | order | samples/s | vs unshuffled |")
        print("|---|---|---|---|")
        for where, data_dir in (("local disk", folder), ("20 ms per read", "benchorder://data/")):
            base = None
            for name, shuffle in (("unshuffled", False), ("file shuffle", True), ("Shuffle()", pl.Shuffle())):
                times = []
                for _ in range(rounds):
                    loader = pl.DataLoader(JsonLinesReader(batch_size=256), Words(), Lengths(), data_dir,
                                           shuffle=shuffle)
                    began = time.perf_counter()
                    n = sum(len(b["n"]) for b in loader)
                    times.append(time.perf_counter() - began)
                    assert n == 200_000, n
                rate = 200_000 / float(np.median(times))
                base = base or rate
                print(f"| {where} | {name} | {rate:,.0f} | {rate / base:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--throughput", action="store_true", help="samples/s of the orders instead of their quality")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.throughput:
        throughput(args.rounds)
        return
    with tempfile.TemporaryDirectory() as folder:
        write_data(folder)
        ideal = [balance(ideal_epochs(s)) for s in range(20)]
        floor = float(np.mean(ideal))
        ceiling = balance(pyloader_epochs(folder))

        def norm(x: float) -> float:
            return (x - floor) / (ceiling - floor)
        rows = [("uniform permutation (ideal)", norm(floor), spearman(ideal_epochs(0)), f"{N:,}", "-", "-")]
        cases = [("pyloader, file + in-file shuffle", dict(shuffle=True), f"{PER_FILE:,}")]
        cases += [(f"pyloader, shuffle_buffer {b:,}", dict(shuffle=True, order=pl.Order(shuffle_buffer=b)),
                   f"{b + PER_FILE:,}") for b in (1_000, 10_000)]
        cases += [(f"pyloader, Shuffle(block={b:,})", dict(shuffle=pl.Shuffle(block=b)), f"{b:,} (RAM)")
                  for b in (1_000, 10_000, N)]
        for name, options, held in cases:
            one = pyloader_epochs(folder, 1, **options)
            two, four = pyloader_epochs(folder, 2, **options), pyloader_epochs(folder, 4, **options)
            shares = f"{same(one, two):.0%}", f"{same(one, four):.0%}"
            rows.append((name, norm(balance(one)), spearman(one), held, *shares))
        for name, make in peers().items():
            one, two, four = make(1), make(2), make(4)
            held = "the index (all samples)" if "Grain" in name else "the block, on disk"
            rows.append((name, norm(balance(one)), spearman(one), held, f"{same(one, two):.0%}",
                         f"{same(one, four):.0%}"))
    print("| order | normalised batch balance (0 ideal, 1 no shuffle) | mean abs. Spearman | samples held | "
          "same global batches 1 vs 2 | 1 vs 4 |")
    print("|---|---|---|---|---|---|")
    for name, bal, rho, held, two, four in rows:
        print(f"| {name} | {bal:.3f} | {rho:.3f} | {held} | {two} | {four} |")


if __name__ == "__main__":
    main()
