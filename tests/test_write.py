"""``pyloader.write`` and ``python -m pyloader write``: every input kind and format, read back by the
built-in readers; executors; append and merge; atomic chunks under SIGKILL; the index of counts."""
from __future__ import annotations

import concurrent.futures as cf
import gzip
import json
import logging
import os
import pickle
import random
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from multiprocessing.pool import ThreadPool
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
from conftest import ListCollator

import pyloader as pl
from pyloader import _cli
from pyloader._storage import count_index as ix
from pyloader._write import api, formats, output
from pyloader.readers import JsonLinesReader, NumpyReader, ParquetReader, TarReader, TextLinesReader

pytestmark = pytest.mark.timeout(120)


def docs(n: int, start: int = 0) -> List[Dict[str, object]]:
    return [{"id": i, "text": f"doc {i}"} for i in range(start, start + n)]


def tokenize(sample: dict) -> dict:
    """A user function for worker processes (importable from here)."""
    return {"id": sample["id"], "tokens": [len(w) for w in str(sample["text"]).split()]}


def split_even(sample: dict) -> object:
    """Two samples of an even id, none of an odd one."""
    i = int(sample["id"])
    return None if i % 2 else [{"id": 10 * i}, {"id": 10 * i + 1}]


def read_back(folder: str, reader: pl.DataReader) -> List[Dict[str, object]]:
    """Every sample of ``folder`` as the loader gives it, in order."""
    loader = pl.DataLoader(reader, pl.IdentityDataset(), ListCollator(), folder, num_workers=0)
    rows = []
    for batch in loader:
        names = list(batch)
        rows.extend(dict(zip(names, values)) for values in zip(*batch.values()))
    return rows


def ids(rows: List[Dict[str, object]]) -> List[int]:
    return [int(r["id"]) for r in rows]  # type: ignore[call-overload]


def chunk_names(folder: Path) -> List[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith((".", "_")))


FORMATS = [("jsonl", None, JsonLinesReader), ("jsonl", "gzip", JsonLinesReader), ("jsonl", "zstd", JsonLinesReader),
           ("parquet", "zstd", None), ("tar", None, TarReader), ("tar", "gzip", TarReader)]


@pytest.mark.parametrize("format,compression,reader_cls", FORMATS,
                         ids=[f"{f}-{c}" for f, c, _ in FORMATS])
def test_each_format_reads_back_every_sample_exactly_once_with_its_built_in_reader(tmp_path, format, compression,
                                                                                   reader_cls):
    reader_cls = reader_cls or ParquetReader
    summary = pl.write(source=docs(100), output=tmp_path / "out", format=format, compression=compression,
                       chunk_samples=30, workers=0)
    assert (summary.samples, summary.chunks) == (100, 4)
    names = chunk_names(tmp_path / "out")
    assert names == [f"shard-{k:06d}{names[0][len('shard-000000'):]}" for k in range(4)]
    rows = read_back(str(tmp_path / "out"), reader_cls(batch_size=7))
    assert ids(rows) == list(range(100))
    text = [r["text"] if isinstance(r["text"], str) else r["text"].decode() for r in rows]
    assert text == [f"doc {i}" for i in range(100)]


def test_npy_and_npz_chunks_stack_array_samples_read_back_by_the_numpy_reader(tmp_path):
    arrays = [{"x": np.full(3, i, dtype=np.int32)} for i in range(50)]
    pl.write(source=arrays, output=tmp_path / "npy", format="npy", compression="gzip", chunk_samples=20, workers=0)
    assert chunk_names(tmp_path / "npy") == ["shard-000000.npy.gz", "shard-000001.npy.gz", "shard-000002.npy.gz"]
    rows = read_back(str(tmp_path / "npy"), NumpyReader(batch_size=8))
    assert [int(r["x"][0]) for r in rows] == list(range(50))
    pairs = [{"a": np.arange(2) + i, "b": i} for i in range(10)]
    pl.write(source=pairs, output=tmp_path / "npz", format="npz", chunk_samples=4, workers=0)
    rows = read_back(str(tmp_path / "npz"), NumpyReader(batch_size=3))
    assert [int(r["b"]) for r in rows] == list(range(10))
    assert [int(r["a"][1]) for r in rows] == [i + 1 for i in range(10)]


