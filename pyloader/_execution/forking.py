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
* other threads running at all: a ``RuntimeWarning`` names them once, with the fixes that apply
  to them; a thread blocked until the iterating thread ends (a ``join`` of it, the result of its
  future) runs nothing meanwhile and is not named.

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
from concurrent.futures import Future
from concurrent.futures.thread import _WorkItem
from types import FrameType
from typing import Any, Dict, Iterable, List, Optional, Set

LAUNCHER = "pyloader-workers"  # the name of a pool's launcher thread (its DaemonExecutor's prefix)
LAUNCH = threading.Lock()  # one launch at a time: a launcher thread is busy only while it holds this
IMPORT_WAIT_S = 10.0
ENDING_WAIT_S = 2.0  # for threads of ours that end (a run stopped by a dropped iterator's finalizer)
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


class ForkUnsafe(RuntimeError):
    """Workers that may only be forked (placed by ``num_workers="auto"``) cannot be now."""


def why_not_fork_soon(timeout: float = ENDING_WAIT_S) -> str:
    """``why_not_fork()``, once the threads of ours that run now end, if they do within ``timeout``:
    a run whose iterator the garbage collector dropped is being stopped by a thread of its own."""
    deadline = time.monotonic() + timeout
    why = why_not_fork()
    while why and busy_threads_of_ours() and time.monotonic() < deadline:
        time.sleep(0.01)
        why = why_not_fork()
    return why


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


def wait_for_imports(caller: int, timeout: float = IMPORT_WAIT_S,
                     fix: str = "Pass start_method='forkserver' to the DataLoader") -> None:
    """Wait until no other thread is importing; warn, naming the modules and ``fix``, if one still is."""
    deadline = time.monotonic() + timeout
    held = imports_in_progress(caller)
    while held and time.monotonic() < deadline:
        time.sleep(0.005)
        held = imports_in_progress(caller)
    if held:
        warnings.warn(f"pyloader: forking worker processes while other threads still import {held} after "
                      f"{timeout:g} s: a worker that imports one of them will wait forever. {fix}", RuntimeWarning,
                      stacklevel=2)


def warn_about_user_threads(caller: int, future: object = None, persistent: bool = False) -> None:
    """Warn once per set of thread names that other threads run while workers are forked (other than
    ``caller``, which waits for the fork, and threads that wait for ``caller`` to end or for ``future``,
    the one it runs: ``_waits_for``), with the advice that fits them (``persistent``: the workers are
    kept, forked at the first iteration only)."""
    others = user_threads(caller, future)
    key = ",".join(others)
    if not others or key in _warned:
        return
    _warned.add(key)
    warnings.warn(f"pyloader: worker processes are forked while other threads of this process run "
                  f"({', '.join(others)}): a lock one of them holds at that moment stays held in the workers, "
                  f"and a worker that takes it waits forever. {_advice(others, persistent)}",
                  RuntimeWarning, stacklevel=2)


def user_threads(caller: int, future: object = None) -> List[str]:
    """The names, sorted, of the threads running besides ``caller`` that are neither pyloader's own nor known
    to be safe across a fork, and do not wait for ``caller`` to end or for ``future``."""
    return _unwaited(_user_threads(caller), caller, future)


def _user_threads(caller: int) -> List[threading.Thread]:
    """The threads running besides ``caller`` that are neither pyloader's own nor known to be safe."""
    return [t for t in _other_threads(caller) if not t.name.startswith((_OURS, *_SAFE_THREADS))]


def _unwaited(running: List[threading.Thread], caller: int, future: object) -> List[str]:
    """The names, sorted, of the threads of ``running`` that do not wait for ``caller`` or ``future``
    (``_waits_for``)."""
    if not running:
        return []
    frames = sys._current_frames()
    try:
        return sorted(t.name for t in running if not _waits_for(frames.get(t.ident or -1), caller, future))
    finally:  # it holds this frame, which holds it: a cycle keeping every thread's frames (an iterator's among them)
        frames.clear()


def _advice(others: List[str], persistent: bool) -> str:
    """What can be done about ``others`` running at a fork: the main thread was there first (the loop can
    move to it), a thread the user starts can start after the only fork (of persistent workers)."""
    main = threading.main_thread().name
    later = [name for name in others if name != main]
    ways = ["iterate the loader from the main thread"] if main in others else []
    if later:
        kept = "" if persistent else " and keep the workers with persistent_workers=True"
        ways.append(f"start {', '.join(later)} after the loader's first iteration{kept}")
    ways.append("pass start_method='forkserver'")
    text = _either(ways)
    return text[0].upper() + text[1:]


def _either(ways: List[str]) -> str:
    """``ways`` (one or more) as one clause: ``a; b; or c``."""
    return "; ".join(ways[:-1]) + "; or " + ways[-1] if len(ways) > 1 else ways[0]


def _waits_for(frame: Optional[FrameType], caller: int, future: object) -> bool:
    """Whether the thread running ``frame`` is blocked until the thread ``caller`` ends (joining it), or
    until ``future`` (the one ``caller`` runs) is done. Such a thread runs no code of its own meanwhile,
    so it holds no lock a worker could need."""
    while isinstance(frame, FrameType):  # anything else (a profiler's stand-in): no frames to read
        this = frame.f_locals.get("self") if frame.f_code in _WAITS else None
        if this is not None and (getattr(this, "ident", None) == caller or this is future):
            return True
        frame = frame.f_back
    return False


def running_future() -> object:
    """The ``concurrent.futures`` future whose work this thread does, if any. Read from this thread's own
    frames: walking another thread's (``sys._current_frames()``, ``f_back``) crashed CPython 3.11 here."""
    frame: Optional[FrameType] = sys._getframe(1)
    while isinstance(frame, FrameType):
        if frame.f_code is _WorkItem.run.__code__:
            return getattr(frame.f_locals.get("self"), "future", None)
        frame = frame.f_back
    return None


_WAITS = (threading.Thread.join.__code__, Future.result.__code__)


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
