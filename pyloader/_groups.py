"""The option groups of ``DataLoader``: one small frozen dataclass per feature, given as one keyword.

``Shuffle`` (``shuffle=``), ``Stream`` (``stream=``), ``Ranks`` (``ranks=``), ``Storage`` (``storage=``),
``Rotation`` (``rotation=``), ``Bucket`` (``bucket=``), ``Pack`` (``pack=``), ``OnError`` (``on_error=``),
``Workers`` (``workers=``), ``Device`` (``device=``) and ``Order`` (``order=``). Each field is declared
as the loader's options are (``Annotated[type, Option(doc, check=...)]``, ``_checks``): each
group checks its own values when it is made (one ``ValueError`` or ``TypeError`` per bad value,
naming ``Group.field``), and the rules between its fields; the rules between a group and the
loader's other options are ``_options._check_together``'s. Fields after the first are
keyword-only. A group's ``repr`` shows the fields that differ from their defaults, as one would
write it (``Stream(seq_len=8)``). Which flat keyword of earlier releases became which field is
``_options.MOVED``.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
from dataclasses import KW_ONLY, dataclass
from typing import Annotated, Any, Callable, Dict, Optional, Union

from ._checks import Option, a_folder, as_path, at_least_zero, declared, is_integer, one_of, optional, positive
from ._errors import ErrorPolicy
from ._execution.auto_workers import check as check_workers
from ._stages.bucket import BucketBy
from ._stages.mix import STOPS
from ._stages.pack import METHODS as PACK_METHODS
from ._stages.pack import PackSpec
from ._stages.schedule import ScheduleLike, as_schedule, check_schedule
from ._stages.shard import EVEN_BATCHES
from ._stages.stream import PADDING_MODES
from ._stages.tiles import BATCHINGS, DEFAULT_BLOCK
from ._storage.bytes import DEFAULT_READAHEAD_BYTES


class Group:
    """What every group does: checks its fields when made, and shows the ones given."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        for field, option in declared(type(self)).items():
            if option.check is not None:
                option.check(f"{name}.{field}", getattr(self, field))
            if option.convert is not None:
                object.__setattr__(self, field, option.convert(getattr(self, field)))
        self._check()

    def _check(self) -> None:
        """The rules between this group's fields (each one's own check has passed)."""

    def __repr__(self) -> str:
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        shown = [f"{f.name}={getattr(self, f.name)!r}" if f.kw_only else repr(getattr(self, f.name))
                 for f in fields if not f.kw_only or differs(getattr(self, f.name), f.default)]
        return f"{type(self).__name__}({', '.join(shown)})"


def differs(value: object, default: object) -> bool:
    try:
        return bool(value != default)
    except (TypeError, ValueError):  # an array, say
        return True


def _times(name: str, value: object) -> None:
    if not is_integer(value, least=2):
        raise ValueError(f"{name} must be an integer >= 2 (each sample served once: rotation=None), got {value!r}")


def _bucket_by(name: str, value: object) -> None:
    if not (isinstance(value, str) or callable(value)):
        raise TypeError(f"{name} must be a field name or a callable giving a sample's length, got {value!r}")


def check_policy(name: str, value: object) -> None:
    if not callable(value) and value not in ("raise", "skip"):
        raise ValueError(f"{name} must be 'raise', 'skip' or a callable taking the PipelineError, got {value!r}")


@dataclass(frozen=True, repr=False)
class Stream(Group):
    """Stream mode for recurrent models: each batch row reads one file in order, continuing it across
    batches (``stream=True`` is ``stream=Stream()``).

    Example:
        ```python
        loader = DataLoader(JsonLinesReader(batch_size=8), IdentityDataset(), NumpyCollator(), "data/",
                            stream=Stream(seq_len=16, padding_mode="edge"))
        ```
    """

    _: KW_ONLY
    seq_len: Annotated[Optional[int], Option(
        "the steps of a window (None: one step)", check=optional(positive))] = None
    padding_mode: Annotated[str, Option(
        'how rows whose files ran out are padded: "zeros", "data" or "edge"', check=one_of(PADDING_MODES))] = "zeros"
    pad_value: Annotated[object, Option(
        'the value padding_mode="zeros" pads with (or a dict of them by field)')] = 0
    time_major: Annotated[bool, Option("with seq_len: fields as [T, B, ...]")] = False

    def _check(self) -> None:
        if self.time_major and not self.seq_len:
            raise ValueError("Stream.time_major=True lays windows out as [T, B, ...]: it needs seq_len")


