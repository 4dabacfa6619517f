"""Every ``DataLoader`` option, declared once: name, type, default, a line of doc, its check, its part in resume.

``Options`` below is the declaration. Each field is one option::

    name: Annotated[type, Option("one line of doc", check=..., resume=...)] = default

and everything else is derived from it, at import or at construction:

* the loader's signature: ``DataLoader`` is an ``Options`` whose ``__init__`` writes the
  options out, as ``SIGNATURE`` (derived from the fields) has them: names, kinds, types and
  defaults (tests/test_options.py fails on any difference), so that mypy, IDEs and the API
  reference (read from the source) see them; ``binding`` calls it with the values bound (an
  unknown keyword is a ``TypeError`` naming it, with the nearest option);
* the attributes users read (``loader.workers``, ``loader.stream``...): the fields themselves, read-only;
* validation: each option's ``check(name, value)``, in declaration order, then the
  rules between options (``_check_together``); bool options are stored as ``bool``,
  ``stream`` as ``False`` or a ``Stream``, ``on_error``, ``workers`` and ``device`` as their
  groups, and three defaults are resolved from others (``Workers.threads``, ``Bucket.buffer``,
  ``Rotation.size``);
* the groups (``_groups``): a feature with settings of its own takes one frozen object
  (``stream=Stream(seq_len=8)``) that checks its fields itself; ``stream_of``,
  ``seq_len_of``, ``times_of``, ``errors_of``, ``workers_of`` and ``device_of`` read them typed;
* the flat keywords of 0.1 (``seq_len=8``): ``MOVED``, the one table of old -> new; ``bind``
  moves them into their groups with a ``FutureWarning`` naming the new form (an old keyword
  with its group is a ``TypeError``), and the CHANGELOG lists the table (a test says so);
* the resume fingerprint (``fingerprint``): the options declared with ``resume``, under
  their names: ``True`` keeps the value, a callable maps it to what the state records
  (a group's maps it to a dict: its fields under the flat names states recorded).
  Keys and values must stay as older states recorded them, and a new option that
  changes the batch sequence must record ``None`` at its default (as ``time_major``
  does), so that states saved before it existed still load;
* the settings the pipeline reads (``_plan.Settings.options``, an ``Options``);
* the docs: ``help(DataLoader)`` lists every option with its default and doc
  (``describe``), and tests/test_options.py checks that the README's table of
  ``DataLoader`` arguments names exactly these options.

Why a frozen dataclass and a signature written out beside it: the dataclass holds what a
signature cannot (each option's doc, check and part in resume) next to its type and
default; the written signature is what tools that read the source see (a signature made
at run time is invisible to them), and the test comparing the two keeps them one
declaration. ``DataLoader`` inherits the fields,
so ``loader.workers`` is typed too; frozen, so the pipeline, the fingerprint and
the user all see the values that were checked. ``Annotated`` keeps the metadata next
to the type without changing it for mypy or for users.

Adding an option is a field here (after ``_: KW_ONLY``, keyword-only; and the same
parameter in ``DataLoader.__init__``: the test says so), or in its feature's group
(``_groups``: nothing else to write), with its doc, its check (reuse ``positive``,
``at_least_zero``, ``optional``, ``one_of``... from ``_checks``), and ``resume=`` when it
changes the batch sequence (a group's field: in its group's ``resume``); then a row in
the README's table (the test says so), and the pipeline reads it as
``settings.options.<name>``. A rule between options goes in ``_check_together``.
Changing a default (e.g. ``workers="auto"``) is the field's default, type and
check, and the README's list of defaults (the test says so too).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import typing
import warnings
from dataclasses import KW_ONLY, MISSING, dataclass, fields
from typing import (
    Annotated,
    Any,
    Callable,
    Dict,
    NamedTuple,
    Optional,
    ParamSpec,
    Sequence,
    Tuple,
    Type,
    Union,
    cast,
)

from ._abc import DataCollator, DataReader, Dataset
from ._checks import Option, Recorded, declared, instance_of, optional, positive
from ._compose import callable_name, check_compose
from ._errors import ErrorPolicy
from ._execution.auto_workers import check as check_workers
from ._frameworks.progress import check as check_progress
from ._groups import (
    Bucket,
    Device,
    Group,
    OnError,
    Order,
    Pack,
    Ranks,
    Rotation,
    Shuffle,
    Storage,
    Stream,
    Workers,
    as_device,
    as_on_error,
    as_stream,
    as_workers,
    check_policy,
    differs,
)
from ._stages.bucket import buffer_size
from ._stages.rotation import held_samples
from ._stages.schedule import describe as describe_schedule
from ._stages.shard import resolve as resolve_sharding
from ._stages.sources import Source
from ._storage.epoch_cache import CacheEncoded, as_cache_encoded, check_cache_encoded, resume_key
from ._storage.files import DataDir

GROUPS_IN_FLIGHT = 2  # being encoded and collated without workers
GROUPS_PER_WORKER = 4  # with workers: enough that one worker's file does not hold the other idle


def _reader(name: str, value: Any) -> None:
    instance_of(DataReader)(name, value)
    positive("batch_size", value.batch_size)


def _progress(name: str, value: object) -> None:
    if value:
        check_progress()


def _workers(name: str, value: object) -> None:
    if not isinstance(value, Workers):
        check_workers(name, value)  # a number of processes alone


def _stream(name: str, value: object) -> None:
    if not isinstance(value, (bool, Stream)):
        raise TypeError(f"{name} must be True, False or a pyloader.Stream, got {value!r}")


def _on_error(name: str, value: object) -> None:
    if not isinstance(value, OnError):
        check_policy(name, value)  # a policy alone


def _shuffle(name: str, value: object) -> None:
    if not isinstance(value, (bool, int, Shuffle)):
        raise TypeError(f"{name} must be True, False or a pyloader.Shuffle, got {value!r}")


def _as_shuffle(value: object) -> Union[bool, Shuffle]:
    return value if isinstance(value, Shuffle) else bool(value)


def _shuffle_record(value: object) -> object:
    """``shuffle`` as states record it: a bool, or the global order's block (which older states cannot hold)."""
    if not isinstance(value, Shuffle):
        return bool(value)
    record: Dict[str, object] = {"block": value.block, "epoch_size": value.epoch_size, "batching": value.batching}
    if value.schedule is not None:  # only where given: states saved before schedules existed still match
        record["schedule"] = describe_schedule(value.schedule)
    return record


