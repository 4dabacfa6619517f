"""``_stages.filter``: ``filter_fn`` applied to each sample of a file's pieces, built alone."""
from __future__ import annotations

from typing import Any, Iterator, List

import numpy as np
import pytest

import pyloader as pl
from pyloader._errors import PipelineError
from pyloader._stages.filter import Filtered, SampleFilter, check_filter, unbundle, with_filter

pytestmark = pytest.mark.timeout(30)


def piece(first: int, n: int) -> dict:
    return {"id": np.arange(first, first + n), "text": [f"t{i}" for i in range(first, first + n)]}


def test_samples_the_filter_keeps_stay_in_order_and_the_others_are_counted_as_dropped():
    kept, dropped = SampleFilter(lambda s: s["id"] % 3 != 0).apply(piece(0, 7), "f", 0)
    assert kept["id"].tolist() == [1, 2, 4, 5] and kept["text"] == ["t1", "t2", "t4", "t5"]
    assert dropped == 3


def test_the_filter_sees_each_sample_as_a_dict_of_its_fields():
    seen: List[dict] = []
    SampleFilter(lambda s: seen.append(s) or True).apply(piece(4, 2), "f", 0)
    assert [(int(s["id"]), s["text"]) for s in seen] == [(4, "t4"), (5, "t5")]


def test_a_piece_the_filter_keeps_whole_is_passed_on_as_it_is():
    columns = piece(0, 3)
    kept, dropped = SampleFilter(lambda s: np.bool_(True)).apply(columns, "f", 0)
    assert kept is columns and dropped == 0


def test_a_filter_that_drops_everything_leaves_an_empty_piece():
    kept, dropped = SampleFilter(lambda s: False).apply(piece(0, 3), "f", 0)
    assert kept["id"].tolist() == [] and dropped == 3


@pytest.mark.parametrize("returned", [1, None, "yes", np.array([True])])
def test_a_filter_that_returns_no_bool_is_an_error_of_the_file_naming_the_sample(returned: Any):
    with pytest.raises(PipelineError, match=r"filter_fn \(sample 12\) failed on 'data/f.txt'.*must return a bool") \
            as caught:
        SampleFilter(lambda s: returned if s["id"] == 2 else True).apply(piece(0, 4), "data/f.txt", 10)
    assert isinstance(caught.value, TypeError)


def test_a_filter_that_raises_is_an_error_of_the_file_keeping_the_original_type():
    def broken(sample: dict) -> bool:
        raise KeyError("label")

    with pytest.raises(KeyError) as caught:
        SampleFilter(broken).apply(piece(0, 2), "f.txt", 5)
    assert isinstance(caught.value, PipelineError)
    assert caught.value.stage == "filter_fn (sample 5)" and caught.value.paths == ("f.txt",)


def test_pieces_count_sample_positions_across_a_files_pieces():
    def pieces() -> Iterator[dict]:
        yield piece(0, 3)
        yield piece(3, 4)

    with pytest.raises(PipelineError, match=r"sample 105\)"):
        list(SampleFilter(lambda s: bool(s["id"] != 5) or None).pieces(pieces(), "f", 100))
    out = list(SampleFilter(lambda s: s["id"] % 2 == 0).pieces(pieces(), "f", 0))
    assert [(k["id"].tolist(), d) for k, d in out] == [([0, 2], 1), ([4, 6], 2)]


def test_closing_the_filtered_pieces_closes_the_readers_pieces():
    closed = []

    def pieces() -> Iterator[dict]:
        try:
            yield piece(0, 2)
            yield piece(2, 2)
        finally:
            closed.append(True)

    out = SampleFilter(lambda s: True).pieces(pieces(), "f", 0)
    next(out)
    out.close()
    assert closed == [True]


class Reader(pl.DataReader):
    def read_file(self, path: str) -> Any:
        return {"id": [1]}, 1


def test_the_reader_travels_with_the_filter_only_when_there_is_one():
    reader = Reader()
    assert with_filter(reader, None) is reader
    assert unbundle(reader) == (reader, None)
    bundled = with_filter(reader, bool)
    assert isinstance(bundled, Filtered)
    got_reader, keep = unbundle(bundled)
    assert got_reader is reader and isinstance(keep, SampleFilter) and keep.fn is bool


def test_filter_fn_must_be_callable_and_applies_outside_stream_mode():
    check_filter(None, stream=True)
    check_filter(bool, stream=False)
    with pytest.raises(TypeError, match="callable"):
        check_filter("id > 3", stream=False)
    with pytest.raises(ValueError, match="outside stream mode"):
        check_filter(bool, stream=True)
