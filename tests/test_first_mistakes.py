"""The three mistakes a first reader most often makes get errors that say what to do."""
from __future__ import annotations

from pathlib import Path

import pytest

from pyloader import DataLoader, DataReader, IdentityDataset
from pyloader.collators import NumpyCollator

pytestmark = pytest.mark.timeout(120)


class ReturnsAList(DataReader):
    def read_file(self, path):
        return [{"x": 1}, {"x": 2}, {"x": 3}]


class ReturnsTheDictAlone(DataReader):
    def read_file(self, path):
        return {"text": ["a", "b"], "label": [0, 1]}


class ForgetsSuperInit(DataReader):
    def __init__(self, lowercase: bool = True) -> None:
        self.lowercase = lowercase

    def read_file(self, path):
        return {"x": [1]}, 1


def chunk(tmp_path: Path) -> str:
    path = tmp_path / "part-0.txt"
    path.write_text("a\nb\n")
    return str(path)


def run(reader: DataReader, path: str, num_workers: int) -> None:
    with DataLoader(reader, IdentityDataset(), NumpyCollator(), path, num_workers=num_workers) as loader:
        list(iter(loader))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_read_file_returning_a_list_says_to_return_the_dict_and_its_count(tmp_path, num_workers):
    path = chunk(tmp_path)
    with pytest.raises(ValueError) as caught:
        run(ReturnsAList(batch_size=2), path, num_workers)
    message = str(caught.value)
    assert path in message and "got a list of 3 items" in message
    assert "(dict_of_lists, n_sample)" in message and "too many values" not in message


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_read_file_returning_a_dict_without_its_count_says_to_add_the_count(tmp_path, num_workers):
    path = chunk(tmp_path)
    with pytest.raises(ValueError) as caught:
        run(ReturnsTheDictAlone(batch_size=2), path, num_workers)
    message = str(caught.value)
    assert path in message and "returned a dict" in message and "n_sample" in message
    assert "got str" not in message


def test_the_mistakes_of_read_file_are_named_by_iter_file_and_count_too(tmp_path):
    path = chunk(tmp_path)
    with pytest.raises(ValueError, match="got a list of 3 items"):
        ReturnsAList().count(path)
    with pytest.raises(ValueError, match="returned a dict"):
        next(ReturnsTheDictAlone().iter_file(path))


def test_a_reader_whose_init_skips_super_init_says_to_call_it(tmp_path):
    with pytest.raises(AttributeError) as caught:
        run(ForgetsSuperInit(), chunk(tmp_path), 0)
    message = str(caught.value)
    assert "ForgetsSuperInit" in message and "super().__init__(" in message and "batch_size" in message


def test_a_reader_that_calls_super_init_still_reports_a_missing_attribute_plainly():
    reader = ReturnsAList()
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        reader.nothing_here  # noqa: B018  # the attribute access is the test
    assert not hasattr(reader, "nothing_here")