def _stream_record(value: object) -> Recorded:
    if not isinstance(value, Stream):
        return Recorded(stream=False, seq_len=None, padding_mode="zeros", time_major=None)
    return Recorded(stream=True, seq_len=value.seq_len, padding_mode=value.padding_mode,
                    time_major=True if value.time_major else None)  # None at the default: older states


def _ranks_record(value: object) -> Recorded:
    r = cast(Ranks, value)
    return Recorded(rank=r.rank, world_size=r.world_size, even_batches=r.even_batches)


def _bucket_record(value: object) -> Recorded:
    b = cast(Optional[Bucket], value)
    if b is None:
        return Recorded(bucket_by=None, bucket_buffer=None)
    return Recorded(bucket_by=b.by if isinstance(b.by, str) else callable_name(b.by), bucket_buffer=b.buffer)


def _order_record(value: object) -> Recorded:
    o = cast(Order, value)
    return Recorded(shuffle_buffer=o.shuffle_buffer, filter_fn=callable_name(o.filter_fn),
                    file_order=callable_name(o.file_order))  # stop: in the mix's part (``mix_fingerprint``)


def _rotation_record(value: object) -> Recorded:
    r = cast(Optional[Rotation], value)
    if r is None:
        return Recorded(rotation=None, rotation_size=None)
    return Recorded(rotation=r.times, rotation_size=r.size)


