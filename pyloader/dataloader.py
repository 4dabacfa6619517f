"""``pyloader.dataloader``: the original PyLoader's module of ``DataLoader``, kept so that its imports work
(``from pyloader.dataloader import DataLoader``); the class is ``pyloader.DataLoader``
(docs/guides/migrating.md)."""
from ._loader import DataLoader

__all__ = ["DataLoader"]
