"""``Source``: one corpus of a weighted mix, and ``Mix``: the sources of a loader, with the reader that reads
each file with its source's reader (``_execution.reading.Readers``, where files are read).

A loader whose ``data_dir`` is a list of ``Source``s lists each source's files
(``list_files``) and reads them with the source's reader (the loader's
``datareader`` when it names none). The files of all sources are put end to end
into one list (a source's files stay together, in their order); a path may
belong to one source only. How samples are drawn across sources is ``_stages.mix``.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, TypeGuard

from .._abc import DataReader, is_thread_safe
from .._checks import is_integer
from .._execution.reading import Readers, SafeReaders
from .._storage.files import DataDir, list_files


class Source:
    """A corpus in a weighted mix: ``data_dir`` (anything ``DataLoader`` takes, but not a list of
    ``Source``s), its share ``weight`` (> 0; weights are normalized) and its ``reader`` (``None``:
    the loader's ``datareader``).

    Under the global order (``shuffle=Shuffle(...)``) a source's samples per epoch can be given instead
    of its share: ``repeat`` (times its samples: 0.1 subsamples, 2.5 upsamples) or ``choose`` (a number
    of samples); ``sampling`` says which samples a subsampled source gives: ``"balanced"`` (each epoch
    goes on where the last stopped, so every sample is seen about equally) or ``"fixed"`` (the same
    ones every epoch).

    Example:
        ```python
        loader = DataLoader(JsonLinesReader(32), IdentityDataset(), NumpyCollator(),
                            [Source("web/", weight=0.7), Source("tables/", weight=0.3, reader=CSVReader(32))],
                            shuffle=True)
        ```
    """

    def __init__(self, data_dir: DataDir, weight: float = 1.0, reader: Optional[DataReader] = None, *,
                 repeat: Optional[float] = None, choose: Optional[int] = None, sampling: str = "balanced") -> None:
        if _holds_sources(data_dir):
            raise ValueError("a Source's data_dir cannot hold Sources: list every Source in the loader's data_dir")
        _check_weight(weight)
        if reader is not None and not isinstance(reader, DataReader):
            raise TypeError(f"Source reader must be a pyloader.DataReader, got {type(reader).__name__}")
        _check_amount(repeat, choose, sampling)
        self.data_dir: DataDir = data_dir
        self.weight: float = float(weight)
        self.reader: Optional[DataReader] = reader
        self.repeat: Optional[float] = None if repeat is None else float(repeat)
        self.choose: Optional[int] = choose
        self.sampling: str = sampling

    @property
    def amount(self) -> Optional[Dict[str, object]]:
        """``repeat``, ``choose`` and ``sampling`` where any is given (the global order's), else ``None``."""
        if self.repeat is None and self.choose is None and self.sampling == "balanced":
            return None
        return {"repeat": self.repeat, "choose": self.choose, "sampling": self.sampling}

    def __repr__(self) -> str:
        amount = "".join(f", {k}={v!r}" for k, v in (self.amount or {}).items())
        return f"Source({self.data_dir!r}, weight={self.weight}, reader={type(self.reader).__name__}{amount})"


def _check_weight(weight: object) -> None:
    if not isinstance(weight, numbers.Real) or isinstance(weight, bool) or not 0 < float(weight) < float("inf"):
        raise ValueError(f"Source weight must be a finite number > 0, got {weight!r}")


def _check_amount(repeat: object, choose: object, sampling: object) -> None:
    if repeat is not None and choose is not None:
        raise ValueError("a Source takes repeat or choose, not both")
    if repeat is not None and not _finite_at_least_zero(repeat):
        raise ValueError(f"Source repeat must be a finite number >= 0, got {repeat!r}")
    if choose is not None and not is_integer(choose):
        raise ValueError(f"Source choose must be an integer >= 0, got {choose!r}")
    if sampling not in ("balanced", "fixed"):
        raise ValueError(f"Source sampling must be 'balanced' or 'fixed', got {sampling!r}")


def _finite_at_least_zero(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 <= float(value) < float("inf")


def _holds_sources(data_dir: object) -> TypeGuard[Sequence[object]]:
    """Whether ``data_dir`` is a list (or tuple) that holds a ``Source``."""
    return isinstance(data_dir, (list, tuple)) and any(isinstance(d, Source) for d in data_dir)


def is_mix(data_dir: object) -> TypeGuard[Sequence[Source]]:
    """Whether ``data_dir`` is a list of ``Source``s (a list mixing sources and paths is refused)."""
    if not _holds_sources(data_dir):
        return False
    if not all(isinstance(d, Source) for d in data_dir):
        raise TypeError("data_dir mixes Sources with other entries: make every entry a pyloader.Source")
    return True


@dataclass(frozen=True)
class Mix:
    """The sources of a loader: all their files end to end, and where each source's files lie."""

    sources: Tuple[Source, ...]
    files: List[str]
    spans: Tuple[Tuple[int, int], ...]  # source k's files are files[a:b]
    readers: "Readers"

    def source_of(self) -> List[int]:
        """The source of every file."""
        return [k for k, (a, b) in enumerate(self.spans) for _ in range(a, b)]

    def weights(self) -> List[float]:
        total = sum(s.weight for s in self.sources)
        return [s.weight / total for s in self.sources]


def readers_of(mix: Optional[Mix], default: DataReader) -> List[DataReader]:
    """The readers of a loader: its sources' (``mix``), else its ``datareader`` (``default``)."""
    return [default] if mix is None else mix.readers.readers


def build_mix(sources: Sequence[Source], default: DataReader, retries: int) -> Mix:
    """List every source's files; a path listed by two sources is a ``ValueError`` naming it and them."""
    files, spans, owner = _listed(sources, retries)
    chosen = [s.reader or default for s in sources]
    cls = SafeReaders if all(map(is_thread_safe, chosen)) else Readers
    return Mix(tuple(sources), files, tuple(spans), cls(default.batch_size, chosen, owner))


def _listed(sources: Sequence[Source], retries: int) -> Tuple[List[str], List[Tuple[int, int]], Dict[str, int]]:
    """Every source's files end to end, where each source's lie, and the source of each file."""
    files: List[str] = []
    spans: List[Tuple[int, int]] = []
    owner: Dict[str, int] = {}
    for k, source in enumerate(sources):
        listed = list_files(source.data_dir, retries)
        for path in listed:
            if path in owner:
                raise ValueError(f"file {path!r} belongs to source {owner[path]} ({sources[owner[path]]!r}) and to "
                                 f"source {k} ({source!r}): a file may be in one source only")
            owner[path] = k
        spans.append((len(files), len(files) + len(listed)))
        files.extend(listed)
    return files, spans, owner
