"""The package's layers import only downwards (README "How it works"), checked from the source.

Every import of every module under ``pyloader/`` counts, those inside functions and under
``TYPE_CHECKING`` included: a lazy import is still a dependency. From the top:

- the top level (the loader, its options, the run's chain, the CLI, ``testing``, the original PyLoader's
  module paths ``datareader``, ``dataset``, ``datacollator``, ``dataloader``);
- ``_stages``: the pipeline's stages;
- ``_execution``: where user code runs (threads, the worker pool, the event loop);
- ``_storage``: bytes, caches, remote files, codecs;
- the shared basics (``_abc``, ``_columns``, ``_errors``, ``_stats``, ``_rng``, ``_state``, ``_paths``).

A module may import its own layer and any layer below it. ``_frameworks`` (what torch, TF and
the progress bar get) is imported by the top level only. ``readers`` and ``collators`` are
building blocks for users: they stand on the basics and on opening files (``_storage.files``,
``_storage.compression``, what ``open_file`` is made of), and nothing inside the package imports them
but the top level.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pyloader"
TOP = {"__init__", "__main__", "_loader", "_pipeline", "_plan", "_options", "_groups", "_compose", "_length", "_counts",
       "_cli", "_diagnose", "testing", "datareader", "dataset", "datacollator", "dataloader"}
TOP_PACKAGES = {"_write"}  # packages of the top level: pyloader.write
BASICS = {"_abc", "_columns", "_errors", "_stats", "_trace", "_rng", "_state", "_paths", "_npy", "_checks", "_libc",
          "_sample_index"}
RANK = {"top": 4, "_stages": 3, "_execution": 2, "_storage": 1, "basics": 0}
FILE_OPENING = {"_storage.files", "_storage.compression"}


def module_name(path: Path) -> str:
    """``pyloader/_stages/read.py`` -> ``_stages.read``; a package's ``__init__`` is named for the package."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if len(parts) > 1 and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> str:
    head = module.split(".")[0]
    if module in TOP or head in TOP_PACKAGES:
        return "top"
    if head in BASICS:
        return "basics"
    if head in RANK or head in ("_frameworks", "readers", "collators"):
        return head
    raise AssertionError(f"pyloader.{module} belongs to no layer: add it to tests/test_layers.py")


def imported(path: Path) -> Iterator[str]:
    """The pyloader modules ``path`` imports (relative or absolute), as names like ``module_name``'s."""
    package = module_name(path).split(".")
    if path.name != "__init__.py" or package == ["__init__"]:
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pyloader."):
                    yield alias.name[len("pyloader."):]
        elif isinstance(node, ast.ImportFrom):
            yield from _from_names(node, package)


def _from_names(node: ast.ImportFrom, package: List[str]) -> Iterator[str]:
    if node.level == 0:
        if node.module is None or not (node.module + ".").startswith("pyloader."):
            return
        base = node.module[len("pyloader."):]
    else:
        parent = package[:len(package) - (node.level - 1)]
        base = ".".join(parent + ([node.module] if node.module else []))
    for alias in node.names:  # ``from . import ipc`` imports a module; ``from .x import name`` imports x
        candidate = f"{base}.{alias.name}" if base else alias.name
        yield candidate if _is_module(candidate) else base


def _is_module(name: str) -> bool:
    path = PACKAGE.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def violation(importer: str, target: str) -> Optional[str]:
    """Why ``importer`` may not import ``target``, or None when it may."""
    src, dst = layer(importer), layer(target)
    if src == dst:
        return None
    if dst == "_frameworks":
        return None if src == "top" else "_frameworks is imported by the top level only"
    if dst in ("readers", "collators"):
        return None if src == "top" else f"{dst} are building blocks imported by the top level only"
    if src in ("readers", "collators"):
        ok = dst == "basics" or target in FILE_OPENING
        return None if ok else f"{src} stand on the basics and opening files only"
    if src == "_frameworks":
        return None if dst != "top" else "_frameworks may not import the top level"
    return None if RANK[src] > RANK[dst] else f"{src} may not import {dst}, a layer above it"


def all_imports() -> Dict[str, List[str]]:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 40, f"pyloader's modules not found under {PACKAGE}"
    return {module_name(p): sorted(set(imported(p))) for p in modules}


def violations(imports: Dict[str, List[str]]) -> List[Tuple[str, str, str]]:
    return [(m, t, why) for m, targets in imports.items() for t in targets if (why := violation(m, t))]


@pytest.mark.timeout(60)
def test_every_module_imports_only_its_own_layer_or_those_below():
    found = violations(all_imports())
    assert found == [], "imports against the layers:\n" + "\n".join(
        f"pyloader.{m} -> pyloader.{t} ({why})" for m, t, why in found)


@pytest.mark.timeout(60)
def test_the_import_check_sees_lazy_relative_and_absolute_imports(tmp_path):
    """The check is not blind: an upward import inside a function, or written absolute, is found."""
    source = ("from .._columns import n_rows\n"
              "def f():\n    from .._stages.map import Step\n    import pyloader._loader\n")
    path = PACKAGE / "_storage" / "probe.py"
    found = set(_imports_of_source(source, path))
    assert found == {"_columns", "_stages.map", "_loader"}, found
    assert violation("_storage.probe", "_stages.map") and violation("_storage.probe", "_loader")
    assert violation("_storage.probe", "_columns") is None
    assert violation("_execution.worker", "_stages.read") and violation("_state", "_storage.files")
    assert violation("_stages.read", "_frameworks.torch") and violation("_storage.bytes", "readers")
    assert violation("_pipeline", "_frameworks.torch") is None
    assert violation("_stages.read", "_execution.runners") is None


def _imports_of_source(source: str, path: Path) -> Iterator[str]:
    """``imported`` for a module that is not on disk."""
    package = module_name(path).split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            yield from _from_names(node, package)
        elif isinstance(node, ast.Import):
            yield from (a.name[len("pyloader."):] for a in node.names if a.name.startswith("pyloader."))
