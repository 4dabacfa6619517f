"""``_stages.sources``: ``Source`` checks, the files of a mix end to end, and reading each with its source's reader."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Tuple

import pytest

import pyloader as pl
from pyloader._stages.sources import Readers, SafeReaders, Source, build_mix, is_mix, picked

pytestmark = pytest.mark.timeout(30)


class NamedReader(pl.DataReader):
    def __init__(self, name: str) -> None:
        super().__init__(batch_size=2)
        self.name = name

    def read_file(self, path: str) -> Tuple[Mapping[str, Any], int]:
        return {"by": [self.name]}, 1

    def count(self, path: str) -> int:
        return len(self.name)


class SafeNamedReader(NamedReader):
    thread_safe = True


def folder(root: Path, name: str, n: int) -> str:
    (root / name).mkdir()
    for i in range(n):
        (root / name / f"part-{i}.txt").write_text("0\n")
    return str(root / name)


@pytest.mark.parametrize("weight", [0, -1.0, float("inf"), float("nan"), True, "1"])
def test_a_weight_that_is_not_a_finite_number_above_zero_is_refused(weight: Any):
    with pytest.raises(ValueError, match="weight must be a finite number > 0"):
        Source("data", weight=weight)


def test_a_source_cannot_hold_sources_nor_take_a_reader_that_is_not_a_datareader():
    with pytest.raises(ValueError, match="cannot hold Sources"):
        Source([Source("a")])
    with pytest.raises(TypeError, match="pyloader.DataReader"):
        Source("a", reader=object())


def test_a_list_of_sources_is_a_mix_and_a_list_mixing_sources_and_paths_is_refused():
    assert is_mix([Source("a"), Source("b")])
    assert not is_mix(["a", "b"]) and not is_mix("a")
    with pytest.raises(TypeError, match="mixes Sources with other entries"):
        is_mix([Source("a"), "b"])


def test_the_mix_puts_the_sources_files_end_to_end_each_source_together(tmp_path: Path):
    a, b = folder(tmp_path, "a", 2), folder(tmp_path, "b", 3)
    mix = build_mix([Source(b, weight=3), Source(a)], NamedReader("default"), retries=0)
    assert [Path(f).parent.name for f in mix.files] == ["b"] * 3 + ["a"] * 2
    assert mix.spans == ((0, 3), (3, 5))
    assert mix.source_of() == [0, 0, 0, 1, 1]
    assert mix.weights() == [0.75, 0.25]


def test_a_file_listed_by_two_sources_is_refused_naming_it(tmp_path: Path):
    a = folder(tmp_path, "a", 2)
    shared = str(Path(a) / "part-1.txt")
    with pytest.raises(ValueError, match=r"part-1\.txt.*belongs to source 0.*and to source 1"):
        build_mix([Source(a), Source([shared])], NamedReader("default"), retries=0)


def test_each_file_is_read_by_its_sources_reader_or_the_loaders(tmp_path: Path):
    a, b = folder(tmp_path, "a", 1), folder(tmp_path, "b", 1)
    mix = build_mix([Source(a, reader=NamedReader("own")), Source(b)], NamedReader("loader's"), retries=0)
    readers = mix.readers
    assert isinstance(readers, Readers) and not isinstance(readers, SafeReaders)
    got: Dict[str, List[str]] = {Path(f).parent.name: list(readers.read_file(f)[0]["by"]) for f in mix.files}
    assert got == {"a": ["own"], "b": ["loader's"]}
    assert [readers.count(f) for f in mix.files] == [3, 8]
    assert picked(readers, mix.files[0]).name == "own"  # type: ignore[attr-defined]
    plain = NamedReader("plain")
    assert picked(plain, mix.files[0]) is plain


def test_the_readers_are_thread_safe_only_when_every_sources_reader_is(tmp_path: Path):
    a, b = folder(tmp_path, "a", 1), folder(tmp_path, "b", 1)
    safe = build_mix([Source(a, reader=SafeNamedReader("x")), Source(b)], SafeNamedReader("y"), retries=0)
    assert isinstance(safe.readers, SafeReaders)
    mixed = build_mix([Source(a, reader=NamedReader("x")), Source(b)], SafeNamedReader("y"), retries=0)
    assert not isinstance(mixed.readers, SafeReaders)
