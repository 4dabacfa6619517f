"""A DDP training loop fed by pyloader, run by tests/test_distributed.py under torchrun (gloo, CPU)."""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

import pyloader as pl
from pyloader.collators import TorchCollator


class IdLines(pl.DataReader):
    """One integer sample id per line."""

    def read_file(self, path):
        with pl.open_file(path, "rt") as f:
            ids = [int(line) for line in f if line.strip()]
        return {"id": ids}, len(ids)

    def count(self, path):
        """Lines, unparsed: a line that does not parse fails the read, not the count."""
        with pl.open_file(path, "rt") as f:
            return sum(1 for line in f if line.strip())


def train(data: str, out: str, workers: int = 0, stream: bool = False, even: str = "pad", epochs: int = 2,
          on_error: str = "raise") -> None:
    """One loader and one DDP model: writes this rank's steps and the sample ids it trained on to ``out``."""
    loader = pl.DataLoader(IdLines(batch_size=3), pl.IdentityDataset(), TorchCollator(), data,
                           num_epoch=epochs, shuffle=True, num_workers=workers, ranks=pl.Ranks(even_batches=even),
                           stream=pl.Stream(seq_len=2) if stream else False, on_error=on_error)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    steps, seen = 0, []
    for batch in loader:
        x = batch["id"].float().reshape(-1, 1) / 100.0
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # gradients are all-reduced: unequal step counts would hang here
        optimizer.step()
        steps += 1
        if stream:
            real = batch["__valid__"] & ~batch["__replay__"][:, None]
            seen.extend(batch["id"][real].tolist())
        else:
            seen.extend(batch["id"][~batch["__padding__"]].tolist() if "__padding__" in batch else batch["id"].tolist())
    dist.barrier()
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"rank": loader.sharding.rank, "world_size": loader.sharding.world_size, "steps": steps,
                   "seen": seen}, f)
    loader.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data")
    parser.add_argument("--out")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--even", default="pad")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--on-error", default="raise")
    parser.add_argument("--runs", help="a JSON file: a list of train() keyword arguments, run one after the other "
                                       "(one launch, as a program may train several models)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    if args.runs:
        with open(args.runs) as f:
            for run in json.load(f):
                train(**run)
    else:
        train(args.data, args.out, args.workers, args.stream, args.even, args.epochs, args.on_error)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
