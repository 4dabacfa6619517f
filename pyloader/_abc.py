"""The three classes a user subclasses: how to read a file, encode a batch, collate it."""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Dict, Iterator, Mapping, NoReturn, Tuple

from ._checks import is_integer
from ._columns import Column, Columns, check_columns, n_rows

__all__ = ["DataReader", "Dataset", "DataCollator", "IdentityDataset"]


def declared(obj: object, flag: str) -> bool:
    """Whether ``obj``'s class says ``flag = True`` for all the methods it has.

    Only a class can say so, and the word holds for the methods of that class
    and of its bases: a subclass that defines a method of its own (a
    ``read_file`` keeping state on ``self``) is back to ``False`` unless it says
    so itself.
    """
    for cls in type(obj).__mro__:
        if flag in cls.__dict__:
            return bool(cls.__dict__[flag])
        if any(callable(v) and not k.startswith("__") for k, v in cls.__dict__.items()):
            return False  # a method defined below any declaration
    return False


def is_thread_safe(obj: object) -> bool:
    """Whether the loader may call ``obj``'s methods from several threads at once: its class
    says ``thread_safe = True`` (see ``declared``)."""
    return declared(obj, "thread_safe")


def releases_gil(obj: object) -> bool:
    """Whether ``obj``'s methods spend their time outside the GIL (NumPy, pyarrow, I/O), so
    threads of this process run them side by side: its class says ``releases_gil = True``
    (see ``declared``). ``num_workers="auto"`` keeps such objects in this process."""
    return declared(obj, "releases_gil")


def read_result(path: str, result: object) -> Tuple[Mapping[str, Column], int]:
    """Split what ``read_file`` returned into ``(columns, n_sample)``.

    The two common slips (a list of samples; the dict alone, without its count)
    are a ``ValueError`` naming the file, the shape expected and the fix.
    """
    expected = "read_file must return (dict_of_lists, n_sample), e.g. ({'text': lines}, len(lines))"
    if isinstance(result, Mapping):
        raise ValueError(f"file {path!r}: read_file returned a dict without its sample count: {expected}")
    if not isinstance(result, (tuple, list)) or len(result) != 2 or not isinstance(result[0], Mapping):
        got = (f"a {type(result).__name__} of {len(result)} items" if isinstance(result, (tuple, list))
               else f"a {type(result).__name__}")
        fix = " (a list of samples: gather them into one list per field)" if isinstance(result, list) else ""
        raise ValueError(f"file {path!r}: {expected}; got {got}{fix}")
    return result[0], result[1]


_INIT_ATTRIBUTES = ("batch_size", "shuffle", "random_seed")


class DataReader(abc.ABC):
    """Reads one chunk file into a dict of equal-length columns.

    ``batch_size`` is the number of samples per batch (the number of rows in
    stream mode). ``shuffle=True`` permutes the samples inside each file, seeded
    by ``random_seed``, the epoch and the file, never by global random state.

    Example:
        ```python
        class LinesReader(DataReader):
            def __init__(self, batch_size=16, shuffle=False, random_seed=42):
                super().__init__(batch_size, shuffle=shuffle, random_seed=random_seed)

            def read_file(self, path):
                with open_file(path, "rt") as f:
                    lines = [line.rstrip("\\n") for line in f]
                return {"text": lines}, len(lines)   # a dict of equal-length lists, and their length


        for batch in DataLoader(LinesReader(batch_size=16), IdentityDataset(), NumpyCollator(), "texts/"):
            assert len(batch["text"]) <= 16      # a list of str: strings are not stacked
        ```
    """

    def __init__(self, batch_size: int = 16, shuffle: bool = False, random_seed: int = 42) -> None:
        if not is_integer(batch_size, least=1):
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.random_seed = int(random_seed)

    if not TYPE_CHECKING:  # for mypy, a missing attribute stays an error in the user's code
        def __getattr__(self, name: str) -> NoReturn:
            # only reached for attributes that are missing: say why these three are
            if name in _INIT_ATTRIBUTES:
                raise AttributeError(
                    f"{type(self).__name__!r} object has no attribute {name!r}: its __init__ must call "
                    f"super().__init__(batch_size, shuffle=shuffle, random_seed=random_seed) "
                    f"(DataReader.__init__ sets {', '.join(_INIT_ATTRIBUTES)})", name=name, obj=self)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self)

    @abc.abstractmethod
    def read_file(self, path: str) -> Tuple[Mapping[str, Column], int]:
        """Read the file at ``path``.

        Returns ``(dict_samples, n_sample)``: every value of ``dict_samples`` is a
        list (or a NumPy array) of exactly ``n_sample`` items. ``path`` is a string:
        a local path or an fsspec URL; ``pyloader.open_file(path)`` opens either.
        """

    def iter_file(self, path: str) -> Iterator[Mapping[str, Column]]:
        """Yield the samples of ``path`` in order, as dict-of-lists pieces.

        Override it for files too large to hold in memory: when the reader does not
        shuffle (``shuffle=False``), the loader reads every file through it, stream
        mode included, so a streaming ``iter_file`` keeps memory independent of file
        size. The default yields ``read_file``'s result as one piece. Of ``read_file``
        and ``iter_file``, the one a class defines last is called whatever the settings
        (a ``read_file`` on top of a built-in reader, whose ``iter_file`` streams, is
        called with ``shuffle=False`` too).

        Example:
            ```python
            class BigLines(DataReader):
                def read_file(self, path):
                    with open_file(path, "rt") as f:
                        lines = [line.rstrip("\\n") for line in f]
                    return {"text": lines}, len(lines)

                def iter_file(self, path):   # 1,000 lines at a time
                    with open_file(path, "rt") as f:
                        while piece := [line.rstrip("\\n") for _, line in zip(range(1000), f)]:
                            yield {"text": piece}
            ```
        """
        columns, n_sample = read_result(path, self.read_file(path))
        yield self.checked(path, columns, n_sample)

    def count(self, path: str) -> int:
        """The number of samples in ``path``.

        Used to split an epoch evenly across ranks (multi-node training). The
        default reads the file through ``iter_file``; override it with something
        cheaper when the format allows (a header, an index, a line count).
        """
        return sum(n_rows(dict(piece)) for piece in self.iter_file(path))

    def read_range(self, path: str, start: int, stop: int) -> Tuple[Mapping[str, Column], int]:
        """Samples ``start:stop`` of ``path`` (counted as ``iter_file`` gives them), as ``read_file`` returns a file.

        Optional. The global order (``DataLoader(shuffle=Shuffle(...))``) reads files as ranges of a few
        hundred samples; override this where your format can go straight to a sample (an offset index,
        fixed-size records, row groups), and each range costs what it holds. Without it a range is read
        through ``iter_file`` from the file's start (correct, but it costs the whole file up to the range).
        The built-in readers go straight to a range through the sample index (``python -m pyloader index``).

        Example:
            ```python
            import os
            from pyloader import DataReader, open_file

            class Records(DataReader):      # fixed-size records of 16 bytes
                def read_file(self, path):
                    return self.read_range(path, 0, self.count(path))

                def count(self, path):
                    return os.path.getsize(path) // 16

                def read_range(self, path, start, stop):
                    with open_file(path, "rb") as f:
                        f.seek(16 * start)
                        data = f.read(16 * (stop - start))
                    return {"record": [data[i:i + 16] for i in range(0, len(data), 16)]}, stop - start
            ```
        """
        raise NotImplementedError(f"{type(self).__name__} reads no range of a file")

    def checked(self, path: str, columns: Mapping[str, Column], n_sample: int | None = None) -> Columns:
        """Validate what ``read_file``/``iter_file`` returned; ``ValueError`` names the file and key."""
        return check_columns(columns, n_sample, f"file {path!r}")


