"""Who is writing a temporary file or folder, told by its name, so that a later run can remove
what a writer that died (a process killed) left behind (``cache_dir``'s ``.tmp`` files,
``rotation_dir``'s run folders).

Contracts:

- ``tag()`` is ``pyw<scope>-<pid>-<start>``: this process's id and start time (so that a pid
  used again by a later process is told apart), and a scope naming this boot of this machine
  and its pid namespace (processes of another machine or container sharing the folder have
  another scope). It goes in the name of what the process writes.
- ``dead(name)`` is true only when ``name`` holds a tag of this scope whose process is gone,
  or whose pid is another process now. A name without a tag, or of another scope, or on a
  system without ``/proc`` (the tag's scope is then ``x``), is never called dead: the caller
  falls back to its age.
"""
from __future__ import annotations

import hashlib
import os
import re
from typing import Dict, Optional

__all__ = ["dead", "tag"]

_TAG = re.compile(r"pyw([0-9a-f]{12}|x)-([0-9]+)-([0-9]+)-")
_scope: Optional[str] = None
_tags: Dict[int, str] = {}  # pid -> its tag (a forked child has its own)


def _start_of(pid: int) -> Optional[int]:
    """The start time of process ``pid`` (clock ticks since boot), ``None`` when there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()  # the name, in parentheses, may hold spaces
    return int(fields[19])  # field 22 of proc(5): starttime


def _this_scope() -> str:
    global _scope
    if _scope is None:
        try:
            with open("/proc/sys/kernel/random/boot_id", "rb") as f:
                boot = f.read().strip()
            namespace = os.stat("/proc/self/ns/pid").st_ino
            _scope = hashlib.sha256(boot + b"/" + str(namespace).encode()).hexdigest()[:12]
        except OSError:
            _scope = "x"
    return _scope


def tag() -> str:
    pid = os.getpid()
    if pid not in _tags:
        start = _start_of(pid) if _this_scope() != "x" else None
        _tags[pid] = f"pyw{_this_scope()}-{pid}-{start or 0}"
    return _tags[pid]


def dead(name: str) -> bool:
    """Whether ``name`` was written by a process of this machine and namespace that is gone."""
    found = _TAG.search(name)  # scope, pid, start
    if found is None or found[1] != _this_scope() or found[1] == "x":
        return False
    return _start_of(int(found[2])) != int(found[3])
