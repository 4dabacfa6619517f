"""``python -m pyloader write SOURCE OUTPUT``: ``pyloader.write`` from the command line.

``--fn module:function`` names the user function (imported, so worker processes can import it too);
the summary is printed; a failure is reported in one line by the command line's ``main``.
"""
from __future__ import annotations

import argparse
import importlib
from typing import Callable, Optional

from .api import write
from .formats import FORMATS
from .parallel import UserFn
from .sources import KINDS

HELP = "write SOURCE's samples as chunk files in OUTPUT, with the index of counts (pyloader.write)"


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    sub = commands.add_parser("write", help=HELP, description=HELP)
    sub.add_argument("source", nargs="+", help="a folder, glob or file(s): Parquet/CSV/JSON lines tables, "
                     "or any files (those sharing a key are one sample)")
    sub.add_argument("output", help="the output folder, local or an fsspec URL")
    sub.add_argument("--format", default="jsonl", choices=FORMATS, help="the chunks' format (default jsonl)")
    sub.add_argument("--compression", default=None, help="gzip, zstd, bz2, xz; Parquet's own codecs for parquet")
    sub.add_argument("--chunk-bytes", type=int, default=None, help="bytes of a chunk before compression "
                     "(default 64 MiB when --chunk-samples is not given)")
    sub.add_argument("--chunk-samples", type=int, default=None, help="samples of a chunk at most")
    sub.add_argument("--mode", default="create", choices=("create", "overwrite", "append"))
    sub.add_argument("--workers", type=int, default=None, help="worker processes (default: one per CPU; 0: none)")
    sub.add_argument("--kind", default="auto", choices=KINDS, help="how SOURCE is read (default: told by names)")
    sub.add_argument("--fn", default=None, help="module:function applied to each sample")
    sub.add_argument("--progress", action="store_true", help="a progress bar")


def _function(spec: Optional[str]) -> Optional[UserFn]:
    if spec is None:
        return None
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"--fn takes module:function, got {spec!r}")
    fn = getattr(importlib.import_module(module), name)
    if not callable(fn):
        raise ValueError(f"--fn {spec!r} is not callable")
    return fn


def run(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    source = args.source[0] if len(args.source) == 1 else args.source
    summary = write(source=source, output=args.output, fn=_function(args.fn), format=args.format,
                    compression=args.compression, chunk_bytes=args.chunk_bytes, chunk_samples=args.chunk_samples,
                    mode=args.mode, workers=args.workers, kind=args.kind, progress=args.progress)
    out(str(summary))
    return 0