def test_npy_refuses_samples_of_several_fields_naming_npz(tmp_path):
    with pytest.raises(ValueError, match="npz"):
        pl.write(source=[{"a": 1, "b": 2}], output=tmp_path / "out", format="npy", workers=0)


def test_a_parquet_chunk_is_written_in_row_groups_of_about_a_mebibyte_each_a_piece_the_reader_reads(tmp_path):
    import pyarrow.parquet as pq

    rows = [{"id": i, "text": f"{i:08d}" * 250} for i in range(2000)]  # 2 kB a row: 4 MB in one chunk
    summary = pl.write(source=rows, output=tmp_path / "out", format="parquet", chunk_samples=2000, workers=0)
    assert summary.chunks == 1
    chunk = pq.ParquetFile(str(tmp_path / "out" / "shard-000000.parquet"))
    groups = [chunk.read_row_group(g) for g in range(chunk.num_row_groups)]
    assert chunk.num_row_groups >= 4 and all(g.nbytes <= 1.1 * formats.ROW_GROUP_BYTES for g in groups)
    pieces = list(ParquetReader().iter_file(str(tmp_path / "out" / "shard-000000.parquet")))
    assert len(pieces) == chunk.num_row_groups
    assert [i for piece in pieces for i in piece["id"]] == list(range(2000))


def test_chunk_bytes_cuts_chunks_at_the_target_size_before_compression(tmp_path):
    summary = pl.write(source=iter(docs(1000)), output=tmp_path / "out", chunk_bytes=4000, workers=0)
    sizes = [os.path.getsize(tmp_path / "out" / n) for n in chunk_names(tmp_path / "out")]
    assert summary.chunks == len(sizes) > 5 and summary.bytes == sum(sizes)
    assert all(s < 4000 + 100 for s in sizes)  # closed at the first sample reaching the target
    assert sum(s >= 4000 for s in sizes) >= len(sizes) // 2  # most chunks are full: parts are sized to fit
    assert ids(read_back(str(tmp_path / "out"), JsonLinesReader())) == list(range(1000))


def test_a_small_input_of_known_size_is_cut_into_parts_enough_for_the_workers(tmp_path):
    summary = pl.write(source=docs(3200), output=tmp_path / "out", workers=0)  # 64 MiB chunks by default
    assert summary.chunks == api.MIN_PARTS
    assert ids(read_back(str(tmp_path / "out"), JsonLinesReader())) == list(range(3200))
    tiny = pl.write(source=docs(100), output=tmp_path / "tiny", workers=0)
    assert tiny.chunks == 2  # parts of 64 samples at least


def test_the_rest_of_an_input_of_known_size_is_cut_into_an_even_number_of_parts_of_equal_size(tmp_path):
    pl.write(source=docs(3250), output=tmp_path / "out", workers=0)  # 2 first parts of 102, then 3046 left
    counts = json.loads((tmp_path / "out" / ix.INDEX_NAME).read_text())["files"]
    sizes = [counts[name]["count"] for name in sorted(counts)]
    assert sum(sizes) == 3250 and sizes[:2] == [102, 102]
    assert len(sizes[2:]) % 2 == 0 and max(sizes[2:]) - min(sizes[2:]) <= 1 and max(sizes[2:]) <= 102


def test_the_index_of_counts_is_the_one_the_index_command_writes(tmp_path):
    pl.write(source=docs(40), output=tmp_path / "out", chunk_samples=15, workers=0)
    written = json.loads((tmp_path / "out" / ix.INDEX_NAME).read_text())
    assert {name: e["count"] for name, e in written["files"].items()} == \
        {"shard-000000.jsonl": 15, "shard-000001.jsonl": 15, "shard-000002.jsonl": 10}
    (tmp_path / "out" / ix.INDEX_NAME).unlink()
    assert _cli.main(["index", str(tmp_path / "out"), "--reader", "jsonl"], out=lambda line: None) == 0
    again = json.loads((tmp_path / "out" / ix.INDEX_NAME).read_text())
    assert again["key"] == written["key"] and again["files"] == written["files"]


