"""Resume state: what ``DataLoader.state_dict`` records, and the checks ``load_state_dict`` makes.

A state is a small JSON-serializable dict: where the consumer is (``epoch``,
``batches_in_epoch``), the end of the iteration it is in (``end_epoch``,
exclusive), and a fingerprint of the data and of every setting that changes
the batch sequence. The files are fingerprinted by their names relative to the
folder they were listed from, and (local files) their sizes, so the same data
moved or mounted elsewhere still resumes. Every check happens before anything
changes; a refusal names each setting that differs with both values.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence

from ._files import is_url

FORMAT = "pyloader.state/2"
OLD_FORMAT = "pyloader.state/1"  # before epochs went on across iterations: always from epoch 0


@dataclass(frozen=True)
class Start:
    """Where an iteration begins: ``epoch``, after skipping its first ``skip`` batches,
    running to ``end`` (exclusive)."""

    epoch: int = 0
    skip: int = 0
    end: int = 1


def _strip_scheme(path: str) -> str:
    return path.split("://", 1)[1] if "://" in path else path


def files_digest(files: Sequence[str]) -> str:
    """The files' names relative to their common folder, and the sizes of local ones."""
    names = [_strip_scheme(p) for p in files]
    root = os.path.commonpath(names) if len(names) > 1 else os.path.dirname(names[0])
    if len(names) > 1 and root in names:  # one path is the other's folder: cannot happen with files
        root = os.path.dirname(root)
    lines = []
    for path, name in zip(files, names):
        size = "" if is_url(path) else str(os.path.getsize(path[7:] if path.startswith("file://") else path))
        lines.append(f"{os.path.relpath(name, root) if root else name}\t{size}")
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()


def old_files_digest(files: Sequence[str]) -> str:
    return hashlib.sha1("\n".join(files).encode()).hexdigest()


def make_state(start: Start, settings: Mapping[str, Any]) -> Dict[str, Any]:
    return {"format": FORMAT, "epoch": start.epoch, "batches_in_epoch": start.skip, "end_epoch": start.end,
            "settings": dict(settings)}


def _integer(state: Mapping[str, Any], name: str) -> int:
    value = state.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"the state's {name} must be an integer >= 0, got {value!r}")
    return value


def read_state(state: Any, ours: Mapping[str, Any], old_files: str, num_epoch: int) -> Start:
    """The ``Start`` that ``state`` resumes, checked against ``ours`` (the loader's fingerprint)."""
    if not isinstance(state, dict) or state.get("format") not in (FORMAT, OLD_FORMAT):
        raise ValueError(f"not a pyloader state (expected format {FORMAT!r})")
    theirs = state.get("settings")
    if not isinstance(theirs, dict):
        raise ValueError("the state has no settings fingerprint")
    if state["format"] == OLD_FORMAT:
        ours = {**ours, "files": old_files}
    differ = [f"{k} (saved {theirs.get(k)!r}, now {ours[k]!r})" for k in ours
              if k in theirs or state["format"] == FORMAT
              if json.dumps(ours[k]) != json.dumps(theirs.get(k))]
    if differ:
        raise ValueError(f"the state was saved with other data or settings: {'; '.join(differ)}")
    epoch, skip = _integer(state, "epoch"), _integer(state, "batches_in_epoch")
    if state["format"] == OLD_FORMAT:
        if epoch > num_epoch:
            raise ValueError(f"the state's epoch {epoch} is beyond num_epoch={num_epoch}")
        return Start(epoch, skip, num_epoch)
    end = _integer(state, "end_epoch")
    if end <= epoch:
        raise ValueError(f"the state's end_epoch {end} must be after its epoch {epoch}")
    return Start(epoch, skip, end)


def after(last_epoch: Optional[int], start: Start, num_epoch: int) -> Start:
    """Where the next iteration begins after one that began at ``start`` and handed out its
    last batch in ``last_epoch`` (``None``: none at all) without finishing: the epoch after."""
    if last_epoch is None:
        return start
    return Start(last_epoch + 1, 0, last_epoch + 1 + num_epoch)


def fresh(epoch: int, num_epoch: int) -> Start:
    return Start(epoch, 0, epoch + num_epoch)


