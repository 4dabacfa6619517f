"""pyloader inside real training stacks: Lightning's ``Trainer.fit`` (one process, DDP on two CPU
processes, a mid-epoch checkpoint resumed in a new process), Keras ``fit``, and a plain epoch loop."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from conftest import write_chunks

import pyloader as pl

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "lightning_train.py"
SIZES = [7, 5, 9, 4, 6, 8]  # 39 samples


def lightning_run(tmp_path: Path, name: str, *args: str, ranks: int = 1,
                  dropped: Tuple[str, ...] = ()) -> List[Dict[str, Any]]:
    pytest.importorskip("lightning")
    out = tmp_path / name
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", *dropped):
        env.pop(key, None)
    env["MASTER_ADDR"] = "127.0.0.1"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--data", str(tmp_path / "data"), "--out", str(out), *args],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((tmp_path / f"{name}.rank{r}.json").read_text()) for r in range(ranks)]


def by_epoch(seen: List[Dict[str, Any]]) -> Dict[int, List[int]]:
    out: Dict[int, List[int]] = {}
    for step in seen:
        out.setdefault(step["epoch"], []).extend(i for i, pad in zip(step["ids"], step["padding"]) if not pad)
    return out


def test_lightning_fit_trains_every_epoch_in_full_and_reshuffled(tmp_path):
    write_chunks(tmp_path / "data", SIZES)
    [run] = lightning_run(tmp_path, "single", "--epochs", "3")
    epochs = by_epoch(run["seen"])
    assert sorted(epochs) == [0, 1, 2]
    assert all(sorted(ids) == list(range(39)) for ids in epochs.values())
    assert len({tuple(ids) for ids in epochs.values()}) == 3
    assert run["num_training_batches"] == 10  # len(loader), not inf


def test_lightning_fit_with_default_settings_starts_workers_and_places_files_by_measuring(tmp_path):
    # the suite's PYLOADER_NUM_WORKERS=0 is dropped: the user's default, num_workers="auto", decides
    write_chunks(tmp_path / "data", SIZES)
    [run] = lightning_run(tmp_path, "auto", "--epochs", "2", "--workers", "auto", dropped=("PYLOADER_NUM_WORKERS",))
    epochs = by_epoch(run["seen"])
    assert all(sorted(ids) == list(range(39)) for ids in epochs.values()) and sorted(epochs) == [0, 1]
    assert epochs[0] != epochs[1]
    readers = {pid for step in run["seen"] for pid in step["read_by"]}
    placement = run["placement"]
    if len(os.sched_getaffinity(0)) >= 2:  # one worker per CPU (at most 4), each file where it measured faster
        assert placement["num_workers"] >= 2 and "measured" in placement, placement
        in_workers = sum(w["batches"] for w in placement["measured"]["windows"] if w["place"] != "threads")
        assert in_workers == 0 or readers - {run["pid"]}, (readers, placement)  # batches measured there were read there
    else:  # below 2 CPUs the default keeps user code in threads
        assert readers == {run["pid"]} and placement["num_workers"] == 0, placement


def test_lightning_ddp_with_the_loader_built_before_fit_splits_each_epoch_evenly(tmp_path):
    write_chunks(tmp_path / "data", SIZES)
    runs = lightning_run(tmp_path, "ddp", "--epochs", "2", "--devices", "2", "--strategy", "ddp", ranks=2)
    assert len(runs[0]["seen"]) == len(runs[1]["seen"])  # equal steps
    for epoch in (0, 1):
        shares = [by_epoch(run["seen"])[epoch] for run in runs]
        assert not set(shares[0]) & set(shares[1])  # disjoint
        assert sorted(shares[0] + shares[1]) == list(range(39))  # complete


def test_a_lightning_checkpoint_taken_mid_epoch_resumes_with_exactly_the_next_batches(tmp_path):
    write_chunks(tmp_path / "data", SIZES)
    [full] = lightning_run(tmp_path, "full", "--epochs", "2", "--ckpt-every", "3", "--ckpt-dir", str(tmp_path / "ckpt"))
    steps = [s["ids"] for s in full["seen"]]
    assert len(steps) == 20
    at = (3, 12)  # inside the first epoch, and inside the second: both fits in one process, one after the other
    lightning_run(tmp_path, "resumed", "--epochs", "2", "--resume", *(str(tmp_path / "ckpt" / f"step={k}.ckpt")
                                                                      for k in at), ranks=0)
    for i, k in enumerate(at):
        resumed = json.loads((tmp_path / f"resumed.{i}.rank0.json").read_text())
        assert [s["ids"] for s in resumed["seen"]] == steps[k:], f"resumed at step {k}"


def write_jsonl(folder: Path, n_files: int, per_file: int) -> None:
    folder.mkdir(parents=True)
    for k in range(n_files):
        rows = [{"id": i, "x": [float(i), 1.0], "y": float(i % 2)} for i in range(k * per_file, (k + 1) * per_file)]
        (folder / f"part-{k:03d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


class RecordIds(pl.Dataset):
    def __init__(self) -> None:
        self.ids: List[int] = []

    def batch_encode(self, batch_data):
        self.ids.extend(batch_data["id"])
        return batch_data


def test_keras_fit_runs_every_epoch_in_full_and_reshuffled_without_running_out_of_data(tmp_path):
    tf = pytest.importorskip("tensorflow")
    import warnings

    from pyloader.collators import NumpyCollator
    from pyloader.readers import JsonLinesReader

    write_jsonl(tmp_path / "data", 6, 7)
    dataset = RecordIds()
    loader = pl.DataLoader(JsonLinesReader(batch_size=5, shuffle=True), dataset, NumpyCollator(),
                           str(tmp_path / "data"), shuffle=True)
    ds = loader.to_tf_dataset().map(lambda b: (b["x"], b["y"]))
    assert int(ds.cardinality()) == 9
    dataset.ids.clear()  # the signature's look ahead
    per_epoch: List[List[int]] = []

    class Snapshot(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            per_epoch.append(list(dataset.ids))
            dataset.ids.clear()

    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(ds, epochs=3, verbose=0, callbacks=[Snapshot()])
    assert not [w for w in caught if "ran out of data" in str(w.message)]
    assert len(history.history["loss"]) == 3
    assert all(sorted(ids) == list(range(42)) for ids in per_epoch)
    assert len({tuple(ids) for ids in per_epoch}) == 3
    loader.close()


class PadToLongest(pl.DataCollator):
    """Pads ``tokens`` to the longest row of each batch, with no mask: a field whose width varies."""

    def collate_batch(self, features):
        import numpy as np

        width = max(len(t) for t in features["tokens"])
        return {"tokens": np.array([t + [0] * (width - len(t)) for t in features["tokens"]], dtype=np.int64)}


def tokens_data(folder: Path, widths: List[int]) -> None:
    folder.mkdir(parents=True)
    (folder / "a.jsonl").write_text("".join(json.dumps({"tokens": [1] * w}) + "\n" for w in widths))


def test_a_field_that_widens_after_the_first_batches_gets_an_error_saying_what_to_pass(tmp_path):
    tf = pytest.importorskip("tensorflow")
    from pyloader.readers import JsonLinesReader

    tokens_data(tmp_path / "data", [3] * 40 + [5] * 4)  # 10 batches of width 3, then one of width 5
    loader = pl.DataLoader(JsonLinesReader(batch_size=4), pl.IdentityDataset(), PadToLongest(), str(tmp_path / "data"))
    ds = loader.to_tf_dataset()
    with pytest.raises(Exception, match=r"tokens.*output_signature=\{'tokens': tf.TensorSpec\(\[None, None\]"):
        list(ds)
    loose = loader.to_tf_dataset(output_signature={"tokens": tf.TensorSpec([None, None], tf.int64)})
    assert [b["tokens"].shape[1] for b in loose][-1] == 5


def test_a_field_whose_width_varies_within_the_first_batches_is_inferred_as_unknown(tmp_path):
    tf = pytest.importorskip("tensorflow")
    from pyloader.readers import JsonLinesReader

    tokens_data(tmp_path / "data", [2, 2, 2, 2, 6, 6, 6, 6, 3, 3, 3, 3])
    loader = pl.DataLoader(JsonLinesReader(batch_size=4), pl.IdentityDataset(), PadToLongest(), str(tmp_path / "data"))
    ds = loader.to_tf_dataset()
    assert ds.element_spec["tokens"].shape.as_list() == [None, None]
    assert [b["tokens"].shape[1] for b in ds] == [2, 6, 3]
    del tf


def test_tqdm_shows_the_total_from_len(tmp_path):
    tqdm = pytest.importorskip("tqdm")
    write_chunks(tmp_path / "data", SIZES)
    from conftest import IdReader, ListCollator

    loader = pl.DataLoader(IdReader(4), pl.IdentityDataset(), ListCollator(), str(tmp_path / "data"))
    bar = tqdm.tqdm(loader, disable=True)
    assert bar.total == 10
    assert sum(1 for _ in bar) == 10