@pytest.mark.parametrize("format", ["tar", "jsonl"])
def test_the_index_takes_the_counts_of_the_chunks_written_and_counts_only_those_of_an_earlier_run(
        tmp_path, format, caplog):
    pl.write(source=docs(40), output=tmp_path / "out", chunk_samples=15, workers=0, format=format, index=False)
    with caplog.at_level(logging.INFO, logger="pyloader"):
        pl.write(source=docs(20), output=tmp_path / "out", chunk_samples=15, workers=0, format=format,
                 mode="append")
    said = [r.getMessage() for r in caplog.records if "from the index there" in r.getMessage()]
    assert len(said) == 1 and "2 from the index there, 3 counted" in said[0], said  # the earlier run's 3 chunks
    written = json.loads((tmp_path / "out" / ix.INDEX_NAME).read_text())["files"]
    assert [written[n]["count"] for n in sorted(written)] == [15, 15, 10, 15, 5]
    (tmp_path / "out" / ix.INDEX_NAME).unlink()
    assert _cli.main(["index", str(tmp_path / "out"), "--reader", format], out=lambda line: None) == 0
    assert json.loads((tmp_path / "out" / ix.INDEX_NAME).read_text())["files"] == written


def test_fn_may_return_a_list_of_samples_or_none_to_drop_one(tmp_path):
    summary = pl.write(source=docs(10), output=tmp_path / "out", fn=split_even, workers=0)
    assert summary.samples == 10
    assert ids(read_back(str(tmp_path / "out"), JsonLinesReader())) == [0, 1, 20, 21, 40, 41, 60, 61, 80, 81]


def test_a_failing_fn_keeps_its_type_and_names_the_sample_and_leaves_no_temporary_file(tmp_path):
    def bad(sample):
        if sample["id"] == 7:
            raise KeyError("no such token")
        return sample

    with pytest.raises(KeyError) as caught:
        pl.write(source=docs(20), output=tmp_path / "out", fn=bad, chunk_samples=5, workers=0)
    assert any("sample 2 of samples 5-9 of the input" in note for note in caught.value.__notes__)
    assert not [n for n in os.listdir(tmp_path / "out") if n.startswith(".")]
    assert chunk_names(tmp_path / "out") == ["shard-000000.jsonl"]  # the chunk before it, whole


def test_worker_processes_give_the_same_chunks_as_one_process(tmp_path):
    pl.write(source=docs(300), output=tmp_path / "one", fn=tokenize, chunk_bytes=2000, workers=0)
    pl.write(source=docs(300), output=tmp_path / "two", fn=tokenize, chunk_bytes=2000, workers=2)
    names = chunk_names(tmp_path / "one")
    assert names == chunk_names(tmp_path / "two") and len(names) > 3
    assert all((tmp_path / "one" / n).read_bytes() == (tmp_path / "two" / n).read_bytes() for n in names)


def test_a_function_worker_processes_cannot_get_is_refused_before_they_start_saying_what_to_do(tmp_path):
    with pytest.raises((AttributeError, pickle.PicklingError)) as caught:  # pickle's own, by Python version
        pl.write(source=docs(5), output=tmp_path / "out", fn=lambda s: s, workers=2)
    assert any("workers=0" in note for note in caught.value.__notes__)
    assert chunk_names(tmp_path / "out") == []


def test_a_users_executor_and_an_apply_async_pool_give_the_same_dataset(tmp_path):
    pl.write(source=docs(200), output=tmp_path / "one", format="tar", compression="gzip", chunk_samples=30, workers=0)
    with cf.ThreadPoolExecutor(3) as executor:
        pl.write(source=docs(200), output=tmp_path / "threads", format="tar", compression="gzip", chunk_samples=30,
                 executor=executor)
    with ThreadPool(2) as pool:
        pl.write(source=docs(200), output=tmp_path / "pool", format="tar", compression="gzip", chunk_samples=30,
                 executor=pool)
    for other in ("threads", "pool"):
        names = chunk_names(tmp_path / "one")
        assert names == chunk_names(tmp_path / other)
        assert all((tmp_path / "one" / n).read_bytes() == (tmp_path / other / n).read_bytes()
                   for n in names if n.endswith(".gz"))


def test_a_dask_local_cluster_writes_the_same_dataset_as_a_local_run(tmp_path):
    distributed = pytest.importorskip("distributed")
    pl.write(source=docs(120), output=tmp_path / "local", fn=tokenize, chunk_samples=25, workers=0)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) \
            as cluster, distributed.Client(cluster) as client:
        summary = pl.write(source=docs(120), output=tmp_path / "dask", fn=tokenize, chunk_samples=25,
                           executor=client.get_executor())
    assert summary.samples == 120
    names = chunk_names(tmp_path / "local")
    assert names == chunk_names(tmp_path / "dask")
    assert all((tmp_path / "local" / n).read_bytes() == (tmp_path / "dask" / n).read_bytes() for n in names)


