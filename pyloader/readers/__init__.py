"""Built-in readers: JSON Lines, plain text lines, CSV, NumPy ``.npy``/``.npz``, Parquet
(and Arrow IPC) files, and webdataset-style tar shards. Files may be compressed (``.gz``, ``.bz2``,
``.xz``, ``.zst``)."""
from ._csv import CSVReader
from ._jsonl import JsonLinesReader
from ._numpy import NumpyReader
from ._parquet import ParquetReader
from ._tar import TarReader, decode_image
from ._text import TextLinesReader

__all__ = ["JsonLinesReader", "TextLinesReader", "CSVReader", "NumpyReader", "ParquetReader", "TarReader",
           "decode_image"]
