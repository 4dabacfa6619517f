"""Errors raised to the consumer, and the pluggable policies that decide what to do with them."""
from __future__ import annotations

import logging
import os
from traceback import clear_frames
from types import TracebackType
from typing import Any, Callable, Dict, NoReturn, Optional, Sequence, Tuple, Union

from ._stats import Stats

logger = logging.getLogger("pyloader")


class PipelineError(RuntimeError):
    """A user method (``read_file``, ``batch_encode``, ``collate_batch``, …) failed.

    ``stage`` names the method, ``paths`` the files involved, and the original
    exception is chained as ``__cause__`` (and kept as ``original``).

    The error keeps the original's type: ``PipelineError(stage, paths, exc)`` is
    an instance of a subclass of both ``PipelineError`` and ``type(exc)``, so
    ``except ValueError`` catches a ``ValueError`` raised in ``read_file``. Where
    that type cannot be subclassed (or is ``StopIteration``, which would end the
    consumer's loop silently), it is a plain ``PipelineError``.

    Example:
        ```python
        try:
            for batch in loader:
                ...
        except PipelineError as error:    # also an instance of the original's type (ValueError, OSError...)
            print(error.stage, error.paths, repr(error.__cause__))
        ```
    """

    def __new__(cls, stage: str, paths: Sequence[str], original: BaseException) -> "PipelineError":
        if cls is PipelineError:
            cls = _typed(type(original))
        try:
            return type(original).__new__(cls, stage) if cls is not PipelineError else super().__new__(cls, stage)
        except Exception:
            return super().__new__(PipelineError, stage)

    def __init__(self, stage: str, paths: Sequence[str], original: BaseException) -> None:
        self.stage = stage
        self.paths = tuple(paths)
        self.original = original
        where = ", ".join(repr(p) for p in self.paths) if self.paths else "no file"
        super().__init__(f"{stage} failed on {where}: {describe(original)}")
        # in a worker, its frames in this process are the loader's, not where it failed (its notes show those)
        original.__traceback__ = None if getattr(original, _IN_WORKER, False) else users_frames(original.__traceback__)
        self.__cause__ = original

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> Tuple[Any, ...]:
        cls = PipelineError if type(self) in _typed_cache.values() else type(self)
        return cls, (self.stage, self.paths, self.original)


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
# the loader's objects a user picks: their frames tell where a file or batch failed
_OBJECTS = tuple(_PACKAGE + folder + os.sep for folder in ("readers", "collators", "_storage"))


def is_machinery(filename: str) -> bool:
    """Whether ``filename`` is the loader's machinery that calls user code (the package, but for ``_OBJECTS``)."""
    return filename.startswith(_PACKAGE) and not filename.startswith(_OBJECTS)


def users_frames(tb: Optional[TracebackType]) -> Optional[TracebackType]:
    """``tb`` without the machinery's frames (``is_machinery``): the user's code, and the built-in readers'
    and collators'; ``tb`` whole when no other frame is in it (a failure of the machinery itself)."""
    kept, step = [], tb
    while step is not None:
        if not is_machinery(step.tb_frame.f_code.co_filename):
            kept.append(step)
        step = step.tb_next
    if not kept:
        return tb
    out = None
    for one in reversed(kept):
        out = TracebackType(out, one.tb_frame, one.tb_lasti, one.tb_lineno)
    return out


_IN_WORKER = "_pyloader_in_worker"


def raised_in_worker(exc: BaseException) -> None:
    """Mark ``exc`` as raised in a worker process (its notes hold the worker's traceback): a
    ``PipelineError`` chaining it drops the frames of this process it was raised through since."""
    try:
        setattr(exc, _IN_WORKER, True)
    except Exception:  # an exception type without a __dict__: it keeps those frames
        pass


_NOT_TYPED = (StopIteration, StopAsyncIteration)
_typed_cache: Dict[type, type] = {}


def _typed(original: type) -> type:
    """``PipelineError`` for errors of type ``original``: a subclass of both, made once per type."""
    if not issubclass(original, Exception) or issubclass(original, (PipelineError, *_NOT_TYPED)):
        return PipelineError
    if original not in _typed_cache:
        try:
            _typed_cache[original] = type(
                f"PipelineError[{original.__qualname__}]", (PipelineError, original),
                {"__module__": "pyloader", "__qualname__": f"PipelineError[{original.__qualname__}]",
                 "__doc__": PipelineError.__doc__})
        except TypeError:  # a final type, or instance layouts that cannot be combined
            _typed_cache[original] = PipelineError
    return _typed_cache[original]


