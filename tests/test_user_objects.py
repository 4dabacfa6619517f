"""User objects are called one call at a time unless their class says ``thread_safe = True``,
and errors from user code keep their original type (with 0 and 2 workers)."""
from __future__ import annotations

import threading
import time

import numpy as np
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


# -- what batch_encode and collate_batch return ------------------------------------------------------
class DropsARow(pl.Dataset):
    """A ``batch_encode`` whose ``y`` column lost a row."""

    def batch_encode(self, batch_data):
        return {"x": list(batch_data["id"]), "y": list(batch_data["id"])[1:]}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("collator", [ListCollator, NumpyCollator])
def test_a_batch_encode_returning_columns_of_unequal_lengths_is_an_error_naming_batch_encode(
        tmp_path, num_workers, collator):
    write_chunks(tmp_path / "d", [8])
    loader = pl.DataLoader(IdReader(4), DropsARow(), collator(), str(tmp_path / "d"), num_workers=num_workers)
    with loader, pytest.raises(ValueError) as info:
        list(loader)
    assert isinstance(info.value, pl.PipelineError) and info.value.stage == "batch_encode", str(info.value)
    assert "'x' has 4 items, 'y' has 3" in str(info.value) and "part-0000.txt" in str(info.value)


class Returns(pl.DataCollator):
    """``collate_batch`` returns ``kind``: the ids as a tuple ``(ids, ids)``, a list ``[ids]``, a bare
    array, or ``None``."""

    def __init__(self, kind):
        self.kind = kind

    def collate_batch(self, features):
        ids = np.asarray(features["id"])
        return {"tuple": (ids, ids), "list": [ids], "array": ids, "none": None}[self.kind]


def _ids(batch):
    return batch.tolist() if isinstance(batch, np.ndarray) else batch[0].tolist()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_collate_batch_returning_a_tuple_a_list_or_a_bare_array_hands_it_over_as_it_is(tmp_path, num_workers):
    write_chunks(tmp_path / "d", [6, 6])
    for kind, cls in [("tuple", tuple), ("list", list), ("array", np.ndarray)]:
        with pl.DataLoader(IdReader(4), pl.IdentityDataset(), Returns(kind), str(tmp_path / "d"),
                           num_workers=num_workers) as loader:
            batches = list(loader)
        assert all(type(b) is cls for b in batches), kind
        assert [i for b in batches for i in _ids(b)] == list(range(12)), kind


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_collate_batch_returning_none_is_an_error_at_the_first_batch_naming_it_even_when_skipping(
        tmp_path, num_workers):
    write_chunks(tmp_path / "d", [6, 6])
    loader = pl.DataLoader(IdReader(4), pl.IdentityDataset(), Returns("none"), str(tmp_path / "d"),
                           num_workers=num_workers, on_error="skip")
    with loader, pytest.raises(TypeError, match="collate_batch returned None") as info:
        next(iter(loader))
    assert isinstance(info.value, pl.PipelineError) and info.value.stage == "collate_batch"


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("mode", ["stream", "ranks"])
def test_where_the_loader_adds_its_flags_a_collate_batch_not_returning_a_dict_is_an_error_naming_it_and_the_type(
        tmp_path, num_workers, mode):
    write_chunks(tmp_path / "d", [6, 6])
    setting = {"stream": True} if mode == "stream" else {"ranks": pl.Ranks(rank=0, world_size=2)}
    loader = pl.DataLoader(IdReader(2), pl.IdentityDataset(), Returns("tuple"), str(tmp_path / "d"),
                           num_workers=num_workers, **setting)
    with loader, pytest.raises(TypeError, match="collate_batch returned a tuple.*must return a dict") as info:
        next(iter(loader))
    assert isinstance(info.value, pl.PipelineError) and info.value.stage == "collate_batch"


# -- which reading method is called ------------------------------------------------------------------
class MarksReadFile(JsonLinesReader):
    """A built-in reader whose ``read_file`` is overridden: every sample says it came through it."""

    def read_file(self, path):
        columns, n = super().read_file(path)
        return {**columns, "via": ["read_file"] * n}, n


class MarksIterFile(JsonLinesReader):
    """A built-in reader whose ``iter_file`` is overridden."""

    def iter_file(self, path):
        for piece in super().iter_file(path):
            yield {**piece, "via": ["iter_file"] * len(piece["id"])}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("reader, method", [(MarksReadFile, "read_file"), (MarksIterFile, "iter_file")])
def test_the_reading_method_a_subclass_of_a_built_in_reader_overrides_is_called_whatever_the_settings(
        tmp_path, num_workers, shuffle, reader, method):
    (tmp_path / "d").mkdir()
    for k in range(2):
        (tmp_path / "d" / f"part-{k}.jsonl").write_text("".join(f'{{"id": {6 * k + j}}}\n' for j in range(6)))
    with pl.DataLoader(reader(batch_size=4, shuffle=shuffle), pl.IdentityDataset(), ListCollator(),
                       str(tmp_path / "d"), num_workers=num_workers) as loader:
        batches = list(loader)
    assert sorted(ids_of(batches)) == list(range(12))
    assert {v for b in batches for v in b["via"]} == {method}
