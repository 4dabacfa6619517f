"""What ``data_dir`` lists: folder walks and globs skip ``.``/``_`` names and special files
(a named pipe would block ``open`` forever), lists are taken as given; and what a skipped
file that failed partway through has delivered. Also counting under ranks (``count``
and reading agree on what a line is)."""
from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from typing import List

import fsspec
import pytest
from conftest import IdReader, ListCollator, ids_of, wait_no_threads, write_chunks

import pyloader as pl
from pyloader.readers import JsonLinesReader

pytestmark = pytest.mark.timeout(60)


def names(files: List[str], root: Path) -> List[str]:
    return [os.path.relpath(f, root) for f in files]


def odd_folder(root: Path) -> List[str]:
    """Two chunk files among what other tools leave in a data folder; returns the chunks."""
    chunks = write_chunks(root, [2, 3])
    write_chunks(root / "_temporary", [4], prefix="attempt")  # Spark's scratch folder
    write_chunks(root / ".cache", [4])
    (root / "_SUCCESS").write_text("")
    (root / "_metadata").write_text("0\n")
    (root / ".part-0000.txt.crc").write_text("0\n")
    return chunks


def test_folder_walks_and_globs_skip_dot_and_underscore_names_but_a_list_is_taken_as_given(tmp_path):
    chunks = odd_folder(tmp_path)
    assert pl.list_files(str(tmp_path)) == chunks
    assert pl.list_files(str(tmp_path / "*")) == chunks
    assert pl.list_files(str(tmp_path / "**")) == chunks
    assert pl.list_files(str(tmp_path / "**" / "*.txt")) == chunks
    listed = [str(tmp_path / "_metadata"), chunks[0]]
    assert pl.list_files(listed) == listed
    loader = pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), listed)
    assert ids_of(loader) == [0, 0, 1]


def test_a_glob_lists_underscore_names_its_pattern_spells_out(tmp_path):
    odd_folder(tmp_path)
    assert names(pl.list_files(str(tmp_path / "_*")), tmp_path) == ["_SUCCESS", "_metadata"]
    assert names(pl.list_files(str(tmp_path / "_temporary" / "*")), tmp_path) == ["_temporary/attempt-0000.txt"]
    assert names(pl.list_files(str(tmp_path / "_*" / "*.txt")), tmp_path) == ["_temporary/attempt-0000.txt"]
    assert names(pl.list_files(str(tmp_path / ".*" / "*")), tmp_path) == [".cache/part-0000.txt"]
    with pytest.raises(FileNotFoundError, match="'_'"):
        pl.list_files(str(tmp_path / "_temp*" / "_*"))


def test_a_remote_glob_skips_underscore_names_like_a_local_one():
    root = f"memory://pyloader-tests/{uuid.uuid4().hex}"
    for name in ("part-0.jsonl", "part-1.jsonl", "_SUCCESS", "_logs/part-2.jsonl", ".hidden.jsonl"):
        with fsspec.open(f"{root}/{name}", "wb") as f:
            f.write(b'{"a": 1}\n')
    tails = [f.rsplit("/", 1)[1] for f in pl.list_files(f"{root}/*")]
    assert tails == ["part-0.jsonl", "part-1.jsonl"]
    assert [f.rsplit("/", 1)[1] for f in pl.list_files(f"{root}/**")] == ["part-0.jsonl", "part-1.jsonl"]
    assert [f.rsplit("/", 1)[1] for f in pl.list_files(f"{root}/_*")] == ["_SUCCESS"]


def special_folder(root: Path) -> List[str]:
    """Chunk files beside a named pipe and a link to it; returns the chunks and a link to a
    chunk, which counts as the file it points to, in their listed order."""
    chunks = write_chunks(root, [2, 3])
    os.mkfifo(root / "part-0000b.txt")
    os.symlink(root / "part-0000b.txt", root / "part-0000c.txt")
    os.symlink(chunks[0], root / "part-0000d.txt")
    return [chunks[0], str(root / "part-0000d.txt"), chunks[1]]


