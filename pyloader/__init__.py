"""pyloader: stream datasets far larger than memory, stored as many chunk files, into PyTorch and TF2.

Subclass ``DataReader``, ``Dataset`` and ``DataCollator`` (or take the built-ins in
``pyloader.readers`` and ``pyloader.collators``), hand them to ``DataLoader`` and
iterate. Importing this package configures nothing and imports neither torch nor
TensorFlow.
"""
from ._abc import DataCollator, DataReader, Dataset, IdentityDataset
from ._errors import PipelineError, TooManyErrors, WorkerDied, reraise, warn_and_skip
from ._groups import Bucket, Device, OnError, Order, Pack, Ranks, Rotation, Shuffle, Storage, Stream, Workers
from ._loader import DataLoader, LoaderIterator
from ._rng import rng, rng_seed
from ._stages.sources import Source
from ._storage.epoch_cache import CacheEncoded
from ._storage.files import list_files, open_file
from ._write.api import write

__all__ = [
    "DataReader", "Dataset", "DataCollator", "IdentityDataset", "DataLoader", "LoaderIterator",
    "PipelineError", "TooManyErrors", "WorkerDied", "reraise", "warn_and_skip", "open_file", "list_files", "Source",
    "CacheEncoded", "rng", "rng_seed", "Stream", "Shuffle", "Ranks", "Storage", "Rotation", "Bucket", "OnError",
    "Workers", "Device", "Order", "Pack", "write",
]
__version__ = "0.2.0"
