"""The loader's side of its worker processes: start, ask, gather, notice deaths, stop.

Everything here runs on the event loop of the run using the pool: replies are
read by ``loop.add_reader`` callbacks, and a worker's death is seen through its
process sentinel, so no thread waits on a worker and a dead worker fails its
pending requests at once (naming the worker and what it was doing) instead of
hanging. A reply that cannot be decoded here fails the request it answers (a
``run``'s result, only its batch), naming what that request was about; a
worker whose ``worker_init_fn`` raised dies with that exception as the cause.

A pool serves one run (``start`` ... ``finish``) or, kept by a loader with
``persistent_workers`` (``KeptPool``), one run after another: ``start``
attaches it to each run's loop (starting the workers again if one died or the
pool was closed), ``finish`` detaches it. Requests carry the pool's
generation, which ``finish`` moves on: the workers drop what the ended run
still had queued and forget its files and pieces, and replies to its requests
(request ids are never reused) are ignored, so nothing of one run reaches the
next.

Workers are started by ``launch``, called by the thread that calls ``iter()``
before the run's threads start, never from a run's loop: the processes are
forked by the pool's own launcher thread while that thread waits (see
``_execution.forking`` for when fork is safe). The launcher lives as long as
the pool: Linux ends a worker when the *thread* that started it ends
(``PR_SET_PDEATHSIG``). ``attach`` then joins the started workers to the run's
loop. A worker that dies at any time, busy or idle, attached or between the
runs of persistent workers, fails the run's next request with ``WorkerDied``
naming it; a persistent pool that lost a worker starts all anew at its next run.
In a child made by ``os.fork()`` the parent's pools are forgotten: the child
never signals, joins or talks to the parent's workers, even at its exit.

With spawn/forkserver a worker imports the main script first. A script that
iterates a loader when imported (no ``if __name__ == "__main__":`` guard) would
start workers from there: ``start`` ends such a process at once with exit code
``NEEDS_MAIN_GUARD``, and the loader that started it reports the missing guard
in one error.
"""
from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
import weakref
from multiprocessing.context import BaseContext
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from .._errors import WorkerDied, raised_in_worker
from .._stats import BUSY_SLOTS, Busy
from .._trace import RING_BYTES, WorkerRing
from . import forking
from . import ipc as _ipc
from .shared import shared_bytes, shared_row, shared_value
from .steps import StepFailed
from .threads import DaemonExecutor
from .worker import INIT_FAILED, READY, worker_main

NEEDS_MAIN_GUARD = 86  # exit code of a process that was bootstrapping when it tried to start workers
_DETACH_WAIT_S = 1.0
_KILLED_EXIT_S = 10.0  # a SIGKILLed worker is gone by then even on a loaded machine


_pools: "weakref.WeakSet[WorkerPool]" = weakref.WeakSet()
_launching = False  # set while a launcher forks: a child that sees it is a worker being started


def _forget_in_child() -> None:
    """After ``os.fork()`` in a child that is not one of our workers: the parent's workers are not
    this process's. multiprocessing would otherwise signal them at the child's exit."""
    if _launching:
        return
    for pool in list(_pools):
        pool.forget()


os.register_at_fork(after_in_child=_forget_in_child)


def _describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _guard_advice(method: str) -> str:
    main = getattr(sys.modules.get("__main__"), "__file__", None) or "the main script"
    return (f"with start method {method!r} every worker process first imports {main}, and importing it iterates "
            f"a DataLoader with workers again. Put the script's code under `if __name__ == \"__main__\":` "
            f"(or use workers=Workers(start_method='fork'))")


def _forkserver_exit_code(wait_s: float = 1.0) -> Optional[int]:
    """The exit code of multiprocessing's fork server if it has ended (it stays unreaped), else ``None``."""
    from multiprocessing import forkserver

    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    deadline = time.monotonic() + wait_s
    while pid is not None:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except (ChildProcessError, AttributeError):
            return None
        if info is not None:
            return info.si_status if info.si_code == os.CLD_EXITED else None
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)  # its pipe closes a moment before it can be waited for
    return None