@pytest.mark.timeout(60)
def test_a_named_pipe_in_the_data_folder_is_skipped_with_a_warning_not_waited_on(tmp_path, caplog):
    expected = special_folder(tmp_path)
    with caplog.at_level(logging.WARNING, logger="pyloader"):
        loader = pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(tmp_path))
    assert loader.files == expected
    assert "part-0000b.txt' (named pipe)" in caplog.text and "part-0000c.txt' (named pipe)" in caplog.text
    with loader:
        assert ids_of(loader) == [0, 1, 0, 1, 2, 3, 4]
    assert wait_no_threads() == []


@pytest.mark.timeout(60)
def test_a_glob_skips_named_pipes(tmp_path):
    expected = special_folder(tmp_path)
    assert pl.list_files(str(tmp_path / "*.txt")) == expected


@pytest.mark.timeout(60)
def test_a_named_pipe_given_by_name_is_refused_at_construction(tmp_path):
    special_folder(tmp_path)
    pipe = str(tmp_path / "part-0000b.txt")
    for spec in (pipe, [pipe], [str(tmp_path / "part-0000c.txt")]):
        with pytest.raises(FileNotFoundError, match="is a named pipe, not a regular file"):
            pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), spec)
    with pytest.raises(FileNotFoundError, match="which does not exist"):
        pl.list_files([str(tmp_path / "missing.txt")])
    with pytest.raises(FileNotFoundError, match="is a folder, not a regular file"):
        pl.list_files([str(tmp_path)])


def test_links_to_nothing_and_link_loops_are_listed_by_walks_and_globs_and_refused_in_a_list(tmp_path):
    """They could be missing data: reading them reports it, where skipping them would lose it silently."""
    chunks = write_chunks(tmp_path, [2])
    os.symlink(tmp_path / "nowhere.txt", tmp_path / "part-0001.txt")
    os.symlink(tmp_path / "part-0003.txt", tmp_path / "part-0002.txt")
    os.symlink(tmp_path / "part-0002.txt", tmp_path / "part-0003.txt")
    links = [str(tmp_path / f"part-000{i}.txt") for i in (1, 2, 3)]
    assert pl.list_files(str(tmp_path)) == chunks + links
    assert pl.list_files(str(tmp_path / "*.txt")) == chunks + links
    with pytest.raises(FileNotFoundError, match="which does not exist"):
        pl.list_files(links[:1])
    with pytest.raises(FileNotFoundError, match="cannot be examined: .*symbolic links"):
        pl.list_files(links[1:2])


def test_skipping_a_file_that_fails_partway_keeps_the_pieces_read_before(tmp_path):
    """As the README says of ``on_error="skip"``: what was delivered stays delivered."""
    (tmp_path / "a.jsonl").write_text("".join(f'{{"id": {i}}}\n' for i in range(4)))
    (tmp_path / "b.jsonl").write_text("".join(f'{{"id": {i}}}\n' for i in range(4, 10)) + "{oops\n")
    (tmp_path / "c.jsonl").write_text('{"id": 10}\n')
    reader = JsonLinesReader(batch_size=3, piece_size=2)
    with pl.DataLoader(reader, pl.IdentityDataset(), ListCollator(), str(tmp_path), on_error="skip") as loader:
        assert ids_of(loader) == list(range(11))
        assert loader.stats["skipped_files"] == 1
        assert "line 7" in loader.stats["errors"][0]


@pytest.mark.parametrize("separators", ["\x1c", "\x1d\x1e\x1f", "\x85", "\u2028"])
def test_a_jsonl_file_with_lines_of_separators_is_split_across_ranks(tmp_path, separators):
    """Ranks split the epoch by ``count``: a count that disagreed with reading made valid files fail."""
    for k in range(2):
        lines = [f'{{"id": {3 * k + i}}}' for i in range(3)]
        (tmp_path / f"part-{k}.jsonl").write_text(f"\n{separators}\n".join(lines) + "\n", encoding="utf-8")
    got = []
    for rank in range(2):
        with pl.DataLoader(JsonLinesReader(batch_size=2), pl.IdentityDataset(), ListCollator(), str(tmp_path),
                           ranks=pl.Ranks(rank=rank, world_size=2)) as loader:
            got.append([i for b in loader for i, pad in zip(b["id"], b["__padding__"]) if not pad])
    assert got == [[0, 1, 2], [3, 4, 5]]