def describe(exc: BaseException) -> str:
    """``Type: message``, even for an exception whose ``__str__`` raises."""
    try:
        text = str(exc)
    except Exception as failed:
        text = f"<str() failed: {type(failed).__name__}>"
    return f"{type(exc).__name__}: {text}"


class Failure:
    """An exception travelling through a queue, to be raised where it is consumed, in order."""

    def __init__(self, exc: BaseException) -> None:
        self.exc: Optional[BaseException] = exc

    def throw(self, *, traceback: bool = True) -> NoReturn:
        """Raise the exception (without its ``traceback`` so far if false), once. The failure lets go of
        it first: the frames its traceback gathers on the way up hold this failure (and their ``self``),
        and a cycle through them would keep a whole iteration alive until the garbage collector runs."""
        exc, self.exc = self.exc, None
        if exc is None:
            raise RuntimeError("pyloader: a failure raised twice")
        if not traceback:  # the frames it was raised through hold it (``reraise``'s ``error``): a cycle
            clear_frames(exc.__traceback__)
            exc = exc.with_traceback(None)
        try:
            raise exc
        finally:
            exc = None


class WorkerDied(RuntimeError):
    """A worker process ended while the loader still needed it; never skipped by a policy.

    Example:
        ```python
        try:
            for batch in loader:
                ...
        except WorkerDied as error:       # killed (the OOM killer, a segfault): names the worker and its file
            print(error)
        ```
    """


class NeverSkipped(Exception):
    """A base of errors that no ``on_error`` policy skips: a setting that cannot work with this data
    (e.g. ``_storage.codec.NotCacheable``), not a bad file or batch."""


class TooManyErrors(PipelineError):
    """More errors were skipped than ``OnError.max_errors`` allows.

    Example:
        ```python
        loader = DataLoader(reader, dataset, collator, "data/", on_error=OnError("skip", max_errors=10))
        # an iteration that skips more than 10 failed files or batches raises TooManyErrors
        ```
    """


def reraise(error: PipelineError) -> None:
    """Policy: stop the iteration with the error.

    Example:
        ```python
        def policy(error):                # skip files that fail to read, stop on anything else
            if error.stage != "read_file":
                reraise(error)
            warn_and_skip(error)


        loader = DataLoader(reader, dataset, collator, "data/", on_error=policy)
        ```
    """
    raise error


def warn_and_skip(error: PipelineError) -> None:
    """Policy: log a warning naming the file(s) and skip the failed item.

    Example:
        ```python
        loader = DataLoader(reader, dataset, collator, "data/", on_error=warn_and_skip)   # as on_error="skip"
        ```
    """
    logger.warning("pyloader skipped after an error: %s", error)


ErrorPolicy = Union[str, Callable[[PipelineError], None]]
_NAMED = {"raise": reraise, "skip": warn_and_skip}


def resolve_policy(on_error: ErrorPolicy) -> Callable[[PipelineError], None]:
    if callable(on_error):
        return on_error
    if on_error in _NAMED:
        return _NAMED[on_error]
    raise ValueError(f"on_error must be 'raise', 'skip' or a callable, got {on_error!r}")


class ErrorHandler:
    """Applies the policy to a failure: raises, or returns so the caller skips the item."""

    def __init__(self, on_error: ErrorPolicy, max_errors: Optional[int], stats: Stats) -> None:
        if max_errors is not None and max_errors < 0:
            raise ValueError(f"max_errors must be >= 0 or None, got {max_errors!r}")
        self.policy = resolve_policy(on_error)
        self.max_errors = max_errors
        self.stats = stats
        self.skipped = 0  # in this iteration: max_errors counts per iteration

    def __call__(self, stage: str, paths: Sequence[str], exc: BaseException) -> None:
        if isinstance(exc, WorkerDied):
            raise exc
        if isinstance(exc, NeverSkipped):
            raise PipelineError(stage, paths, exc)
        error = exc if isinstance(exc, PipelineError) else PipelineError(stage, paths, exc)
        self.policy(error)  # raises to stop
        self.stats.errors.append(str(error))
        self.skipped += 1
        if self._too_many():
            raise TooManyErrors(stage, paths, RuntimeError(
                f"{self.skipped} errors skipped in this iteration, more than max_errors={self.max_errors}; "
                f"last: {error}"))

    def _too_many(self) -> bool:
        """Whether the errors skipped in this iteration are more than ``max_errors`` allows."""
        return self.max_errors is not None and self.skipped > self.max_errors
