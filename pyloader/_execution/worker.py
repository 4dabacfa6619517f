"""The worker process: runs ``read_file``/``iter_file``, ``batch_encode`` and ``collate_batch``.

It serves requests from the loader one at a time: batches before reading ahead
(see ``_next_request``), otherwise in the order they arrive. Right after it read a
piece, or found its file's end, it waits a little (a share of the read's time) for the
batches of that piece before it reads another file ahead (``_receive``):

* ``("open", gid, task, data)``: start reading a file (its pieces, in order;
  ``data``: its bytes when the loader fetched them ahead);
* ``("next", rid, gid, pid, fetch)``: the file's next piece: kept here under
  ``pid`` (only its length is sent) or, with ``fetch``, sent whole; the reply
  says whether the file is known to end with it, how many samples
  ``filter_fn`` dropped from it, and for a kept piece whose columns are all arrays
  the bytes of a row (``_columns.array_row_bytes``);
* ``("close", gid)`` and ``("release", pids)``: forget a file or pieces;
* ``("run", rid, jobs)``: for each ``(segments, paths, key)`` of a group, assemble a
  batch from kept pieces or sent columns and run the steps on it (under ``key``, the
  batch's ``pyloader.rng()``: ``_execution.steps.run_steps``); the reply is
  one ``(ok, value)`` per batch, so one failed batch does not sink its group;
* ``("stacked", rid, (pid, start, size, count), paths, keys)``: ``count`` batches of ``size`` rows of a
  kept piece of arrays from row ``start`` on, run at once where every step can (``run_stacked``):
  the reply is ``(True, [(ok, outputs)])``; else batch by batch, as ``run``: ``(False, [(ok, value), ...])``;
* ``("encode", rid, jobs)``: as ``run``, with ``batch_encode`` alone (an epoch whose
  encoded batches are cached: they are written and collated in the loader's process);
* ``("fetch", rid, pid, start, end)``: send rows of a kept piece.

Every reply is ``(ok, value)``, tagged with its ``rid`` (see ``_execution.ipc``); a
failure sends the exception (or, if it cannot be pickled, a ``RuntimeError``
with its text) and its traceback text. Each result of a ``run`` is ``Sealed``
here, so a result that cannot be pickled fails its batch (as an error of the
last step, the pickling error chained) and one that cannot be unpickled in the
loader fails only its batch there. After ``worker_init_fn`` the worker says
``READY``, or sends its exception tagged ``INIT_FAILED`` and exits.

Requests carry the generation of the run that sent them; the loader moves the
shared ``generation`` on when a run of persistent workers ends, and the worker
then drops that run's requests still queued and forgets its files and pieces.
The worker exits when the loader's end of the socket closes, and at once when
the thread that started it dies (Linux ``PR_SET_PDEATHSIG``).
"""
from __future__ import annotations

import collections
import gc
import os
import pickle
import select
import signal
import socket
import sys
import time
import traceback
from typing import TYPE_CHECKING, Callable, Deque, Dict, Generator, List, Optional, Set, Tuple, Union

from .._columns import Columns, array_row_bytes, n_rows, slice_rows, stacked_views
from .._errors import users_frames
from .._libc import libc
from .._npy import populating
from .._stats import BusySink, GroupClock, RowBusy
from .._trace import RingWriter, SpanSink
from . import ipc as _ipc
from .reading import pieces_with_end
from .shared import SharedNumber, SharedRow
from .steps import Key, StackedRows, StepFailed, assemble, run_stacked, run_steps, traced

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

Segment = Tuple[Union[int, Columns], int, int]  # (pid or inline columns, start, end)
Pieces = Generator[Tuple[Columns, bool, int], None, None]  # a file's (piece, last, dropped), from pieces_with_end
RUN_GRACE_S = 0.005  # the least a worker waits for the batches of what it just read
RUN_GRACE_SHARE, RUN_GRACE_MOST_S = 0.25, 0.025  # ... and the share of the read's time it may wait, up to this
READY = -1  # the tag of the message saying that the worker is ready (worker_init_fn ran)
INIT_FAILED = -2  # the tag of worker_init_fn's exception


def _die_with_parent() -> None:
    found = libc()
    prctl = getattr(found, "prctl", None)
    if prctl is not None:  # else not Linux: the closed socket still ends the worker
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class RemoteError(Exception):
    """Stands for a worker exception that could not be pickled."""


