"""``file_order``: the user's own order of files per epoch (a curriculum, a fixed order), in place of ``shuffle``.

``file_order(files, epoch, rng)`` gets the loader's files (a fresh list on every
call), the epoch and a NumPy ``Generator`` drawn from ``(random_seed, epoch)``
(the one ``shuffle=True`` draws its permutation from, so
``lambda files, epoch, rng: [files[i] for i in rng.permutation(len(files))]``
is ``shuffle=True``), and returns the epoch's files in the order they are read.

Contracts:

* It is a pure function of its arguments, randomness from ``rng`` only: every
  rank, every resumed run and ``len()`` call it again and must get the same
  order. The loader calls it twice per epoch and refuses an order that changes
  (``ValueError``), which catches a global ``random.shuffle``.
* It returns every file exactly once, unless the callable declares
  ``drops_or_repeats = True`` (an attribute): then an epoch may leave files out
  and read others several times (each read is a full pass over the file: with
  ``DataReader(shuffle=True)`` in the same in-file order), and "exactly once"
  becomes "as often as the order says". An order that drops or repeats files
  without the declaration is refused (``ValueError`` naming them).
"""
from __future__ import annotations

import collections
import os
from typing import Callable, Dict, List, Sequence

from .._rng import FILE_ORDER, derive_rng

DECLARATION = "drops_or_repeats"
OrderFn = Callable[[List[str], int, object], Sequence[str]]


def declares_drops_or_repeats(fn: object) -> bool:
    return bool(getattr(fn, DECLARATION, False))


def _shown(paths: Sequence[str], limit: int = 3) -> str:
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(map(repr, paths[:limit])) + more


class FileOrder:
    """Epoch -> the positions (in ``files``) of the files it reads, from ``fn``; each epoch's order is
    worked out once per instance."""

    def __init__(self, fn: OrderFn, files: Sequence[str], seed: int) -> None:
        self.fn = fn
        self.files = list(files)
        self.seed = seed
        self.exact = not declares_drops_or_repeats(fn)
        self._slots: Dict[str, List[int]] = collections.defaultdict(list)  # path -> its positions in files
        for i, path in enumerate(self.files):
            self._slots[path].append(i)
        self._orders: Dict[int, List[int]] = {}

    def __call__(self, epoch: int) -> List[int]:
        if epoch not in self._orders:
            first, second = self._ask(epoch), self._ask(epoch)
            if first != second:
                raise ValueError(f"file_order gave two different orders for epoch {epoch} from the same arguments: "
                                 f"it must be a pure function of (files, epoch, rng), drawing randomness from rng "
                                 f"only (every rank and every resumed run asks it again)")
            self._orders[epoch] = self._positions(first, epoch)
        return list(self._orders[epoch])

    def _ask(self, epoch: int) -> List[str]:
        try:
            got = self.fn(list(self.files), epoch, derive_rng(self.seed, FILE_ORDER, epoch))
        except Exception as exc:
            exc.add_note(f"pyloader: raised by file_order(files, epoch={epoch}, rng)")
            raise
        if isinstance(got, (str, bytes)) or not hasattr(got, "__iter__"):
            raise TypeError(f"file_order must return a list of the files (paths) for epoch {epoch}, "
                            f"got {type(got).__name__}")
        return [self._path(item, epoch) for item in got]

    def _path(self, item: object, epoch: int) -> str:
        """An item of the order ``file_order`` gave for ``epoch``, as one of the loader's files."""
        path = os.fspath(item) if isinstance(item, os.PathLike) else item
        if not isinstance(path, str) or path not in self._slots:
            raise ValueError(f"file_order returned {item!r} for epoch {epoch}, which is not one of the "
                             f"loader's files (it must return paths from the list it is given)")
        return path

    def _positions(self, order: List[str], epoch: int) -> List[int]:
        """Each path as a position in ``files``; a path listed several times in ``files`` takes
        its positions in turn."""
        if self.exact:
            self._check_exact(order, epoch)
        taken: Dict[str, int] = collections.Counter()
        positions = []
        for path in order:
            slots = self._slots[path]
            positions.append(slots[taken[path] % len(slots)])
            taken[path] += 1
        return positions

    def _check_exact(self, order: List[str], epoch: int) -> None:
        wanted, got = collections.Counter(self.files), collections.Counter(order)
        if wanted == got:
            return
        dropped, repeated = list(wanted - got), list(got - wanted)  # the files it gives less often, more often
        what = []
        if dropped:
            what.append(f"leaves out {_shown(dropped)}")
        if repeated:
            what.append(f"repeats {_shown(repeated)}")
        raise ValueError(f"file_order's order for epoch {epoch} {'; '.join(what)}: it must give every file once, "
                         f"or declare that it does not ({getattr(self.fn, '__name__', 'file_order')}."
                         f"{DECLARATION} = True)")


def check_file_order(fn: object, shuffle: bool) -> None:
    if fn is None:
        return
    if not callable(fn):
        raise TypeError(f"file_order must be a callable (files, epoch, rng) -> list of files, got {fn!r}")
    if shuffle:
        raise ValueError("file_order replaces shuffle: use shuffle=False (file_order's rng draws from "
                         "random_seed and the epoch, as shuffle does)")
