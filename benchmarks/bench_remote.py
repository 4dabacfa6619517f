"""A two-epoch run over S3 (moto's server on 127.0.0.1), with and without the disk cache.

A byte-counting TCP proxy sits between the loader and the server, so the bytes fetched in
each epoch are what crossed the connection (headers included), not what pyloader says it
asked for. Each epoch is one iteration of the loader (``num_epoch=1``, iterated twice).

    python benchmarks/bench_remote.py [--quick] [--write]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import select
import shutil
import socket
import tempfile
import threading
import time
from typing import Any, Dict, List

from _harness import HERE, MB, machine_line, markdown_table, replace_section

RESULTS = os.path.join(HERE, "results", "bench_remote.json")


class CountingProxy:
    """Relays 127.0.0.1:port to the server, counting the bytes sent back and the GET requests."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.bytes = 0
        self.gets = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream), timeout=10)
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([client, upstream], [], [], 0.2)
                for src, dst in ((client, upstream), (upstream, client)):
                    if src in ready:
                        data = src.recv(1 << 16)
                        if not data:
                            return
                        with self._lock:
                            if src is upstream:
                                self.bytes += len(data)
                            else:
                                self.gets += data.count(b"GET /")
                        dst.sendall(data)
        except OSError:
            return
        finally:
            upstream.close()
            client.close()

    def snapshot(self) -> Dict[str, int]:
        with self._lock:
            return {"bytes": self.bytes, "gets": self.gets}

    def close(self) -> None:
        self._stop.set()
        self._server.close()


def start_moto() -> Any:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    return server, port


def put_data(n_files: int, rows: int) -> int:
    import boto3

    client = boto3.client("s3")
    client.create_bucket(Bucket="bench")
    total = 0
    for i in range(n_files):
        body = "".join(json.dumps({"id": i * rows + j, "ids": list(range(j % 50, j % 50 + 32))}) + "\n"
                       for j in range(rows)).encode()
        client.put_object(Bucket="bench", Key=f"train/part-{i:03d}.jsonl", Body=body)
        total += len(body)
    return total


def two_epochs(proxy: CountingProxy, cache_dir: Any, n_samples: int) -> List[Dict[str, Any]]:
    import fsspec

    import pyloader as pl
    from pyloader.collators import NumpyCollator
    from pyloader.readers import JsonLinesReader

    fsspec.config.conf["s3"] = {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}
    loader = pl.DataLoader(JsonLinesReader(256), pl.IdentityDataset(), NumpyCollator(), "s3://bench/train",
                           storage=pl.Storage(cache_dir=cache_dir), shuffle=True)
    epochs = []
    for epoch in range(2):
        before, start = proxy.snapshot(), time.perf_counter()
        ids = sorted(int(i) for batch in loader for i in batch["id"])
        seconds = time.perf_counter() - start
        after = proxy.snapshot()
        epochs.append({"epoch": epoch, "bytes": after["bytes"] - before["bytes"],
                       "gets": after["gets"] - before["gets"],
                       "seconds": seconds, "samples_per_s": len(ids) / seconds, "exact": ids == list(range(n_samples))})
    loader.close()
    return epochs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--write", action="store_true", help="write the results into benchmarks/README.md")
    args = ap.parse_args()
    n_files, rows = (8, 500) if args.quick else (32, 4000)
    server, port = start_moto()
    proxy = CountingProxy(port)
    cache = tempfile.mkdtemp(prefix="pyloader-bench-cache-")
    try:
        size = put_data(n_files, rows)
        print(f"{machine_line()}\n{n_files} files, {size / MB:.1f} MB of JSONL in all", flush=True)
        runs = {"without the cache": two_epochs(proxy, None, n_files * rows),
                "with `cache_dir`": two_epochs(proxy, cache, n_files * rows)}
    finally:
        proxy.close()
        server.stop()
        shutil.rmtree(cache, ignore_errors=True)
    rows_out = [[name, e["epoch"] + 1, f"{e['bytes'] / MB:.2f}", e["gets"], f"{e['seconds']:.2f}",
                 f"{e['samples_per_s']:,.0f}", "yes" if e["exact"] else "NO"]
                for name, epochs in runs.items() for e in epochs]
    markdown = (f"Machine: {machine_line()}; {n_files} files, {size / MB:.1f} MB of JSONL on moto's S3 server "
                "(loopback), bytes counted by a proxy in front of it.\n\n"
                + markdown_table(["run", "epoch", "MB fetched", "GET requests", "seconds", "samples/s",
                                  "every sample once"], rows_out))
    print("\n" + markdown)
    if args.write:
        replace_section(os.path.join(HERE, "README.md"), "bench_remote", markdown)
        os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
        with open(RESULTS, "w") as f:
            json.dump({"machine": machine_line(), "data_bytes": size, "runs": runs}, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