def test_a_ray_pool_writes_the_dataset_when_ray_is_installed(tmp_path):
    ray = pytest.importorskip("ray", reason="ray is in the bench extra only")
    from ray.util.multiprocessing import Pool

    ray.init(num_cpus=1, include_dashboard=False)
    try:
        with Pool(1) as pool:
            summary = pl.write(source=docs(50), output=tmp_path / "ray", chunk_samples=20, executor=pool)
    finally:
        ray.shutdown()
    assert summary.chunks == 3 and ids(read_back(str(tmp_path / "ray"), JsonLinesReader())) == list(range(50))


class Indexed:
    """A HF ``Dataset`` stand-in: ``__len__`` and ``__getitem__`` giving dicts."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"id": i, "text": f"doc {i}"}


def test_an_object_with_len_and_getitem_is_read_by_index_in_the_tasks(tmp_path):
    summary = pl.write(source=Indexed(70), output=tmp_path / "out", chunk_samples=32, workers=0)
    assert (summary.samples, summary.chunks) == (70, 3)
    assert ids(read_back(str(tmp_path / "out"), JsonLinesReader())) == list(range(70))


class Unpicklable(Indexed):
    """An object read by index that cannot go to a task (it holds a lock)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.lock = threading.Lock()


def test_an_object_read_by_index_that_cannot_travel_is_read_here_into_the_same_chunks(tmp_path):
    from pyloader._write.sources import source_of

    assert source_of(Indexed(5)).kind == "indexed" and source_of(Unpicklable(5)).kind == "samples"
    pl.write(source=Indexed(150), output=tmp_path / "by_index", workers=0)
    pl.write(source=Unpicklable(150), output=tmp_path / "here", workers=0)
    names = chunk_names(tmp_path / "here")
    assert names == chunk_names(tmp_path / "by_index") and len(names) == 3
    assert all((tmp_path / "here" / n).read_bytes() == (tmp_path / "by_index" / n).read_bytes() for n in names)


