"""Stream mode, the letter demo: each batch row continues its own stream.

    python examples/stream_letters.py

Eight files ``a`` .. ``h`` hold the samples ``a_0, a_1, ...``; with 8 rows and
``seq_len=3`` row ``r`` of batch ``k+1`` continues where row ``r`` of batch ``k``
stopped. ``__first__`` tells the model to reset a row's hidden state.
"""
from __future__ import annotations

import os
import tempfile

import pyloader as pl
from pyloader.collators import NumpyCollator
from pyloader.readers import TextLinesReader


def main(rows: int = 8, seq_len: int = 3, batches: int = 3) -> None:
    with tempfile.TemporaryDirectory(prefix="pyloader-letters-") as folder:
        for letter in "abcdefghijkl":
            with open(os.path.join(folder, f"{letter}.txt"), "w") as f:
                f.writelines(f"{letter}_{t}\n" for t in range(12))
        loader = pl.DataLoader(TextLinesReader(batch_size=rows), pl.IdentityDataset(), NumpyCollator(), folder,
                               stream=pl.Stream(seq_len=seq_len, pad_value=""))
        with loader:
            for k, batch in enumerate(loader):
                if k == batches:
                    break
                print(f"- batch{k + 1}")
                for r in range(rows):
                    reset = "  <- reset hidden state" if batch["__first__"][r] else ""
                    print("".join(f"{token};" for token in batch["text"][r]) + reset)
                print()


if __name__ == "__main__":
    main()
