"""The loader's keywords for composing data: the checks between them at construction.

Each feature lives in its own module (``_execution.filter``: ``filter_fn``; ``_stages.order``:
``file_order``; ``_stages.bucket``: ``bucket``; ``_stages.stream`` and ``_stages.entries``: the
stream-mode additions; ``_stages.rotation``: ``rotation``; their groups: ``_groups``); this one only
gathers the checks between them that ``_options`` runs, and refuses the options ``cache_encoded`` cannot
cache under (``_storage.epoch_cache`` stores the batches, knowing nothing of the stages). Their part of the resume
fingerprint is declared with each option (``_options.Options``).
"""
from __future__ import annotations

from typing import Any, List, Mapping, Optional

from ._execution.filter import check_filter
from ._groups import Bucket, Shuffle
from ._stages.order import check_file_order, declares_drops_or_repeats
from ._stages.sources import is_mix


def check_compose(a: Mapping[str, Any]) -> None:
    """Check the composing keywords of ``DataLoader(**a)`` against each other (each option and group
    has checked its own values); raises naming the keyword."""
    order = a["order"]
    check_filter(order.filter_fn, bool(a["stream"]))
    check_file_order(order.file_order, a["shuffle"])
    check_bucket(a["bucket"], bool(a["stream"]), a["datareader"].batch_size)
    check_rotation(a)
    check_pack(a)
    check_cache_encoded_applies(a)
    check_global_order(a)


def check_global_order(a: Mapping[str, Any]) -> None:
    """``shuffle=Shuffle(...)`` makes the whole order: the orders it replaces are refused beside it, and the
    features that do not compose with it yet say so."""
    if not isinstance(a["shuffle"], Shuffle):
        _check_no_amounts(a["data_dir"])
        return
    if a["datareader"].shuffle:
        raise ValueError("shuffle=Shuffle(...) makes the order of every sample: use DataReader(shuffle=False)")
    if a["order"].shuffle_buffer:
        raise ValueError("shuffle=Shuffle(...) replaces the shuffle buffer: use Order(shuffle_buffer=0) (Shuffle.block "
                         "is its budget)")
    clash = _not_composing(a)
    if clash:
        raise ValueError(f"shuffle=Shuffle(...) does not compose with {clash[0]} yet: use shuffle=True "
                         f"(the file order, with Order(shuffle_buffer=...) for samples) for it")
    if a["shuffle"].schedule is not None:
        _check_scheduled(a["data_dir"])


def _check_scheduled(data_dir: object) -> None:
    """A schedule weighs ``Source``s, every one of them: none gives its own amount."""
    if not is_mix(data_dir):
        raise ValueError("Shuffle.schedule gives the weights of Sources: make data_dir a list of pyloader.Source")
    if any(s.repeat is not None or s.choose is not None for s in data_dir):
        raise ValueError("Shuffle.schedule gives every Source's share at every step: leave out the Sources' "
                         "repeat and choose (Shuffle.epoch_size sets the epoch's samples)")


def _check_no_amounts(data_dir: object) -> None:
    """Sources mixed by weight alone: none of them gives ``repeat``, ``choose`` or ``sampling``."""
    if is_mix(data_dir) and any(s.amount for s in data_dir):
        raise ValueError("a Source's repeat, choose or sampling needs the global order: "
                         "shuffle=Shuffle(...) (without it sources are mixed by weight alone)")


def _not_composing(a: Mapping[str, Any]) -> List[str]:
    """The features given that the global order does not compose with yet."""
    given = {"stream": bool(a["stream"]), "bucket": a["bucket"] is not None, "rotation": a["rotation"] is not None,
             "filter_fn": a["order"].filter_fn is not None, "cache_encoded": a["cache_encoded"] is not None}
    return [name for name, on in given.items() if on]


def check_bucket(bucket: Optional[Bucket], stream: bool, batch_size: int) -> None:
    """``bucket`` (a ``Bucket`` or ``None``) with stream mode and the batch size."""
    if bucket is None:
        return
    if stream:
        raise ValueError("bucket batches samples by length: stream mode keeps each row in file order")
    if bucket.buffer is not None and bucket.buffer < batch_size:
        raise ValueError(f"Bucket.buffer must be an integer >= batch_size ({batch_size}), got {bucket.buffer!r}")


def check_rotation(a: Mapping[str, Any]) -> None:
    """``rotation`` with the options it cannot go with."""
    if a["rotation"] is None:
        return
    conflicts = (
        (bool(a["stream"]),
         "rotation serves samples again in other batches: stream mode keeps each row in file order"),
        (a["bucket"] is not None,
         "rotation re-batches samples: the batches of similar lengths bucket makes would not survive it"),
        (a["cache_encoded"] is not None,
         "rotation and cache_encoded both serve encoded samples again (within an epoch, and across epochs): "
         "use one of them"),
    )
    for conflict, message in conflicts:
        if conflict:
            raise ValueError(message)


def check_pack(a: Mapping[str, Any]) -> None:
    """``pack`` with the options it cannot go with."""
    if a["pack"] is None:
        return
    if a["stream"]:
        raise ValueError("pack packs each batch's documents into sequences: stream mode cuts windows of rows instead")
    if a["cache_encoded"] is not None:
        raise ValueError("pack and cache_encoded do not go together yet: the cache would hold the packed batches")


def check_cache_encoded_applies(a: Mapping[str, Any]) -> None:
    """With ``cache_encoded``, refuse the options under which a cached epoch could not stand for its own."""
    if a["cache_encoded"] is None:
        return
    if a["stream"]:
        raise ValueError("cache_encoded is not supported in stream mode (a stream epoch's batches are rows of "
                         "consecutive windows: they cannot be reordered)")
    if is_mix(a["data_dir"]):
        raise ValueError("cache_encoded is not supported with weighted sources (a data_dir of Sources): their "
                         "epochs differ in length")
    if declares_drops_or_repeats(a["order"].file_order):
        raise ValueError("cache_encoded is not supported with a file_order that declares drops_or_repeats: "
                         "its epochs differ in length")


def callable_name(fn: Any) -> Optional[str]:
    """``module.qualname`` of a user callable, for the fingerprint (a state saved with another
    filter or order is refused); ``None`` when there is none."""
    if fn is None:
        return None
    named = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(named, '__module__', '?')}.{named.__qualname__}"

