#!/usr/bin/env python
"""Draw img/trace_timeline.png and print the report shown in docs/guides/watching-a-run.md.

    python img/draw_trace.py

The workload: 8 JSONL files of 500 short texts, a ``batch_encode`` that tokenizes them in Python
(split, hash into ids, pad), ``NumpyCollator``, 2 worker processes, and a consumer that only sums each
batch of 64 (as a training step on a fast GPU would: the loader has to keep up). Data goes to a temporary
folder, removed afterwards.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile

import numpy as np

import pyloader as pl
from pyloader._diagnose import timeline_png
from pyloader.collators import NumpyCollator
from pyloader.readers import JsonLinesReader

HERE = os.path.dirname(os.path.abspath(__file__))
WORDS = "the quick brown fox jumps over a lazy dog while loaders read files and workers encode batches".split()


class Tokenize(pl.Dataset):
    def batch_encode(self, batch_data):
        ids = np.zeros((len(batch_data["text"]), 64), dtype=np.int64)
        for i, text in enumerate(batch_data["text"]):
            tokens = [hash(w) % 30_000 for w in text.split()][:64]
            ids[i, :len(tokens)] = tokens
        return {"ids": ids, "label": np.asarray(batch_data["label"])}


def main() -> None:
    root = tempfile.mkdtemp(prefix="pyloader-trace-")
    rng = np.random.default_rng(0)
    try:
        for f in range(8):
            with open(os.path.join(root, f"part-{f}.jsonl"), "w", encoding="utf-8") as out:
                for j in range(500):
                    text = " ".join(rng.choice(WORDS, size=int(rng.integers(20, 60))))
                    out.write(json.dumps({"text": text, "label": j % 7}) + "\n")
        loader = pl.DataLoader(JsonLinesReader(batch_size=64), Tokenize(), NumpyCollator(), root, num_workers=2)
        path = os.path.join(root, "trace.json")
        with loader, loader.trace(path):
            for batch in loader:
                batch["ids"].sum()  # the training step
        print(loader.report())
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
        print(timeline_png(trace, os.path.join(HERE, "trace_timeline.png")))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
