"""Errors raised to the consumer, and the pluggable policies that decide what to do with them."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Union

logger = logging.getLogger("pyloader")


class PipelineError(RuntimeError):
    """A user method (``read_file``, ``batch_encode``, ``collate_batch``, …) failed.

    ``stage`` names the method, ``paths`` the files involved, and the original
    exception is chained as ``__cause__`` (and kept as ``original``).
    """

    def __init__(self, stage: str, paths: Sequence[str], original: BaseException) -> None:
        self.stage = stage
        self.paths = tuple(paths)
        self.original = original
        where = ", ".join(repr(p) for p in self.paths) if self.paths else "no file"
        super().__init__(f"{stage} failed on {where}: {type(original).__name__}: {original}")
        self.__cause__ = original


class Failure:
    """An exception travelling through a queue, to be raised where it is consumed, in order."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class WorkerDied(RuntimeError):
    """A worker process ended while the loader still needed it; never skipped by a policy."""


class TooManyErrors(PipelineError):
    """More errors were skipped than ``max_errors`` allows."""


def reraise(error: PipelineError) -> None:
    """Policy: stop the iteration with the error."""
    raise error


def warn_and_skip(error: PipelineError) -> None:
    """Policy: log a warning naming the file(s) and skip the failed item."""
    logger.warning("pyloader skipped after an error: %s", error)


ErrorPolicy = Union[str, Callable[[PipelineError], None]]
_NAMED = {"raise": reraise, "skip": warn_and_skip}


def resolve_policy(on_error: ErrorPolicy) -> Callable[[PipelineError], None]:
    if callable(on_error):
        return on_error
    if on_error in _NAMED:
        return _NAMED[on_error]
    raise ValueError(f"on_error must be 'raise', 'skip' or a callable, got {on_error!r}")


@dataclass
class Stats:
    """Counters of one loader, updated as batches are produced."""

    files_read: int = 0
    samples_read: int = 0
    batches: int = 0
    skipped_files: int = 0
    skipped_batches: int = 0
    errors: List[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()}


class ErrorHandler:
    """Applies the policy to a failure: raises, or returns so the caller skips the item."""

    def __init__(self, on_error: ErrorPolicy, max_errors: Optional[int], stats: Stats) -> None:
        if max_errors is not None and max_errors < 0:
            raise ValueError(f"max_errors must be >= 0 or None, got {max_errors!r}")
        self.policy = resolve_policy(on_error)
        self.max_errors = max_errors
        self.stats = stats

    def __call__(self, stage: str, paths: Sequence[str], exc: BaseException) -> None:
        if isinstance(exc, WorkerDied):
            raise exc
        error = exc if isinstance(exc, PipelineError) else PipelineError(stage, paths, exc)
        self.policy(error)  # raises to stop
        self.stats.errors.append(str(error))
        if self.max_errors is not None and len(self.stats.errors) > self.max_errors:
            raise TooManyErrors(stage, paths, RuntimeError(
                f"{len(self.stats.errors)} errors skipped, more than max_errors={self.max_errors}; last: {error}"))
