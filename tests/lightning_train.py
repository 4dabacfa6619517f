"""Lightning training fed by pyloader, run by tests/test_training_stacks.py in its own processes.

The loader is built before ``Trainer.fit`` (and, under ``strategy="ddp"``, before the
process group exists). Every training step records the ids it trained on; each rank
writes them to ``<out>.rank<r>.json`` when training ends.
"""
from __future__ import annotations

import argparse
import json
import os

import lightning as L
import torch

import pyloader as pl
from pyloader.collators import TorchCollator


class IdLines(pl.DataReader):
    """One integer sample id per line; keeps the file's rows on ``self`` (not thread-safe)."""

    def read_file(self, path):
        with pl.open_file(path, "rt") as f:
            self.rows = [int(line) for line in f if line.strip()]
        return {"id": list(self.rows), "pid": [os.getpid()] * len(self.rows)}, len(self.rows)


class Recorder(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list = []

    def training_step(self, batch, batch_idx):
        ids = batch["id"].tolist()
        padding = batch["__padding__"].tolist() if "__padding__" in batch else [False] * len(ids)
        self.seen.append({"epoch": self.current_epoch, "step": self.global_step, "ids": ids, "padding": padding,
                          "read_by": sorted(set(batch["pid"].tolist()))})
        return self.layer(batch["id"].float().unsqueeze(1)).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def on_train_end(self) -> None:
        with open(f"{self.out}.rank{self.global_rank}.json", "w") as f:
            json.dump({"seen": self.seen, "num_training_batches": self.trainer.num_training_batches,
                       "pid": os.getpid(), "placement": self.loader.stats.get("placement")}, f)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--workers", default="0", help='a number, or "auto" (the default of DataLoader)')
    parser.add_argument("--ckpt-dir", default=None)
    parser.add_argument("--ckpt-every", type=int, default=0)
    parser.add_argument("--resume", nargs="+", default=[None],
                        help="checkpoints: one fit from each, one after the other, writing <out>.<i>.rank<r>.json "
                             "when there are several")
    args = parser.parse_args()

    for i, resume in enumerate(args.resume):
        loader = pl.DataLoader(IdLines(batch_size=4), pl.IdentityDataset(), TorchCollator(), args.data,
                               shuffle=True, num_workers=args.workers if args.workers == "auto" else int(args.workers))
        callbacks = []
        if args.ckpt_every:
            callbacks.append(L.pytorch.callbacks.ModelCheckpoint(
                dirpath=args.ckpt_dir, filename="{step}", every_n_train_steps=args.ckpt_every, save_top_k=-1))
        trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=args.devices, strategy=args.strategy,
                            logger=False, enable_checkpointing=bool(callbacks), callbacks=callbacks,
                            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
        model = Recorder()
        model.loader = loader
        model.out = args.out if len(args.resume) == 1 else f"{args.out}.{i}"
        trainer.fit(model, train_dataloaders=loader, ckpt_path=resume)
        loader.close()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
