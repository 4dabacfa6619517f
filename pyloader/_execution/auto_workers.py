"""``num_workers="auto"`` (the default): where user methods run, decided when each iteration starts.

Worker processes pay off when user code holds the GIL (a parse or an encode
written in Python): threads of this process would take turns with each other
and with the training loop, which waits for the GIL between its short torch
operations. They cost when user code releases it (NumPy, pyarrow): arrays are
then copied between processes while threads would already run side by side.
So ``"auto"`` runs user methods in this process (``num_workers=0``, threads) when

* every user object's class says ``releases_gil = True`` (``_abc.releases_gil``:
  the built-in NumPy and Parquet readers, ``IdentityDataset``, the built-in
  collators);
* this process's share of the CPUs is below 2: the CPUs it may run on
  (``os.sched_getaffinity``), divided among the processes of this node
  (``LOCAL_WORLD_SIZE``, set by torchrun and Lightning);
* workers would not start by ``fork`` (TensorFlow imported, another loader's
  threads running: ``_execution.forking``, or a platform without fork) and no
  ``start_method`` is given: spawn and forkserver import the
  main script again (a script without an ``if __name__ == "__main__":`` guard
  fails there), pickle every user object, and take seconds to start with
  TensorFlow imported;

and otherwise starts one worker per CPU of that share, at most ``MAX_WORKERS``; each
file then runs where the consumer measured it faster, in those workers or in threads
(``_execution.measured``; not with a ``worker_init_fn``, nor in stream mode).
The environment variable ``PYLOADER_NUM_WORKERS`` (an integer, or ``auto``)
replaces the decision where it is set, for every loader left at ``"auto"``: a
cluster's or a test suite's choice, made without touching the code.
The choice and its reason are logged (INFO, logger ``pyloader``) when they
change, and are in ``loader.stats["placement"]``.
"""
from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .._abc import releases_gil
from .._checks import is_integer
from . import forking, remembered
from .measured import THREADS_FIRST, WORKERS_FIRST, Measured

AUTO = "auto"
ENV = "PYLOADER_NUM_WORKERS"
MAX_WORKERS = 4  # beyond this, the main process's hand-over is the limit for Python user code

_log = logging.getLogger("pyloader")

# the trial's order: workers started by fork are ready at once, by spawn or forkserver they warm up
_TRIAL: Dict[Optional[str], Tuple[str, ...]] = {None: WORKERS_FIRST, "fork": WORKERS_FIRST}


@dataclass(frozen=True)
class Placement:
    """How many worker processes an iteration runs user methods in, and why."""

    num_workers: int
    why: str
    decided: bool = True  # by ``"auto"``'s rules, not given (as an argument or in ``PYLOADER_NUM_WORKERS``)

    def as_dict(self) -> dict:
        return {"num_workers": self.num_workers, "why": self.why}


def check(name: str, value: Any) -> None:
    """``num_workers`` is ``"auto"`` or an integer >= 0."""
    if value == AUTO and isinstance(value, str):
        return
    if not is_integer(value):
        raise ValueError(f"{name} must be 'auto' or an integer >= 0, got {value!r}")


def from_env() -> Any:
    """``PYLOADER_NUM_WORKERS``: ``"auto"`` when unset."""
    raw = os.environ.get(ENV, "").strip()
    if raw in ("", AUTO):
        return AUTO
    try:
        value: Any = int(raw)
    except ValueError:
        value = raw
    check(f"the environment variable {ENV}", value)
    return value


def cpu_share() -> int:
    """The CPUs this process may use, divided among the processes of this node."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    return max(1, cpus // local)


def place(num_workers: Any, objects: Iterable[Any], start_method: Optional[str]) -> Placement:
    """The placement of an iteration: ``num_workers`` as given, or decided for ``"auto"``."""
    if num_workers != AUTO:
        return Placement(int(num_workers), "num_workers given", decided=False)
    num_workers = from_env()
    if num_workers != AUTO:
        return Placement(int(num_workers), f"{ENV}={num_workers}", decided=False)
    return _decided(objects, start_method)


def not_forked(why: str) -> Placement:
    """No workers: they would not start by fork (``why``) and no ``start_method`` was given."""
    return Placement(0, f"workers would not start by fork ({why}); pass start_method to use them anyway")


def _decided(objects: Iterable[object], start_method: Optional[str]) -> Placement:
    """``"auto"``'s rules (see the module)."""
    python = next((type(obj).__name__ for obj in objects if not releases_gil(obj)), None)
    if python is None:
        return Placement(0, "every user object releases the GIL (releases_gil = True)")
    share = cpu_share()
    if share < 2:
        return Placement(0, f"{share} CPU for this process")
    unsafe = forking.why_not_fork() if start_method is None else ""
    if unsafe:
        return not_forked(unsafe)
    return Placement(min(share, MAX_WORKERS), f"{share} CPUs for this process; {python} runs Python code")


class Placer:
    """``place`` for one loader, logging each new decision once."""

    def __init__(self, num_workers: Any, start_method: Optional[str], worker_init_fn: Optional[object] = None) -> None:
        self.num_workers, self.start_method = num_workers, start_method
        self.worker_init_fn = worker_init_fn  # given: the user's code expects to run in workers
        self.last: Optional[Placement] = None
        self._measured: Optional[Measured] = None
        self._objects: List[Any] = []  # the user objects of the latest placement

    def measured(self, placement: Placement, stream: bool, files: Sequence[str] = ()) -> Optional[Measured]:
        """Where each file of an iteration runs, measured (``_execution.measured``), when ``"auto"`` gave it
        workers; kept across the loader's iterations, and started where the last run of the same code on
        the same data kept its files (``_execution.remembered``). Stream mode keeps the rule: each of its
        batches takes rows from as many files as it has rows, so no window of files can be measured
        alone; a ``worker_init_fn`` prepares each worker for the user's code, which then must run there.
        ``files``: those an epoch reads."""
        if not placement.decided or not placement.num_workers or stream or self.worker_init_fn is not None:
            return None
        if self._measured is None:
            self._measured = self._new_measured(placement, files)
        self._measured.new_run(len(files))
        return self._measured

    def _new_measured(self, placement: Placement, files: Sequence[str]) -> Measured:
        key = remembered.identity(self._objects, files, placement.num_workers, self.start_method)
        return Measured(trial=_TRIAL.get(self.start_method, THREADS_FIRST), remembered=remembered.recall(key),
                        keep=functools.partial(remembered.remember, key))

    def fallback(self, why: str) -> Placement:
        """The placement of an iteration whose workers, placed by ``"auto"``, would not start by fork
        (``why``) when they were launched: a thread of ours had begun since the placement."""
        self.last = not_forked(why)
        _log.info("num_workers='auto': 0 worker processes (%s)", self.last.why)
        return self.last

    def __call__(self, objects: Iterable[Any]) -> Placement:
        self._objects = list(objects)
        placement = place(self.num_workers, self._objects, self.start_method)
        if placement.decided and placement != self.last:
            _log.info("num_workers='auto': %d worker processes (%s)", placement.num_workers, placement.why)
        self.last = placement
        return placement
