"""One lock for every parse of a ``.npy`` header in this process (``.npz`` members included).

NumPy parses a ``.npy`` header with ``ast.literal_eval``, and CPython 3.11 builds AST
objects in state all threads share: a parse in one thread can make one running in
another fail with "SystemError: AST constructor recursion depth mismatch"
(python/cpython#106905). Whatever of pyloader parses headers from threads (the
``NumpyReader``, cached epochs, rotation on disk) holds this lock meanwhile.
"""
from __future__ import annotations

import threading

HEADER_PARSE = threading.Lock()
