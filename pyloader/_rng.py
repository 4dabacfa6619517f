"""Private random generators: every draw is a pure function of a seed and a few keys."""
from __future__ import annotations

import numpy as np

# Stage tags keep the streams of different stages independent under one seed.
FILE_ORDER = 1
IN_FILE = 2
SHUFFLE_BUFFER = 3
BUCKETS = 4  # length bucketing: tie-breaks and the order of the batches (``_stages.bucket``)
MIX = 5  # weighted mixing: the source of each sample position (``_stages.mix``)
MIX_FILES = 6  # weighted mixing: each source's file order
CACHED_EPOCH = 7  # cache_encoded: the order of a cached epoch's batches (``_stages.cached_epochs``)
ROTATION = 8  # rotation: the order of each window's rounds and of the windows in each cycle (``_stages.rotation``)


def derive_rng(seed: int, *keys: int) -> np.random.Generator:
    """A fresh generator for ``(seed, *keys)``; never touches global ``random``/``np.random``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, *map(int, keys)])))
