"""The worker process: runs ``read_file``/``iter_file``, ``batch_encode`` and ``collate_batch``.

It serves requests from the loader one at a time: batches before reading ahead
(see ``_next_request``), otherwise in the order they arrive:

* ``("open", gid, task, data)``: start reading a file (its pieces, in order;
  ``data``: its bytes when the loader fetched them ahead);
* ``("next", rid, gid, pid, fetch)``: the file's next piece: kept here under
  ``pid`` (only its length is sent) or, with ``fetch``, sent whole; the reply
  says whether the file is known to end with it, and how many samples
  ``filter_fn`` dropped from it;
* ``("close", gid)`` and ``("release", pids)``: forget a file or pieces;
* ``("run", rid, jobs)``: for each ``(segments, paths)`` of a group, assemble a
  batch from kept pieces or sent columns and run the steps on it; the reply is
  one ``(ok, value)`` per batch, so one failed batch does not sink its group;
* ``("fetch", rid, pid, start, end)``: send rows of a kept piece.

Every reply is ``(rid, ok, value)``; a failure sends the exception (or, if it
cannot be pickled, a ``RuntimeError`` with its text) and its traceback text.
The worker exits when the loader's end of the socket closes, and at once when
the thread that started it dies (Linux ``PR_SET_PDEATHSIG``).
"""
from __future__ import annotations

import collections
import ctypes
import gc
import os
import pickle
import select
import signal
import socket
import sys
import traceback
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Set, Tuple

from . import _ipc
from ._batch import assemble
from ._columns import Columns, n_rows, slice_rows
from ._read import pieces_with_end

Segment = Tuple[Any, int, int]  # (pid or inline columns, start, end)
RUN_GRACE_S = 0.005


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the closed socket still ends the worker


class RemoteError(Exception):
    """Stands for a worker exception that could not be pickled."""


def _error(exc: BaseException) -> tuple:
    """``(step, cause, traceback text)``, picklable whatever the exception was."""
    text = "".join(traceback.format_exception(exc))
    step = getattr(exc, "step", None)
    cause = exc.__cause__ if step is not None else exc
    try:
        payload = pickle.dumps(cause, protocol=5)
        pickle.loads(payload)
    except Exception:
        cause = RemoteError(f"{type(cause).__name__}: {cause}")
    return (step, cause, text)


def _run_job(steps: List[Tuple[str, Callable]], kept: Dict[int, Columns], segments: List[Segment],
             paths: Tuple[str, ...]) -> Tuple[bool, Any]:
    from ._map import run_steps

    try:
        parts = [(kept[src] if isinstance(src, int) else src, start, end) for src, start, end in segments]
        return True, run_steps(steps, assemble(parts, paths))
    except Exception as exc:
        return False, _error(exc)


def _receive(sock: socket.socket, inbox: Deque[tuple], grace: float = 0.0) -> None:
    """Wait for a request if none is queued, then take every request already sent.

    With ``grace``, when no urgent request is queued, wait up to that long for one:
    right after a piece was kept here, the loader is about to send the batches that
    run on it, and starting to parse another file first would hold them up for the
    whole parse.
    """
    if not inbox:
        inbox.append(_ipc.recv(sock))
    _drain(sock, inbox)
    if grace and not any(msg[0] in _URGENT for msg in inbox):
        if select.select([sock], [], [], grace)[0]:
            _drain(sock, inbox)


def _drain(sock: socket.socket, inbox: Deque[tuple]) -> None:
    sock.setblocking(False)
    try:
        while True:
            inbox.append(_ipc.recv(sock))
    except BlockingIOError:
        pass
    finally:
        sock.setblocking(True)


_URGENT = ("open", "close", "release", "run", "fetch")


def _next_request(inbox: Deque[tuple], started: Set[int]) -> tuple:
    """Bookkeeping and batches first, then the next piece of a file already under way
    (often just its end), reading a new file ahead (``next`` of a fresh file) last:
    a batch the consumer waits for never queues behind the parsing of a file that is
    not needed yet. Requests of one kind keep their order; ``next`` comes after the
    ``open`` it needs."""
    for i, msg in enumerate(inbox):
        if msg[0] in _URGENT:
            del inbox[i]
            return msg
    for i, msg in enumerate(inbox):
        if msg[2] in started:
            del inbox[i]
            return msg
    return inbox.popleft()


def worker_main(worker_id: int, sock: socket.socket, inherited: List[int], current: Any, reader: Any,
                steps: List[Tuple[str, Callable]], worker_init_fn: Optional[Callable[[int], None]]) -> None:
    for fd in inherited:
        try:
            os.close(fd)
        except OSError:
            pass

    gc.freeze()  # inherited objects: never scanned here, so forked pages stay shared
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the loader's to handle
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)  # N workers with a thread pool each would oversubscribe the cores
    if worker_init_fn is not None:
        worker_init_fn(worker_id)
    files: Dict[int, Iterator[Columns]] = {}
    started: Set[int] = set()  # files that gave a piece
    kept: Dict[int, Columns] = {}
    inbox: Deque[tuple] = collections.deque()
    grace = 0.0
    while True:
        try:
            _receive(sock, inbox, grace)
        except (EOFError, OSError):
            break
        msg = _next_request(inbox, started)
        op = msg[0]
        grace = 0.0
        if op == "open":
            _, gid, task, data = msg
            files[gid] = pieces_with_end(reader, task, data)
            continue
        if op == "close":
            started.discard(msg[1])
            gen = files.pop(msg[1], None)
            if gen is not None:
                gen.close()
            continue
        if op == "release":
            for pid in msg[1]:
                kept.pop(pid, None)
            continue
        rid = msg[1]
        current.value = rid  # read by the loader if this worker dies now
        try:
            if op == "next":
                _, _, gid, pid, fetch = msg
                item = next(files[gid], None)
                started.add(gid)
                if item is None:
                    reply = (rid, True, None)
                elif fetch:
                    reply = (rid, True, (n_rows(item[0]), item[0], *item[1:]))
                else:
                    kept[pid] = item[0]
                    reply = (rid, True, (n_rows(item[0]), None, *item[1:]))
                    grace = RUN_GRACE_S
            elif op == "run":
                reply = (rid, True, [_run_job(steps, kept, segments, paths) for segments, paths in msg[2]])
            elif op == "fetch":
                _, _, pid, start, end = msg
                reply = (rid, True, slice_rows(kept[pid], start, end))
            else:
                raise ValueError(f"unknown request {op!r}")
        except Exception as exc:
            reply = (rid, False, _error(exc))
        current.value = -1
        try:
            _ipc.send(sock, reply)
        except OSError:
            break
    for gen in files.values():
        gen.close()
    os._exit(0)
