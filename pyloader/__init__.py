"""pyloader: stream datasets far larger than memory, stored as many chunk files, into PyTorch and TF2."""
from ._abc import DataCollator, DataReader, Dataset, IdentityDataset
from ._files import list_files, open_file

__all__ = ["DataReader", "Dataset", "DataCollator", "IdentityDataset", "open_file", "list_files"]
__version__ = "0.1.0"
