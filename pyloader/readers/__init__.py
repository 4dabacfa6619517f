"""Built-in readers: JSON Lines, plain text lines, CSV, and NumPy ``.npy``/``.npz``."""
from ._csv import CSVReader
from ._jsonl import JsonLinesReader
from ._numpy import NumpyReader
from ._text import TextLinesReader

__all__ = ["JsonLinesReader", "TextLinesReader", "CSVReader", "NumpyReader"]
