"""``pyloader.write``: turn any data into chunk files the loader reads, with their index (``api``).

``sources`` tells the kinds of input apart and cuts them into parts, ``formats`` encodes chunks,
``parallel`` runs the parts (worker processes, or any executor), ``output`` writes the chunks
atomically on local disk or behind an fsspec URL, ``cli`` is ``python -m pyloader write``.
"""
