"""The README's usage under default settings, run as a fresh interpreter would: ``python fresh_start.py VARIANT DIR``.

Prints ``OK <placement>`` once every sample of both epochs came exactly once; anything else
(a hang included: the caller's timeout) is a failure. Variants:

* ``plain``: a Python reader, reader and loader shuffling, two epochs;
* ``torch``: torch imported first, ``TorchCollator``;
* ``importing``: a user thread imports a slow module while the loader starts, and the
  reader imports the same module in the workers;
* ``tokenizer``: batch_encode uses an HF ``tokenizers`` BPE trained here, whose thread pool
  has already run in this process;
* ``forked`` (persistent workers) and ``forked-run``: two children made by ``os.fork()`` while
  the workers run, one exiting normally and one with an uncaught exception.

Also used by ``benchmarks/bench_fresh_start.py`` for a larger count.
"""
from __future__ import annotations

import json
import os
import sys
import threading

VARIANT, DATA = sys.argv[1], sys.argv[2]
if VARIANT == "torch":
    import torch  # noqa: F401

import pyloader as pl  # noqa: E402
from pyloader.collators import TorchCollator  # noqa: E402

N_FILES, PER_FILE = 10, 40


class Reader(pl.DataReader):
    def read_file(self, path):
        if VARIANT == "importing":
            import slow_module  # noqa: F401
        rows = [json.loads(line) for line in open(path)]
        return {"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]}, len(rows)


class Encode(pl.Dataset):
    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer

    def batch_encode(self, batch):
        if self.tokenizer is not None:
            batch["tokens"] = [len(e.ids) for e in self.tokenizer.encode_batch(batch["text"])]
        return {k: v for k, v in batch.items() if k != "text"}


class Collate(pl.DataCollator):
    def collate_batch(self, features):
        return {k: list(v) for k, v in features.items()}


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([f"sample number {i} of the text" for i in range(500)],
                            trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]"]))
    tok.encode_batch(["warm the thread pool up"] * 64)
    return tok


def main() -> None:
    os.makedirs(os.path.join(DATA, "data"))
    for i in range(N_FILES):
        with open(os.path.join(DATA, "data", f"part-{i:02d}.jsonl"), "w") as f:
            for j in range(PER_FILE):
                f.write(json.dumps({"id": i * PER_FILE + j, "text": f"sample {j} of file {i}"}) + "\n")
    if VARIANT == "importing":
        modules = os.path.join(DATA, "modules")
        os.mkdir(modules)
        with open(os.path.join(modules, "slow_module.py"), "w") as f:
            f.write("import time\ntime.sleep(0.5)\n")
        sys.path.insert(0, modules)
        threading.Thread(target=lambda: __import__("slow_module"), name="user-importer").start()
    dataset = Encode(tokenizer() if VARIANT == "tokenizer" else None)
    collator = TorchCollator() if VARIANT == "torch" else Collate()
    loader = pl.DataLoader(Reader(batch_size=16, shuffle=True), dataset, collator, data_dir=os.path.join(DATA, "data"),
                           shuffle=True, num_epoch=2, persistent_workers=VARIANT == "forked")
    ids = forked_mid_run(loader) if VARIANT.startswith("forked") else [int(i) for batch in loader for i in batch["id"]]
    assert sorted(ids) == sorted(list(range(N_FILES * PER_FILE)) * 2), f"{len(ids)} samples"
    print("OK", json.dumps(loader.stats["placement"]), flush=True)


def forked_mid_run(loader: pl.DataLoader) -> list:
    """Two epochs in which children of this process, forked after the first batch of each, exit:
    normally in the first, with an uncaught exception in the second (both run the exit handlers)."""
    ids = []
    for k, batch in enumerate(loader):
        ids.extend(int(i) for i in batch["id"])
        if k in (0, 30):
            pid = os.fork()
            if pid == 0:
                if k == 0:
                    sys.exit(0)
                raise RuntimeError("the child fails (expected)")
            os.waitpid(pid, 0)
    return ids


if __name__ == "__main__":
    main()
