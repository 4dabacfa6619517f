"""Tests for pyloader.collators: NumPy stacking/padding, and the torch and TF conversions."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from pyloader import DataCollator
from pyloader.collators import NumpyCollator, TFCollator, TorchCollator

pytestmark = pytest.mark.timeout(120)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def collate(features, **options):
    return NumpyCollator(**options).collate_batch(features)


def check(array, expected, dtype):
    """``array`` is an ndarray equal to ``expected`` in shape and values, of ``dtype``."""
    assert isinstance(array, np.ndarray)
    assert array.dtype == np.dtype(dtype)
    expected = np.asarray(expected)
    assert array.shape == expected.shape
    np.testing.assert_array_equal(array, expected)


# --- dtype inference -------------------------------------------------------


def test_dtype_inference_defaults():
    out = collate({"b": [True, False], "i": [1, 2], "f": [1.5, 2.0], "mixed": [1, 2.5], "seq": [[1, 2], [3, 4]]})
    check(out["b"], [True, False], np.bool_)
    check(out["i"], [1, 2], np.int64)
    check(out["f"], [1.5, 2.0], np.float32)
    check(out["mixed"], [1.0, 2.5], np.float32)
    check(out["seq"], [[1, 2], [3, 4]], np.int64)
    assert list(out) == ["b", "i", "f", "mixed", "seq"]  # rectangular: no companions


def test_dtype_inference_configurable():
    out = collate({"i": [[1], [2]], "f": [[0.5], [1.5]]}, float_dtype="float64", int_dtype=np.int32)
    check(out["i"], [[1], [2]], np.int32)
    check(out["f"], [[0.5], [1.5]], np.float64)


def test_numpy_items_keep_their_dtype():
    out = collate(
        {
            "scalars": [np.float16(1), np.float16(2)],
            "arrays": [np.array([1, 2], np.int32), np.array([3, 4], np.int32)],
            "ragged": [np.array([1, 2, 3], np.uint8), np.array([4], np.uint8)],
        }
    )
    check(out["scalars"], [1, 2], np.float16)
    check(out["arrays"], [[1, 2], [3, 4]], np.int32)
    check(out["ragged"], [[1, 2, 3], [4, 0, 0]], np.uint8)


def test_empty_sequences_and_bad_options():
    check(collate({"e": [[], []]})["e"], np.zeros((2, 0)), np.float32)
    with pytest.raises(ValueError, match="pad_info"):
        NumpyCollator(pad_info="bogus")
    with pytest.raises(ValueError, match="float_dtype"):
        NumpyCollator(float_dtype="int32")
    with pytest.raises(ValueError, match="int_dtype"):
        NumpyCollator(int_dtype="float32")


# --- ragged padding --------------------------------------------------------


def test_ragged_padding_with_mask():
    out = collate({"ids": [[1, 2, 3], [4], [5, 6]], "label": [0, 1, 0]})
    assert list(out) == ["ids", "ids_mask", "label"]
    check(out["ids"], [[1, 2, 3], [4, 0, 0], [5, 6, 0]], np.int64)
    check(out["ids_mask"], [[True, True, True], [True, False, False], [True, True, False]], np.bool_)
    check(out["label"], [0, 1, 0], np.int64)


def test_ragged_padding_with_lengths_and_pad_value():
    out = collate({"ids": [[1, 2, 3], [4], [5, 6]]}, pad_info="lengths", pad_value=-1)
    assert list(out) == ["ids", "ids_lengths"]
    check(out["ids"], [[1, 2, 3], [4, -1, -1], [5, 6, -1]], np.int64)
    check(out["ids_lengths"], [3, 1, 2], np.int64)


def test_ragged_padding_without_companion_and_per_key_pad_values():
    out = collate({"a": [[1.0], [2.0, 3.0]], "b": [[1], [2, 3]]}, pad_info=None, pad_value=7, pad_values={"b": -100})
    assert list(out) == ["a", "b"]
    check(out["a"], [[1.0, 7.0], [2.0, 3.0]], np.float32)
    check(out["b"], [[1, -100], [2, 3]], np.int64)


def test_ragged_arrays_with_feature_dims():
    items = [np.arange(6, dtype=np.float64).reshape(3, 2), np.array([[9.0, 8.0]])]
    out = collate({"frames": items})
    check(out["frames"], [[[0, 1], [2, 3], [4, 5]], [[9, 8], [0, 0], [0, 0]]], np.float64)
    check(out["frames_mask"], [[True, True, True], [True, False, False]], np.bool_)  # no trailing feature dim
    lengths = collate({"frames": items}, pad_info="lengths")["frames_lengths"]
    check(lengths, [3, 1], np.int64)


def test_two_level_ragged():
    features = {"tok": [[[1, 2], [3]], [[4, 5, 6]], []]}  # [batch][T][L]
    out = collate(features)
    check(
        out["tok"],
        [[[1, 2, 0], [3, 0, 0]], [[4, 5, 6], [0, 0, 0]], [[0, 0, 0], [0, 0, 0]]],
        np.int64,
    )
    check(
        out["tok_mask"],
        [
            [[True, True, False], [True, False, False]],
            [[True, True, True], [False, False, False]],
            [[False, False, False], [False, False, False]],
        ],
        np.bool_,
    )
    lengths = collate(features, pad_info="lengths", pad_value=9)
    check(lengths["tok"][1], [[4, 5, 6], [9, 9, 9]], np.int64)
    check(lengths["tok_lengths"], [2, 1, 0], np.int64)


def test_two_level_ragged_of_arrays():
    out = collate({"img": [np.ones((1, 2), np.int16), np.full((2, 1), 5, np.int16)]})
    check(out["img"], [[[1, 1], [0, 0]], [[5, 0], [5, 0]]], np.int16)
    check(out["img_mask"], [[[True, True], [False, False]], [[True, False], [True, False]]], np.bool_)


def test_ragged_keys_always_get_a_companion():
    out = collate({"ids": [[1, 2], [3, 4]]}, ragged_keys=["ids"])
    check(out["ids"], [[1, 2], [3, 4]], np.int64)
    check(out["ids_mask"], np.ones((2, 2), bool), np.bool_)
    out = collate({"ids": [[1, 2], [3, 4]]}, ragged_keys=["ids"], pad_info="lengths")
    check(out["ids_lengths"], [2, 2], np.int64)
    with pytest.raises(ValueError, match="'label'"):
        collate({"label": [1, 2]}, ragged_keys=["label"])


# --- shapes ----------------------------------------------------------------


def test_batch_of_one_keeps_batch_dim():
    out = collate({"ids": [[1, 2, 3]], "label": [1], "x": [0.5], "s": ["only"]})
    check(out["ids"], [[1, 2, 3]], np.int64)
    check(out["label"], [1], np.int64)
    check(out["x"], [0.5], np.float32)
    assert out["s"] == ["only"]
    assert "ids_mask" not in out
    check(collate({"ids": [[1, 2, 3]]}, ragged_keys={"ids": 1})["ids_mask"], [[True, True, True]], np.bool_)


def test_arrays_passed_through_without_copy():
    arr = np.arange(12, dtype=np.float64).reshape(3, 4)
    flags = np.array([True, False, True])
    out = collate({"x": arr, "flags": flags, "ids": [[1], [2, 3], [4]]})
    assert out["x"] is arr and np.shares_memory(out["x"], arr)
    assert out["x"].dtype == np.float64  # arrays keep their dtype, float_dtype does not apply
    assert out["flags"] is flags
    check(out["ids"], [[1, 0], [2, 3], [4, 0]], np.int64)


def _array_columns():
    """Array columns of every kind the shortcut for arrays takes or leaves (``_stack._as_it_is``)."""
    base = np.arange(24, dtype=np.int64).reshape(4, 6)
    records = np.zeros(4, dtype=[("a", "<i4"), ("b", "<f8")])
    return {
        "i64": base, "f16": base.astype(np.float16), "u8": base.astype(np.uint8), "b": base % 2 == 0,
        "c64": base.astype(np.complex64), "dates": np.arange(4).astype("datetime64[D]"),
        "deltas": np.arange(4).astype("timedelta64[s]"), "big": base.astype(">i4"), "flipped": base[::-1, ::-1],
        "strided": base[:, ::2], "fortran": np.asfortranarray(base), "records": records,
        "fixed_str": np.array(["a", "b", "c", "d"]), "fixed_bytes": np.array([b"a", b"b", b"c", b"d"]),
        "memmap_like": base.view(np.memmap), "ragged_declared": base,
    }


@pytest.mark.parametrize("collator", [NumpyCollator(ragged_keys=["ragged_declared"]),
                                      TorchCollator(ragged_keys=["ragged_declared"])], ids=["numpy", "torch"])
def test_array_columns_collate_as_the_full_walk_collates_them(collator, monkeypatch):
    import pyloader.collators._stack as stack

    columns = {k: v for k, v in _array_columns().items()
               if not (isinstance(collator, TorchCollator) and k in ("records", "dates", "deltas"))}  # torch has none
    with pytest.raises(ValueError, match="'zero_d'"):
        collator.collate_batch({"zero_d": np.array(3)})
    fast = collator.collate_batch(dict(columns))
    monkeypatch.setattr(stack, "_as_it_is", lambda column, key, options: False)
    walked = collator.collate_batch(dict(columns))
    assert list(fast) == list(walked)
    for key in walked:
        a, b = fast[key], walked[key]
        assert type(a) is type(b), key
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape and a.strides == b.strides, key
            assert np.array_equal(a, b), key
            if key in columns:  # not a companion: a copy where the walk copies, the column itself where it does not
                assert np.shares_memory(a, columns[key]) == np.shares_memory(b, columns[key]), key
        else:  # torch tensors
            assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and a.equal(b), key
    assert "ragged_declared_mask" in fast  # a declared key still gets its companion


def test_object_array_column_is_stacked():
    column = np.empty(2, dtype=object)
    column[0], column[1] = np.array([1, 2]), np.array([3])
    out = collate({"ids": column})
    check(out["ids"], [[1, 2], [3, 0]], np.int64)
    check(out["ids_mask"], [[True, True], [True, False]], np.bool_)


def test_strings_passed_through():
    words = ["a", "bb", "ccc"]
    nested = [["x", "y"], ["z"], []]
    raw = [b"1", b"2", b"3"]
    arr = np.array(["p", "q", "r"])
    out = collate({"w": words, "n": nested, "raw": raw, "arr": arr, "i": [1, 2, 3]})
    assert out["w"] is words and out["n"] is nested and out["raw"] is raw and out["arr"] is arr
    assert set(out) == {"w", "n", "raw", "arr", "i"}


def test_keys_and_passthrough():
    ids, label, meta = [[1, 2], [3]], [0, 1], [{"a": 1}, None]
    out = collate({"ids": ids, "label": label, "meta": meta}, keys=["ids", "label"], passthrough=["label"])
    assert out["label"] is label and out["meta"] is meta
    check(out["ids"], [[1, 2], [3, 0]], np.int64)
    with pytest.raises(ValueError, match="'missing'"):
        collate({"ids": ids}, keys=["ids", "missing"])


# --- errors ----------------------------------------------------------------


def test_none_item_raises_naming_key():
    with pytest.raises(ValueError, match="'label'"):
        collate({"ids": [[1], [2]], "label": [1, None]})
    with pytest.raises(ValueError, match="'ids'.*None"):
        collate({"ids": [[1, None], [2]]})
    with pytest.raises(ValueError, match="'name'.*None"):
        collate({"name": ["a", None]})


def test_malformed_columns_raise_naming_key():
    with pytest.raises(ValueError, match="'a'.*different depths"):
        collate({"a": [[1, 2], [[3]]]})
    with pytest.raises(ValueError, match="'a'.*mixes sequences and scalars"):
        collate({"a": [[1, [2]], [3]]})
    with pytest.raises(ValueError, match="'a'.*strings"):
        collate({"a": [1, "x"]})
    with pytest.raises(ValueError, match="'b'.*1 items.*'a'.*2"):
        collate({"a": [1, 2], "b": [1]})
    with pytest.raises(ValueError, match="'a'.*clashes"):
        collate({"a": [[1], [1, 2]], "a_mask": [0, 1]})
    with pytest.raises(ValueError, match="'a'.*uint8"):
        collate({"a": [np.array([1], np.uint8), np.array([1, 2], np.uint8)]}, pad_value=-1)


# --- torch -----------------------------------------------------------------


def test_torch_types_and_dtypes():
    import torch

    arr = np.arange(6, dtype=np.float64).reshape(2, 3)
    collator = TorchCollator()
    assert isinstance(collator, DataCollator)
    out = collator.collate_batch({"ids": [[1, 2, 3], [4]], "x": [0.5, 1.5], "b": [True, False], "arr": arr,
                                  "s": ["a", "b"]})
    assert list(out) == ["ids", "ids_mask", "x", "b", "arr", "s"]
    for key, dtype in [("ids", torch.int64), ("ids_mask", torch.bool), ("x", torch.float32), ("b", torch.bool),
                       ("arr", torch.float64)]:
        assert isinstance(out[key], torch.Tensor), key
        assert out[key].dtype == dtype, key
        assert out[key].device.type == "cpu"
    assert out["ids"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert out["ids_mask"].tolist() == [[True, True, True], [True, False, False]]
    assert np.shares_memory(out["arr"].numpy(), arr)  # torch.from_numpy: no copy
    assert out["s"] == ["a", "b"]
    lengths = TorchCollator(pad_info="lengths").collate_batch({"ids": [[1, 2, 3], [4]]})["ids_lengths"]
    assert lengths.dtype == torch.int64 and lengths.tolist() == [3, 1]


def test_torch_handles_negative_strides_and_byte_order():
    import torch

    out = TorchCollator().collate_batch({"rev": np.arange(3)[::-1], "be": np.arange(3, dtype=">i4")})
    assert out["rev"].tolist() == [2, 1, 0]
    assert out["be"].dtype == torch.int32 and out["be"].tolist() == [0, 1, 2]


# --- tensorflow ------------------------------------------------------------


@pytest.fixture(scope="module")
def tf():
    import tensorflow

    return tensorflow


def test_tf_output_types(tf):
    collator = TFCollator(pad_info="lengths")
    out = collator.collate_batch(
        {"ids": [[1, 2, 3], [4]], "x": [0.5, 1.5], "b": [True, False], "arr": np.ones((2, 2), np.float64),
         "s": ["a", "b"]}
    )
    assert list(out) == ["ids", "ids_lengths", "x", "b", "arr", "s"]
    for key, dtype in [
        ("ids", tf.int64),
        ("ids_lengths", tf.int64),
        ("x", tf.float32),
        ("b", tf.bool),
        ("arr", tf.float64),
        ("s", tf.string),
    ]:
        assert isinstance(out[key], tf.Tensor), key
        assert out[key].dtype == dtype, key
    assert out["ids"].numpy().tolist() == [[1, 2, 3], [4, 0, 0]]
    assert out["ids_lengths"].numpy().tolist() == [3, 1]
    assert out["s"].numpy().tolist() == [b"a", b"b"]
    mask = TFCollator().collate_batch({"ids": [[1, 2, 3], [4]]})["ids_mask"]
    assert mask.dtype == tf.bool and mask.numpy().tolist() == [[True, True, True], [True, False, False]]


def test_tf_strings(tf):
    out = TFCollator(passthrough=["ragged"]).collate_batch(
        {"nested": [["x", "y"], ["z", "w"]], "arr": np.array(["p", "q"]), "ragged": [["x"], ["y", "z"]]}
    )
    assert out["nested"].dtype == tf.string and out["nested"].shape == (2, 2)
    assert out["arr"].dtype == tf.string and out["arr"].numpy().tolist() == [b"p", b"q"]
    assert out["ragged"] == [["x"], ["y", "z"]]
    with pytest.raises(ValueError, match="'ragged'"):
        TFCollator().collate_batch({"ragged": [["x"], ["y", "z"]]})


# --- whole groups at once (stream mode) ---------------------------------------


def _as_numpy(value):
    return value if isinstance(value, np.ndarray) else np.asarray(value)


@pytest.mark.parametrize("make", [NumpyCollator, TorchCollator, TFCollator])
@pytest.mark.parametrize("options", [{}, {"passthrough": ["b"]}, {"keys": ["i", "f"]}, {"pad_info": "lengths"}])
def test_collate_stacked_matches_collating_each_batch(make, options):
    rng = np.random.default_rng(0)
    columns = {"i": rng.integers(0, 9, (4, 3, 5)), "f": rng.random((4, 3)).astype(np.float32),
               "b": rng.random((4, 3, 2, 2)) > 0.5, "be": np.arange(12, dtype=">i4").reshape(4, 3)}
    collator = make(**options)
    out = collator.collate_stacked(columns)
    assert out is not None
    for k in range(4):
        each = collator.collate_batch({key: column[k] for key, column in columns.items()})
        assert list(out) == list(each)
        for key, value in each.items():
            assert type(out[key]) is type(value) and out[key].dtype == value.dtype, key
            np.testing.assert_array_equal(_as_numpy(out[key])[k], _as_numpy(value))


class _Doubling(TorchCollator):
    def convert_array(self, key, array):  # not marked row_wise: may depend on the batch axis
        return super().convert_array(key, array * 2)


class _Own(NumpyCollator):
    def collate_batch(self, features):
        return {"n": len(features)}


class _Plain(TorchCollator):
    """Changes nothing: still collated at once."""


@pytest.mark.parametrize("collator,columns", [
    (NumpyCollator(ragged_keys=["i"]), {"i": np.zeros((2, 3, 4))}),  # companions take the leading axes' shape
    (NumpyCollator(), {"i": [[1, 2], [3, 4]]}),  # not an array
    (NumpyCollator(), {"i": np.zeros(3)}),  # no batch axis inside
    (NumpyCollator(), {"s": np.array([["a", "b"], ["c", "d"]])}),  # strings
    (NumpyCollator(), {"o": np.empty((2, 2), dtype=object)}),
    (_Doubling(), {"i": np.zeros((2, 3))}),
    (_Own(), {"i": np.zeros((2, 3))}),
])
def test_collate_stacked_declines_what_could_differ(collator, columns):
    assert collator.collate_stacked(columns) is None


def test_collate_stacked_keeps_subclasses_that_change_nothing():
    out = _Plain().collate_stacked({"i": np.arange(6).reshape(2, 3)})
    assert out is not None and out["i"].tolist() == [[0, 1, 2], [3, 4, 5]]


# --- import cost -----------------------------------------------------------


def test_import_does_not_pull_in_frameworks():
    code = (
        "import sys\n"
        "import pyloader.collators as c\n"
        "c.NumpyCollator().collate_batch({'ids': [[1, 2], [3]]})\n"
        "c.TorchCollator(); c.TFCollator()\n"
        "loaded = sorted(m for m in ('torch', 'tensorflow') if m in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