def _pack_record(value: object) -> object:
    return None if value is None else repr(value)


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
    shuffle: Annotated[Union[bool, Shuffle], Option(
        "True: shuffle the file order, anew each epoch; a Shuffle: the global order, one permutation of "
        "every sample made a block at a time", check=_shuffle, resume=_shuffle_record, convert=_as_shuffle)] = False
    random_seed: Annotated[int, Option("seeds the file order and the shuffle buffer", resume=True, convert=int)] = 42
    _: KW_ONLY
    drop_last: Annotated[bool, Option("drop each epoch's final partial batch", resume=True)] = False
    order: Annotated[Order, Option(
        "which samples an epoch holds and in what order: an Order(shuffle_buffer, file_order, filter_fn, stop)",
        check=instance_of(Order), resume=_order_record)] = Order()
    on_error: Annotated[Union[ErrorPolicy, OnError], Option(
        '"raise", "skip" (log, skip the rest of the file, count it), a callable taking the PipelineError, '
        'or an OnError (with max_errors)', check=_on_error, convert=as_on_error)] = "raise"
    device: Annotated[Any, Option(
        "move torch tensors to this device before handing them over, or a Device (with pin_memory)",
        convert=as_device)] = None
    stream: Annotated[Union[bool, Stream], Option(
        "stream mode for recurrent models, each row a file in order: True, or a Stream (seq_len, padding...)",
        check=_stream, resume=_stream_record, convert=as_stream)] = False
    workers: Annotated[Union[int, str, Workers], Option(
        'worker processes running the user methods (0: threads of this process; "auto": decided per run), '
        "or a Workers (with threads, start_method, persistent, init_fn)", check=_workers,
        convert=as_workers)] = "auto"
    ranks: Annotated[Ranks, Option(
        "this process's rank, the world size and even_batches (default: from torch.distributed, else RANK and "
        "WORLD_SIZE)", check=instance_of(Ranks), resume=_ranks_record)] = Ranks()
    storage: Annotated[Storage, Option(
        "remote files: a disk cache (cache_dir, cache_limit), retries, the bytes and files read ahead",
        check=instance_of(Storage))] = Storage()
    progress: Annotated[bool, Option("show a tqdm bar for each iteration", check=_progress)] = False
    bucket: Annotated[Optional[Bucket], Option(
        "length bucketing: a Bucket(by, buffer=None)", check=optional(instance_of(Bucket)),
        resume=_bucket_record)] = None
    cache_encoded: Annotated[Union[None, CacheEncoded, Dict[str, Any]], Option(
        'write every update_every-th epoch\'s encoded batches to dir and read them back in the epochs between: '
        '{"dir": ..., "update_every": K, "limit": None} or a CacheEncoded', check=check_cache_encoded,
        resume=resume_key, convert=as_cache_encoded)] = None
    rotation: Annotated[Optional[Rotation], Option(
        "serve each encoded sample several times per epoch: a Rotation(times, folder=None, size=None)",
        check=optional(instance_of(Rotation)), resume=_rotation_record)] = None
    pack: Annotated[Optional[Pack], Option(
        "pack each batch's tokenized documents into fixed-length sequences: a Pack(field, seq_len=2048, "
        "method='best_fit', pad_value=0, rows=None)", check=optional(instance_of(Pack)), resume=_pack_record)] = None

    def __post_init__(self) -> None:
        for name, option in OPTIONS.items():
            if option.check is not None:
                option.check(name, getattr(self, name))
            if option.convert is not None:
                object.__setattr__(self, name, option.convert(getattr(self, name)))
        _check_together(values_of(self))
        self._resolve_defaults()

    def _resolve_defaults(self) -> None:
        """The ``None`` defaults resolved (see ``resolved``)."""
        workers = workers_of(self)
        if workers.threads is None:  # every file read ahead and every group in flight at once
            object.__setattr__(self, "workers", dataclasses.replace(
                workers, threads=self.storage.prefetch_files + GROUPS_IN_FLIGHT))
        batch_size = self.datareader.batch_size
        if self.bucket is not None:
            object.__setattr__(self, "bucket", dataclasses.replace(
                self.bucket, buffer=buffer_size(self.bucket.buffer, batch_size)))
        if self.rotation is not None:
            object.__setattr__(self, "rotation", dataclasses.replace(
                self.rotation, size=held_samples(self.rotation.times, self.rotation.size, batch_size)))


def _check_together(a: Dict[str, Any]) -> None:
    """The rules between options (each one's own check has passed; the groups are stored as groups)."""
    if a["stream"]:
        if a["order"].shuffle_buffer:
            raise ValueError("stream mode keeps each row in file order: shuffle_buffer must be 0")
        if a["datareader"].shuffle:
            raise ValueError("stream mode reads every file in order: use DataReader(shuffle=False) "
                             "(DataLoader(shuffle=True) still shuffles the file order)")
    check_compose(a)
    ranks = a["ranks"]
    # explicit values against the found ones
    resolve_sharding(ranks.rank, ranks.world_size, ranks.even_batches, ranks.replication)


