"""``python -m pyloader``: look at a dataset, and time the loader on it.

* ``inspect DATA --reader R``: every file with its size and its samples
  (``DataReader.count``), the totals, and the first batch (each field's type, shape
  and first values). A file that cannot be counted is listed with its error.
* ``bench DATA --reader R --workers 0,1,2 --batch-size N``: each ``workers``
  setting runs one epoch (or ``--max-batches``) in a fresh Python process, with nothing
  done to the batches; it reports samples/s (from ``loader.stats``), the time to the
  first batch and the peak memory of that process's whole tree (it and its workers:
  summed RSS, sampled from this process, so the measured one runs no thread of ours).
  The default itself (``workers="auto"``) is always timed too, as the row ``auto``,
  with where it ran the files: with workers started it places each file by measurement
  (``_execution.measured``), so its row says what it settled on. The advice follows the
  measurement: the fastest setting when it beat the default by more than ``--tolerance``
  (with, when the run ended during the default's trial of places, that a run this short is
  mostly that trial), else the default, with what it did here. While a setting runs, a line
  on stderr says which, and how long it has run, every ``PROGRESS_EVERY_S`` seconds.

* ``diagnose DATA --reader R``: one epoch (or ``--max-batches``), then ``loader.report()``: what limits the
  loader and what to change; ``--trace`` writes its trace, ``--png`` draws it (``_diagnose``).

* ``index DATA --reader R``: count every file and write the index of counts next to the data
  (``_storage.count_index``), reusing the entries of an index there that still match; it names
  the files that changed since and those no longer in the data.
* ``write SOURCE OUTPUT``: ``pyloader.write`` (``_write.cli``).

Batches are collated by ``NumpyCollator``, so neither torch nor TensorFlow is needed.
Exit status: 0; 1 when something failed (the message names the file); 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import itertools
import json
import os
import reprlib
import resource
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, TypedDict, Union, cast

import numpy as np

from ._abc import DataCollator, DataReader, Dataset, IdentityDataset
from ._counts import Counter, IndexPlaces
from ._diagnose import DIAGNOSE_HELP, add_options, diagnose, throughput_png
from ._errors import ErrorPolicy, PipelineError, describe
from ._execution import auto_workers
from ._execution.runners import Exclusive
from ._frameworks.progress import check as check_progress
from ._length import checked_count
from ._loader import DataLoader
from ._paths import local_path
from ._storage import count_index as ix
from ._storage.files import DataDir, is_url, list_files
from ._write import cli as write_cli

READERS = {
    "jsonl": ("pyloader.readers", "JsonLinesReader"),
    "text": ("pyloader.readers", "TextLinesReader"),
    "csv": ("pyloader.readers", "CSVReader"),
    "npy": ("pyloader.readers", "NumpyReader"),
    "parquet": ("pyloader.readers._parquet", "ParquetReader"),
    "tar": ("pyloader.readers", "TarReader"),  # webdataset-style shards: images decoded to arrays
}
MEMORY_EVERY_S = 0.02
PROGRESS_EVERY_S = 5.0  # bench: a line on stderr this often while a setting runs


class CommandError(Exception):
    """A failure to report in one line (exit status 1)."""


def make_reader(name: str, batch_size: int) -> DataReader:
    """The built-in reader called ``name``, imported only now."""
    module_name, class_name = READERS[name]
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise CommandError(f"the {name} reader ({module_name}.{class_name}) is not available in this "
                           f"installation: {describe(exc)}") from exc
    return cls(batch_size=batch_size)


def user_objects(reader: DataReader) -> Tuple[DataReader, Dataset, DataCollator]:
    """The reader, dataset and collator every command's loader holds (``auto``'s rule looks at them)."""
    from .collators import NumpyCollator

    return reader, IdentityDataset(), NumpyCollator()


def make_loader(reader: DataReader, data: DataDir, num_workers: Union[int, str] = 0,
                on_error: ErrorPolicy = "raise") -> DataLoader:
    _, dataset, collator = user_objects(reader)
    return DataLoader(reader, dataset, collator, data, workers=num_workers, on_error=on_error)


# -- inspect ---------------------------------------------------------------------------
def file_size(path: str) -> Optional[int]:
    """Bytes of a local file or an fsspec URL; ``None`` when they cannot be had."""
    try:
        if is_url(path):
            import fsspec

            fs, _, (one,) = fsspec.get_fs_token_paths(path)
            return fs.size(one)
        return os.path.getsize(local_path(path))
    except Exception:
        return None


def human(n: Optional[float]) -> str:
    """Bytes, in the largest unit that keeps the number at 1 or more."""
    if n is None:
        return "?"
    unit = "B"
    for larger in ("KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            break
        n, unit = n / 1024, larger
    return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"


def describe_value(value: object) -> str:
    """A field of a batch in one line: its type, shape and first values."""
    short = reprlib.Repr()
    short.maxlist = short.maxother = 4
    short.maxstring = 40
    if isinstance(value, np.ndarray):
        flat = np.array2string(value.reshape(-1)[:4], threshold=4, max_line_width=200)
        return f"ndarray {value.dtype} {tuple(value.shape)}: {flat}{' ...' if value.size > 4 else ''}"
    if isinstance(value, list):
        kinds = sorted({type(v).__name__ for v in value})
        return f"list of {len(value)} {'/'.join(kinds)}: {short.repr(value)}"
    return f"{type(value).__name__}: {short.repr(value)}"


def inspect(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    reader = make_reader(args.reader, args.batch_size)
    files = list_files(args.data)
    failed = _list_files(reader, files, args.max_files, out)
    skipped: List[PipelineError] = []  # files that fail to read: listed, and the batch is made of the others
    with make_loader(reader, files, on_error=skipped.append) as loader:
        batch = next(iter(loader), None)
    _lines("error: ", skipped, out)
    if batch is None:
        out("no batch: the files hold no samples")
        return 1
    out(f"first batch ({args.reader} reader, batch_size={args.batch_size}, NumpyCollator):")
    for key, value in batch.items():
        out(f"  {key}: {describe_value(value)}")
    return 1 if failed or skipped else 0


def _list_files(reader: DataReader, files: List[str], max_files: int, out: Callable[[str], None]) -> List[str]:
    """The first ``max_files`` files with their sizes and counts, then the totals; the counts that failed."""
    failed: List[str] = []
    sizes, counts = 0, 0
    out(f"{'size':>10}  {'samples':>10}  file")
    for k, path in enumerate(files):
        size, n = file_size(path), _counted(reader, path, failed)
        sizes += size or 0
        counts += n or 0
        if k < max_files:
            out(f"{human(size):>10}  {'error' if n is None else n:>10}  {path}")
    if len(files) > max_files:
        out(f"... and {len(files) - max_files} more files")
    out(f"{len(files)} files, {human(sizes)}, {counts} samples" + (f", {len(failed)} not counted" if failed else ""))
    _lines("error: ", failed, out)
    return failed


def _lines(prefix: str, items: Iterable[object], out: Callable[[str], None]) -> None:
    """One line for each of ``items``, after ``prefix``."""
    for item in items:
        out(f"{prefix}{item}")


def _counted(reader: DataReader, path: str, failed: List[str]) -> Optional[int]:
    """The samples of ``path``; ``None`` when they cannot be counted (why, added to ``failed``)."""
    try:
        return checked_count(reader, path)
    except PipelineError as exc:
        failed.append(str(exc))
        return None


# -- bench -----------------------------------------------------------------------------
class Setting(TypedDict):
    """One ``bench`` setting, as ``_measure`` takes it (JSON)."""

    data: str
    reader: str
    batch_size: int
    workers: Union[int, str]  # a number, or "auto"
    max_batches: Optional[int]


@dataclass
class Result:
    workers: Union[int, str]  # a number, or "auto"
    samples_per_s: float = 0.0
    samples: int = 0
    batches: int = 0
    first_batch_s: float = 0.0
    peak_mib: float = 0.0
    memory: str = ""  # how the peak was measured
    error: Optional[str] = None
    processes: int = 0  # the most processes of the tree seen at once (0: not sampled)
    placed: str = ""  # where the run's files ran: "workers", "threads"... (from ``loader.stats["placement"]``)
    why: str = ""  # how that was decided
    settled: bool = True  # False: the run ended while its trial of places for the files was still on


def tree_pids(root: int) -> List[int]:
    """``root`` and its descendants, from ``/proc/<pid>/task/<tid>/children`` (empty without /proc)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        found.append(pid)
        for tid in tids:  # a thread or the process that ended meanwhile has no children file: OSError
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                todo.extend(int(child) for child in f.read().split())
    return found


