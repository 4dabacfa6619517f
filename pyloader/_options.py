"""Every ``DataLoader`` option, declared once: name, type, default, a line of doc, its check, its part in resume.

``Options`` below is the declaration. Each field is one option::

    name: Annotated[type, Option("one line of doc", check=..., resume=...)] = default

and everything else is derived from it, at import or at construction:

* the loader's signature: ``DataLoader`` is an ``Options`` whose ``__init__`` is typed
  (``taking``) and signed as ``Options``' (so ``inspect.signature``, ``help`` and mypy
  see every option, its type and its default; an unknown keyword is a ``TypeError``
  naming it, with the nearest option);
* the attributes users read (``loader.num_workers``...): the fields themselves, read-only;
* validation: each option's ``check(name, value)``, in declaration order, then the
  rules between options (``_check_together``); bool options are stored as ``bool``,
  and three defaults are resolved from others (``num_threads``, ``bucket_buffer``, ``rotation_size``);
* the resume fingerprint (``fingerprint``): the options declared with ``resume``, under
  their names: ``True`` keeps the value, a callable maps it to what the state records.
  Keys and values must stay as older states recorded them, and a new option that
  changes the batch sequence must record ``None`` at its default (as ``time_major``
  does), so that states saved before it existed still load;
* the settings the pipeline reads (``_plan.Settings.options``, an ``Options``);
* the docs: ``help(DataLoader)`` lists every option with its default and doc
  (``describe``), and tests/test_options.py checks that the README's table of
  ``DataLoader`` arguments names exactly these options.

Why a frozen dataclass and not a table beside an explicit signature: the signature
*is* the declaration here, so nothing can disagree with it, and mypy still checks
callers' keyword names and types (the dataclass plugin reads the fields; ``taking``
hands that signature to ``DataLoader.__init__``). ``DataLoader`` inherits the fields,
so ``loader.num_workers`` is typed too; frozen, so the pipeline, the fingerprint and
the user all see the values that were checked. ``Annotated`` keeps the metadata next
to the type without changing it for mypy or for users.

Adding an option is one place: a field here (after ``_: KW_ONLY``, keyword-only),
with its doc, its check (reuse ``positive``, ``at_least_zero``, ``optional``,
``one_of``...), and ``resume=`` when it changes the batch sequence; then a row in
the README's table (the test says so), and the pipeline reads it as
``settings.options.<name>``. A rule between options goes in ``_check_together``.
Changing a default (e.g. ``num_workers="auto"``) is the field's default, type and
check, and the README's list of defaults (the test says so too).
"""
from __future__ import annotations

import difflib
import inspect
import multiprocessing
import os
import typing
from dataclasses import KW_ONLY, MISSING, dataclass, fields
from typing import Annotated, Any, Callable, Concatenate, Dict, Optional, ParamSpec, Sequence, Tuple, Union

from ._abc import DataCollator, DataReader, Dataset
from ._compose import callable_name, check_compose
from ._errors import ErrorHandler, ErrorPolicy, Stats
from ._execution.auto_workers import check as check_workers
from ._frameworks.progress import check as check_progress
from ._stages.bucket import BucketBy, buffer_size
from ._stages.mix import check_stop
from ._stages.rotation import check_folder, held_samples
from ._stages.shard import EVEN_BATCHES
from ._stages.shard import resolve as resolve_sharding
from ._stages.sources import Source
from ._stages.stream import PADDING_MODES
from ._storage.bytes import DEFAULT_READAHEAD_BYTES
from ._storage.epoch_cache import CacheEncoded, as_cache_encoded, check_cache_encoded, resume_key
from ._storage.files import DataDir

GROUPS_IN_FLIGHT = 2  # being encoded and collated without workers
GROUPS_PER_WORKER = 4  # with workers: enough that one worker's file does not hold the other idle

Check = Callable[[str, object], object]  # raises naming the option when the value is bad


@dataclass(frozen=True)
class Option:
    """What ``Options`` declares of one option besides its name, type and default."""

    doc: str
    check: Optional[Check] = None
    resume: Union[bool, Callable[[object], object]] = False  # in the fingerprint: as is (True), or mapped
    convert: Optional[Callable[[object], object]] = None  # how it is stored (bool options: ``bool``)


