"""A message too large for one packet travels in a memfd (``_execution.ipc``): its pickle and each
out-of-band array are written at their aligned offsets and arrive whole, as writable arrays that own
no memory of the sender's."""
from __future__ import annotations

import numpy as np
import pytest

from pyloader._execution import ipc


@pytest.mark.parametrize("sizes", [(40_001,), (16_385, 3_000_017, 70_001), (1, 5_000_000)])
def test_a_large_message_with_arrays_of_odd_sizes_arrives_whole(sizes):
    rng = np.random.default_rng(len(sizes))
    want = {"text": "x" * 100_003, "arrays": [rng.integers(0, 255, n, dtype=np.uint8) for n in sizes],
            "floats": rng.random((513, 17)).astype(np.float32), "small": np.arange(3)}
    ours, theirs = ipc.channel_pair()
    with ours, theirs:
        ipc.send(ours, want, tag=7, gen=3)
        tag, gen, got = ipc.recv(theirs)
    assert (tag, gen) == (7, 3) and got["text"] == want["text"]
    for g, w in zip([*got["arrays"], got["floats"], got["small"]], [*want["arrays"], want["floats"], want["small"]]):
        assert g.dtype == w.dtype and g.shape == w.shape and g.flags.writeable and not np.shares_memory(g, w)
        np.testing.assert_array_equal(g, w)
