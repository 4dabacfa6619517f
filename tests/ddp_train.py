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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--even", default="pad")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--on-error", default="raise")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = pl.DataLoader(IdLines(batch_size=3), pl.IdentityDataset(), TorchCollator(), args.data,
                           num_epoch=args.epochs, shuffle=True, num_workers=args.workers, even_batches=args.even,
                           stream=args.stream, seq_len=2 if args.stream else None, on_error=args.on_error)
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
        if args.stream:
            real = batch["__valid__"] & ~batch["__replay__"][:, None]
            seen.extend(batch["id"][real].tolist())
        else:
            seen.extend(batch["id"][~batch["__padding__"]].tolist() if "__padding__" in batch else batch["id"].tolist())
    dist.barrier()
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": loader.sharding.rank, "world_size": loader.sharding.world_size, "steps": steps,
                   "seen": seen}, f)
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