@dataclass(frozen=True, repr=False)
class Ranks(Group):
    """The processes sharing the data: this one's ``rank`` among ``world_size``; each not given is
    taken from ``torch.distributed``, else the ``RANK``/``WORLD_SIZE`` variables, else 0 and 1.
    With ``replication=R``, ranks ``R·g .. R·g + R - 1`` form replica ``g``: they get identical
    batches, and the ``world_size // R`` replicas share the data as that many ranks would.

    Example:
        ```python
        loader = DataLoader(JsonLinesReader(batch_size=8), IdentityDataset(), NumpyCollator(), "data/",
                            ranks=Ranks(rank=0, world_size=2, even_batches="drop"))
        tensor_parallel = DataLoader(JsonLinesReader(batch_size=8), IdentityDataset(), NumpyCollator(), "data/",
                                     ranks=Ranks(rank=3, world_size=4, replication=2))  # replica 1 of 2
        ```
    """

    _: KW_ONLY
    rank: Annotated[Optional[int], Option(
        "this process's rank (None: torch.distributed's, else RANK, else 0)", check=optional(at_least_zero))] = None
    world_size: Annotated[Optional[int], Option(
        "the processes sharing the data (None: torch.distributed's, else WORLD_SIZE, else 1)",
        check=optional(positive))] = None
    even_batches: Annotated[str, Option(
        'under ranks: "pad" or "drop" to give every rank as many steps', check=one_of(EVEN_BATCHES))] = "pad"
    replication: Annotated[int, Option(
        "consecutive ranks forming one data-parallel replica (a tensor or sequence parallel group): they get "
        "the same batches", check=positive)] = 1

    def _check(self) -> None:
        if self.rank is not None and self.world_size is not None and self.rank >= self.world_size:
            raise ValueError(f"Ranks needs 0 <= rank < world_size, got rank={self.rank}, "
                             f"world_size={self.world_size}")
        if self.world_size is not None and self.world_size % self.replication:
            raise ValueError(f"Ranks.replication ({self.replication}) must divide world_size ({self.world_size})")


@dataclass(frozen=True, repr=False)
class Storage(Group):
    """How files are fetched: a local disk cache of remote files, retries, the bytes and files read ahead.

    Example:
        ```python
        loader = DataLoader(JsonLinesReader(batch_size=8), IdentityDataset(), NumpyCollator(), "data/",
                            storage=Storage(cache_dir="/tmp/pyloader-cache", cache_limit=2**30, retries=5))
        ```
    """

    _: KW_ONLY
    cache_dir: Annotated[Union[None, str, "os.PathLike[str]"], Option(
        "a local disk cache of remote files (and of the count index)", check=optional(a_folder),
        convert=as_path)] = None
    cache_limit: Annotated[Optional[int], Option(
        "the disk cache's size in bytes (least recently used out)", check=optional(positive))] = None
    retries: Annotated[int, Option("retries of transient remote errors", check=at_least_zero)] = 10
    readahead_bytes: Annotated[int, Option(
        "bytes read ahead of the parsers (0: none)", check=at_least_zero)] = DEFAULT_READAHEAD_BYTES
    prefetch_files: Annotated[int, Option(
        "files read ahead of the one being batched (stream mode: at least one per row)", check=positive)] = 4

    def _check(self) -> None:
        if self.cache_limit is not None and self.cache_dir is None:
            raise ValueError("Storage.cache_limit sizes the disk cache: it needs cache_dir")


@dataclass(frozen=True, repr=False)
class Rotation(Group):
    """Serve each encoded sample ``times`` times per epoch (the epoch grows as many times), spread
    through it, from at most ``size`` samples held in memory, or on disk under ``folder``.

    Example:
        ```python
        loader = DataLoader(JsonLinesReader(batch_size=8), IdentityDataset(), NumpyCollator(), "data/",
                            rotation=Rotation(3, size=3000))
        ```
    """

    times: Annotated[int, Option("the times each encoded sample is served per epoch (>= 2)", check=_times)]
    _: KW_ONLY
    folder: Annotated[Union[None, str, "os.PathLike[str]"], Option(
        "hold the samples served again in .npy files under this folder (None: in memory)",
        check=optional(a_folder), convert=as_path)] = None
    size: Annotated[Optional[int], Option(
        "the encoded samples held at once (None: times windows of 32 batches)", check=optional(positive))] = None

    def _check(self) -> None:
        if self.size is not None and self.size < self.times:
            raise ValueError(f"Rotation.size (the samples held) must be >= times ({self.times}), got {self.size!r}")