def rss(pid: int) -> int:
    """Resident bytes of ``pid`` now (``/proc/<pid>/statm``); 0 once it has ended."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


class TreeMemory:
    """The peak of the summed resident memory of a process and all its descendants (its worker
    processes), sampled every ``MEMORY_EVERY_S`` from a thread of *this* process, so the measured
    process runs nothing of ours. Without /proc (not Linux), psutil is asked; without either,
    ``samples`` stays 0 and the measured process's own figure is used."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = self.processes = self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.watch, name="bench-memory", daemon=True)

    def sample(self) -> None:
        pids = tree_pids(self.pid)  # none without /proc
        if pids:
            total = sum(rss(pid) for pid in pids)
        else:
            pids, total = _psutil_tree(self.pid)
        if pids:
            self.peak, self.processes = max(self.peak, total), max(self.processes, len(pids))
            self.samples += 1

    def watch(self) -> None:
        while not self._stop.wait(MEMORY_EVERY_S):
            self.sample()

    def __enter__(self) -> "TreeMemory":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _psutil_tree(pid: int) -> Tuple[List[int], int]:
    try:
        import psutil

        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        return [p.pid for p in procs], sum(p.memory_info().rss for p in procs)
    except Exception:  # no psutil, or a process ending between the listing and the reading
        return [], 0


