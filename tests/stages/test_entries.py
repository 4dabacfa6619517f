"""``_stages.entries``: stream-mode ``data_dir`` lists of file slices and in-memory streams, parsed alone."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, List

import numpy as np
import pytest

from pyloader._stages.entries import FIELD, MemoryRunner, parse_entries, stream_data
from pyloader._stages.source import FileTask

pytestmark = pytest.mark.timeout(30)


def files(tmp_path: Path, n: int = 2) -> List[str]:
    paths = []
    for i in range(n):
        path = tmp_path / f"part-{i}.txt"
        path.write_text("0\n1\n")
        paths.append(str(path))
    return paths


def test_an_ordinary_data_dir_is_left_to_list_files(tmp_path: Path):
    a, b = files(tmp_path)
    assert parse_entries(str(tmp_path), stream=True) is None
    assert parse_entries(tmp_path, stream=True) is None
    assert parse_entries([a, Path(b)], stream=True) is None
    assert stream_data([a, b], stream=True) == ([a, b], None)


def test_slices_and_whole_files_become_one_stream_each_with_their_bounds(tmp_path: Path):
    a, b = files(tmp_path)
    entries = parse_entries([(a, 2, 5), b, (a, 5, 5)], stream=True)
    assert entries is not None
    assert entries.files == [a, b, a]
    assert entries.bounds == [(2, 5), None, (5, 5)]
    assert entries.memory is None
    assert entries.known_counts() == [3, None, 0]


@pytest.mark.parametrize("item", [(".", 5, 2), (".", -1, 2), (".", 0.0, 2), (".", True, 2), (".", 0, "3")])
def test_a_slice_with_bounds_that_are_not_0_le_start_le_end_integers_is_refused_naming_it(tmp_path: Path,
                                                                                       item: Any):
    a = files(tmp_path, 1)[0]
    with pytest.raises(ValueError, match=r"data_dir item 1 .*(0 <= start <= end|integer bounds)"):
        parse_entries([a, (a, *item[1:])], stream=True)


def test_slices_are_streams_of_stream_mode_only(tmp_path: Path):
    a = files(tmp_path, 1)[0]
    with pytest.raises(ValueError, match="data_dir item 0 is a tuple: outside stream mode"):
        parse_entries([(a, 0, 1)], stream=False)


def test_in_memory_streams_are_named_by_their_place_and_counted_by_their_length():
    entries = parse_entries([{"x": np.arange(4), "y": list("abcd")}, [1, 2], np.zeros((3, 2))], stream=True)
    assert entries is not None and entries.memory is not None
    assert entries.files == ["<memory 0>", "<memory 1>", "<memory 2>"]
    assert entries.known_counts() == [4, 2, 3]
    assert sorted(entries.memory[1]) == [FIELD]


def test_an_iterator_of_streams_is_read_once_and_kept():
    streams = iter([[1, 2, 3], [4]])
    entries = parse_entries(streams, stream=True)
    assert entries is not None and entries.listed == [[1, 2, 3], [4]]


def test_an_in_memory_stream_of_unequal_columns_is_refused():
    with pytest.raises(ValueError, match="in-memory stream 1"):
        parse_entries([[1], {"x": [1, 2], "y": [1]}], stream=True)


@pytest.mark.parametrize("item", [b"bytes", 7, None])
def test_something_that_is_no_stream_is_refused_saying_what_it_is(item: Any):
    with pytest.raises(ValueError, match=f"got {type(item).__name__}"):
        parse_entries([[1, 2], item], stream=True)


def test_files_and_in_memory_streams_are_not_mixed(tmp_path: Path):
    a = files(tmp_path, 1)[0]
    with pytest.raises(ValueError, match="data_dir item 1 is a list among files"):
        parse_entries([(a, 0, 1), [1, 2]], stream=True)


def test_a_slice_of_a_missing_file_is_refused(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        parse_entries([(str(tmp_path / "nothing.txt"), 0, 1)], stream=True)


def test_the_fingerprint_follows_the_slices_bounds_and_the_streams_layout_not_their_contents(tmp_path: Path):
    a, b = files(tmp_path)

    def digest(data_dir: Any) -> str:
        entries = parse_entries(data_dir, stream=True)
        assert entries is not None
        return entries.digest()

    assert digest([(a, 0, 2), b]) == digest([(a, 0, 2), b])
    assert digest([(a, 0, 2), b]) != digest([(a, 0, 1), b])
    assert digest([[1, 2, 3]]) == digest([[7, 8, 9]])
    assert digest([[1, 2, 3]]) != digest([[1, 2]])
    assert digest([{"x": [1]}]) != digest([{"y": [1]}])


def test_an_in_memory_stream_is_served_from_this_process_as_its_task_bounds_say():
    entries = parse_entries([{"x": np.arange(10)}, [5, 6]], stream=True)
    assert entries is not None and entries.memory is not None

    class Runner:
        run = "the wrapped runner's"
        encoding_only = "the wrapped runner's too"

    runner = MemoryRunner(Runner(), entries.memory)
    assert runner.run == "the wrapped runner's" and runner.encoding_only == "the wrapped runner's too"

    async def pieces(task: FileTask) -> List[Any]:
        return [(n, list(columns[next(iter(columns))])) async for n, columns, _, _ in runner.pieces(task, True)]

    def got(task: FileTask) -> List[Any]:
        return asyncio.run(asyncio.wait_for(pieces(task), 10))

    assert got(FileTask(0, 0, 0, "<memory 0>", 3, 6)) == [(3, [3, 4, 5])]
    assert got(FileTask(0, 1, 1, "<memory 1>")) == [(2, [5, 6])]
    assert got(FileTask(0, 1, 1, "<memory 1>", 2, None)) == []
