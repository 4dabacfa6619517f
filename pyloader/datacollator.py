"""``pyloader.datacollator``: the original PyLoader's module of ``DataCollator``, kept so that its imports work
(``from pyloader.datacollator import DataCollator``); the class is ``pyloader.DataCollator``
(docs/guides/migrating.md)."""
from ._abc import DataCollator

__all__ = ["DataCollator"]
