"""The start-up ramp: the read stage reads few files ahead until the first batch is out, then
``prefetch_files``. The end of the ramp flows back as a signal the read stage observes
(``_stages.read.Ramp``), set by whoever consumes the first batch."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import List

import pytest
from conftest import IdReader, ListCollator, ids_of, write_chunks

import pyloader as pl

pytestmark = pytest.mark.timeout(120)


class MarkingReader(IdReader):
    """Leaves a mark per file it reads in ``marks`` (seen from any process); while it parses the
    first file (slowly) it notes in ``during`` which other files were read meanwhile."""

    def __init__(self, marks: str) -> None:
        super().__init__(4)
        self.marks = marks

    def read_file(self, path):
        name = os.path.basename(path)
        if name == "part-0000.txt":
            time.sleep(0.5)
            Path(self.marks, "..", "during").write_text(" ".join(_marked(self.marks)))
        Path(self.marks, name).touch()
        return super().read_file(path)


def _marked(marks: str) -> List[str]:
    return sorted(os.listdir(marks))


def _wait_for(marks: str, names: List[str]) -> List[str]:
    deadline = time.monotonic() + 60
    while not set(names) <= set(_marked(marks)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return _marked(marks)


@pytest.mark.parametrize("workers", [0, 2])
def test_files_are_read_prefetch_files_ahead_only_once_the_first_batch_is_out(tmp_path, workers):
    """Until the first batch is out only a file per extra worker is read beside the first one; then the
    read stage opens ``prefetch_files`` files ahead at once, while the first (long) file is still batched."""
    write_chunks(tmp_path / "d", [8000] + [8] * 6)  # the first file's batches fill the hand-over long before its end
    marks = tmp_path / "marks"
    marks.mkdir()
    loader = pl.DataLoader(MarkingReader(str(marks)), pl.IdentityDataset(), ListCollator(), str(tmp_path / "d"),
                           prefetch_files=3, max_queue_size=2, num_workers=workers)
    batches = iter(loader)
    first = next(batches)
    during = (tmp_path / "during").read_text().split()
    assert set(during) <= ({"part-0001.txt"} if workers == 2 else set()), during
    ahead = [f"part-{i:04d}.txt" for i in range(1, 4)]
    assert _wait_for(str(marks), ahead) == ["part-0000.txt"] + ahead
    time.sleep(0.3)  # the read stage stays prefetch_files ahead: the file after them waits its turn
    assert _marked(str(marks)) == ["part-0000.txt"] + ahead
    assert ids_of([first] + list(batches)) == list(range(8048))
    loader.close()
