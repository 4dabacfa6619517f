"""Files behind fsspec URLs: listing (URL chains such as ``simplecache::s3://…`` too), one
file's size and version, byte ranges, and retries of transient errors.

Contracts:

- A listed file's URL keeps the chain it was found through: listing
  ``simplecache::s3://b/data`` gives ``simplecache::s3://b/data/part-0``.
- Transient errors (a connection reset, refused or closed, a timeout, HTTP 5xx or 429,
  S3's ``SlowDown``; see ``is_transient``) are retried up to ``retries`` times with
  exponential backoff and full jitter (``BACKOFF_S`` doubling up to ``BACKOFF_CAP_S``,
  from a private generator: the global ``random`` is never touched). Anything else
  (a missing file, a refused permission) is raised at once.
- After the last attempt the last error is raised as itself (same type), with a note
  naming the file and the attempts made.
- ``retries`` bounds the attempts of each request, and one attempt is one request: a listing
  retries its calls one by one (``list_remote``); on S3 a file is read by byte ranges of a known
  size (``RemoteRanges``: no hidden HEAD before each GET), a body cut short is kept and the next
  request asks for the rest alone, of the version the file's first request got; a request that
  got further than the one before counts its own attempts (``awith_retries``'s ``reached``).
- The layers below do not multiply ``retries``. The S3 filesystems
  the loader reads and lists through (``storage_options``) make one attempt per call (s3fs's
  ``retries`` of 1 on instances of pyloader's own, botocore's ``total_max_attempts=1``, the rest
  of the user's fsspec configuration kept; aiohttp's own resending of a GET or HEAD turned off).
  A file a reader opens itself (``files.open_file`` without read-ahead; a reader's ``count``)
  is retried by s3fs alone (its own 5 attempts), never by botocore or aiohttp as well.
- Calls into one of fsspec's caching filesystems (``filecache::``, ``simplecache::``,
  ``blockcache::``) run one at a time per instance (``serialized``): their cache metadata and
  downloads are not thread-safe, and the loader reads several files at once.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import random
import sys
import threading
import time
import weakref
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    ContextManager,
    Dict,
    Iterator,
    List,
    Optional,
    Tuple,
    TypeVar,
)

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

T = TypeVar("T")
Info = Dict[str, Any]  # what fsspec says of a file (``info``, ``find(detail=True)``): size, type, version fields

BACKOFF_S = 0.05  # the first retry waits up to this long; each next one up to twice as long
BACKOFF_CAP_S = 5.0

_TRANSIENT_ERRNOS = {errno.ECONNRESET, errno.ECONNABORTED, errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EPIPE,
                     errno.EREMOTEIO, errno.EAGAIN}
# by class name, so that neither botocore nor aiohttp need be imported to recognize theirs
_TRANSIENT_NAMES = {"HTTPClientError", "ConnectionClosedError", "EndpointConnectionError", "ReadTimeoutError",
                    "ConnectTimeoutError", "IncompleteReadError", "IncompleteRead", "ResponseStreamingError",
                    "ClientPayloadError", "ServerDisconnectedError", "ClientConnectionError", "ClientOSError",
                    "FSTimeoutError", "ProtocolError", "ChunkedEncodingError", "ResponseParserError"}
_TRANSIENT_CODES = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling",
                    "ThrottlingException", "RequestLimitExceeded", "TooManyRequests"}
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, ValueError, TypeError)

_jitter = random.Random()  # private: the global generator is the user's

_locks: "weakref.WeakKeyDictionary[AbstractFileSystem, threading.Lock]" = weakref.WeakKeyDictionary()
_locks_lock = threading.Lock()


def serialized(fs: AbstractFileSystem) -> ContextManager[object]:
    """The lock that calls into ``fs`` hold when it is one of fsspec's caching filesystems (two threads
    saving filecache's metadata at once lose one's entry, and the open that needs it fails); else a null
    context."""
    from fsspec.implementations.cached import CachingFileSystem

    if not isinstance(fs, CachingFileSystem):
        return contextlib.nullcontext()
    with _locks_lock:
        lock = _locks.get(fs)
        if lock is None:
            lock = _locks[fs] = threading.Lock()
    return lock


def _new_locks_in_child() -> None:
    """A forked child's locks are fresh: one held by a thread of the parent would be held forever."""
    global _locks_lock
    _locks_lock = threading.Lock()
    _locks.clear()


os.register_at_fork(after_in_child=_new_locks_in_child)


def _chained(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]


def _status(exc: BaseException) -> Optional[int]:
    """The HTTP status an exception carries (aiohttp's ``status``, botocore's response), if any."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return code if isinstance(code, int) else None
    return None


def _one_is_transient(exc: BaseException) -> bool:
    return _transient_kind(exc) or _transient_answer(exc)


def _transient_kind(exc: BaseException) -> bool:
    """Whether ``exc`` is of a transient kind: by its class, a class's name, or its ``errno``."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if any(cls.__name__ in _TRANSIENT_NAMES for cls in type(exc).__mro__):
        return True
    return isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS


