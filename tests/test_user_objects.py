"""User objects are called one call at a time unless their class says ``thread_safe = True``,
and errors from user code keep their original type (with 0 and 2 workers)."""
from __future__ import annotations

import threading
import time

import pytest
from conftest import IdReader, ListCollator, ids_of, write_chunks

import pyloader as pl
from pyloader._abc import is_thread_safe
from pyloader.collators import NumpyCollator, TFCollator, TorchCollator
from pyloader.readers import CSVReader, JsonLinesReader, NumpyReader, TextLinesReader

pytestmark = pytest.mark.timeout(120)


class StatefulReader(pl.DataReader):
    """Keeps the file being read on ``self``, as single-threaded loaders allow."""

    def read_file(self, path):
        with open(path) as f:
            self.rows = [int(line) for line in f if line.strip()]
        time.sleep(0.002)  # let another thread in, if the loader allowed one
        ids = list(self.rows)
        return {"id": ids}, len(ids)


class StatefulDataset(pl.Dataset):
    def batch_encode(self, batch_data):
        self.current = list(batch_data["id"])
        time.sleep(0.001)
        return {"id": self.current}


class ConcurrencyProbe:
    """Counts how many calls of one object overlap."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.most = 0

    def enter(self) -> None:
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)

    def leave(self) -> None:
        with self.lock:
            self.inside -= 1


@pytest.mark.parametrize("run", range(3))
def test_a_reader_keeping_state_on_self_delivers_every_sample_exactly_once_under_the_defaults(tmp_path, run):
    sizes = [50 + (k * 7) % 30 for k in range(40)]
    write_chunks(tmp_path / "d", sizes)
    loader = pl.DataLoader(StatefulReader(batch_size=32), StatefulDataset(), ListCollator(),
                           str(tmp_path / "d"), shuffle=True, random_seed=run)
    with loader:
        got = ids_of(loader)
    assert len(got) == sum(sizes)
    assert sorted(got) == list(range(sum(sizes)))


def test_calls_on_one_object_never_overlap_unless_its_class_says_thread_safe(tmp_path):
    write_chunks(tmp_path / "d", [20] * 12)
    probes = {"unsafe": ConcurrencyProbe(), "safe": ConcurrencyProbe()}

    class Probed(IdReader):
        probe = probes["unsafe"]

        def read_file(self, path):
            self.probe.enter()
            try:
                time.sleep(0.02)
                return super().read_file(path)
            finally:
                self.probe.leave()

    class SafeProbed(Probed):
        thread_safe = True
        probe = probes["safe"]

        def read_file(self, path):
            return super().read_file(path)

    for cls in (Probed, SafeProbed):
        loader = pl.DataLoader(cls(batch_size=8), pl.IdentityDataset(), ListCollator(), str(tmp_path / "d"),
                               prefetch_files=6, num_threads=6, num_workers=0)  # threads of this process
        with loader:
            assert sorted(ids_of(loader)) == list(range(240))
    assert probes["unsafe"].most == 1
    assert probes["safe"].most > 1  # the declaration is what lets calls run at once


def test_the_built_ins_declare_thread_safety_and_a_subclass_with_its_own_method_does_not_inherit_it():
    for obj in (JsonLinesReader(), CSVReader(), TextLinesReader(), NumpyReader(), pl.IdentityDataset(),
                NumpyCollator(), TorchCollator(), TFCollator()):
        assert is_thread_safe(obj), type(obj).__name__

    class Configured(JsonLinesReader):
        def __init__(self) -> None:
            super().__init__(batch_size=4)

    class OwnRead(JsonLinesReader):
        def read_file(self, path):
            self.last = path
            return super().read_file(path)

    class OwnReadSafe(OwnRead):
        thread_safe = True

    assert is_thread_safe(Configured())
    assert not is_thread_safe(OwnRead())
    assert is_thread_safe(OwnReadSafe())
    assert not is_thread_safe(IdReader())


class Failing(IdReader):
    def __init__(self, exc: BaseException, **kwargs) -> None:
        super().__init__(**kwargs)
        self.exc = exc

    def read_file(self, path):
        if path.endswith("0001.txt"):
            raise self.exc
        return super().read_file(path)


class NeedsArgs(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(code, detail)
        self.code = code


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("exc", [ValueError("bad value"), KeyError("key"), FileNotFoundError(2, "gone", "x"),
                                 NeedsArgs(7, "detail")], ids=lambda e: type(e).__name__)
def test_an_error_in_read_file_keeps_its_type_and_names_the_file(tmp_path, num_workers, exc):
    write_chunks(tmp_path / "d", [8, 8, 8])
    loader = pl.DataLoader(Failing(exc, batch_size=4), pl.IdentityDataset(), ListCollator(), str(tmp_path / "d"),
                           num_workers=num_workers)
    with loader, pytest.raises(type(exc)) as info:
        list(loader)
    assert isinstance(info.value, pl.PipelineError)
    assert "part-0001.txt" in str(info.value)
    assert type(info.value.__cause__) is type(exc)


class FailOnNine(pl.Dataset):
    def batch_encode(self, batch_data):
        if 9 in batch_data["id"]:
            raise ZeroDivisionError("nine")
        return batch_data


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_error_in_batch_encode_keeps_its_type(tmp_path, num_workers):
    write_chunks(tmp_path / "d", [8, 8])
    loader = pl.DataLoader(IdReader(4), FailOnNine(), ListCollator(), str(tmp_path / "d"), num_workers=num_workers)
    with loader, pytest.raises(ZeroDivisionError, match="batch_encode failed on .*part-0001.txt"):
        list(loader)


def test_an_exception_whose_str_raises_still_names_the_file(tmp_path):
    write_chunks(tmp_path / "d", [8, 8])
    loader = pl.DataLoader(Failing(UnprintableError(), batch_size=4), pl.IdentityDataset(), ListCollator(),
                           str(tmp_path / "d"))
    with loader, pytest.raises(UnprintableError) as info:
        list(loader)
    assert "part-0001.txt" in str(info.value) and "UnprintableError" in str(info.value)


def test_a_stop_iteration_from_user_code_is_an_error_not_a_silent_end(tmp_path):
    write_chunks(tmp_path / "d", [8, 8])
    loader = pl.DataLoader(Failing(StopIteration(), batch_size=4), pl.IdentityDataset(), ListCollator(),
                           str(tmp_path / "d"))
    with loader, pytest.raises(pl.PipelineError, match="part-0001.txt"):
        list(loader)


def test_typed_errors_pickle_and_keep_their_type():
    import pickle

    error = pl.PipelineError("read_file", ["a.txt"], ValueError("v"))
    again = pickle.loads(pickle.dumps(error))
    assert isinstance(again, ValueError) and isinstance(again, pl.PipelineError)
    assert again.paths == ("a.txt",) and str(again) == str(error)
