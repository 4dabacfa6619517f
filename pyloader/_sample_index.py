"""The sample index of a line file: where every ``RUN``-th sample line starts, so that samples
``start:stop`` are read as the bytes from the run ``start`` falls in to the run after ``stop - 1``.

Kept in the count index's entry of the file (``_storage.count_index``, key ``"runs"``: written by
``python -m pyloader index`` and with the counts in ``cache_dir``, used only while the file is as it
was) and, where no index holds it, made once per file and process from the file's bytes
(``readers._ranges``). JSON, never pickled: ``{"every": RUN, "at": [byte offsets], "size": bytes}``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

RUN = 64  # samples per entry of a table


@dataclass(frozen=True)
class LineTable:
    """Where sample ``k * RUN`` starts, for every ``k``, and where the file's bytes end."""

    starts: np.ndarray
    size: int
    samples: int

    def extent(self, start: int, stop: int) -> Tuple[int, int, int]:
        """The bytes holding samples ``start:stop`` (from the run of ``start`` to the run after ``stop - 1``),
        and the samples before ``start`` in them."""
        first = start // RUN
        last = -(-stop // RUN)
        end = int(self.starts[last]) if last < len(self.starts) else self.size
        return int(self.starts[first]), end, start - first * RUN

    def as_json(self) -> Dict[str, object]:
        return {"every": RUN, "at": self.starts.tolist(), "size": self.size}


def table_of(runs: object, count: int) -> Optional[LineTable]:
    """The table an index entry's ``runs`` holds for a file of ``count`` samples, if it is one."""
    if not isinstance(runs, dict) or runs.get("every") != RUN or not isinstance(runs.get("size"), int):
        return None
    at = runs.get("at")
    return LineTable(np.asarray(at, dtype=np.int64), runs["size"], count) if _offsets(at, count) else None


def _offsets(at: object, count: int) -> bool:
    """Whether ``at`` is a list of the offsets of a file of ``count`` samples, every ``RUN``-th."""
    return isinstance(at, list) and len(at) == -(-count // RUN) and all(isinstance(a, int) for a in at)


Extent = Tuple[int, int, int]  # (first byte, end byte, samples before the range in them)
