"""Stream mode with a recurrent model: a small GRU language model over streamed text.

    python examples/stream_gru.py [--rows 8] [--seq-len 32] [--epochs 3]

Each batch row continues its own text file from the previous batch, so the
GRU's hidden state is carried from batch to batch; rows flagged ``__first__``
start a new file and get a fresh hidden state. Padding (``__valid__`` false)
and replayed rows are left out of the loss. The data is made on the spot.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from typing import Optional

import numpy as np
import torch

import pyloader as pl
from pyloader.collators import TorchCollator

VOCAB = 256


class ByteStream(pl.DataReader):
    """A text file as a stream of byte tokens: one sample per byte, read 4 KiB at a time."""

    def read_file(self, path):
        with pl.open_file(path, "rb") as f:
            data = list(f.read())
        return {"token": data}, len(data)

    def iter_file(self, path):
        with pl.open_file(path, "rb") as f:
            while chunk := f.read(4096):
                yield {"token": list(chunk)}


class NextToken(pl.Dataset):
    """Each window predicts itself shifted by one inside the model; nothing to encode."""

    def batch_encode(self, batch_data):
        return batch_data


class GRULanguageModel(torch.nn.Module):
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.gru = torch.nn.GRU(32, hidden, batch_first=True)
        self.head = torch.nn.Linear(hidden, VOCAB)

    def forward(self, tokens: torch.Tensor, state: torch.Tensor):
        out, state = self.gru(self.embed(tokens), state)
        return self.head(out), state


def make_texts(folder: str, files: int = 12, seed: int = 0) -> None:
    """Files of varying length written in a tiny grammar, so there is something to learn."""
    rng = np.random.default_rng(seed)
    words = ["stream", "batch", "row", "file", "hidden", "state", "loader", "epoch", "sample", "model"]
    for i in range(files):
        n_words = int(rng.integers(300, 1500))
        text = " ".join(words[(j * 3 + int(rng.integers(0, 2))) % len(words)] for j in range(n_words)) + ".\n"
        with open(os.path.join(folder, f"text-{i:03d}.txt"), "w") as f:
            f.write(text)


def train(folder: str, rows: int, seq_len: int, epochs: int, hidden: int = 64, max_steps: Optional[int] = None) -> list:
    torch.manual_seed(0)
    model = GRULanguageModel(hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loader = pl.DataLoader(ByteStream(batch_size=rows), NextToken(), TorchCollator(), folder, num_epoch=epochs,
                           shuffle=True, stream=pl.Stream(seq_len=seq_len + 1, padding_mode="zeros"))
    state = torch.zeros(1, rows, hidden)
    losses = []
    with loader:
        for step, batch in enumerate(loader):
            tokens = batch["token"]
            state = state.detach()
            state[:, batch["__first__"]] = 0.0  # a row that starts a file forgets the previous one
            logits, state = model(tokens[:, :-1], state)
            real = batch["__valid__"][:, 1:] & ~batch["__replay__"][:, None]
            loss = torch.nn.functional.cross_entropy(logits[real], tokens[:, 1:][real])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if step % 50 == 0:
                print(f"epoch {loader.epoch} step {step:4d}  loss {loss.item():.3f}")
            if max_steps is not None and step + 1 >= max_steps:
                break
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pyloader-gru-") as folder:
        make_texts(folder)
        losses = train(folder, args.rows, args.seq_len, args.epochs, max_steps=args.max_steps)
    print(f"loss {np.mean(losses[:10]):.3f} -> {np.mean(losses[-10:]):.3f} over {len(losses)} steps")


if __name__ == "__main__":
    main()
