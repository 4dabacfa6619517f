"""``LatencyFileSystem``: an in-memory fsspec filesystem that waits before every read (see ``pyloader.testing``)."""
from __future__ import annotations

import threading
import time
from typing import Any

from fsspec.implementations.memory import MemoryFileSystem


class LatencyFileSystem(MemoryFileSystem):
    """A memory filesystem whose reads each wait ``latency`` seconds; counts reads in flight.

    Example:
        ```python
        slow = LatencyFileSystem.register("slow", latency=0.05)    # "slow://" URLs, 50 ms per read
        slow().pipe("/data/part-0.jsonl", b'{"x": 1}\\n{"x": 2}\\n')
        loader = DataLoader(JsonLinesReader(batch_size=2), IdentityDataset(), NumpyCollator(), "slow://data/")
        ```
    """

    protocol = "latency"
    latency = 0.05
    store: dict = {}
    pseudo_dirs = [""]
    _lock = threading.Lock()
    in_flight = 0
    max_in_flight = 0

    @classmethod
    def register(cls, protocol: str, latency: float = 0.05) -> type:
        """A subclass under ``protocol`` with its own store and counters, registered with fsspec."""
        import fsspec

        sub = type(f"LatencyFileSystem_{protocol}", (cls,), {
            "protocol": protocol, "latency": latency, "store": {}, "pseudo_dirs": [""],
            "_lock": threading.Lock(), "in_flight": 0, "max_in_flight": 0})
        fsspec.register_implementation(protocol, sub, clobber=True)
        return sub

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        prefix = f"{cls.protocol}://"
        return super()._strip_protocol(path.removeprefix(prefix))

    def cat_file(self, path: str, start: Any = None, end: Any = None, **kwargs: Any) -> bytes:
        cls = type(self)
        with cls._lock:
            cls.in_flight += 1
            cls.max_in_flight = max(cls.max_in_flight, cls.in_flight)
        try:
            time.sleep(cls.latency)
            return super().cat_file(path, start, end, **kwargs)
        finally:
            with cls._lock:
                cls.in_flight -= 1

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "r" in mode:
            time.sleep(type(self).latency)
        return super()._open(path, mode, **kwargs)