@dataclass(frozen=True, repr=False)
class Shuffle(Group):
    """The global order (``shuffle=Shuffle()``): every sample of an epoch in one permutation, made
    ``block`` samples at a time, the same for any number of ranks (``docs/guides/global-order.md``).

    An epoch's files are cut into spans of ``block // (batch_size * world_size)`` samples, the spans
    permuted, and each global batch takes one sample from each of ``batch_size * world_size`` spans:
    batches mix samples from all over the data, files are read in ranges of a span, and a rank holds
    ``block / world_size`` samples. It replaces the file shuffle, the reader's in-file shuffle and the
    shuffle buffer; global batch ``k`` holds the same samples for every world size that divides
    ``batch_size * world_size`` (keep that product fixed), and a state resumes under any of them.

    Example:
        ```python
        loader = DataLoader(JsonLinesReader(batch_size=8), IdentityDataset(), NumpyCollator(), "data/",
                            shuffle=Shuffle(block=65536))
        ```
    """

    _: KW_ONLY
    block: Annotated[int, Option(
        "samples of one block (all ranks together): the spans read are block / global batch samples long",
        check=positive)] = DEFAULT_BLOCK
    epoch_size: Annotated[Optional[int], Option(
        "samples per epoch (None: the data's, or the weighted sources' amounts); smaller: a different part "
        "each epoch, together covering the data; larger: the data repeated", check=optional(positive))] = None
    batching: Annotated[str, Option(
        'with weighted sources: "random" (mixed), "stratified" (every batch holds each source\'s share), '
        '"per_source" (each batch from one source)', check=one_of(BATCHINGS))] = "random"
    schedule: Annotated[Optional[ScheduleLike], Option(
        "with weighted sources: their weights as a function of the step, a callable step -> weights or "
        "(step, weights) points interpolated (docs/guides/global-order.md)", check=check_schedule,
        convert=as_schedule)] = None


@dataclass(frozen=True, repr=False)
class Bucket(Group):
    """Length bucketing: batches of samples of similar length, sorted ``buffer`` samples at a time;
    ``by`` is a field (its ``len()``) or a callable giving a sample's length.

    Example:
        ```python
        loader = DataLoader(JsonLinesReader(batch_size=8), IdentityDataset(), NumpyCollator(), "data/",
                            bucket=Bucket("tokens", buffer=512))
        ```
    """

    by: Annotated[BucketBy, Option("a field (its len()) or a callable giving a sample's length", check=_bucket_by)]
    _: KW_ONLY
    buffer: Annotated[Optional[int], Option(
        "samples sorted by length at a time (None: 32 batches; at least batch_size)", check=optional(positive))] = None