# -- checks of one value ------------------------------------------------------------------
def positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def at_least_zero(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def optional(check: Check) -> Check:
    """``check``, with ``None`` allowed."""
    def checked(name: str, value: object) -> None:
        if value is not None:
            check(name, value)
    return checked


def one_of(choices: Union[Sequence[str], Callable[[], Sequence[str]]]) -> Check:
    """One of ``choices`` (or of what ``choices()`` gives when checked)."""
    def checked(name: str, value: object) -> None:
        allowed = choices() if callable(choices) else choices
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return checked


def instance_of(cls: type) -> Check:
    def checked(name: str, value: object) -> None:
        if not isinstance(value, cls):
            raise TypeError(f"{name} must be a pyloader.{cls.__name__}, got {type(value).__name__}")
    return checked


def _reader(name: str, value: Any) -> None:
    instance_of(DataReader)(name, value)
    positive("batch_size", value.batch_size)


def _progress(name: str, value: object) -> None:
    if value:
        check_progress()


def _stop(name: str, value: object) -> None:
    check_stop(value)


def _bucket_key(bucket_by: object) -> object:
    return bucket_by if isinstance(bucket_by, str) else callable_name(bucket_by)


def _true_or_none(value: bool) -> Optional[bool]:
    return value or None


def _above_one(value: int) -> Optional[int]:
    return value if value > 1 else None


def _path(value: Any) -> Optional[str]:
    return None if value is None else os.fspath(value)


# -- the declaration ------------------------------------------------------------------------
@dataclass(frozen=True, eq=False, repr=False)
class Options:
    """The options of a ``DataLoader``, checked and resolved (see the module docstring)."""

    datareader: Annotated[DataReader, Option(
        "reads each file into columns; its batch_size, shuffle (in-file order) and random_seed apply",
        check=_reader)]
    dataset: Annotated[Dataset, Option("encodes each batch of samples (batch_encode)", check=instance_of(Dataset))]
    datacollator: Annotated[DataCollator, Option(
        "turns each encoded batch into tensors (collate_batch)", check=instance_of(DataCollator))]
    data_dir: Annotated[Union[DataDir, Sequence[Source]], Option(
        "a folder, glob, list of paths or URL (stream mode: also slices and in-memory streams), "
        "or a list of Sources mixed by weight")]
    num_epoch: Annotated[int, Option("epochs per iteration", check=positive)] = 1
    max_queue_size: Annotated[int, Option("collated batches kept ready for the consumer", check=positive)] = 10
    shuffle: Annotated[bool, Option("shuffle the file order, anew each epoch", resume=True)] = False
    random_seed: Annotated[int, Option("seeds the file order and the shuffle buffer", resume=True, convert=int)] = 42
    _: KW_ONLY
    shuffle_buffer: Annotated[int, Option(
        "mix samples across files through a buffer of this many samples (0: off)",
        check=at_least_zero, resume=True)] = 0
    drop_last: Annotated[bool, Option("drop each epoch's final partial batch", resume=True)] = False
    prefetch_files: Annotated[int, Option(
        "files read ahead of the one being batched (stream mode: at least one per row)", check=positive)] = 4
    on_error: Annotated[ErrorPolicy, Option(
        '"raise", "skip" (log, skip the rest of the file, count it) or a callable taking the PipelineError')] = "raise"
    max_errors: Annotated[Optional[int], Option(
        "with skipping: raise TooManyErrors once more errors than this were skipped in an iteration")] = None
    pin_memory: Annotated[bool, Option("pin torch tensors in page-locked memory")] = False
    device: Annotated[Any, Option("move torch tensors to this device before handing them over")] = None
    stream: Annotated[bool, Option("stream mode for recurrent models: each row a file in order", resume=True)] = False
    seq_len: Annotated[Optional[int], Option(
        "stream mode: the steps of a window (None: one step)", check=optional(positive), resume=True)] = None
    padding_mode: Annotated[str, Option(
        "stream mode: how rows whose files ran out are padded", check=one_of(PADDING_MODES), resume=True)] = "zeros"
    pad_value: Annotated[Any, Option('stream mode: the value padding_mode="zeros" pads with')] = 0
    num_workers: Annotated[Union[int, str], Option(
        'worker processes running the user methods (0: threads of this process; "auto": decided per run)',
        check=check_workers)] = "auto"
    num_threads: Annotated[Optional[int], Option(
        "user methods run at once in this process (default: one per file read ahead and per group being encoded)",
        check=optional(positive))] = None
    worker_init_fn: Annotated[Optional[Callable[[int], None]], Option(
        "called as worker_init_fn(worker_id) first thing in each worker")] = None
    start_method: Annotated[Optional[str], Option(
        '"fork", "forkserver" or "spawn" (default: fork, or forkserver once TensorFlow is imported)',
        check=optional(one_of(multiprocessing.get_all_start_methods)))] = None
    rank: Annotated[Optional[int], Option(
        "this process's rank (default: torch.distributed's, else RANK, else 0)", resume=True)] = None
    world_size: Annotated[Optional[int], Option(
        "the processes sharing the data (default: torch.distributed's, else WORLD_SIZE, else 1)", resume=True)] = None
    even_batches: Annotated[str, Option(
        'under ranks: "pad" or "drop" to give every rank as many steps', check=one_of(EVEN_BATCHES),
        resume=True)] = "pad"
    persistent_workers: Annotated[bool, Option("keep the worker processes from one iteration to the next")] = False
    cache_dir: Annotated[Optional[str], Option("a local disk cache of remote files")] = None
    cache_limit: Annotated[Optional[int], Option(
        "the disk cache's size in bytes (least recently used out)", check=optional(positive))] = None
    retries: Annotated[int, Option("retries of transient remote errors", check=at_least_zero)] = 3
    readahead_bytes: Annotated[int, Option(
        "bytes read ahead of the parsers (0: none)", check=at_least_zero)] = DEFAULT_READAHEAD_BYTES
    progress: Annotated[bool, Option("show a tqdm bar for each iteration", check=_progress)] = False
    filter_fn: Annotated[Optional[Callable[[Dict[str, Any]], bool]], Option(
        "filter_fn(sample) -> bool: keep a sample or drop it before batching", resume=callable_name)] = None
    file_order: Annotated[Optional[Callable[..., Any]], Option(
        "file_order(files, epoch, rng) -> list of files: each epoch's file order, in place of shuffle",
        resume=callable_name)] = None
    time_major: Annotated[bool, Option(
        "stream mode with seq_len: fields as [T, B, ...]", resume=_true_or_none)] = False
    bucket_by: Annotated[Optional[BucketBy], Option(
        "length bucketing: a field (its len()) or a callable giving a sample's length", resume=_bucket_key)] = None
    bucket_buffer: Annotated[Optional[int], Option(
        "samples sorted by length at a time (default: 32 batches)", resume=True)] = None
    stop: Annotated[str, Option(
        'with Sources: "first_exhausted" or "all_exhausted"',
        check=_stop)] = "first_exhausted"
    cache_encoded: Annotated[Union[None, CacheEncoded, Dict[str, Any]], Option(
        'write every update_every-th epoch\'s encoded batches to dir and read them back in the epochs between: '
        '{"dir": ..., "update_every": K, "limit": None} or a CacheEncoded', check=check_cache_encoded,
        resume=resume_key, convert=as_cache_encoded)] = None
    rotation: Annotated[int, Option(
        "serve each encoded sample this many times per epoch (the epoch grows as many times), spread through it",
        check=positive, resume=_above_one)] = 1
    rotation_dir: Annotated[Union[None, str, "os.PathLike[str]"], Option(
        "with rotation: hold the samples served again in .npy files under this folder (else in memory)",
        check=optional(check_folder), convert=_path)] = None
    rotation_size: Annotated[Optional[int], Option(
        "with rotation: the encoded samples held at once (default: rotation windows of 32 batches)",
        check=optional(positive), resume=True)] = None

    def __post_init__(self) -> None:
        for name, option in OPTIONS.items():
            if option.check is not None:
                option.check(name, getattr(self, name))
        given = values_of(self)
        _check_together(given)
        for name, option in OPTIONS.items():
            if option.convert is not None:
                object.__setattr__(self, name, option.convert(given[name]))
        if self.num_threads is None:  # every file read ahead and every group in flight at once
            object.__setattr__(self, "num_threads", self.prefetch_files + GROUPS_IN_FLIGHT)
        object.__setattr__(self, "bucket_buffer", buffer_size(given))
        object.__setattr__(self, "rotation_size", held_samples(given))


def _check_together(a: Dict[str, Any]) -> None:
    """The rules between options (each one's own check has passed)."""
    if a["stream"] and a["shuffle_buffer"]:
        raise ValueError("stream mode keeps each row in file order: shuffle_buffer must be 0")
    if a["stream"] and a["datareader"].shuffle:
        raise ValueError("stream mode reads every file in order: use DataReader(shuffle=False) "
                         "(DataLoader(shuffle=True) still shuffles the file order)")
    if not a["stream"] and a["seq_len"] is not None:
        raise ValueError("seq_len applies to stream mode only (stream=True)")
    check_compose(a)
    resolve_sharding(a["rank"], a["world_size"], a["even_batches"])  # explicit values are checked now
    ErrorHandler(a["on_error"], a["max_errors"], Stats())  # checks them; each iteration gets its own
    if a["persistent_workers"] and a["num_workers"] == 0:
        raise ValueError("persistent_workers=True keeps worker processes: it needs num_workers > 0 or 'auto'")


def _declared() -> Dict[str, Option]:
    hints = typing.get_type_hints(Options, globals(), include_extras=True)
    declared = {}
    for f in fields(Options):
        meta = [m for m in getattr(hints[f.name], "__metadata__", ()) if isinstance(m, Option)]
        if len(meta) != 1:
            raise TypeError(f"Options.{f.name} must be declared as Annotated[type, Option(...)]")
        option = meta[0]
        if option.convert is None and typing.get_args(hints[f.name])[0] is bool:
            option = Option(option.doc, option.check, option.resume, bool)
        declared[f.name] = option
    return declared


OPTIONS: Dict[str, Option] = _declared()  # in declaration order


def _signature() -> inspect.Signature:
    types = typing.get_type_hints(Options, globals())  # without the Annotated metadata, as users read them
    params = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY if f.kw_only
                                else inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                default=inspect.Parameter.empty if f.default is MISSING else f.default,
                                annotation=types[f.name])
              for f in fields(Options)]
    return inspect.Signature(params, return_annotation=None)