def test_a_hugging_face_dataset_is_written_when_datasets_is_installed(tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets is in the bench extra only")
    ds = datasets.Dataset.from_dict({"id": list(range(30)), "text": [f"doc {i}" for i in range(30)]})
    pl.write(source=ds, output=tmp_path / "out", format="parquet", chunk_samples=16, workers=0)

    assert ids(read_back(str(tmp_path / "out"), ParquetReader())) == list(range(30))


def test_a_folder_of_files_makes_one_sample_per_key_and_a_tar_dataset_of_it(tmp_path):
    src = tmp_path / "images" / "train"
    src.mkdir(parents=True)
    sizes = [0, 1, 2, 3 * 2**20 + 1, *range(5, 13)]  # empty, one byte, one of several MiB: each read whole
    for i, size in enumerate(sizes):
        (src / f"{i:03d}.bin").write_bytes(bytes([i]) * size)
        (src / f"{i:03d}.cls").write_text(str(i % 3))
    (src / ".hidden").write_text("skipped")
    pl.write(source=tmp_path / "images", output=tmp_path / "shards", format="tar", chunk_samples=5, workers=0)
    rows = read_back(str(tmp_path / "shards"), TarReader(batch_size=4))
    assert [r["__key__"] for r in rows] == [f"train/{i:03d}" for i in range(12)]
    assert [r["cls"] for r in rows] == [i % 3 for i in range(12)]
    assert [r["bin"] for r in rows] == [bytes([i]) * size for i, size in enumerate(sizes)]


def test_a_folder_of_files_behind_an_fsspec_url_is_read_like_a_local_one(tmp_path):
    import fsspec

    url = f"memory://pyloader-write-src/{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    for i in range(6):
        fs.pipe_file(f"{url}/{i:03d}.bin", bytes([i]) * i)
        fs.pipe_file(f"{url}/{i:03d}.cls", str(i).encode())
    pl.write(source=url, output=tmp_path / "shards", format="tar", workers=0)
    rows = read_back(str(tmp_path / "shards"), TarReader(batch_size=4))
    assert [(r["__key__"], r["bin"], r["cls"]) for r in rows] == [(f"{i:03d}", bytes([i]) * i, i) for i in range(6)]


def test_parquet_csv_and_jsonl_datasets_are_read_row_by_row_and_merged_in_order(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a").mkdir()
    pq.write_table(pa.table({"id": list(range(10)), "text": [f"doc {i}" for i in range(10)]}),
                   tmp_path / "a" / "part-0.parquet")
    (tmp_path / "b.csv").write_text("id,text\n" + "".join(f"{i},doc {i}\n" for i in range(10, 15)))
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs(5, start=15))
    fix = lambda s: {"id": int(s["id"]), "text": s["text"]}  # noqa: E731  (CSV's values are strings)
    summary = pl.write(source=[str(tmp_path / "a"), str(tmp_path / "b.csv"), str(tmp_path / "c.jsonl.gz")],
                       output=tmp_path / "out", fn=fix, workers=0)
    assert summary.samples == 20
    assert ids(read_back(str(tmp_path / "out"), JsonLinesReader())) == list(range(20))


def test_append_continues_the_numbers_and_merges_datasets(tmp_path):
    pl.write(source=docs(25), output=tmp_path / "a", chunk_samples=10, workers=0)
    pl.write(source=docs(15, start=25), output=tmp_path / "b", chunk_samples=10, workers=0)
    pl.write(source=str(tmp_path / "a"), output=tmp_path / "merged", chunk_samples=10, workers=0)
    with pytest.raises(FileExistsError, match="mode='append'"):
        pl.write(source=str(tmp_path / "b"), output=tmp_path / "merged", workers=0)
    pl.write(source=str(tmp_path / "b"), output=tmp_path / "merged", chunk_samples=10, workers=0, mode="append")
    assert chunk_names(tmp_path / "merged") == [f"shard-{k:06d}.jsonl" for k in range(5)]
    counts = json.loads((tmp_path / "merged" / ix.INDEX_NAME).read_text())["files"]
    assert sum(e["count"] for e in counts.values()) == 40 and len(counts) == 5
    assert ids(read_back(str(tmp_path / "merged"), JsonLinesReader())) == list(range(40))
    with pytest.raises(ValueError, match="another format"):
        pl.write(source=docs(3), output=tmp_path / "merged", workers=0, mode="append", compression="gzip")
    pl.write(source=docs(3), output=tmp_path / "merged", workers=0, mode="overwrite")
    assert chunk_names(tmp_path / "merged") == ["shard-000000.jsonl"]


def test_an_fsspec_url_is_written_and_read_back(tmp_path):
    url = f"memory://pyloader-write/{uuid.uuid4().hex}"
    summary = pl.write(source=docs(50), output=url, chunk_samples=20, workers=0, compression="gzip")
    assert summary.chunks == 3
    rows = read_back(url, JsonLinesReader())
    assert ids(rows) == list(range(50))
    import fsspec

    fs = fsspec.filesystem("memory")
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(url, detail=False)) == \
        [ix.INDEX_NAME, "shard-000000.jsonl.gz", "shard-000001.jsonl.gz", "shard-000002.jsonl.gz"]


PARENTS = """
import glob, json, os, sys, threading
import pyloader as pl

def parent(sample):
    return {**sample, "parent": os.getppid()}

if __name__ == "__main__":
    stop = threading.Event()
    if sys.argv[2] == "with-a-thread":
        threading.Thread(target=stop.wait, name="uploader").start()
    pl.write(source=({"id": i} for i in range(300)), output=sys.argv[1], fn=parent, chunk_samples=100, workers=2)
    stop.set()
    parents = {json.loads(line)["parent"] for f in glob.glob(sys.argv[1] + "/*.jsonl") for line in open(f)}
    print("FORKED" if parents == {os.getpid()} else "SERVED" if os.getpid() not in parents else "MIXED")
"""


@pytest.mark.parametrize("threads,expected", [("alone", "FORKED"), ("with-a-thread", "SERVED")])
def test_the_workers_are_forked_from_a_process_with_no_other_thread_else_started_by_the_fork_server(
        tmp_path, threads, expected):
    script = tmp_path / "parents.py"
    script.write_text(PARENTS)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "out"), threads], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == expected


