"""``DataLoader(progress=True)``: a tqdm bar per iteration.

The bar counts batches out of ``len(loader)`` (no total when the length is unknown),
shows tqdm's rate, and as its postfix the samples per second and the data stall (the
share of the consumer's time spent inside ``next()``), refreshed at most every
``POSTFIX_EVERY_S`` seconds: a batch costs one ``tqdm.update``. tqdm is optional (the
``progress`` extra): ``check()`` raises ``ImportError`` saying so when it is missing.
"""
from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Optional, Sized, Type

from .._stats import Figures

if TYPE_CHECKING:
    from tqdm import tqdm

POSTFIX_EVERY_S = 0.5


def check(what: str = "progress=True") -> None:
    """``ImportError`` naming ``what`` needs tqdm and what to install, when tqdm is missing."""
    try:
        import tqdm  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"{what} needs tqdm: pip install tqdm (or the 'progress' extra of "
                          "pyloader-ml: pip install 'pyloader-ml[progress]')") from exc


@functools.lru_cache(maxsize=None)
def _bar_class() -> Type[tqdm]:
    """tqdm's bar, without its monitor thread: the next iteration forks its workers, and a thread
    running at that moment leaves the locks it holds (tqdm's own) held in them forever."""
    from tqdm.auto import tqdm

    class Bar(tqdm):
        monitor_interval = 0

    return Bar


def describe(f: Figures) -> str:
    return f"{f.rate():,.0f} samples/s, data stall {f.stall_share():.0%}"


class Progress:
    """One iteration's bar; ``initial``: the batches a resumed iteration already handed out."""

    def __init__(self, total: Optional[int], initial: int = 0) -> None:
        self._bar = _bar_class()(total=total, initial=initial, unit="batch", desc="pyloader", dynamic_ncols=True)
        self._next_postfix = time.perf_counter() + POSTFIX_EVERY_S  # the first batches' figures say little

    def update(self, figures: Figures, now: float) -> None:
        self._bar.update(1)
        if now >= self._next_postfix:
            self._next_postfix = now + POSTFIX_EVERY_S
            self._bar.set_postfix_str(describe(figures), refresh=False)

    def close(self, figures: Optional[Figures] = None) -> None:
        if figures is not None:
            self._bar.set_postfix_str(describe(figures), refresh=False)  # the final figures, shown by close()
        self._bar.close()  # tqdm's close does nothing the second time


def progress_bar(loader: Sized, initial: int) -> Progress:
    """A bar for ``loader``'s iteration that starts now (its total from ``len(loader)``)."""
    try:
        total: Optional[int] = len(loader)
    except TypeError:  # a count failed: the length is unknown
        total = None
    return Progress(total, initial)


def counting_bar(total: int) -> tqdm:
    """A bar over the files being counted (``DataReader.count``) before the first batch."""
    return _bar_class()(total=total, unit="file", desc="pyloader: counting", dynamic_ncols=True)