def _error(exc: BaseException) -> tuple:
    """``(step, cause, traceback text)``, picklable whatever the exception was."""
    step = getattr(exc, "step", None)
    cause = exc.__cause__ if step is not None else exc
    text = worker_traceback(cause) if cause is not None else ""
    try:
        payload = pickle.dumps(cause, protocol=5)
        pickle.loads(payload)
    except Exception:
        cause = RemoteError(f"{type(cause).__name__}: {cause}")
    return (step, cause, text)


def worker_traceback(exc: BaseException) -> str:
    """``exc``'s traceback in this process, to be shown under the exception in the loader's: the frames of
    the user's code (and of the built-in readers and collators), not those of the machinery that called
    it (``users_frames``), and not the exception's own line (it travels with the exception)."""
    shown = traceback.TracebackException.from_exception(exc.with_traceback(users_frames(exc.__traceback__)))
    lines = list(shown.format())
    return "".join(lines[:len(lines) - len(list(shown.format_exception_only()))])


def _run_job(steps: List[Tuple[str, Callable]], kept: Dict[int, Columns], segments: List[Segment],
             paths: Tuple[str, ...], key: Optional[Key], spent: List[float],
             trace: Optional[SpanSink] = None) -> Tuple[bool, object]:
    try:
        parts = [(kept[src] if isinstance(src, int) else src, start, end) for src, start, end in segments]
        mine = steps if trace is None else traced(steps, trace, key, paths)
        result = run_steps(mine, assemble(parts, paths), spent, key)
    except Exception as exc:
        return False, _error(exc)
    return _sealed(steps, result)


def _sealed(steps: List[Tuple[str, Callable]], result: object) -> Tuple[bool, object]:
    """``(True, result)`` sealed to be sent, or ``(False, error)`` of the last step when it cannot be pickled."""
    try:
        return True, _ipc.Sealed.seal(result)
    except Exception as exc:  # a lock, a generator, a lambda, ... in the batch
        last = steps[-1][0]
        exc.add_note(f"the result of {last} must be picklable: it is sent from the worker process to the loader")
        failed = StepFailed(last)
        failed.__cause__ = exc
        return False, _error(failed)


def _run_jobs(steps: List[Tuple[str, Callable]], kept: Dict[int, Columns],
              jobs: List[Tuple[List[Segment], Tuple[str, ...], Optional[Key]]],
              busy: Optional[BusySink]) -> List[Tuple[bool, object]]:
    with GroupClock(busy, steps) as clock:
        return [_run_job(steps, kept, segments, paths, key, clock.steps, trace=clock.trace)
                for segments, paths, key in jobs]


_NO_REPLY = ("open", "close", "release")
_BOOKKEEPING = (*_NO_REPLY, "fetch")
_READ_AHEAD = 3  # the rank of a request to read a file not started yet


def _rank(msg: tuple, started: Set[int]) -> int:
    if msg[0] in _BOOKKEEPING:
        return 0
    if msg[0] != "next":
        return 2  # batches
    return 1 if msg[2] in started else _READ_AHEAD


def _awaited(msg: tuple, started: Set[int]) -> bool:
    """The loader waits for the reply: anything but reading a file ahead and the requests with no reply."""
    return msg[0] not in _NO_REPLY and _rank(msg, started) != _READ_AHEAD


def _next_request(inbox: Deque[tuple], started: Set[int]) -> tuple:
    """Bookkeeping first, then the next piece of a file already under way, then batches,
    reading a new file ahead (``next`` of a fresh file) last.

    A batch the consumer waits for never queues behind the parsing of a file that is not
    needed yet. The next piece of a file under way goes before batches: the loader cuts
    batches in order and waits for that piece's length to cut the rest of the file and
    the next files', so it would otherwise wait for every batch queued here, while the
    other workers, whose files come next, have nothing to do. Requests of one rank keep
    their order; ``next`` comes after the ``open`` it needs."""
    best = min(range(len(inbox)), key=lambda i: _rank(inbox[i], started))
    msg = inbox[best]
    del inbox[best]
    return msg


def _failing(error: BaseException) -> Pieces:
    """Stands for a file whose ``open`` request could not be decoded here."""
    raise error
    yield  # a generator