INTERACTIVE = """
import json, os, threading, warnings
import pyloader as pl
from pyloader.collators import NumpyCollator
from pyloader.readers import JsonLinesReader

def parent(sample):
    return {**sample, "parent": os.getppid()}

out = OUT
stop = threading.Event()
threading.Thread(target=stop.wait, name="uploader").start()
try:
    if BUSY:  # a loader mid-iteration: pyloader's own threads run, forking is unsafe
        pl.write(source=[{"id": i} for i in range(10000)], output=out + "-in", workers=0)
        loader = pl.DataLoader(JsonLinesReader(batch_size=2), pl.IdentityDataset(), NumpyCollator(), out + "-in",
                               num_workers=0)
        batches = iter(loader)
        next(batches)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            pl.write(source=[{"id": i} for i in range(300)], output=out, fn=parent, chunk_samples=100, workers=2)
        except Exception as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        else:
            parents = {json.loads(line)["parent"] for f in sorted(os.listdir(out)) if f.endswith(".jsonl")
                       for line in open(os.path.join(out, f))}
            print(json.dumps({"forked": parents == {os.getpid()}, "warnings": [str(w.message) for w in caught
                              if issubclass(w.category, RuntimeWarning)]}))
finally:
    stop.set()
"""


@pytest.mark.parametrize("busy", [False, True], ids=["user-threads", "a-loader-running"])
def test_a_notebooks_function_is_run_by_forked_workers_beside_other_threads_or_refused_saying_what_to_do(
        tmp_path, busy):
    code = INTERACTIVE.replace("OUT", repr(str(tmp_path / "out"))).replace("BUSY", str(busy))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    if busy:  # no BrokenProcessPool from workers that cannot find fn: a clear error before any starts
        assert result["error"] == "PicklingError" and "interactive session" in result["message"]
        assert "workers=0" in result["message"] and "threads of another pyloader iteration" in result["message"]
        assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.jsonl"))
    else:
        assert result["forked"] is True
        assert any("uploader" in w and "interactive session" in w for w in result["warnings"])


NOTEBOOK_CELLS = [
    "import json, os, warnings\nimport pyloader as pl",
    "def parent(sample):\n    return {**sample, 'parent': os.getppid()}",
    "with warnings.catch_warnings(record=True) as caught:\n    warnings.simplefilter('always')\n"
    "    pl.write(source=[{'id': i} for i in range(300)], output=OUT, fn=parent, chunk_samples=100, workers=2)\n"
    "parents = {json.loads(line)['parent'] for f in sorted(os.listdir(OUT)) if f.endswith('.jsonl')\n"
    "           for line in open(os.path.join(OUT, f))}\n"
    "print(json.dumps({'forked': parents == {os.getpid()}, 'warned': [str(w.message) for w in caught]}))",
]


def test_a_function_defined_in_a_jupyter_notebook_is_written_by_worker_processes(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(c.replace("OUT", repr(str(tmp_path / "out")))) for c in NOTEBOOK_CELLS]
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    NotebookClient(notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}},
                   kernel_manager_kwargs={"env": {**os.environ, **env}}).execute()
    printed = [o["text"] for o in notebook.cells[-1].outputs if o.get("name") == "stdout"]
    result = json.loads("".join(printed).splitlines()[-1])
    assert result["forked"] is True  # a kernel always runs threads: the fork server could not import parent
    assert any("interactive session" in w and "IOPub" in w for w in result["warned"])
    assert ids(read_back(str(tmp_path / "out"), JsonLinesReader())) == list(range(300))


# A process that imports pyloader once, then for each line read forks a writer (it has no thread
# of its own: the fork is safe), prints the writer's pid, and reaps it once it is killed.
FORKER = """
import os, sys
import pyloader as pl
for _ in sys.stdin:
    pid = os.fork()
    if pid == 0:
        samples = ({"id": i, "text": "x" * (i % 50)} for i in range(10**7))
        pl.write(source=samples, output=sys.argv[1], compression="gzip", chunk_samples=200, workers=0,
                 index=False, mode="append")
        os._exit(0)
    print(pid, flush=True)
    os.waitpid(pid, 0)
    print("reaped", flush=True)
"""


def _line(child: "subprocess.Popen[str]") -> str:
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], 30)
    assert ready, "the forking helper did not answer in 30 s"
    return child.stdout.readline().strip()