def own_peak_bytes() -> int:
    """This process's peak RSS plus its largest reaped child's (``getrusage``; KiB on Linux): the
    figure used when the tree could not be sampled."""
    return 1024 * (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                   + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)


def measure(spec: Setting) -> Result:
    """One setting, in this process: the loader's rates over one epoch (or ``max_batches``)."""
    reader = make_reader(spec["reader"], spec["batch_size"])
    with make_loader(reader, spec["data"], spec["workers"]) as loader:
        for _ in itertools.islice(loader, spec["max_batches"] or None):  # max_batches 0: the whole epoch
            pass
        seen, placement = loader.stats["iteration"], loader.stats["placement"]
    placed, why, settled = placed_by(placement)
    return Result(spec["workers"], seen["samples_per_s"], seen["samples"], seen["batches"],
                  first_batch_s=seen["first_batch_s"] or 0.0, peak_mib=own_peak_bytes() / 2**20,
                  memory="peak RSS of the process plus its largest worker's (the tree could not be sampled)",
                  placed=placed, why=why, settled=settled)


def placed_by(placement: Dict[str, Any]) -> Tuple[str, str, bool]:
    """Where a run's files ran, how that was decided, and whether it was (not while the trial of places
    for the files was still on), from its ``stats["placement"]``."""
    measured = placement.get("measured")
    if measured is None:
        return ("workers" if placement["num_workers"] else "threads"), placement["why"], True
    rates = next((c["samples_per_s"] for c in reversed(measured["changes"])), None)
    how = f"measured: {', '.join(f'{p} {r:,.0f}' for p, r in rates.items())} samples/s" if rates else \
        "measuring: the run ended before the trial did"
    return measured["place"], f"{placement['num_workers']} workers started; {how}", bool(measured["trial_over"])


