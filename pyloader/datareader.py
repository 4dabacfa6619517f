"""``pyloader.datareader``: the original PyLoader's module of ``DataReader``, kept so that its imports work
(``from pyloader.datareader import DataReader``); the class is ``pyloader.DataReader``
(docs/guides/migrating.md)."""
from ._abc import DataReader

__all__ = ["DataReader"]
