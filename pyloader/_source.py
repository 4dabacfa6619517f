"""Stage 1: which file is read when — the per-epoch plan of files."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Sequence, Union

from ._rng import FILE_ORDER, derive_rng


@dataclass(frozen=True)
class FileTask:
    """File ``path`` is the ``pos``-th file of ``epoch``; ``index`` is its place in the sorted list."""

    epoch: int
    pos: int
    index: int
    path: str


@dataclass(frozen=True)
class EpochEnd:
    epoch: int


SourceItem = Union[FileTask, EpochEnd]


class FileSource:
    """Yields every epoch's files in order, then an ``EpochEnd`` marker.

    The order of epoch ``e`` is the sorted list, or with ``shuffle`` a permutation
    drawn from ``(seed, e)``: the same on every run, rank and worker.
    """

    def __init__(self, files: Sequence[str], num_epoch: int, shuffle: bool, seed: int) -> None:
        self.files = list(files)
        self.num_epoch = num_epoch
        self.shuffle = shuffle
        self.seed = seed

    def order(self, epoch: int) -> List[int]:
        if not self.shuffle:
            return list(range(len(self.files)))
        return derive_rng(self.seed, FILE_ORDER, epoch).permutation(len(self.files)).tolist()

    def iterate(self, start_epoch: int = 0) -> Iterator[SourceItem]:
        for epoch in range(start_epoch, self.num_epoch):
            for pos, index in enumerate(self.order(epoch)):
                yield FileTask(epoch, pos, index, self.files[index])
            yield EpochEnd(epoch)