def run_setting(spec: Setting, timeout: float, progress: Callable[[str], None] = lambda line: None) -> Result:
    """``measure(spec)`` in a fresh Python process running this same pyloader, its tree's memory
    sampled from here; ``progress`` gets a line every ``PROGRESS_EVERY_S`` seconds while it runs."""
    command = [sys.executable, "-m", "pyloader", "_measure", json.dumps(spec)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_child_env())
    with TreeMemory(child.pid) as memory:
        try:
            stdout, stderr = _wait(child, timeout, lambda s: progress(f"  workers={spec['workers']}: {s:.0f} s, "
                                                                      "still running"))
        except subprocess.TimeoutExpired:
            _kill_tree(child)
            return Result(spec["workers"], error=f"took longer than --timeout {timeout:g} s")
    lines = stdout.strip().splitlines()
    if child.returncode != 0 or not lines:
        why = (stderr.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
        return Result(spec["workers"], error=why)
    result = Result(**json.loads(lines[-1]))
    if memory.samples:
        result.peak_mib, result.processes = memory.peak / 2**20, memory.processes
        result.memory = "peak of the summed RSS of the process and its workers, sampled every " \
                        f"{MEMORY_EVERY_S * 1000:.0f} ms"
    return result


def _wait(child: "subprocess.Popen[str]", timeout: float, tick: Callable[[float], None]) -> Tuple[str, str]:
    """``child.communicate()``, with ``tick(seconds run)`` every ``PROGRESS_EVERY_S`` seconds until it ends;
    ``TimeoutExpired`` once it has run ``timeout`` seconds."""
    began = time.monotonic()
    while True:
        left = timeout - (time.monotonic() - began)
        try:
            return child.communicate(timeout=max(0.0, min(PROGRESS_EVERY_S, left)))
        except subprocess.TimeoutExpired:
            if time.monotonic() - began >= timeout:
                raise
            tick(time.monotonic() - began)


def _child_env() -> Dict[str, str]:
    """This process's environment, with the folder of this pyloader first on ``PYTHONPATH``."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))


def _kill_tree(child: "subprocess.Popen[str]") -> None:
    """Kill a timed-out setting and its workers (the workers first: they would be orphaned), and reap it."""
    for pid in reversed(tree_pids(child.pid)):
        with contextlib.suppress(OSError):  # it ended meanwhile
            os.kill(pid, 9)
    child.kill()
    child.communicate()


def faster_than_default(results: Sequence[Result], tolerance: float) -> Optional[Result]:
    """The fastest setting, when it beats the default's (``auto``) by more than ``tolerance`` (else None)."""
    ran = [r for r in results if r.error is None and r.samples_per_s > 0]
    mine = [r for r in ran if r.workers == auto_workers.AUTO]
    if not mine:  # nothing ran, or not the default
        return None
    best = max(ran, key=lambda r: r.samples_per_s)
    return best if best.samples_per_s > (1 + tolerance) * mine[0].samples_per_s else None


def parse_workers(text: str) -> List[int]:
    try:
        workers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        workers = []
    if not workers or min(workers) < 0:
        raise argparse.ArgumentTypeError(f"expected numbers of workers >= 0 separated by commas, got {text!r}")
    return workers


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def bench(args: argparse.Namespace, out: Callable[[str], None], progress: Callable[[str], None] = to_stderr) -> int:
    make_reader(args.reader, args.batch_size)  # an unknown or missing reader fails here, once
    list_files(args.data)
    results = []
    out(f"{'workers':>7}  {'samples/s':>12}  {'samples':>9}  {'first batch':>11}  {'peak memory':>11}  processes")
    settings = [*dict.fromkeys(args.workers), auto_workers.AUTO]  # the default is always timed
    for k, workers in enumerate(settings, 1):
        spec: Setting = {"data": args.data, "reader": args.reader, "batch_size": args.batch_size,
                         "workers": workers, "max_batches": args.max_batches}
        progress(f"bench: timing workers={workers!r} ({k} of {len(settings)}), "
                 f"{f'{args.max_batches} batches' if args.max_batches else 'one epoch'} in a new process")
        r = run_setting(spec, args.timeout, progress)
        results.append(r)
        out(_result_line(r, f"  <- the default: ran in {r.placed}" if workers == auto_workers.AUTO else ""))
    failed = sum(r.error is not None for r in results)
    if failed == len(results):
        out("no setting ran: nothing to recommend")
        return 1
    _recommend(results, args.tolerance, out)
    if args.png:
        out(f"picture: {throughput_png(results, args.png)}")
    return 1 if failed else 0


def _result_line(r: Result, mark: str) -> str:
    """A setting's row of the table (``mark``: what follows the row of a setting that ran)."""
    if r.error is not None:
        return f"{r.workers:>7}  failed: {r.error}"
    return (f"{r.workers:>7}  {r.samples_per_s:>12,.0f}  {r.samples:>9}  {r.first_batch_s:>10.3f}s  "
            f"{r.peak_mib:>7.0f} MiB  {r.processes or '?':>9}{mark}")


def _recommend(results: List[Result], tolerance: float, out: Callable[[str], None]) -> None:
    """How memory was measured, a setting faster than the default (the last) if one was, and the recommendation:
    the setting measured fastest when it beat the default by more than ``tolerance``, else the default."""
    memory = next(r.memory for r in results if r.error is None)
    out(f"memory: {memory}")
    faster = faster_than_default(results, tolerance)
    default = results[-1]
    ran = f"which ran in {default.placed} here ({default.why})" if default.error is None else \
        f"which failed here: {default.error}"
    if faster is None:
        out(f'recommended: workers="auto" (the default), {ran}')
        return
    out(f"measured: workers={faster.workers} was {faster.samples_per_s / default.samples_per_s - 1:.0%} "
        f"faster than the default on this data")
    if not default.settled:
        out(f"  this run ended during the default's trial of where to run the files: for runs as short as "
            f"this one, workers={faster.workers} skips that trial; a longer run may settle the default on it")
    out(f'recommended: workers={faster.workers} (measured fastest here; the default, workers="auto", {ran})')


# -- index -----------------------------------------------------------------------------
def index(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    """Count every file (reusing the entries of an index already there that still match) and write
    the index next to the data, atomically."""
    reader = make_reader(args.reader, args.batch_size)
    if args.progress:
        try:
            check_progress("--progress")
        except ImportError as exc:
            raise CommandError(str(exc)) from exc
    files = list_files(args.data)
    places = IndexPlaces.of(reader, args.data, files, None)
    now = _stamps(files, places.folder)
    names = ix.names_in(places.folder, files)
    found = ix.read_index(places.data_index, places.key) or {}
    kept = ix.lookup(files, names, now, [found])
    counted = Counter(reader, files, Exclusive([reader]), None).count(kept.counts, first_failure_stops=False,
                                                                       progress=args.progress)
    entries = {name: ix.entry(stamp, n, _runs(reader, path, runs))
               for path, name, stamp, n, runs in zip(files, names, now, counted.counts, kept.runs) if n is not None}
    ix.write_index(places.data_index, places.key, entries, keep_found=False)
    out(f"{places.data_index}: {len(entries)} files, {sum(e['count'] for e in entries.values())} samples "
        f"({len(files) - counted.counted} from the index there, {counted.counted} counted, in {counted.seconds:.2f} s)")
    return _report_index(kept.stale, sorted(set(found) - set(names)), counted.failures, out)


def _runs(reader: object, path: str, kept: Optional[Dict[str, object]]) -> Optional[Dict[str, object]]:
    """Where the samples of ``path`` start (the sample index, ``_sample_index``): kept from the index
    there while the file is as it was, else found from its bytes, for the readers that can."""
    if kept is not None:
        return kept
    sample_runs = getattr(reader, "sample_runs", None)
    return None if sample_runs is None else sample_runs(path)


def _stamps(files: List[str], folder: str) -> List[ix.Stamp]:
    """Each file's size and version now; ``FileNotFoundError`` naming the first that is gone."""
    now = ix.stamps(files, folder)
    missing = [f for f, stamp in zip(files, now) if stamp is None]
    if missing:
        raise FileNotFoundError(f"{missing[0]!r} was listed but is gone" + (f" (and {len(missing) - 1} more)"
                                                                            if len(missing) > 1 else ""))
    return cast(List[ix.Stamp], now)  # none missing


def _report_index(stale: Sequence[str], gone: Sequence[str], failures: Sequence[Tuple[int, PipelineError]],
                  out: Callable[[str], None]) -> int:
    _lines("changed since the index was written, counted again: ", stale, out)
    _lines("in the old index, no longer in the data: ", gone, out)
    _lines("error: ", [exc for _, exc in failures], out)
    return 1 if failures else 0


# -- the command line ------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m pyloader", description="Look at a dataset, time the loader on it.")
    commands = top.add_subparsers(dest="command", required=True, metavar="{inspect,bench,diagnose,index,write}")
    for name, text in (("inspect", "list the files, their sizes and samples, and print a first batch"),
                       ("bench", "samples/s and peak memory for each number of workers, and a recommendation"),
                       ("diagnose", DIAGNOSE_HELP),
                       ("index", f"count the samples of every file and write them to {ix.INDEX_NAME} in the data's "
                                 "folder, read by every loader and rank instead of counting")):
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument("data", help="a folder, a glob or an fsspec URL (as DataLoader's data_dir)")
        sub.add_argument("--reader", required=True, choices=sorted(READERS),
                         help="the built-in reader (tar: webdataset-style shards, images decoded)")
        sub.add_argument("--batch-size", type=int, default=16, help="samples per batch (default 16)")
    inspect_ = commands.choices["inspect"]
    inspect_.add_argument("--max-files", type=int, default=50, help="files listed one by one (default 50)")
    bench_ = commands.choices["bench"]
    bench_.add_argument("--workers", type=parse_workers, default=[0, 1, 2],
                        help="the workers settings to time, e.g. 0,1,2 (the default)")
    bench_.add_argument("--max-batches", type=int, default=0, help="stop each setting after this many batches "
                        "(default 0: one epoch)")
    bench_.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per setting (default 600)")
    bench_.add_argument("--tolerance", type=float, default=0.05,
                        help="a setting faster than the default's by more than this is named (default 0.05)")
    add_options(commands.choices["diagnose"], bench_)
    commands.choices["index"].add_argument("--progress", action="store_true", help="a bar over the files counted")
    write_cli.add_parser(commands)
    measure_ = commands.add_parser("_measure")  # one setting of bench, in its own process
    measure_.add_argument("spec")
    return top


def main(argv: Optional[Sequence[str]] = None, out: Callable[[str], None] = print) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "batch_size", 1) < 1:
        parser().error(f"--batch-size must be >= 1, got {args.batch_size}")
    try:
        if args.command == "_measure":
            out(json.dumps(asdict(measure(json.loads(args.spec)))))
            return 0
        commands_ = {"inspect": inspect, "bench": bench, "diagnose": diagnose, "index": index, "write": write_cli.run}
        return commands_[args.command](args, out)
    except (CommandError, PipelineError, OSError, ValueError) as exc:
        print(f"pyloader: error: {exc}", file=sys.stderr)
        return 1