def _transient_answer(exc: BaseException) -> bool:
    """Whether ``exc`` carries a server's temporary failure: an HTTP 5xx or 429, or an S3 error code."""
    status = _status(exc)
    if status is not None and (status >= 500 or status == 429):
        return True
    response = getattr(exc, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return code in _TRANSIENT_CODES or "SlowDown" in str(exc)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying may help: the error, or one it was raised from, is a dropped connection,
    a timeout or a server's temporary failure. A missing file or a refused permission never is."""
    if isinstance(exc, _PERMANENT):
        return False
    return any(_one_is_transient(e) for e in _chained(exc))


def backoff(attempt: int) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): full jitter over a doubling span."""
    return _jitter.uniform(0.0, min(BACKOFF_CAP_S, BACKOFF_S * 2 ** attempt))


def _raise_unless_retried(exc: Exception, what: str, attempt: int, retries: int) -> None:
    """Raise ``exc`` (noting the attempts made, when more than one) unless retry number ``attempt``
    (0-based) is allowed and may help."""
    if attempt < retries and is_transient(exc):
        return
    if attempt:
        exc.add_note(f"pyloader: gave up on {what} after {attempt + 1} attempts; this is the last error")
    raise exc  # as it is: its own cause (s3fs keeps botocore's error, and the HTTP status, there) kept


def with_retries(call: Callable[[], T], what: str, retries: int) -> T:
    """``call()``, retried on transient errors (``time.sleep`` between attempts): for the caller's thread."""
    attempt = 0
    while True:
        try:
            return call()
        except Exception as exc:
            _raise_unless_retried(exc, what, attempt, retries)
        time.sleep(backoff(attempt))
        attempt += 1


async def awith_retries(call: Callable[[], Awaitable[T]], what: str, retries: int,
                        reached: Optional[Callable[[], int]] = None) -> T:
    """``await call()``, retried on transient errors; the waits between attempts can be cancelled.
    ``reached``: how far the calls got (the bytes kept so far); an attempt that failed after getting
    further made headway, and the next one is a new request from there, with attempts of its own."""
    attempt, got = 0, reached() if reached is not None else 0
    while True:
        try:
            return await call()
        except Exception as exc:
            if reached is not None and reached() > got:
                attempt, got = 0, reached()
            _raise_unless_retried(exc, what, attempt, retries)
        await asyncio.sleep(backoff(attempt))
        attempt += 1


_CHUNK = 2**20  # the most of a response's body taken at a time


class RemoteRanges:
    """One remote file on its filesystem (``fs``, ``path``), read by byte ranges. ``resumable``: on S3
    (s3fs), where a body cut short keeps what came."""

    def __init__(self, fs: AbstractFileSystem, path: str) -> None:
        self.fs, self.path = fs, path
        self._etag: Optional[str] = None  # the version of the object its first request got
        s3fs = sys.modules.get("s3fs")
        self.resumable = s3fs is not None and isinstance(fs, s3fs.S3FileSystem) and hasattr(fs, "_call_s3")

    def read_range(self, start: int, end: int, out: List[bytes]) -> None:
        """Append to ``out`` the bytes from ``start`` plus those already in ``out`` up to ``end``, in one
        request. On S3 the body is taken as it arrives: when it is cut short, ``out`` keeps what came, and
        the next call asks for the rest alone; every request after the first asks for the version of the
        object the first one got (S3 refuses it otherwise: a changed object's bytes are never joined to
        the old one's, in a range or across the blocks of a file). Elsewhere, ``cat_file`` of the range."""
        start += sum(map(len, out))
        if start >= end:
            return
        if self.resumable:
            from fsspec.asyn import sync

            sync(self.fs.loop, self._s3_range, start, end, out)
        else:
            out.append(self.fs.cat_file(self.path, start=start, end=end))

    async def _s3_range(self, start: int, end: int, out: List[bytes]) -> None:
        fs: Any = self.fs
        bucket, key, version_id = fs.split_path(self.path)
        given = {"VersionId": version_id} if version_id else {}
        if self._etag:
            given["IfMatch"] = self._etag
        response = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **given)
        self._etag = self._etag or response.get("ETag")
        body = response["Body"]
        try:
            while True:
                chunk = await body.read(_CHUNK)
                if not chunk:
                    return
                out.append(chunk)
        finally:
            body.close()


def _chain(url: str) -> Tuple[List[str], int]:
    """The ``::``-separated parts of ``url`` and the index of the one that carries the path (the
    first with ``://``: ``simplecache::s3://b/k`` carries it in ``s3://b/k``, ``zip://m::s3://b/a.zip``
    in ``zip://m``)."""
    bits = url.split("::")
    return bits, next((i for i, bit in enumerate(bits) if "://" in bit), len(bits) - 1)