def _start_failure(index: int, method: str, exc: BaseException) -> RuntimeError:
    if method == "forkserver" and isinstance(exc, (EOFError, ConnectionError)) and \
            _forkserver_exit_code() == NEEDS_MAIN_GUARD:
        return RuntimeError(f"could not start worker {index}: {_guard_advice(method)}")
    return RuntimeError(f"could not start worker {index} with start method {method!r} (with spawn/forkserver "
                        f"the reader, dataset and collator must be picklable): {exc}")


class _Worker:
    def __init__(self, index: int, process: Any, sock: socket.socket, current: Any) -> None:
        self.index = index
        self.process = process
        self.current = current
        self.sock = sock
        self.fd = sock.fileno()
        self.sentinel = process.sentinel
        self.pending: Dict[int, Tuple[asyncio.Future, str, str]] = {}  # rid: (future, doing, op)
        self.outbox: List[Tuple[int, tuple]] = []  # (tag, message)
        self.releases: List[int] = []
        self.dead: Optional[str] = None
        self.ready = False  # worker_init_fn ran
        self.init_error: Optional[BaseException] = None

    def died(self, doing: str) -> WorkerDied:
        error = WorkerDied(f"{self.dead}; cannot go on {doing}")
        error.__cause__ = self.init_error
        return error

    def gone(self) -> bool:
        """Whether the worker has ended: ``is_alive()`` of a forkserver child learns it only once the
        server has reaped it, while the process table shows a zombie at once."""
        return self.dead is not None or not self.process.is_alive() or _exited(self.process.pid)


def _exited(pid: Optional[int]) -> bool:
    """Whether process ``pid`` has ended, not yet reaped (Linux's ``/proc``; elsewhere: unknown, False)."""
    if pid is None or not os.path.isdir("/proc/self"):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        return False


def _waiting(worker: _Worker, tag: int) -> Optional[Tuple[asyncio.Future, str, str]]:
    """The request ``tag`` of ``worker`` as ``(future, doing, op)``, no longer pending, if its future
    still waits (else it was cancelled, or its run has ended)."""
    entry = worker.pending.pop(tag, None)
    return entry if entry is not None and not entry[0].done() else None


def _unwatch(loop: asyncio.AbstractEventLoop, worker: _Worker) -> None:
    """``loop`` no longer reads ``worker``'s replies and death, nor waits to write to it."""
    loop.remove_reader(worker.fd)
    loop.remove_reader(worker.sentinel)
    loop.remove_writer(worker.fd)