SIGNATURE = _signature()


def resolved(value: Optional[int]) -> int:
    """An option whose ``None`` default was resolved at construction: ``num_threads`` (always),
    ``bucket_buffer`` (with ``bucket_by``), ``rotation_size`` (with ``rotation``)."""
    assert value is not None
    return value


def values_of(options: Options) -> Dict[str, Any]:
    """Every option's value, by name."""
    return {name: getattr(options, name) for name in OPTIONS}


def fingerprint(options: Options, **resolved: object) -> Dict[str, object]:
    """The options' part of the resume fingerprint, in declaration order; ``resolved``: values
    resolved when an iteration starts (``rank``, ``world_size``, ``even_batches``) in place of the given ones."""
    out: Dict[str, object] = {}
    for name, option in OPTIONS.items():
        if option.resume is not False:
            value = resolved[name] if name in resolved else getattr(options, name)
            out[name] = value if option.resume is True else option.resume(value)
    return out


def bind(owner: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """The value of every option for ``owner(*args, **kwargs)``, defaults filled in; a ``TypeError``
    naming ``owner`` for a bad call (an unknown keyword: with the nearest option)."""
    for key in kwargs:
        if key not in OPTIONS:
            near = difflib.get_close_matches(key, OPTIONS, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise TypeError(f"{owner}() got an unexpected keyword argument {key!r}{hint}")
    try:
        bound = SIGNATURE.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{owner}(): {exc}") from None
    bound.apply_defaults()
    return dict(bound.arguments)


P = ParamSpec("P")


def taking(options: Callable[P, object]) -> Callable[[Callable[..., None]], Callable[Concatenate[object, P], None]]:
    """Gives ``__init__(self, *args, **kwargs)`` the parameters of ``options`` (``Options``): for mypy,
    which then checks callers' keywords and types, and for ``inspect.signature`` and ``help``."""
    def typed(init: Callable[..., None]) -> Callable[Concatenate[object, P], None]:
        self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        init.__signature__ = SIGNATURE.replace(parameters=[self, *SIGNATURE.parameters.values()])  # type: ignore[attr-defined]
        # as an explicit signature would have them (read by code that inspects the defaults)
        init.__kwdefaults__ = {p.name: p.default for p in SIGNATURE.parameters.values()
                               if p.kind is p.KEYWORD_ONLY}
        return init
    return typed


def describe() -> str:
    """The options as ``help(DataLoader)`` lists them: name, default, doc (indented as a class docstring)."""
    lines = ["", "    Options (in signature order; the README's table says more):", ""]
    for f in fields(Options):
        default = "" if f.default is MISSING else f" = {f.default!r}"
        lines.append(f"    ``{f.name}{default}``: {OPTIONS[f.name].doc}")
    return "\n".join(lines) + "\n"
