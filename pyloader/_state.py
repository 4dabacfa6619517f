"""Resume state: what ``DataLoader.state_dict`` records, and the checks ``load_state_dict`` makes.

A state is a small JSON-serializable dict: where the consumer is (``epoch``,
``batches_in_epoch``), the end of the iteration it is in (``end_epoch``,
exclusive), with ``cache_encoded`` whether that epoch's batches were read from
the cache and which epoch wrote it (``cached_from``), and a fingerprint of the
data and of every setting that changes the batch sequence. The files are fingerprinted by their names relative to the
folder they were listed from, and (local files) their sizes, so the same data
moved or mounted elsewhere still resumes. Every check happens before anything
changes; a refusal names each setting that differs with both values, each value cut to
``SHOWN`` characters (``shown``). A state nested deeper than ``MAX_DEPTH`` is refused
before anything walks it. ``num_epoch`` records the epochs of the iteration the state
belongs to, so that a loader with another ``num_epoch`` resumes that iteration up to its
own number of epochs (``read_state``).
"""
from __future__ import annotations

import hashlib
import json
import os
import reprlib
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ._checks import is_integer
from ._paths import is_url, local_path

FORMAT = "pyloader.state/2"
OLD_FORMAT = "pyloader.state/1"  # before epochs went on across iterations: always from epoch 0
MAX_DEPTH = 32  # a state is a few levels deep; deeper ones are refused before anything recurses into them
SHOWN = 200  # characters of a saved value that an error message repeats
LIMIT = 2**63  # epochs, batches and world sizes are below this (what NumPy's seeds and sizes take)


class _Repr(reprlib.Repr):
    def __init__(self) -> None:
        super().__init__()
        self.maxstring = self.maxother = SHOWN
        self.maxlevel = 4

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 600:  # repr() refuses ints of over 4,300 digits
            return f"<an integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_REPR = _Repr()


@dataclass(frozen=True)
class Start:
    """Where an iteration begins: ``epoch``, after skipping its first ``skip`` batches,
    running to ``end`` (exclusive). ``splits``: the parts of ``epoch`` taken under other
    world sizes, as ``(world_size, batches)`` (elastic resume; see ``_stages.shard.undelivered``).
    ``cached``: the epoch that wrote the cache of encoded batches that ``epoch``'s first
    ``skip`` batches were read from, if they were; at an epoch's start after an iteration
    that ended, the cache the batches before it belong to (``_stages.cached_epochs``)."""

    epoch: int = 0
    skip: int = 0
    end: int = 1
    splits: Tuple[Tuple[int, int], ...] = ()
    cached: Optional[int] = None

    @property
    def base(self) -> int:
        """The first batch of ``epoch`` under the current world size."""
        return sum(batches for _, batches in self.splits)


def _strip_scheme(path: str) -> str:
    return path.split("://", 1)[1] if "://" in path else path


def files_digest(files: Sequence[str]) -> str:
    """The files' names relative to their common folder, and the sizes of local ones."""
    names = [_strip_scheme(p) for p in files]
    root = _common_root(names)
    lines = []
    for path, name in zip(files, names):
        size = "" if is_url(path) else str(os.path.getsize(local_path(path)))
        lines.append(f"{os.path.relpath(name, root) if root else name}\t{size}")
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()


def _common_root(names: List[str]) -> str:
    """The folder the files ``names`` have in common (a single file's own folder)."""
    if len(names) == 1:
        return os.path.dirname(names[0])
    root = os.path.commonpath(names)
    return os.path.dirname(root) if root in names else root  # one path is the other's folder: not with files


def old_files_digest(files: Sequence[str]) -> str:
    return hashlib.sha1("\n".join(files).encode()).hexdigest()


def make_state(start: Start, settings: Mapping[str, object], num_epoch: int) -> Dict[str, object]:
    """The state of ``start``, in an iteration of ``num_epoch`` epochs (it began at ``end - num_epoch``;
    not recorded where it cannot have: a state that recorded none was loaded, see ``_iteration_end``)."""
    recorded = num_epoch if 0 <= start.end - num_epoch <= start.epoch else None
    return {"format": FORMAT, "epoch": start.epoch, "batches_in_epoch": start.skip, "end_epoch": start.end,
            "num_epoch": recorded, "splits": [list(split) for split in start.splits], "cached_from": start.cached,
            "settings": dict(settings)}