class _Server:
    """What a worker holds (open files, kept pieces, queued requests) and how it answers."""

    def __init__(self, sock: socket.socket, current: SharedNumber, generation: SharedNumber, reader: object,
                 steps: List[Tuple[str, Callable]], busy: Optional[BusySink]) -> None:
        self.sock = sock
        self.busy = busy
        self.current = current
        self.generation = generation
        self.reader = reader
        self.gen = generation.value  # every queued request is of this generation
        self.files: Dict[int, Pieces] = {}
        self.started: Set[int] = set()  # files that gave a piece
        self.kept: Dict[int, Columns] = {}
        self.inbox: Deque[tuple] = collections.deque()
        self.grace = 0.0
        self.read_s = 0.0  # how long the last piece read here took
        self._steps_of = {"run": steps, "encode": steps[:1]}  # "encode": batch_encode alone
        self._bookkeeping: Dict[str, Callable[[tuple], None]] = {
            "open": self._open, "close": self._close, "release": self._release}
        self._answers: Dict[str, Callable[[tuple], object]] = {
            "next": self._next_piece, "run": self._run, "encode": self._run, "fetch": self._fetch,
            "stacked": self._stacked}

    def serve(self) -> None:
        """Answer requests until the loader goes."""
        while True:
            try:
                self._receive()
            except (EOFError, OSError):
                return
            if self.generation.value != self.gen:
                self._reset()
            if not self.inbox:
                continue
            answer = self._handle(_next_request(self.inbox, self.started))
            if answer is not None and not self._reply(*answer):
                return

    def close(self) -> None:
        for pieces in self.files.values():
            try:
                pieces.close()
            except Exception:
                pass  # a reader's clean-up failing as its file is dropped: nobody wants that file now
        self.files.clear()

    def _reset(self) -> None:
        """The loader's run ended: forget its requests, files and pieces."""
        self.gen = self.generation.value
        self.inbox.clear()
        self.close()
        self.started.clear()
        self.kept.clear()

    # -- receiving ---------------------------------------------------------------------
    def _receive(self) -> None:
        """Wait for a request if none is queued, then take every request already sent.

        With ``grace``, when no urgent request is queued, wait up to that long for one:
        right after a piece was kept here, or its file was found to end, the loader is
        about to send the batches that run on it (and the rows of it a batch crossing
        into the next file needs), and starting to parse another file first would hold
        them up for the whole parse.
        """
        grace, self.grace = self.grace, 0.0
        while not self.inbox:
            self._take_one()
            if self.generation.value != self.gen:
                return
        self._drain()
        if grace:
            self._linger(grace)

    def _linger(self, grace: float) -> None:
        """Until a request the loader waits for is queued, wait up to ``grace`` seconds for one (see
        ``_receive``): the requests to read the next file ahead may come first."""
        deadline = time.monotonic() + grace
        while not any(_awaited(msg, self.started) for msg in self.inbox):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return
            self._drain()
            if self.generation.value != self.gen:
                return

    def _drain(self) -> None:
        self.sock.setblocking(False)
        try:
            while True:
                self._take_one()
        except BlockingIOError:
            pass
        finally:
            self.sock.setblocking(True)

    def _take_one(self) -> None:
        """Receive one message; queue it if it is of the current generation."""
        try:
            _, gen, msg = _ipc.recv(self.sock)
        except _ipc.MessageLost as lost:
            if lost.gen == self.generation.value and lost.tag >= 0:
                self._lost(lost)
            return
        if gen != self.generation.value:
            return  # sent by a run that has ended
        if self.gen != gen:
            self._reset()
        self.inbox.append(msg)

    def _lost(self, lost: _ipc.MessageLost) -> None:
        """A request that cannot be decoded here: its reply (or its file's next piece) is the error."""
        error = lost.cause
        error.add_note("pyloader: a request from the loader could not be decoded in the worker process")
        self.files[lost.tag] = _failing(error)
        self._reply(lost.tag, (False, _error(error)))

    # -- answering ---------------------------------------------------------------------
    def _handle(self, msg: tuple) -> Optional[Tuple[int, tuple]]:
        """Carry out one request; ``(rid, reply)`` when it expects one."""
        op = msg[0]
        if op in self._bookkeeping:
            self._bookkeeping[op](msg)
            return None
        rid = msg[1]
        self.current.value = rid  # read by the loader if this worker dies now
        try:
            reply = (True, self._answer(op, msg))
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # user code asking to exit: raised in the loader
            reply = (False, _error(exc))
        self.current.value = -1
        return rid, reply

    def _open(self, msg: tuple) -> None:
        """``("open", gid, task, data)``: start reading a file."""
        _, gid, task, data = msg
        self.files[gid] = pieces_with_end(self.reader, task, data, self.busy)

    def _close(self, msg: tuple) -> None:
        """``("close", gid)``: forget a file."""
        self.started.discard(msg[1])
        pieces = self.files.pop(msg[1], None)
        if pieces is not None:
            pieces.close()

    def _release(self, msg: tuple) -> None:
        """``("release", pids)``: forget pieces."""
        for pid in msg[1]:
            self.kept.pop(pid, None)

    def _answer(self, op: str, msg: tuple) -> object:
        if op not in self._answers:
            raise ValueError(f"unknown request {op!r}")
        return self._answers[op](msg)

    def _next_piece(self, msg: tuple) -> object:
        """``("next", rid, gid, pid, fetch)``: the file's next piece, kept here under ``pid`` or sent whole."""
        _, _, gid, pid, fetch = msg
        began = time.monotonic()
        item = next(self.files[gid], None)
        self.started.add(gid)
        if item is None:
            if self.kept:
                self._await_batches()
            return None
        if fetch:
            return n_rows(item[0]), item[0], *item[1:], None
        self.read_s = time.monotonic() - began
        self.kept[pid] = item[0]
        self._await_batches()
        return n_rows(item[0]), None, *item[1:], array_row_bytes(item[0])

    def _await_batches(self) -> None:
        """Wait for the batches of the pieces kept here before reading on (``_receive``): longer after a
        slow read, whose batches a parse of the next file would hold up as long."""
        self.grace = min(RUN_GRACE_MOST_S, max(RUN_GRACE_S, RUN_GRACE_SHARE * self.read_s))

    def _run(self, msg: tuple) -> object:
        """``("run" or "encode", rid, jobs)``: the steps on each job's batch."""
        return _run_jobs(self._steps_of[msg[0]], self.kept, msg[2], self.busy)

    def _stacked(self, msg: tuple) -> object:
        """``("stacked", rid, (pid, start, size, count), paths, keys)``: a group of full batches of one kept piece."""
        _, _, (pid, start, size, count), paths, keys = msg
        steps = self._steps_of["run"]
        outputs = run_stacked(steps, StackedRows(stacked_views(self.kept[pid], start, count, size), count), self.busy)
        if outputs is not None:
            return True, [_sealed(steps, dict(outputs))]
        jobs = [([(pid, start + k * size, start + (k + 1) * size)], paths, keys[k] if keys else None)
                for k in range(count)]
        return False, _run_jobs(steps, self.kept, jobs, self.busy)

    def _fetch(self, msg: tuple) -> object:
        """``("fetch", rid, pid, start, end)``: rows of a kept piece."""
        _, _, pid, start, end = msg
        return slice_rows(self.kept[pid], start, end)

    def _reply(self, rid: int, reply: tuple) -> bool:
        """Send a reply; false when the loader has gone. A reply that cannot be pickled (rows
        of ``read_file`` holding a lock, ...) is answered with that error instead."""
        try:
            _ipc.send(self.sock, reply, tag=rid)
        except OSError:
            return False
        except Exception as exc:
            exc.add_note("pyloader: the worker's reply must be picklable: it is sent to the loader's process")
            return self._reply(rid, (False, _error(exc)))
        return True


