"""``pyloader.dataset``: the original PyLoader's module of ``Dataset``, kept so that its imports work
(``from pyloader.dataset import Dataset``); the class is ``pyloader.Dataset``
(docs/guides/migrating.md)."""
from ._abc import Dataset

__all__ = ["Dataset"]