def shown(value: object) -> str:
    """``value`` for an error message: its repr, cut to about ``SHOWN`` characters with a note of
    its full length (a saved value may be any size)."""
    text = _REPR.repr(value)
    size = len(value) if isinstance(value, (str, bytes, list, tuple, dict)) else 0
    if len(text) > SHOWN:
        text = text[:SHOWN] + "..."
    if size > SHOWN:
        text += f" (cut: {size:,} {'characters' if isinstance(value, (str, bytes)) else 'items'} in all)"
    return text


def _check_depth(state: object) -> None:
    """Refuse a state nested deeper than ``MAX_DEPTH`` (walked without recursion)."""
    stack = [(state, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"not a pyloader state: nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, (list, tuple)):
            stack.extend((v, depth + 1) for v in value)


_PER_RANK = ("rank", "world_size")  # any rank's state resumes every rank, under any world size


def _integer(state: Mapping[str, object], name: str, least: int = 0) -> int:
    value = state.get(name)
    if not is_integer(value, least, LIMIT):
        raise ValueError(f"the state's {name} must be an integer >= {least} and < 2**63, got {shown(value)}")
    return value


def read_state(state: object, ours: Mapping[str, object], old_files: str, num_epoch: int) -> Start:
    """The ``Start`` that ``state`` resumes, checked against ``ours`` (the loader's fingerprint), in an
    iteration of ``num_epoch`` epochs: the one the state was saved in, which began at its ``end_epoch``
    less the ``num_epoch`` it recorded (states that record none end where they were saved to end)."""
    if not isinstance(state, dict) or state.get("format") not in (FORMAT, OLD_FORMAT):
        raise ValueError(f"not a pyloader state (expected format {FORMAT!r})")
    _check_depth(state)
    theirs = state.get("settings")
    if not isinstance(theirs, dict):
        raise ValueError("the state has no settings fingerprint")
    if state["format"] == OLD_FORMAT:
        return _read_old(state, theirs, {**ours, "files": old_files}, num_epoch)
    _check_fingerprint(theirs, ours, every=True)
    epoch, skip = _integer(state, "epoch"), _integer(state, "batches_in_epoch")
    return _elastic(_position(state, epoch, skip, _iteration_end(state, epoch, num_epoch)), theirs, ours)


def _read_old(state: Mapping[str, object], theirs: Mapping[str, object], ours: Mapping[str, object],
              num_epoch: int) -> Start:
    """The ``Start`` of a state of the old format: its iteration began at epoch 0, its files fingerprinted
    by their paths (``old_files_digest``)."""
    _check_fingerprint(theirs, ours, every=False)
    epoch, skip = _integer(state, "epoch"), _integer(state, "batches_in_epoch")
    if epoch > num_epoch:
        raise ValueError(f"the state's epoch {epoch} is beyond num_epoch={num_epoch}")
    return Start(epoch, skip, num_epoch)


def _check_fingerprint(theirs: Mapping[str, object], ours: Mapping[str, object], every: bool) -> None:
    """``ValueError`` naming each setting of ``ours`` that the state's ``theirs`` differs in (the settings
    of one rank aside); ``every=False`` (a state of the old format): only those it recorded."""
    differ = [line for k in ours if k not in _PER_RANK and (k in theirs or every)
              for line in _differences(k, ours[k], theirs.get(k))]
    if differ:
        raise ValueError(f"the state was saved with other data or settings: {'; '.join(differ)}")


def _position(state: Mapping[str, object], epoch: int, skip: int, end: int) -> Start:
    """The state's position, its splits and cache checked against it."""
    start = Start(epoch, skip, end, _splits(state.get("splits", [])), _optional(state, "cached_from"))
    if skip < start.base:
        raise ValueError(f"the state's batches_in_epoch {skip} is before its splits end ({start.base})")
    if start.cached is not None and start.cached > epoch:
        raise ValueError(f"the state's cached_from {start.cached} is after its epoch {epoch}")
    return start


def _differences(name: str, ours: object, theirs: object) -> List[str]:
    """Each setting under ``name`` that differs, with both values; in a dict, each key that does."""
    if isinstance(ours, dict) and isinstance(theirs, dict):  # every key of either, ours first
        return [line for k in {**ours, **theirs} for line in _differences(f"{name}.{k}", ours.get(k), theirs.get(k))]
    if json.dumps(ours) == json.dumps(theirs):
        return []
    return [f"{name} (saved {shown(theirs)}, now {shown(ours)})"]


def _iteration_end(state: Mapping[str, object], epoch: int, num_epoch: int) -> int:
    """Where the resumed iteration ends: ``num_epoch`` epochs after the saved iteration began."""
    end = _integer(state, "end_epoch", least=1)
    if state.get("num_epoch") is None:  # saved before states recorded it: it ends where it was saved to end
        if end <= epoch:
            raise ValueError(f"the state's end_epoch {end} must be after its epoch {epoch}")
        return end
    saved = _integer(state, "num_epoch", least=1)
    first = end - saved
    if not 0 <= first <= epoch < end:
        raise ValueError(f"the state's epoch {epoch}, end_epoch {end} and num_epoch {saved} disagree "
                         f"(its iteration would be epochs {first} to {end - 1})")
    if epoch >= first + num_epoch:
        raise ValueError(f"the state is in epoch {epoch} of an iteration that began with epoch {first}, "
                         f"past the end of one of num_epoch={num_epoch} (it was saved under num_epoch={saved}): "
                         f"resume it with num_epoch >= {epoch - first + 1}")
    return first + num_epoch


def _optional(state: Mapping[str, object], name: str) -> Optional[int]:
    return None if state.get(name) is None else _integer(state, name)


def _splits(value: object) -> Tuple[Tuple[int, int], ...]:
    """Each split: a world size and the batches every rank of it took (at least one: a split is
    made only where its ranks took some). Their sizes are checked against the data by the loader."""
    if not (isinstance(value, list) and all(_is_split(s) for s in value)):
        raise ValueError(f"the state's splits must be a list of [world_size, batches] (integers >= 1), "
                         f"got {shown(value)}")
    return tuple((w, b) for w, b in value)


def _is_split(s: object) -> bool:
    """Whether ``s`` is ``[world_size, batches]``, two integers in ``1 .. LIMIT - 1``."""
    return isinstance(s, list) and len(s) == 2 and all(is_integer(v, 1, LIMIT) for v in s)


def _elastic(start: Start, theirs: Mapping[str, object], ours: Mapping[str, object]) -> Start:
    """``start`` for this world size: under another one than the state's, the rest of the epoch
    is shared out anew (what the saved ranks took becomes a split)."""
    saved_world, saved_rank = _integer(theirs, "world_size", least=1), theirs.get("rank", 0)
    if not is_integer(saved_rank, 0, saved_world):
        raise ValueError(f"the state's rank must be an integer >= 0 and below its world_size {saved_world}, "
                         f"got {shown(saved_rank)}")
    taken = start.skip - start.base
    if saved_world == ours["world_size"] or not taken or isinstance(ours.get("shuffle"), dict):
        return start  # the global order's batch k is the same global batch under any world size
    if start.cached is not None:
        raise ValueError(f"the state was saved mid-epoch under world_size={saved_world}, not {ours['world_size']}, "
                         f"in an epoch read from the cache of encoded batches (cache_encoded), which holds "
                         f"the saved rank's share only: resume it under world_size={saved_world}")
    if _reorders(ours):
        raise ValueError(f"the state was saved mid-epoch under world_size={saved_world}, not {ours['world_size']}: "
                         f"resuming under another world size is not supported with a shuffle or bucket buffer, "
                         f"with filter_fn, or with rotation (the samples a rank delivered are then not the first "
                         f"ones of its share)")
    return Start(start.epoch, start.skip, start.end, (*start.splits, (saved_world, taken)))


def _reorders(ours: Mapping[str, object]) -> bool:
    """Whether a rank's delivered samples may not be the first of its share: a shuffle or bucket buffer,
    ``filter_fn``, or rotation."""
    return bool(ours["shuffle_buffer"] or ours.get("filter_fn") or ours.get("bucket_by") or ours.get("rotation"))


def after(last_epoch: Optional[int], start: Start, num_epoch: int) -> Start:
    """Where the next iteration begins after one that began at ``start`` and handed out its
    last batch in ``last_epoch`` (``None``: none at all) without finishing: the epoch after."""
    if last_epoch is None:
        return start
    return Start(last_epoch + 1, 0, last_epoch + 1 + num_epoch)


def fresh(epoch: int, num_epoch: int) -> Start:
    return Start(epoch, 0, epoch + num_epoch)


