"""A batch of small arrays crosses from a worker as one flat buffer (``_execution.packed``), arriving as pickling
would have delivered it: same keys and order, types, dtypes, shapes, memory order and writeable flags, own memory."""
from __future__ import annotations

import pickle
import socket

import numpy as np
import pytest
import torch

from pyloader._execution import ipc
from pyloader._execution.packed import Packed, pack

LIMIT = ipc.INBAND_MAX


def crossed(batch: dict) -> dict:
    """``batch`` sealed as a worker seals a result, sent in a reply over a real socket pair, and opened."""
    sealed = ipc.Sealed.seal(batch)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        ipc.send(ours, [(True, sealed)], tag=1)
        _, _, reply = ipc.recv(theirs)
    return reply[0][1].open()


def assert_same_value(got: object, want: object) -> None:
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
        assert torch.equal(got, want) and got.data_ptr() != want.data_ptr()
        return
    assert isinstance(got, np.ndarray) and isinstance(want, np.ndarray)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.flags.writeable == want.flags.writeable
    assert got.flags.f_contiguous == want.flags.f_contiguous or not want.flags.forc
    np.testing.assert_array_equal(got, want)
    assert not np.shares_memory(got, want)


def every_kind() -> dict:
    rng = np.random.default_rng(0)
    batch = {f"{d}": rng.integers(0, 100, size=(5, 3)).astype(d)
             for d in ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                       "float16", "float32", "float64", "complex64", "complex128", ">i4", ">f8")}
    batch["when"] = np.array(["2026-11-27", "2000-01-01"], dtype="datetime64[D]")
    batch["delta"] = np.array([1, 2, 3], dtype="timedelta64[ms]")
    batch["text"] = np.array(["a", "bcd", ""], dtype="U3")
    batch["raw"] = np.array([b"x", b"yz"], dtype="S2")
    batch["scalar"] = np.array(7.5)
    batch["empty"] = np.zeros((0, 4), dtype=np.float32)
    batch["fortran"] = np.asfortranarray(rng.random((4, 6)))
    batch["strided"] = rng.random((8, 8))[::2, 1::3]
    batch["read_only"] = np.arange(10)
    batch["read_only"].flags.writeable = False
    return batch


def test_arrays_of_every_fixed_width_kind_arrive_as_pickling_would_deliver_them():
    batch = every_kind()
    assert isinstance(ipc.Sealed.seal(batch), Packed)
    got = crossed(batch)
    assert list(got) == list(batch)
    for key in batch:
        assert_same_value(got[key], batch[key])
        want = pickle.loads(pickle.dumps(batch[key], protocol=5))
        assert got[key].flags.writeable == want.flags.writeable and got[key].strides == want.strides


def test_tensors_arrive_as_tensors_of_the_same_dtype_and_layout_and_writable():
    batch = {"ids": torch.arange(12, dtype=torch.int64).reshape(3, 4), "mask": torch.ones(3, 4, dtype=torch.bool),
             "x": torch.rand(4, 3).t(), "half": torch.rand(5).half(), "label": torch.tensor(3)}
    assert isinstance(ipc.Sealed.seal(batch), Packed)
    got = crossed(batch)
    assert list(got) == list(batch)
    for key in batch:
        assert_same_value(got[key], batch[key])
    got["ids"] += 1  # its own, writable memory
    assert int(got["ids"].sum()) == int(batch["ids"].sum()) + 12


@pytest.mark.parametrize("batch", [
    [np.arange(3)],
    {"x": np.arange(3), 1: np.arange(3)},
    {"x": np.arange(3), "names": ["a", "b", "c"]},
    {"x": np.array(["a", None], dtype=object)},
    {"x": np.zeros(3, dtype=[("a", "i4"), ("b", "f4")])},
    {"x": np.zeros(LIMIT // 8 + 1)},
    {"x": torch.zeros(3, requires_grad=True)},
    {"x": torch.zeros(3, dtype=torch.bfloat16)},
    {"x": torch.nn.Parameter(torch.zeros(3))},
    {"x": torch.zeros(3).to_sparse()},
    {"x": torch.zeros(3, dtype=torch.complex64).conj()},
    {"x": np.ma.masked_array(np.arange(3), mask=[0, 1, 0])},
], ids=["a list", "a key not a string", "a list value", "objects", "records", "over the limit", "grad",
        "bfloat16", "a tensor subclass", "sparse", "conjugate", "a masked array"])
def test_anything_else_is_pickled_as_before(batch):
    assert pack(batch, LIMIT) is None
    assert isinstance(ipc.Sealed.seal(batch), ipc.Sealed)


def test_the_same_array_under_two_keys_is_pickled_so_that_it_stays_one_object():
    x = np.arange(4)
    assert pack({"a": x, "b": x}, LIMIT) is None
    got = crossed({"a": x, "b": x})
    assert got["a"] is got["b"]


def test_a_span_of_a_mapped_file_is_left_to_travel_as_where_it_lies(tmp_path):
    from pyloader.readers import NumpyReader

    np.save(tmp_path / "a.npy", np.arange(400, dtype=np.float32).reshape(100, 4))
    piece = next(NumpyReader(piece_size=100).iter_file(str(tmp_path / "a.npy")))["x"]
    assert pack({"x": np.asarray(piece[:10])}, LIMIT) is None
    assert pack({"x": np.array(piece[:10])}, LIMIT) is not None  # a copy is an ordinary array