OPTIONS: Dict[str, Option] = declared(Options)  # in declaration order


class Moved(NamedTuple):
    """A group, and the flat keyword of 0.1 behind each of its fields."""

    group: Type[Group]
    fields: Dict[str, str]  # old keyword -> the group's field
    needs: Optional[str] = None  # the field without which the group is off (no group: its keyword's default)
    short: Optional[str] = None  # the field a value other than a group stands for (on_error="skip")
    joined: Tuple[str, ...] = ()  # fields whose flat keywords joined the group later: given beside it, they merge


# The one table of old -> new: the flat keywords of 0.1 still work for this release (with a FutureWarning
# naming the new form, ``bind``); the CHANGELOG lists it (tests/test_options.py checks).
MOVED: Dict[str, Moved] = {
    "stream": Moved(Stream, {"seq_len": "seq_len", "padding_mode": "padding_mode", "pad_value": "pad_value",
                             "time_major": "time_major"}),  # on with stream=True
    "ranks": Moved(Ranks, {"rank": "rank", "world_size": "world_size", "even_batches": "even_batches"}),
    "storage": Moved(Storage, {"cache_dir": "cache_dir", "cache_limit": "cache_limit", "retries": "retries",
                               "readahead_bytes": "readahead_bytes", "prefetch_files": "prefetch_files"},
                       joined=("prefetch_files",)),
    "on_error": Moved(OnError, {"max_errors": "max_errors"}, short="policy"),
    "workers": Moved(Workers, {"num_workers": "processes", "num_threads": "threads", "start_method": "start_method",
                               "persistent_workers": "persistent", "worker_init_fn": "init_fn"}, short="processes"),
    "device": Moved(Device, {"pin_memory": "pin_memory"}, short="target"),
    "order": Moved(Order, {"shuffle_buffer": "shuffle_buffer", "file_order": "file_order", "filter_fn": "filter_fn",
                           "stop": "stop"}),
    "bucket": Moved(Bucket, {"bucket_by": "by", "bucket_buffer": "buffer"}, needs="by"),
    "rotation": Moved(Rotation, {"rotation": "times", "rotation_dir": "folder", "rotation_size": "size"},
                      needs="times"),
    "pack": Moved(Pack, {}, needs="field"),  # no flat keyword of 0.1: listed so that help() shows its fields
}
# the original PyLoader's keywords -> this one's (docs/guides/migrating.md), with a FutureWarning (``_renamed``)
RENAMED: Dict[str, str] = {"root_dir": "data_dir"}
OLD_KEYWORDS: Dict[str, Tuple[str, str]] = {old: (keyword, field) for keyword, moved in MOVED.items()
                                           for old, field in moved.fields.items()}


def moved_to(old: str) -> str:
    """Where the flat keyword ``old`` went, as written: ``stream=Stream(seq_len=...)``."""
    keyword, field = OLD_KEYWORDS[old]
    group = MOVED[keyword].group.__name__
    first = dataclasses.fields(MOVED[keyword].group)[0]  # type: ignore[arg-type]
    if first.kw_only:
        return f"{keyword}={group}({field}=...)"
    return f"{keyword}={group}(...)" if field == first.name else f"{keyword}={group}({first.name}, {field}=...)"


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
    """An option whose ``None`` default was resolved at construction: ``Workers.threads`` (always),
    ``bucket.buffer`` (with ``bucket``), ``rotation.size`` (with ``rotation``)."""
    assert value is not None
    return value


def stream_of(options: Options) -> Optional[Stream]:
    """Stream mode's settings, ``None`` outside stream mode (``stream=`` is stored as ``False`` or a ``Stream``)."""
    return options.stream if isinstance(options.stream, Stream) else None


def seq_len_of(options: Options) -> Optional[int]:
    """Stream mode's window length (``None``: one step, or not stream mode)."""
    stream = stream_of(options)
    return None if stream is None else stream.seq_len


def times_of(options: Options) -> int:
    """The times each encoded sample is served per epoch (1: no rotation)."""
    return 1 if options.rotation is None else options.rotation.times


def errors_of(options: Options) -> OnError:
    """``on_error``, as stored (an ``OnError``)."""
    return cast(OnError, options.on_error)


