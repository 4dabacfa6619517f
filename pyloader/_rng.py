"""Random generators: every draw is a pure function of a seed and a few keys.

The stages draw from ``derive_rng`` with their own stage tag. User code draws from ``rng()``/``rng_seed()``:
the runners wrap each user call in ``drawing(...)`` (a context variable, so each thread and task sees its
own call's keys), with keys that do not depend on where or when the call runs.
"""
from __future__ import annotations

import itertools
from contextvars import ContextVar, Token
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple, TypeVar

import numpy as np

T = TypeVar("T")

# Stage tags keep the streams of different stages independent under one seed.
FILE_ORDER = 1
IN_FILE = 2
SHUFFLE_BUFFER = 3
BUCKETS = 4  # length bucketing: tie-breaks and the order of the batches (``_stages.bucket``)
MIX = 5  # weighted mixing: the source of each sample position (``_stages.mix``)
MIX_FILES = 6  # weighted mixing: each source's file order
CACHED_EPOCH = 7  # cache_encoded: the order of a cached epoch's batches (``_stages.cached_epochs``)
ROTATION = 8  # rotation: the order of each window's rounds and of the windows in each cycle (``_stages.rotation``)


def derive_rng(seed: int, *keys: int) -> np.random.Generator:
    """A fresh generator for ``(seed, *keys)``; never touches global ``random``/``np.random``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, *map(int, keys)])))
USER_READ = 9  # ``pyloader.rng()`` inside ``read_file``/``iter_file``: keyed by the epoch, the file and the piece
USER_BATCH = 10  # ``pyloader.rng()`` inside ``batch_encode``/``collate_batch``: by the rank, epoch, batch and step
USER_COUNT = 11  # ``pyloader.rng()`` inside ``DataReader.count`` (which may read through ``iter_file``)
TILE_SPANS = 13  # the global order: the spans of every file, permuted per epoch (``_stages.tiles``)
TILE_COLUMNS = 14  # the global order: each tile's columns and rows (``_stages.tiles``)
_TORCH_SEED = 12  # ``pyloader.rng_seed()``: an integer from the same keys, apart from the generator's draws


_current: ContextVar[Optional[List[Any]]] = ContextVar("pyloader_user_rng", default=None)  # [keys, generator]


def enter(keys: Tuple[int, ...]) -> Token:
    """From now on (in this thread or task) ``rng()`` and ``rng_seed()`` answer for ``keys`` (``derive_rng``'s
    arguments); ``leave(token)`` undoes it. The generator is made on the first ``rng()``: a call that draws
    nothing costs a context variable's set and reset."""
    return _current.set([keys, None])


def leave(token: Token) -> None:
    _current.reset(token)


class drawing:
    """``enter((seed, *keys))`` for the ``with`` block."""

    __slots__ = ("_keys", "_token")

    def __init__(self, seed: int, *keys: int) -> None:
        self._keys = (seed, *keys)
        self._token: Optional[Token] = None

    def __enter__(self) -> None:
        self._token = enter(self._keys)

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None, "entered before it is left"
        leave(self._token)


def stepped(make: Callable[[], Iterable[T]], seed: int, *keys: int) -> Iterator[T]:
    """The pieces ``make()`` gives (a user's ``iter_file``), each step (``make`` with the first) run under
    ``drawing(seed, *keys, k)`` for its ``k``-th piece: the iterator may be stepped from different threads,
    so the context is set around each ``next``."""
    with drawing(seed, *keys, 0):
        iterator = iter(make())
    try:
        for k in itertools.count():
            with drawing(seed, *keys, k):
                try:
                    piece = next(iterator)
                except StopIteration:
                    return
            yield piece
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def _draws(name: str) -> List[Any]:
    draws = _current.get()
    if draws is None:
        raise RuntimeError(f"pyloader.{name}() is only valid inside read_file, iter_file, batch_encode or "
                           f"collate_batch while a DataLoader runs them")
    return draws


def rng() -> np.random.Generator:
    """The ``numpy.random.Generator`` of the user call now running (``read_file``/``iter_file``: per file piece;
    ``batch_encode``/``collate_batch``: per batch and step), a pure function of the loader's ``random_seed``,
    the epoch and that position: the same draws with any ``num_workers``/``num_threads``, under ranks and after
    an exact resume; different in each epoch. Calls within one user call continue one stream.
    Outside such a call: ``RuntimeError``.

    Example:
        ```python
        class Noisy(Dataset):
            def batch_encode(self, batch):
                noise = pyloader.rng().normal(0, 0.1, size=len(batch["x"]))   # the same with any num_workers
                return {**batch, "noise": noise.tolist()}


        for batch in DataLoader(JsonLinesReader(batch_size=16), Noisy(), NumpyCollator(), "data/"):
            assert batch["noise"].shape == batch["y"].shape
        ```
    """
    draws = _draws("rng")
    if draws[1] is None:
        draws[1] = derive_rng(*draws[0])
    generator: np.random.Generator = draws[1]
    return generator


def rng_seed() -> int:
    """An integer seed (0 <= seed < 2**63) for the user call now running, from the same keys as ``rng()`` and
    apart from its draws: for ``torch.Generator().manual_seed(pyloader.rng_seed())``. Outside: ``RuntimeError``.

    Example:
        ```python
        import torch


        class TorchAugment(Dataset):
            def batch_encode(self, batch):
                generator = torch.Generator().manual_seed(pyloader.rng_seed())
                flips = torch.rand(len(batch["x"]), generator=generator) < 0.5
                return {**batch, "flip": flips.tolist()}


        for batch in DataLoader(JsonLinesReader(batch_size=16), TorchAugment(), TorchCollator(), "data/"):
            assert batch["flip"].dtype == torch.bool
        ```
    """
    return int(derive_rng(*_draws("rng_seed")[0], _TORCH_SEED).integers(2 ** 63))