class WorkerPool:
    """``num_workers`` processes serving ``_execution.worker.worker_main`` requests."""

    def __init__(self, num_workers: int, reader: Any, steps: List[Tuple[str, Callable]],
                 worker_init_fn: Optional[Callable[[int], None]], start_method: Optional[str],
                 persistent: bool = False, busy: Optional[Busy] = None, imports: Tuple[str, ...] = ()) -> None:
        self.num_workers = num_workers
        self.fork_only = False  # set for each launch: placed by "auto", which counts on fork (else ForkUnsafe)
        self.steps = steps
        self.persistent = persistent
        self.busy = busy  # where the workers' seconds go (``loader.stats``), set for each run
        self._args = (reader, steps, worker_init_fn)
        self._imports = imports  # modules the workers need, imported before they are forked
        self._rows: List[Any] = []  # a shared row per worker, where it adds its seconds
        self._rings: List[Optional[WorkerRing]] = []  # with loader.trace at launch: a ring of spans per worker
        self._requested = start_method
        self._method = start_method or "fork"  # the method of the latest launch
        self._workers: List[_Worker] = []
        self._dead: Optional[_Worker] = None  # the first worker that died since the pool was launched
        self._restart = False  # a death was reported to a run: the next launch starts new workers
        self._generation: Any = None  # shared with the workers, made with them
        self._ids = itertools.count()
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # the run's loop, while attached
        self._lock = threading.Lock()
        self._launcher: Optional[DaemonExecutor] = None
        self._pid = os.getpid()
        _pools.add(self)

    @property
    def method(self) -> str:
        """The start method of the workers running now (or of the latest launch)."""
        return self._method

    # -- lifecycle -------------------------------------------------------------------
    def launch(self) -> None:
        """Make sure the workers run: called by the thread that calls ``iter()``, before the run's
        threads start. Starts them if none runs; a worker that died since the last run is
        reported by the run (``WorkerDied`` on its first request), not replaced silently."""
        if getattr(multiprocessing.current_process(), "_inheriting", False):
            os._exit(NEEDS_MAIN_GUARD)  # a worker importing a main script without the guard: see the docstring
        self._detach_elsewhere()  # from an earlier run that did not finish in time, if any
        with self._lock:
            if self._loop is not None or self._restart:  # busy with an earlier run, or one died: start anew
                self._loop, self._restart = None, False
                self._shut_down()
            self._note_death_between_runs()
            if not self._workers:
                if not threading.main_thread().is_alive():  # the interpreter exits, killing our workers
                    raise RuntimeError("pyloader: no worker starts while the interpreter exits")
                self._launch()

    def _note_death_between_runs(self) -> None:
        """The first worker found dead since the pool was launched (if none was yet), for the run to report."""
        if self._dead is None:
            self._dead = next((w for w in self._workers if w.gone()), None)
            if self._dead is not None:
                self._dead.process.join(0.5)
                self._dead.dead = self._death(self._dead, "waiting for work between iterations")

    def attach(self) -> None:
        """Join the launched workers to the running loop (the run's), which reads their replies and deaths."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._workers:
                raise RuntimeError("pyloader: the worker processes were closed before the run began")
            self._loop = loop
            if self.busy is not None:
                self.busy.track(self._rows)
                if self.busy.trace is not None:
                    self.busy.trace.watch(self._rings)
            for worker in self._workers:
                worker.releases = []
                if worker.dead is None:
                    loop.add_reader(worker.fd, self._readable, worker)
                    loop.add_reader(worker.sentinel, self._died, worker)

    def finish(self) -> None:
        """End a run: a persistent pool detaches (its workers stay), another closes."""
        if self.persistent:
            self.stop()
        else:
            self.close()

    def stop(self) -> None:
        """Detach from the run's loop (on that loop): its requests fail, its work is dropped."""
        with self._lock:
            loop, self._loop = self._loop, None
            if loop is None:
                return
            self._generation.value += 1  # made with the workers, which an attached pool has
            for worker in self._workers:
                if not loop.is_closed():
                    _unwatch(loop, worker)
                worker.outbox = []
                self._fail(worker, died=False)
            self._fold()
            self._restart = self._dead is not None  # reported to this run: the next starts new workers

    def _fold(self) -> None:
        """The run is over: its seconds in the workers go to its ``busy``, and the rows start again."""
        if self.busy is not None and self.busy.trace is not None:
            self.busy.trace.let_go(self._rings)
        if self.busy is not None and self._rows:
            self.busy.fold(self._rows)
            for row in self._rows:
                row[:] = [0.0] * len(row)

    def forget(self) -> None:
        """In a forked child: drop the parent's workers without a signal, a join or a word to them."""
        from multiprocessing import process

        children: Set[object] = getattr(process, "_children", set())
        for worker in self._workers:
            children.discard(worker.process)
            worker.sock.close()  # this process's copy: the parent's stays open
        self._workers, self._loop, self._launcher, self._dead = [], None, None, None
        self._lock = threading.Lock()

    def close(self, timeout: float = 1.0) -> None:
        """Stop every worker (from any thread): close the sockets (workers exit on EOF), then kill what is left."""
        if self._pid != os.getpid():
            self.forget()  # a forked child's copy of a parent's pool
            return
        self._detach_elsewhere()
        with self._lock:
            self._loop = None  # a loop that did not answer: it is stuck or gone, leave it alone
            self._shut_down(timeout)
            launcher, self._launcher = self._launcher, None
        if launcher is not None:
            launcher.shutdown(wait=True, timeout=timeout)

    def _detach_elsewhere(self) -> None:
        """``stop()`` on the loop the pool is attached to (if any), from whatever thread; waits a moment at most."""
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            self.stop()
            return
        done = threading.Event()

        def detach() -> None:
            try:
                self.stop()
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(detach)
        except RuntimeError:
            return  # its loop is closed
        done.wait(_DETACH_WAIT_S)

    def _launch(self) -> None:
        """Start the workers from the pool's launcher thread, while this one waits."""
        if self._launcher is None:
            self._launcher = DaemonExecutor(1, forking.LAUNCHER)
        self._launcher.submit(self._start_safely, threading.get_ident(), forking.running_future()).result()

    def _start_safely(self, caller: int, future: object) -> None:
        """Fork only with no other thread of ours running and no import in progress (``_execution.forking``)."""
        global _launching
        with forking.LAUNCH:
            self._method = self._requested or self._unrequested_method()
            if self._method == "fork":
                forking.preload(self._imports)
                forking.wait_for_imports(caller)
                forking.warn_about_user_threads(caller, future, self.persistent)
            _launching = True
            try:
                self._start_processes()
            finally:
                _launching = False

    def _unrequested_method(self) -> str:
        method = forking.start_method()
        if method == "fork" or not self.fork_only:
            return method
        why = forking.why_not_fork_soon()
        if why:
            raise forking.ForkUnsafe(why)
        return "fork"

    def _start_processes(self) -> None:
        ctx = multiprocessing.get_context(self._method)
        self._generation = shared_value(ctx, "q", 0)
        self._rows = [shared_row(ctx, "d", len(BUSY_SLOTS)) for _ in range(self.num_workers)]
        traced = self.busy is not None and self.busy.trace is not None
        self._rings = [WorkerRing(shared_bytes(ctx, RING_BYTES)) if traced else None for _ in range(self.num_workers)]
        for index in range(self.num_workers):
            self._workers.append(self._start_worker(ctx, index))

    def _start_worker(self, ctx: BaseContext, index: int) -> _Worker:
        ours, theirs = _ipc.channel_pair()
        # a forked worker inherits the loader's ends of its siblings' sockets: it closes them,
        # or a sibling would never see the end of file that tells it the loader has gone
        siblings = [w.fd for w in self._workers] + [ours.fileno()] if self._method == "fork" else []
        current = shared_value(ctx, "q", -1)  # the request the worker is running
        ring = self._rings[index]
        process = ctx.Process(target=worker_main,  # type: ignore[attr-defined]
                              args=(index, theirs, siblings, current, self._generation, *self._args,
                                    self._rows[index], None if ring is None else ring.buffer),
                              name=f"pyloader-worker-{index}", daemon=True)
        try:
            process.start()
        except Exception as exc:
            ours.close()
            theirs.close()
            self._shut_down()
            raise _start_failure(index, self._method, exc) from exc
        theirs.close()
        ours.setblocking(False)
        return _Worker(index, process, ours, current)

    def _shut_down(self, timeout: float = 1.0) -> None:
        self._fold()
        workers, self._workers, self._dead = self._workers, [], None
        for worker in workers:
            worker.sock.close()
        for worker in workers:
            worker.process.join(timeout)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(max(timeout, _KILLED_EXIT_S))
            if not worker.process.is_alive():  # else multiprocessing reaps it later; close() would raise
                worker.process.close()

    # -- requests --------------------------------------------------------------------
    # Once the run has ended (detached), its tasks still being cancelled may ask: they get
    # nothing (a cancelled future), never an error that would hide their cancellation.
    def alive(self, index: int) -> bool:
        return self._loop is not None and self._workers[index].dead is None

    def check(self, doing: str) -> None:
        """Raise ``WorkerDied`` if a worker has died since the pool was launched."""
        if self._dead is not None and self._loop is not None:
            raise self._dead.died(doing)

    def least_loaded(self) -> int:
        live = [w for w in self._workers if w.dead is None] or self._workers
        return min(live, key=lambda w: len(w.pending)).index if live else 0

    def post(self, index: int, message: tuple) -> None:
        """Send without waiting for a reply (tagged with the file id it is about, if any)."""
        if self.alive(index):
            self._send(self._workers[index], message, message[1] if isinstance(message[1], int) else -1)

    def request(self, index: int, op: str, *args: Any, doing: str) -> asyncio.Future:
        """Send ``(op, rid, *args)``; the future gets the reply (or the worker's failure)."""
        if self._loop is None:
            future = asyncio.get_running_loop().create_future()
            future.cancel()
            return future
        worker = self._workers[index]
        future = self._loop.create_future()
        dead = worker if worker.dead is not None else self._dead
        if dead is not None:
            future.set_exception(dead.died(doing))
            return future
        rid = next(self._ids)
        worker.pending[rid] = (future, doing, op)
        try:
            self._send(worker, (op, rid, *args), rid)
        except BaseException:
            worker.pending.pop(rid, None)
            raise
        return future

    def release(self, index: int, pid: int) -> None:
        """Let a worker forget a piece; may be called from any thread (a finalizer)."""
        loop = self._loop
        if loop is None:
            return  # between runs: the workers forget every piece when the next run starts
        try:
            worker = self._workers[index]
        except IndexError:
            return  # closed
        worker.releases.append(pid)
        if len(worker.releases) == 1:
            try:
                loop.call_soon_threadsafe(self._flush_releases, worker)
            except RuntimeError:
                pass  # loop closed: the run is over

    def new_id(self) -> int:
        return next(self._ids)

    def _flush_releases(self, worker: _Worker) -> None:
        pids, worker.releases = worker.releases, []
        if pids and worker.dead is None and self._loop is not None:
            self._send(worker, ("release", pids), -1)

    def _send(self, worker: _Worker, message: tuple, tag: int) -> None:
        """Send now, or once the socket has room; an error other than the worker's end is raised."""
        if worker.outbox:
            worker.outbox.append((tag, message))
            return
        try:
            _ipc.send(worker.sock, message, tag, self._generation.value)
        except BlockingIOError:  # the worker is busy and its socket full: send when writable
            worker.outbox.append((tag, message))
            assert self._loop is not None  # sending only while attached
            self._loop.add_writer(worker.fd, self._writable, worker)
        except (ConnectionError, EOFError):
            self._died(worker)

    def _writable(self, worker: _Worker) -> None:
        while worker.outbox:
            tag, message = worker.outbox[0]
            try:
                _ipc.send(worker.sock, message, tag, self._generation.value)
            except BlockingIOError:
                return
            except (ConnectionError, EOFError):
                self._died(worker)
                return
            except Exception as exc:  # cannot be sent (no descriptor left for its memfd, ...)
                self._fail_request(worker, tag, exc)
            worker.outbox.pop(0)
        if self._loop is not None:  # not detached by a death above
            self._loop.remove_writer(worker.fd)

    # -- replies and deaths ------------------------------------------------------------
    def _readable(self, worker: _Worker) -> None:
        if not self._take_replies(worker):
            self._died(worker)

    def _take_replies(self, worker: _Worker) -> bool:
        """Handle every reply already sent; false once the worker's end is closed."""
        while True:
            try:
                tag, _, message = _ipc.recv(worker.sock)
            except BlockingIOError:
                return True
            except _ipc.MessageLost as lost:
                self._fail_request(worker, lost.tag, lost.cause)
                continue
            except (EOFError, OSError):
                return False
            self._answer(worker, tag, message)

    def _answer(self, worker: _Worker, tag: int, message: Tuple[bool, Any]) -> None:
        ok, value = message
        if tag == READY:
            worker.ready = True
            return
        if tag == INIT_FAILED:
            worker.init_error = rebuild_error(value)
            return
        waiting = _waiting(worker, tag)
        if waiting is None:
            return  # cancelled, or a reply to a run that has ended
        future, _, op = waiting
        if not ok:
            future.set_exception(rebuild_error(value))
        else:
            future.set_result(self._opened(value, op) if op in ("run", "encode") else
                              (value[0], self._opened(value[1], "run")) if op == "stacked" else value)

    def _opened(self, results: List[Tuple[bool, Any]], op: str) -> List[Tuple[bool, Any]]:
        """A ``run`` (or ``encode``) reply with every result unpickled; one that cannot be fails its batch alone."""
        out = []
        for ok, value in results:
            if ok:
                try:
                    value = value.open()
                except Exception as exc:
                    step = self.steps[-1 if op == "run" else 0][0]
                    exc.add_note(f"pyloader: the result of {step}, sent by a worker process, could not be "
                                 f"unpickled in the loader's process")
                    ok, value = False, (step, exc, "")
            out.append((ok, value))
        return out

    def _fail_request(self, worker: _Worker, tag: int, error: BaseException) -> None:
        """The request ``tag`` cannot get its reply: it fails with ``error``, saying what it was."""
        waiting = _waiting(worker, tag)
        if waiting is None:
            return
        future, doing, _ = waiting
        error.add_note(f"pyloader: while worker {worker.index} was {doing}")
        future.set_exception(error)

    def _died(self, worker: _Worker) -> None:
        if worker.dead is not None or self._loop is None:
            return
        self._take_replies(worker)  # what it said before it ended (worker_init_fn's exception)
        worker.process.join(0.5)
        _, doing, _ = worker.pending.get(worker.current.value, (None, "waiting for work", ""))
        worker.dead = self._death(worker, doing)
        if self._dead is None:
            self._dead = worker
        _unwatch(self._loop, worker)
        self._fail(worker, died=True)

    def _death(self, worker: _Worker, doing: str) -> str:
        who = f"worker {worker.index} (pid {worker.process.pid})"
        error = worker.init_error
        if error is not None:
            return f"{who} failed in worker_init_fn: {type(error).__name__}: {error}"
        code = worker.process.exitcode
        if code == NEEDS_MAIN_GUARD and not worker.ready:
            return f"{who} could not start: {_guard_advice(self._method)}"
        return f"{who} {_describe_exit(code)} while {doing}"

    def _fail(self, worker: _Worker, died: bool) -> None:
        pending, worker.pending = worker.pending, {}
        for future, doing, _ in pending.values():
            if future.done():
                continue
            if died:
                future.set_exception(worker.died(doing))
            else:
                future.cancel()


