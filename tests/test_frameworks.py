"""PyTorch and TensorFlow 2 on the receiving end of the loader."""
from __future__ import annotations

import json
import logging
import warnings

import numpy as np
import pytest

import pyloader as pl
from pyloader.collators import NumpyCollator, TFCollator, TorchCollator
from pyloader.readers import JsonLinesReader

pytestmark = pytest.mark.timeout(180)


def write_jsonl(folder, files=4, rows=50, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        with open(folder / f"chunk-{i}.jsonl", "w") as f:
            for j in range(rows):
                x = rng.normal(size=4).round(3).tolist()
                n = int(rng.integers(1, 6))
                f.write(json.dumps({"x": x, "y": int(x[0] > 0), "tokens": list(range(n)), "id": i * rows + j}) + "\n")
    return str(folder)


class Encode(pl.Dataset):
    def batch_encode(self, batch):
        return {"x": batch["x"], "y": batch["y"], "tokens": batch["tokens"], "id": batch["id"]}


# -- PyTorch ---------------------------------------------------------------------------
def test_torch_training_loop(tmp_path):
    import torch

    data = write_jsonl(tmp_path)
    loader = pl.DataLoader(JsonLinesReader(16, shuffle=True), Encode(), TorchCollator(), data,
                           num_epoch=8, shuffle=True, shuffle_buffer=32)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for batch in loader:
        assert batch["x"].dtype == torch.float32 and batch["y"].dtype == torch.int64
        assert batch["tokens"].shape[0] == batch["tokens_mask"].shape[0] == len(batch["y"])
        loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert len(losses) == 8 * 13  # 200 samples: 12 full batches and one of 8, per epoch
    assert np.mean(losses[-10:]) < np.mean(losses[:10])


def test_a_stacked_torch_tensor_is_split_into_views_of_its_memory():
    import torch

    from pyloader._frameworks.torch import unstack

    stacked = torch.arange(24, dtype=torch.float32).reshape(4, 3, 2)
    parts = unstack(stacked)
    assert len(parts) == 4 and all(type(p) is torch.Tensor and p.shape == (3, 2) for p in parts)
    assert [p.tolist() for p in parts] == stacked.tolist()
    parts[2][0, 0] = -1.0  # views: the group's memory, nothing copied
    assert stacked[2, 0, 0] == -1.0
    assert [a.tolist() for a in unstack(np.arange(6).reshape(3, 2))] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(TypeError, match="cannot split"):
        unstack([1, 2])


def test_device_cpu_moves_batches(tmp_path):
    import torch

    loader = pl.DataLoader(JsonLinesReader(16), Encode(), TorchCollator(), write_jsonl(tmp_path), device="cpu")
    batch = next(iter(loader))
    loader.close()
    assert batch["x"].device == torch.device("cpu")


def test_pin_memory_without_cuda_warns_and_delivers(tmp_path, caplog):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this checks the no-accelerator path; test_pin_memory_on_cuda covers CUDA")
    with caplog.at_level(logging.WARNING, logger="pyloader"):
        loader = pl.DataLoader(JsonLinesReader(16), Encode(), TorchCollator(), write_jsonl(tmp_path), pin_memory=True)
    assert any("pin_memory" in r.getMessage() for r in caplog.records)
    assert sorted(int(i) for b in loader for i in b["id"]) == list(range(200))


def test_pin_memory_on_cuda(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    loader = pl.DataLoader(JsonLinesReader(16), Encode(), TorchCollator(), write_jsonl(tmp_path),
                           pin_memory=True, device="cuda")
    for batch in loader:
        assert batch["x"].is_cuda and batch["y"].is_cuda
    loader = pl.DataLoader(JsonLinesReader(16), Encode(), TorchCollator(), write_jsonl(tmp_path), pin_memory=True)
    assert all(b["x"].is_pinned() for b in loader)


# -- TensorFlow 2 ------------------------------------------------------------------------
def test_to_tf_dataset_infers_the_signature(tmp_path):
    import tensorflow as tf

    loader = pl.DataLoader(JsonLinesReader(16), Encode(), NumpyCollator(), write_jsonl(tmp_path))
    ds = loader.to_tf_dataset()
    spec = ds.element_spec
    assert spec["x"].shape.as_list() == [None, 4] and spec["x"].dtype == tf.float32
    assert spec["tokens"].shape.as_list() == [None, None] and spec["tokens_mask"].dtype == tf.bool
    ids = sorted(int(i) for batch in ds for i in batch["id"].numpy())
    assert ids == list(range(200))
    assert sorted(int(i) for batch in ds for i in batch["id"].numpy()) == ids  # re-iterable


class FixedWidth(pl.DataCollator):
    """Every batch ``[B, 60]``, as a tokenizer padding to a fixed length gives: fields named like padding
    companions (``attention_mask``; ``ids`` with ``ids_mask``) whose shapes never change."""

    def collate_batch(self, features):
        n = len(features["id"])
        ids = np.tile(np.arange(60), (n, 1))
        return {"ids": ids, "ids_mask": np.ones((n, 60), dtype=bool), "attention_mask": (ids < 30).astype(np.int64),
                "id": np.asarray(features["id"])}


def test_to_tf_dataset_takes_shapes_from_the_data_not_from_field_names(tmp_path):
    loader = pl.DataLoader(JsonLinesReader(16), Encode(), FixedWidth(), write_jsonl(tmp_path), num_workers=0)
    spec = loader.to_tf_dataset().element_spec
    assert {k: v.shape.as_list() for k, v in spec.items()} == {
        "ids": [None, 60], "ids_mask": [None, 60], "attention_mask": [None, 60], "id": [None]}
    padded = pl.DataLoader(JsonLinesReader(16), Encode(), NumpyCollator(ragged_keys=["tokens"]),
                           write_jsonl(tmp_path / "one", files=1, rows=16), num_workers=0)
    spec = padded.to_tf_dataset().element_spec  # one batch, padded: its mask says so
    assert spec["tokens"].shape.as_list() == [None, None] and spec["tokens_mask"].shape.as_list() == [None, None]


class XY(pl.DataCollator):
    def collate_batch(self, features):
        return np.asarray(features["x"], dtype=np.float32), np.asarray(features["y"])


def test_to_tf_dataset_takes_batches_that_are_not_dicts_given_their_signature(tmp_path):
    import tensorflow as tf

    loader = pl.DataLoader(JsonLinesReader(16), Encode(), XY(), write_jsonl(tmp_path), num_workers=0)
    with pytest.raises(TypeError, match="pass output_signature="):
        loader.to_tf_dataset()
    ds = loader.to_tf_dataset(output_signature=(tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([None], tf.int64)))
    assert sum(int(y.shape[0]) for _, y in ds) == 200


def test_model_fit_on_the_dataset(tmp_path):
    import tensorflow as tf

    loader = pl.DataLoader(JsonLinesReader(16, shuffle=True), Encode(), TFCollator(), write_jsonl(tmp_path),
                           shuffle=True)
    ds = loader.to_tf_dataset().map(lambda b: (b["x"], b["y"]))
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.5),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # keras: a generator's length is unknown
        history = model.fit(ds, epochs=4, verbose=0)
    assert len(history.history["loss"]) == 4
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_plain_from_generator_wrapping(tmp_path):
    import tensorflow as tf

    loader = pl.DataLoader(JsonLinesReader(16), Encode(), NumpyCollator(), write_jsonl(tmp_path))
    signature = {"x": tf.TensorSpec([None, 4], tf.float32), "y": tf.TensorSpec([None], tf.int64),
                 "tokens": tf.TensorSpec([None, None], tf.int64), "tokens_mask": tf.TensorSpec([None, None], tf.bool),
                 "id": tf.TensorSpec([None], tf.int64)}
    ds = tf.data.Dataset.from_generator(lambda: iter(loader), output_signature=signature)
    assert sum(int(b["y"].shape[0]) for b in ds) == 200
    assert loader.to_tf_dataset(output_signature=signature).element_spec == signature