def test_a_writer_killed_at_random_points_leaves_only_whole_chunks_and_the_next_run_cleans_up(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    gen = random.Random(0)
    saw_temporary = 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                       os.environ.get("PYTHONPATH", "")]))
    with subprocess.Popen([sys.executable, "-c", FORKER, str(folder)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, env=env) as child:
        assert child.stdin is not None
        try:
            for _ in range(20):
                child.stdin.write("go\n")
                child.stdin.flush()
                pid = int(_line(child))
                time.sleep(gen.uniform(0.0, 0.2))  # a random point of the writing, not a timed assertion
                os.kill(pid, signal.SIGKILL)
                assert _line(child) == "reaped"
                saw_temporary += any(n.startswith(output.TEMP) for n in os.listdir(folder))
                names = chunk_names(folder)
                assert names == [f"shard-{k:06d}.jsonl.gz" for k in range(len(names))]  # in order, no gap
                for name in names[-2:]:  # whole: gzip checks its end, and every line is an object
                    lines = gzip.decompress((folder / name).read_bytes()).decode().splitlines()
                    assert len(lines) == 200 and all("text" in json.loads(line) for line in lines)
        finally:
            child.stdin.close()
            child.wait(30)
    assert saw_temporary  # some kill fell in the middle of a chunk
    pl.write(source=docs(3), output=folder, workers=0, mode="append", compression="gzip")
    assert not [n for n in os.listdir(folder) if n.startswith(output.TEMP)]
    counts = json.loads((folder / ix.INDEX_NAME).read_text())["files"]
    assert len(counts) == len(chunk_names(folder)) and list(counts.values())[-1]["count"] == 3


def test_a_temporary_file_of_a_live_writer_is_left_alone(tmp_path):
    out = output.Output(str(tmp_path))
    from pyloader._storage import writers

    live = out.temp_name(writers.tag(), 0, 0, ".jsonl")
    dead = ".tmp-pyw" + writers.tag()[3:].split("-")[0] + "-999999999-1-000000-0000.jsonl"
    (tmp_path / live).write_text("{}\n")
    (tmp_path / dead).write_text("{}\n")
    assert out.clean() == [dead]
    assert os.listdir(tmp_path) == [live]


def test_progress_shows_a_bar_and_the_summary_has_the_rate(tmp_path, capsys):
    summary = pl.write(source=docs(40), output=tmp_path / "out", chunk_samples=10, workers=0, progress=True)
    assert "pyloader.write" in capsys.readouterr().err
    assert summary.rate > 0 and summary.seconds > 0 and summary.bytes > 0
    assert "40 samples in 4 chunks" in str(summary)


def test_the_write_command_converts_a_folder_and_prints_the_summary(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs(30)))
    lines: List[str] = []
    rc = _cli.main(["write", str(tmp_path / "in"), str(tmp_path / "out"), "--format", "parquet",
                    "--chunk-samples", "12", "--workers", "0", "--fn", "test_write:tokenize"], out=lines.append)
    assert rc == 0 and "30 samples in 3 chunks" in lines[-1]
    rows = read_back(str(tmp_path / "out"), ParquetReader())
    assert ids(rows) == list(range(30)) and list(rows[3]["tokens"]) == [3, 1]


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="unknown format"):
        pl.write(source=docs(1), output=tmp_path / "a", format="csv")
    with pytest.raises(ValueError, match="compression 'snappy'"):
        pl.write(source=docs(1), output=tmp_path / "a", compression="snappy")
    with pytest.raises(ValueError, match="chunk_samples"):
        pl.write(source=docs(1), output=tmp_path / "a", chunk_samples=0)
    with pytest.raises(ValueError, match="workers must be an integer >= 0"):
        pl.write(source=docs(1), output=tmp_path / "a", workers=-1)
    with pytest.raises(TypeError, match="iterable of dict samples"):
        pl.write(source=42, output=tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_bytes_cannot_be_written_as_json_and_the_error_says_so(tmp_path):
    with pytest.raises(TypeError, match="bytes"):
        pl.write(source=[{"x": b"raw"}], output=tmp_path / "out", workers=0)


def test_text_reader_cannot_be_confused_for_a_table_reader_given_explicitly(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("one\ntwo\n")
    pl.write(source=tmp_path / "in", output=tmp_path / "out", reader=TextLinesReader(), workers=0)
    assert [r["text"] for r in read_back(str(tmp_path / "out"), JsonLinesReader())] == ["one", "two"]


def test_write_is_exported_with_a_keyword_only_signature():
    import inspect

    assert "write" in pl.__all__
    params = inspect.signature(pl.write).parameters.values()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    assert api.WriteSummary.__dataclass_fields__.keys() >= {"samples", "bytes", "chunks", "seconds", "rate"}