def worker_main(worker_id: int, sock: socket.socket, inherited: List[int], current: SharedNumber,
                generation: SharedNumber, reader: object, steps: List[Tuple[str, Callable]],
                worker_init_fn: Optional[Callable[[int], None]], busy_row: Optional[SharedRow] = None,
                ring: Optional["WriteableBuffer"] = None) -> None:
    for fd in inherited:
        try:
            os.close(fd)
        except OSError:
            pass

    _settle()
    _initialize(worker_id, sock, worker_init_fn)
    trace = None if ring is None else RingWriter(ring, worker_id)  # with loader.trace: read by the loader
    busy = RowBusy(busy_row, trace) if busy_row is not None else None  # read by loader.stats
    server = _Server(sock, current, generation, reader, steps, busy)
    server.serve()
    server.close()
    os._exit(0)


def _settle() -> None:
    """The process's own settings, before any user code runs in it."""
    gc.freeze()  # inherited objects: never scanned here, so forked pages stay shared
    _die_with_parent()
    populating(False)  # mapped batches leave as spans of their files: their pages are used in the loader's process
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the loader's to handle
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)  # N workers with a thread pool each would oversubscribe the cores
    if "tokenizers" in sys.modules:  # its thread pool, used before a fork, does not exist here: it would hang
        os.environ["TOKENIZERS_PARALLELISM"] = "false"


def _initialize(worker_id: int, sock: socket.socket, worker_init_fn: Optional[Callable[[int], None]]) -> None:
    """Run ``worker_init_fn`` and tell the loader the worker is ready; the process ends if it raised
    (its error sent first) or if the loader has gone."""
    try:
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
    except Exception as exc:  # reported by the loader with the worker's death
        try:
            _ipc.send(sock, (False, _error(exc)), tag=INIT_FAILED)
        finally:
            os._exit(1)
    try:
        _ipc.send(sock, (True, None), tag=READY)
    except OSError:
        os._exit(0)  # the loader has gone already