def workers_of(options: Options) -> Workers:
    """``workers``, as stored (a ``Workers``, its ``threads`` resolved: see ``resolved``)."""
    return cast(Workers, options.workers)


def device_of(options: Options) -> Device:
    """``device``, as stored (a ``Device``)."""
    return cast(Device, options.device)


def values_of(options: Options) -> Dict[str, Any]:
    """Every option's value, by name."""
    return {name: getattr(options, name) for name in OPTIONS}


def fingerprint(options: Options, **resolved: object) -> Dict[str, object]:
    """The options' part of the resume fingerprint, under the keys older states recorded (a group records
    its fields under their flat names of 0.1); ``resolved``: values resolved when an iteration starts
    (``rank``, ``world_size``, ``even_batches``) in place of the given ones."""
    out: Dict[str, object] = {}
    for name, option in OPTIONS.items():
        if option.resume is False:
            continue
        value = getattr(options, name)
        recorded = option.resume(value) if callable(option.resume) else value
        for key, kept in (recorded.items() if isinstance(recorded, Recorded) else [(name, recorded)]):
            out[key] = resolved.get(key, kept)
    return out


def bind(owner: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """The value of every option for ``owner(*args, **kwargs)``, defaults filled in, the flat keywords of
    0.1 moved into their groups (``MOVED``); a ``TypeError`` naming ``owner`` for a bad call (an unknown
    keyword: with the nearest option)."""
    for key in kwargs:
        if key not in OPTIONS and key not in OLD_KEYWORDS and key not in RENAMED:
            raise _unexpected(owner, key)
    kwargs = _regrouped(owner, _renamed(kwargs))
    try:
        bound = SIGNATURE.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{owner}(): {exc}") from None
    bound.apply_defaults()
    return dict(bound.arguments)


def _renamed(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """``kwargs`` with the original PyLoader's keywords under their names here (``RENAMED``), each with a
    ``FutureWarning`` (given under both names, the old one stays, an unexpected keyword to ``bind``)."""
    out = dict(kwargs)
    for old, new in RENAMED.items():
        if old in out and new not in out:
            out[new] = out.pop(old)
            warnings.warn(f"{old}= is now {new}=; the original PyLoader's name goes in a later release",
                          FutureWarning, stacklevel=4)
    return out


def _unexpected(owner: str, key: str) -> TypeError:
    """The error for the unknown keyword ``key``, naming the nearest option (or flat keyword of 0.1)."""
    near = difflib.get_close_matches(key, OPTIONS, n=1) or difflib.get_close_matches(key, OLD_KEYWORDS, n=1)
    hint = "" if not near else f"; did you mean {near[0]!r}?" if near[0] in OPTIONS else \
        f"; did you mean {moved_to(near[0])}?"
    return TypeError(f"{owner}() got an unexpected keyword argument {key!r}{hint}")


def _is_old(key: str, value: object) -> bool:
    """Whether ``key=value``, ``key`` a flat keyword of 0.1, is given as one (``rotation=3``: a number
    of times, not a ``Rotation``)."""
    return key not in OPTIONS or isinstance(value, int) and not isinstance(value, bool)


def _regrouped(owner: str, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """``kwargs`` with the flat keywords of 0.1 in their groups, each group's with a ``FutureWarning``."""
    out = dict(kwargs)
    for keyword, moved in MOVED.items():
        old = {k: out.pop(k) for k in moved.fields if k in out and _is_old(k, out[k])}
        if old:
            out[keyword] = _regroup(owner, keyword, moved, out.get(keyword), old)
    return out


def _regroup(owner: str, keyword: str, moved: Moved, given: object, old: Dict[str, object]) -> object:
    """The value of ``keyword`` (``given``: its value, ``None`` when absent) that the flat keywords ``old``
    of its group go into, with their ``FutureWarning``."""
    written = ", ".join(f"{k}={v!r}" for k, v in old.items())
    values = {moved.fields[k]: v for k, v in old.items()}
    value = _joined(owner, keyword, moved, given, values, written) if isinstance(given, moved.group) else \
        _group(keyword, moved, given, values, written)
    now = f"{keyword}={value!r}" if isinstance(value, Group) else f"left out (no effect with {keyword}={value!r})"
    warnings.warn(f"{written} is now {now}; the flat keyword goes in a later release", FutureWarning, stacklevel=5)
    return value


def _joined(owner: str, keyword: str, moved: Moved, given: Group, values: Dict[str, Any], written: str) -> Group:
    """The group ``given`` with the fields of flat keywords that joined it after it was made a group
    (``Moved.joined``: given beside it before), where it leaves them at their defaults; else a ``TypeError``."""
    defaults = {f.name: f.default for f in dataclasses.fields(moved.group)}  # type: ignore[arg-type]
    if not set(values) <= set(moved.joined) or any(differs(getattr(given, f), defaults[f]) for f in values):
        raise TypeError(f"{owner}() got {written} and {keyword}={given!r}: give "
                        f"{', '.join(values)} inside the {moved.group.__name__} only")
    return dataclasses.replace(given, **values)  # type: ignore[type-var]


def _group(keyword: str, moved: Moved, given: object, values: Dict[str, Any], written: str) -> object:
    """The group made of a group keyword's short form (``stream=True``, ``on_error="skip"``; ``given``, or
    ``None`` when absent) and the fields the flat keywords gave. A group that needs a field none gave is
    off (the keyword's default); then a flat keyword given a value other than its default is an error."""
    if keyword == "rotation" and values.get("times") == 1:  # rotation=1 was the default: each sample once
        values.pop("times")
    base = {moved.short: given} if moved.short is not None and given is not None else {}
    on = given is True if keyword == "stream" else moved.needs is None or moved.needs in values
    if on:
        return moved.group(**base, **values)
    return _off(keyword, moved, given, values, written)


def _off(keyword: str, moved: Moved, given: object, values: Dict[str, object], written: str) -> object:
    """What a group keyword that is off takes: its short form, else its default; ``ValueError`` when a
    flat keyword gave a field a value other than its default (it would have no effect)."""
    defaults = {f.name: f.default for f in dataclasses.fields(moved.group)}  # type: ignore[arg-type]
    if any(differs(v, defaults[f]) for f, v in values.items()):
        inside = ", ".join([*([moved.needs] if moved.needs else []), *(f"{f}={v!r}" for f, v in values.items())])
        raise ValueError(f"{written} has no effect without {keyword}: write {keyword}={moved.group.__name__}"
                         f"({inside})")
    return SIGNATURE.parameters[keyword].default if given is None else given


P = ParamSpec("P")


def binding(init: Callable[P, None]) -> Callable[P, None]:
    """``DataLoader.__init__``, whose signature is written out (for mypy, IDEs and the API reference) and must
    be ``SIGNATURE`` (tests/test_options.py checks), called with every option by name, defaults filled in and
    the flat keywords of 0.1 moved into their groups (``bind``): its body reads them with ``locals()``."""
    owner = init.__qualname__.split(".")[0]

    @functools.wraps(init)
    def bound(self: object, *args: Any, **kwargs: Any) -> None:
        cast(Callable[..., None], init)(self, **bind(owner, args, kwargs))
    self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)  # with the types evaluated, for help()
    bound.__signature__ = SIGNATURE.replace(parameters=[self, *SIGNATURE.parameters.values()])  # type: ignore[attr-defined]
    bound.__kwdefaults__ = init.__kwdefaults__  # type: ignore[attr-defined]
    return cast(Callable[P, None], bound)


def group_of(name: str) -> Optional[Type[Group]]:
    """The group an option takes (``stream``: ``Stream``...), else ``None``."""
    return MOVED[name].group if name in MOVED else None


def describe() -> str:
    """The options as ``help(DataLoader)`` lists them: name, default, doc (indented as a class docstring);
    a group's fields follow it."""
    lines = ["", "    Options (in signature order; the README's table says more):", ""]
    for f in fields(Options):
        lines.append(f"    ``{f.name}{_default_shown(f)}``: {OPTIONS[f.name].doc}")
        group = group_of(f.name)
        if group is not None:
            for g in dataclasses.fields(group):  # type: ignore[arg-type]
                lines.append(f"        ``{group.__name__}.{g.name}{_default_shown(g)}``: {declared(group)[g.name].doc}")
    return "\n".join(lines) + "\n"


def _default_shown(f: "dataclasses.Field[object]") -> str:
    """`` = <default>`` as a field's default is written after its name; nothing for a field without one."""
    return "" if f.default is MISSING else f" = {f.default!r}"