class Dataset(abc.ABC):
    """Turns a raw batch (dict of lists) into an encoded batch (dict of lists).

    ``batch_encode`` is called one batch at a time unless the class says
    ``thread_safe = True`` (see ``is_thread_safe``).

    Example:
        ```python
        class WithLengths(Dataset):
            def batch_encode(self, batch_data):
                return {**batch_data, "length": [len(text) for text in batch_data["text"]]}


        for batch in DataLoader(JsonLinesReader(batch_size=16), WithLengths(), NumpyCollator(), "data/"):
            assert batch["length"].tolist() == [len(text) for text in batch["text"]]
        ```
    """

    thread_safe = False

    @abc.abstractmethod
    def batch_encode(self, batch_data: Columns) -> Columns:
        """Encode ``batch_data``; every returned value has one item per sample (values of different
        lengths are a ``ValueError`` naming ``batch_encode``)."""


class IdentityDataset(Dataset):
    """A ``Dataset`` that passes batches through, for readers that yield model-ready fields.

    Example:
        ```python
        loader = DataLoader(JsonLinesReader(batch_size=32), IdentityDataset(), NumpyCollator(), "data/")
        ```
    """

    thread_safe = True
    releases_gil = True

    def batch_encode(self, batch_data: Columns) -> Columns:
        return batch_data


class DataCollator(abc.ABC):
    """Turns an encoded batch into the tensors the model takes.

    ``collate_batch`` is called one batch at a time unless the class says
    ``thread_safe = True`` (see ``is_thread_safe``).

    Example:
        ```python
        import torch


        class PadCollator(DataCollator):
            def collate_batch(self, features):
                longest = max(len(ids) for ids in features["tokens"])
                ids = [ids + [0] * (longest - len(ids)) for ids in features["tokens"]]
                return {"tokens": torch.tensor(ids), "label": torch.tensor(features["label"])}


        for batch in DataLoader(JsonLinesReader(batch_size=16), IdentityDataset(), PadCollator(), "data/"):
            assert batch["tokens"].dtype == torch.int64 and batch["tokens"].shape[0] == batch["label"].shape[0]
        ```
    """

    thread_safe = False

    @abc.abstractmethod
    def collate_batch(self, features: Columns) -> Dict[str, Any]:
        """Collate ``features`` (dict of lists, one item per sample) into a dict of tensors.

        What it returns is the batch the loop gets. Any other object (a tuple ``(x, y)``, a
        list, a bare tensor) is handed over as it is, with or without workers; ``pin_memory``
        and ``device`` reach the tensors inside dicts, lists and tuples. Two exceptions, a
        ``TypeError`` at the first batch naming ``collate_batch`` and the type: ``None`` (a
        missing ``return``), and anything but a dict in stream mode or under ``ranks``, where
        the loader adds its flags (``__first__``, ``__padding__``...) to each batch.
        ``DataLoader.to_tf_dataset`` infers the signature of dicts (pass ``output_signature`` for others).
        """
