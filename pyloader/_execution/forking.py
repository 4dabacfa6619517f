"""When and how worker processes may be forked, and what a fork inherits.

Contract: a worker is forked only from a launcher thread of its pool (``pyloader-workers``),
while the thread that called ``iter()`` waits for it, before the run's own threads start,
one launch at a time in the process (``LAUNCH``), and never while another thread of
pyloader's runs: then ``start_method()`` answers ``forkserver`` (the fork server is a
fresh, single-threaded interpreter) instead of ``fork``. A thread that holds a lock when
the process forks leaves it held forever in the child; forking from a thread of our own
that is idle, with no other of ours busy, means no lock of ours is held.

What the user's own threads do is theirs, but two hazards are checked before a fork:

* an ``import`` running in another thread holds that module's import lock, and a child
  that imports the same module waits for it forever: the fork waits (up to
  ``IMPORT_WAIT_S``) until no other thread is importing;
* other threads running at all: a ``RuntimeWarning`` names them once, with the fix.

Before the first fork the modules the workers will need are imported here
(``preload``), once, instead of once per worker on its first batch.
"""
from __future__ import annotations

import importlib
import multiprocessing
import sys
import threading
import time
import warnings
from typing import Any, Dict, Iterable, List, Optional, Set

LAUNCHER = "pyloader-workers"  # the name of a pool's launcher thread (its DaemonExecutor's prefix)
LAUNCH = threading.Lock()  # one launch at a time: a launcher thread is busy only while it holds this
IMPORT_WAIT_S = 10.0
# Threads of other libraries known to be safe across a fork: fsspec resets its loop in a child.
_SAFE_THREADS = ("fsspecIO",)
_warned: Set[str] = set()


_OURS = "pyloader"  # the prefix of the names of pyloader's threads


def _other_threads(caller: Optional[int] = None) -> List[threading.Thread]:
    """The threads running now other than this one and ``caller``."""
    me = threading.current_thread()
    return [t for t in threading.enumerate() if t is not me and t.ident != caller and t.is_alive()]


def busy_threads_of_ours() -> List[str]:
    """Threads of pyloader's running now, other than this one and the launchers (idle
    unless they hold ``LAUNCH``)."""
    return [t.name for t in _other_threads() if t.name.startswith(_OURS) and not t.name.startswith(LAUNCHER)]


def why_not_fork() -> str:
    """Why forking is not safe now, or ``""`` when it is."""
    if "fork" not in multiprocessing.get_all_start_methods() or not sys.platform.startswith("linux"):
        return "no fork on this platform"
    if "tensorflow" in sys.modules:
        return "TensorFlow is imported"
    busy = busy_threads_of_ours()
    return f"threads of another pyloader iteration run ({', '.join(busy)})" if busy else ""


def start_method() -> str:
    """``fork`` starts fastest and needs nothing picklable; ``forkserver`` when forking is unsafe
    (``why_not_fork``)."""
    if not why_not_fork():
        return "fork"
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def imports_in_progress(caller: int = 0) -> List[str]:
    """The modules threads other than this one and ``caller`` (the thread waiting for this one, whose
    imports cannot end meanwhile) are importing now (their import locks are held)."""
    from importlib import _bootstrap

    me = threading.get_ident()
    held = []
    locks: Dict[str, Any] = getattr(_bootstrap, "_module_locks", {})
    for name, ref in list(locks.items()):
        lock = ref() if callable(ref) else None
        if getattr(lock, "count", None) and getattr(lock, "owner", None) not in (None, me, caller):
            held.append(name)
    return held


def wait_for_imports(caller: int, timeout: float = IMPORT_WAIT_S) -> None:
    """Wait until no other thread is importing; warn, naming the modules, if one still is."""
    deadline = time.monotonic() + timeout
    held = imports_in_progress(caller)
    while held and time.monotonic() < deadline:
        time.sleep(0.005)
        held = imports_in_progress(caller)
    if held:
        warnings.warn(f"pyloader: forking worker processes while other threads still import {held} after "
                      f"{timeout:g} s: a worker that imports one of them will wait forever. Pass "
                      f"start_method='forkserver' to the DataLoader", RuntimeWarning, stacklevel=2)


def warn_about_user_threads(caller: int) -> None:
    """Warn once per set of thread names that other threads run while workers are forked (other than
    ``caller``, which waits for the fork)."""
    others = sorted(t.name for t in _other_threads(caller) if not t.name.startswith((_OURS, *_SAFE_THREADS)))
    key = ",".join(others)
    if not others or key in _warned:
        return
    _warned.add(key)
    warnings.warn(f"pyloader: worker processes are forked while other threads of this process run "
                  f"({', '.join(others)}): a lock one of them holds at that moment stays held in the workers, "
                  f"and a worker that takes it waits forever. Start those threads after the loader's first "
                  f"iteration, keep the workers with persistent_workers=True, or pass start_method='forkserver'",
                  RuntimeWarning, stacklevel=2)


def preload(modules: Iterable[str]) -> None:
    """Import what the workers will need, here and once (a module that fails to import is left to fail
    where it is used, with its own error)."""
    for name in ("numpy.random", *modules):
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except ImportError:
                pass


def needed_modules(objects: Iterable[object]) -> List[str]:
    """The modules user objects declare they import lazily (``worker_imports``, e.g. ``("torch",)``)."""
    names: List[str] = []
    for obj in objects:
        names.extend(getattr(obj, "worker_imports", ()))
    return list(dict.fromkeys(names))