def _with_path(url: str, path: str) -> str:
    """``url`` naming ``path`` (as its filesystem lists it) instead of its own path."""
    bits, i = _chain(url)
    protocol = bits[i].split("://", 1)[0]
    bits[i] = path if "://" in path else f"{protocol}://{path}"
    return "::".join(bits)


_S3 = ("s3", "s3a")  # s3fs's protocols
_MARK = "pyloader"  # in the user agent of the S3 filesystems pyloader retries for: instances of their own


def storage_options(url: str, retried_here: bool = True) -> Dict[str, Dict[str, object]]:
    """fsspec options for the S3 layers of ``url`` (keyed by protocol, as fsspec takes them for a
    chain's layers), so that attempts are counted in one place: botocore makes one attempt per
    request and aiohttp sends each once; with ``retried_here`` (the caller retries) s3fs makes
    one per call too (on instances of pyloader's own, told by ``_MARK`` in their user agent),
    else its own (5). The user's fsspec configuration of the protocol is kept, its
    ``config_kwargs`` merged."""
    import fsspec

    options: Dict[str, Dict[str, object]] = {}
    for bit in _chain(url)[0]:
        protocol = bit.split("://", 1)[0]
        if protocol not in _S3 or protocol in options:
            continue
        config_kwargs = {**fsspec.config.conf.get(protocol, {}).get("config_kwargs", {}),
                         "retries": {"total_max_attempts": 1}}
        config_kwargs.setdefault("http_session_cls", _session_sending_once())
        options[protocol] = {"config_kwargs": config_kwargs}
        if retried_here:
            config_kwargs["user_agent_extra"] = f"{config_kwargs.get('user_agent_extra', '')} {_MARK}".strip()
            # s3fs takes its attempts as an attribute only: set on the (cached) instance
            fsspec.filesystem(protocol, **options[protocol]).retries = 1
    return options


_sending_once: Optional[type] = None


def _session_sending_once() -> type:
    """aiobotocore's aiohttp session, less aiohttp's own resending: aiohttp sends a GET or HEAD
    again, once, when its connection drops (RFC 9112's retry of a persistent connection), which
    doubles every attempt. (On an aiohttp without that attribute, nothing changes.)"""
    global _sending_once
    if _sending_once is None:
        from aiobotocore.httpsession import AIOHTTPSession

        class SendingOnce(AIOHTTPSession):
            async def _get_session(self, proxy_url: Any) -> Any:
                session = await super()._get_session(proxy_url)
                session._retry_connection = False
                return session

        _sending_once = SendingOnce
    return _sending_once


def filesystem(url: str, retried_here: bool = True) -> Tuple[AbstractFileSystem, str]:
    """The fsspec filesystem of ``url`` (the outermost of a chain) and the path on it; with
    ``retried_here`` the caller retries its calls (``storage_options``)."""
    from fsspec.core import url_to_fs  # optional: only remote data needs fsspec

    return url_to_fs(url, **storage_options(url, retried_here))


def _hidden_below(path: str, root: str) -> bool:
    return any(part.startswith((".", "_")) for part in path[len(root):].split("/"))


def _found(url: str, fs: AbstractFileSystem, paths: List[str], retried: Callable[..., Any]) -> List[str]:
    found: List[str] = []
    for path in paths:
        if retried(fs.isdir, path):
            found.extend(p for p in retried(fs.find, path) if not _hidden_below(p, path))
        elif retried(fs.exists, path):
            found.append(path)
        else:
            raise FileNotFoundError(f"data_dir {url!r} does not exist")
    return sorted(_with_path(url, f) for f in found)


def list_remote(url: str, retries: int = 0) -> List[str]:
    """The files under ``url`` (a folder, a glob or a file; any fsspec protocol or chain), sorted. Each
    call is retried by itself: a failed one does not repeat the calls before it."""
    import fsspec

    def retried(fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        return with_retries(functools.partial(fn, *args, **kwargs), repr(url), retries)

    fs, _, paths = retried(fsspec.get_fs_token_paths, url, storage_options=storage_options(url))
    # the instance is shared by every loader of the process (and reads files' sizes and versions):
    # list what is there now, and leave no listing behind that would answer for a file changed later
    fs.invalidate_cache()
    try:
        return _found(url, fs, paths, retried)
    finally:
        fs.invalidate_cache()


def version(info: Info) -> str:
    """What tells one content of a remote file from the next: its ETag, generation or
    modification time, whichever the filesystem gives (with the size beside it)."""
    for key in ("ETag", "etag", "generation", "md5Hash", "LastModified", "last_modified", "mtime", "created"):
        if info.get(key) is not None:
            return f"{key}={info[key]}"
    return ""