def _field_name(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be the name of the field holding each document's tokens, got {value!r}")


@dataclass(frozen=True, repr=False)
class Pack(Group):
    """Document packing: each batch's documents (``field``: each one's tokens) packed into sequences of
    ``seq_len`` tokens, with ``segment_ids``, ``positions`` and ``loss_mask`` beside them; ``method``
    ``"concat"``, ``"first_fit"`` or ``"best_fit"``; ``rows``: pad every batch to this many sequences.

    Example:
        ```python
        loader = DataLoader(JsonLinesReader(batch_size=64), IdentityDataset(), NumpyCollator(), "data/",
                            pack=Pack("tokens", seq_len=2048, method="best_fit"))
        ```
    """

    field: Annotated[str, Option("the field holding each document's tokens", check=_field_name)]
    _: KW_ONLY
    seq_len: Annotated[int, Option("the tokens of a packed sequence", check=positive)] = 2048
    method: Annotated[str, Option(
        '"concat" (end to end, cut every seq_len), "first_fit" or "best_fit" (a document is cut only '
        'where longer than a sequence)', check=one_of(PACK_METHODS))] = "best_fit"
    pad_value: Annotated[int, Option("the token after a sequence's last document")] = 0
    rows: Annotated[Optional[int], Option(
        "pad every batch to this many sequences, a fixed shape (None: as many as its documents fill; "
        "a batch needing more fails at stage pack)", check=optional(positive))] = None

    def spec(self) -> PackSpec:
        """What the stage takes (``_stages.pack``)."""
        return PackSpec(self.field, self.seq_len, self.method, self.pad_value, self.rows)


@dataclass(frozen=True, repr=False)
class OnError(Group):
    """What a failed file or batch does: ``"raise"``, ``"skip"`` (log, skip it, count it) or a callable
    taking the ``PipelineError``; with skipping, ``max_errors`` bounds the errors skipped in an iteration
    (``on_error="skip"`` is ``on_error=OnError("skip")``).

    Example:
        ```python
        loader = DataLoader(JsonLinesReader(batch_size=8), IdentityDataset(), NumpyCollator(), "data/",
                            on_error=OnError("skip", max_errors=10))
        ```
    """

    policy: Annotated[ErrorPolicy, Option(
        '"raise", "skip" or a callable taking the PipelineError (raise to stop, return to skip)',
        check=check_policy)] = "raise"
    _: KW_ONLY
    max_errors: Annotated[Optional[int], Option(
        "with skipping: raise TooManyErrors once more errors than this were skipped in an iteration",
        check=optional(at_least_zero))] = None


@dataclass(frozen=True, repr=False)
class Workers(Group):
    """Where the user methods run: in ``processes`` worker processes (0: threads of this process;
    ``"auto"``: decided per run), ``threads`` at a time in this process, and how the workers start
    (``workers=2`` is ``workers=Workers(2)``).

    Example:
        ```python
        loader = DataLoader(JsonLinesReader(batch_size=8), IdentityDataset(), NumpyCollator(), "data/",
                            workers=Workers(2, persistent=True))
        ```
    """

    processes: Annotated[Union[int, str], Option(
        'worker processes running the user methods (0: threads of this process; "auto": decided per run)',
        check=check_workers)] = "auto"
    _: KW_ONLY
    threads: Annotated[Optional[int], Option(
        "user methods run at once in this process (None: one per file read ahead and per group being encoded)",
        check=optional(positive))] = None
    start_method: Annotated[Optional[str], Option(
        '"fork", "forkserver" or "spawn" (None: fork, or forkserver once TensorFlow is imported)',
        check=optional(one_of(multiprocessing.get_all_start_methods)))] = None
    persistent: Annotated[bool, Option("keep the worker processes from one iteration to the next")] = False
    init_fn: Annotated[Optional[Callable[[int], None]], Option(
        "called as init_fn(worker_id) first thing in each worker")] = None

    def _check(self) -> None:
        if self.persistent and self.processes == 0:
            raise ValueError("Workers.persistent=True keeps worker processes: it needs processes > 0 or 'auto'")


@dataclass(frozen=True, repr=False)
class Device(Group):
    """Where each batch's torch tensors go before they are handed over: pinned in page-locked memory
    (``pin_memory``), moved to ``target`` (``device="cuda"`` is ``device=Device("cuda")``).

    Example:
        ```python
        loader = DataLoader(JsonLinesReader(batch_size=8), IdentityDataset(), NumpyCollator(), "data/",
                            device=Device(None, pin_memory=True))
        ```
    """

    target: Annotated[Any, Option("move torch tensors to this device (None: leave them where they are)")] = None
    _: KW_ONLY
    pin_memory: Annotated[bool, Option("pin torch tensors in page-locked memory")] = False


@dataclass(frozen=True, repr=False)
class Order(Group):
    """Which samples an epoch holds and in what order, beyond ``shuffle``: a buffer mixing samples
    across files, a function ordering the files, a filter, and where a mix of ``Source``s ends.

    Example:
        ```python
        loader = DataLoader(JsonLinesReader(batch_size=8), IdentityDataset(), NumpyCollator(), "data/",
                            shuffle=True, order=Order(shuffle_buffer=1000))
        ```
    """

    _: KW_ONLY
    shuffle_buffer: Annotated[int, Option(
        "mix samples across files through a buffer of this many samples (0: off)", check=at_least_zero)] = 0
    file_order: Annotated[Optional[Callable[..., Any]], Option(
        "file_order(files, epoch, rng) -> list of files: each epoch's file order, in place of shuffle")] = None
    filter_fn: Annotated[Optional[Callable[[Dict[str, Any]], bool]], Option(
        "filter_fn(sample) -> bool: keep a sample or drop it before batching")] = None
    stop: Annotated[str, Option('with Sources: "first_exhausted" or "all_exhausted"', check=one_of(STOPS))] = \
        "first_exhausted"


def as_stream(value: object) -> Union[bool, Stream]:
    """``stream=`` as stored: ``False``, or a ``Stream`` (``True`` is ``Stream()``)."""
    return Stream() if value is True else value  # type: ignore[return-value]


def as_on_error(value: object) -> OnError:
    """``on_error=`` as stored: an ``OnError`` (a policy alone is ``OnError(policy)``)."""
    return value if isinstance(value, OnError) else OnError(value)  # type: ignore[arg-type]



def as_workers(value: object) -> Workers:
    """``workers=`` as stored: a ``Workers`` (a number of processes, or ``"auto"``, alone is ``Workers(it)``)."""
    return value if isinstance(value, Workers) else Workers(value)  # type: ignore[arg-type]


def as_device(value: object) -> Device:
    """``device=`` as stored: a ``Device`` (a device alone is ``Device(it)``)."""
    return value if isinstance(value, Device) else Device(value)