class KeptPool:
    """The pool a loader keeps across its runs (``persistent_workers``), made by the first run."""

    def __init__(self) -> None:
        self._pool: Optional[WorkerPool] = None
        self._lock = threading.Lock()

    def get(self, make: Callable[[], WorkerPool]) -> WorkerPool:
        with self._lock:
            if self._pool is None:
                self._pool = make()
            return self._pool

    def close(self) -> None:
        """End the workers (the next run starts new ones); safe from a finalizer and at exit."""
        with self._lock:
            pool = self._pool
        if pool is not None:
            pool.close()


def rebuild_error(value: Tuple[Optional[str], BaseException, str]) -> BaseException:
    """The worker's exception, with the worker's traceback (if any) attached as a note."""
    step, cause, text = value
    if text:
        cause.add_note(f"--- in the worker process:\n{text.rstrip()}")
    raised_in_worker(cause)
    if step is None:
        return cause
    failed = StepFailed(step)
    failed.__cause__ = cause
    return failed


class RemoteRef:
    """A piece kept in a worker; the worker forgets it when this object is collected. ``row_bytes``:
    the bytes of one of its rows when its columns are all arrays (``_columns.array_row_bytes``)."""

    __slots__ = ("worker", "pid", "row_bytes", "__weakref__")

    def __init__(self, pool: WorkerPool, worker: int, pid: int, row_bytes: Optional[int] = None) -> None:
        self.worker = worker
        self.pid = pid
        self.row_bytes = row_bytes
        weakref.finalize(self, pool.release, worker, pid)
