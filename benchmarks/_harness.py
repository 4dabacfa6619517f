"""Shared machinery of the benchmark scripts: fresh subprocesses, memory of a process tree, tables.

Every measurement runs in its own child process (``python <script> --child ...``)
so imports, caches and peak memory never leak from one entry into the next. The
parent watches the child's whole process tree (the child and every process it
starts, e.g. loader workers) from a background thread:

* summed RSS every ``RSS_EVERY_S`` (20 ms), read from ``/proc/<pid>/statm``
  (a few microseconds per process, so the sampling does not steal CPU from the
  2-core machine it measures);
* summed PSS every ``PSS_EVERY_S`` (0.5 s; 20 ms for the memory entries, whose
  throughput is not the point), read from ``/proc/<pid>/smaps_rollup`` (about
  5 ms per torch-sized process, hence the slower rate). PSS splits pages
  shared between a parent and its forked workers instead of counting them once
  per process, so it is the fairer figure for loaders with worker processes.

The child prints one line ``@@RESULT {json}`` with what it measured itself
(samples, seconds, time to first batch, checks); the parent adds the peaks.

Importing this module puts the repository first on ``sys.path`` (the scripts run as
``python benchmarks/<script>.py``, whose folder Python puts there itself), so every
script measures this checkout's ``pyloader``.
"""
from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import re
import subprocess
import sys
import threading
import time
import types
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:  # the scripts measure this checkout's pyloader, not an installed one
    sys.path.insert(0, REPO)

from pyloader._cli import rss as rss_bytes  # noqa: E402  (this checkout's, once it is on the path)
from pyloader._cli import tree_pids  # noqa: E402

RSS_EVERY_S = 0.02
PSS_EVERY_S = 0.5
RESULT_TAG = "@@RESULT "
MB = 2 ** 20


# -- the process tree: ``tree_pids`` and ``rss_bytes`` are ``python -m pyloader bench``'s (``pyloader._cli``) --
def pss_bytes(pid: int) -> int:
    """PSS from smaps_rollup; falls back to psutil, then to RSS."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil

        return int(psutil.Process(pid).memory_full_info().pss)
    except Exception:
        return rss_bytes(pid)


def tree_rss() -> int:
    """Summed RSS of this process and its descendants now (cheap: /proc statm)."""
    return sum(rss_bytes(p) for p in tree_pids(os.getpid()))


def own_memory() -> Dict[str, int]:
    """This process's RSS and PSS now (the child's baseline, taken before its loader starts)."""
    pid = os.getpid()
    return {"rss": rss_bytes(pid), "pss": pss_bytes(pid)}


class TreeMonitor(threading.Thread):
    """Samples the summed RSS (and, less often, PSS) of a process tree until stopped."""

    def __init__(self, pid: int, pss_every: float = PSS_EVERY_S) -> None:
        super().__init__(name="tree-monitor", daemon=True)
        self.pid = pid
        self.pss_every = pss_every
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_procs = 0
        self.samples = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        next_pss = 0.0
        while not self._stop_event.is_set():
            pids = tree_pids(self.pid)
            self.peak_procs = max(self.peak_procs, len(pids))
            self.peak_rss = max(self.peak_rss, sum(rss_bytes(p) for p in pids))
            now = time.monotonic()
            if now >= next_pss:
                self.peak_pss = max(self.peak_pss, sum(pss_bytes(p) for p in pids))
                next_pss = now + self.pss_every
            self.samples += 1
            self._stop_event.wait(RSS_EVERY_S)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


# -- running one entry ----------------------------------------------------------------------------
def report(result: Dict[str, Any]) -> None:
    """Called by a child: hand its measurements to the parent."""
    sys.stdout.flush()
    print(RESULT_TAG + json.dumps(result), flush=True)


def run_child(argv: Sequence[str], timeout: float, env: Optional[Dict[str, str]] = None,
              pss_every: float = PSS_EVERY_S) -> Dict[str, Any]:
    """Run one measurement in a fresh interpreter, watching its process tree's memory."""
    child_env = dict(os.environ)
    child_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    child_env.setdefault("PYTHONHASHSEED", "0")
    if env:
        child_env.update(env)
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=child_env, text=True)
    monitor = TreeMonitor(proc.pid, pss_every)
    monitor.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in reversed(tree_pids(proc.pid)):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        out, err = proc.communicate()
        monitor.stop()
        return {"error": f"timed out after {timeout:.0f} s", "stderr": err[-2000:]}
    monitor.stop()
    result = None
    for line in out.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG):])
    if proc.returncode != 0 or result is None:
        return {"error": f"exit code {proc.returncode}", "stderr": (err or out)[-3000:]}
    result.update(peak_rss=monitor.peak_rss, peak_pss=monitor.peak_pss, peak_procs=monitor.peak_procs,
                  mem_samples=monitor.samples)
    return result


def best_of(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Best throughput and first-batch time, largest peak memory, of the runs that worked."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return dict(runs[-1], runs=len(runs), ok_runs=0)
    best = dict(max(ok, key=lambda r: r["samples_per_s"]))
    best["all_samples_per_s"] = [round(r["samples_per_s"], 1) for r in ok]
    best["first_batch_s"] = min(r["first_batch_s"] for r in ok)
    for key in ("peak_rss", "peak_pss", "peak_procs"):
        best[key] = max(r.get(key, 0) for r in ok)
    best["growth_rss"] = max(r["peak_rss"] - r["baseline"]["rss"] for r in ok)
    best["checks_ok"] = all(r.get("checks_ok", True) for r in ok)
    best["runs"], best["ok_runs"] = len(runs), len(ok)
    return best


def measure(name: str, argv: Sequence[str], repeats: int, timeout: float, log: Callable[[str], None] = print,
            env: Optional[Dict[str, str]] = None, pss_every: float = PSS_EVERY_S) -> Dict[str, Any]:
    runs = []
    for i in range(repeats):
        t = time.perf_counter()
        r = run_child(argv, timeout, env, pss_every)
        wall = time.perf_counter() - t
        if "error" in r:
            log(f"  {name:<34} run {i + 1}/{repeats}: FAILED ({r['error']})\n{r.get('stderr', '')}")
        else:
            log(f"  {name:<34} run {i + 1}/{repeats}: {r['samples_per_s']:>11,.0f} samples/s  "
                f"first batch {r['first_batch_s']:.3f} s  peak RSS {r['peak_rss'] / MB:,.0f} MB  "
                f"PSS {r['peak_pss'] / MB:,.0f} MB  checks {'ok' if r.get('checks_ok', True) else 'FAILED'}"
                f"  ({wall:.1f} s wall)"
                + (f"  [{len(r['threads_left_after_close'])} threads alive after close(), gone after "
                   f"{r['thread_exit_wait_s']:.2f} s]" if r.get("threads_left_after_close") else ""))
        runs.append(r)
    return best_of(runs)


# -- peers ----------------------------------------------------------------------------------------
class _TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty ``torchvision`` modules whose every attribute is an empty class."""

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name.split(".")[0] == "torchvision":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        module = types.ModuleType(spec.name)
        module.__path__ = []  # type: ignore[attr-defined]
        module.__getattr__ = lambda attr: type(attr, (), {})  # type: ignore[method-assign]
        return module

    def exec_module(self, module):  # type: ignore[no-untyped-def]
        pass


def mosaic_importable() -> None:
    """Let ``import streaming`` (Mosaic) work without torchvision: the package imports it at start-up for its
    vision datasets only, and torchvision from PyPI does not load beside the CPU torch of ``constraints.txt``.
    Where torchvision does not import, a stub stands in for it (in this process; call it in each process that
    imports ``streaming``, spawned workers included)."""
    if any(isinstance(finder, _TorchvisionStub) for finder in sys.meta_path):
        return
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        sys.meta_path.insert(0, _TorchvisionStub())


def litdata_cache_in(folder: str) -> None:
    """Point LitData's ``optimize`` caches (chunks before they are moved, downloaded inputs) into ``folder``
    instead of the machine's shared temporary folder, so that they go with the benchmark's data."""
    for var, name in (("DATA_OPTIMIZER_CACHE_FOLDER", "chunks"), ("DATA_OPTIMIZER_DATA_CACHE_FOLDER", "data")):
        os.environ[var] = os.path.join(folder, "litdata-cache", name)


# -- output ---------------------------------------------------------------------------------------
def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: Optional[str] = None) -> str:
    rows = [[str(c) for c in row] for row in rows]
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else ":---:" if a == "c" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def replace_section(path: str, name: str, body: str) -> None:
    """Replace the text between ``<!-- name:start -->`` and ``<!-- name:end -->`` (append both if absent)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    block = f"{start}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def machine_line() -> str:
    import platform

    try:
        import psutil

        mem = f"{psutil.virtual_memory().total / 2 ** 30:.0f} GiB"
    except ImportError:
        mem = "? GiB"
    load = os.getloadavg()
    return (f"{os.cpu_count()} cores, {mem} RAM, CPU only; Python {platform.python_version()}; "
            f"load average at start {load[0]:.2f}")


def source_digest(folder: str) -> str:
    """A short SHA-1 of the ``.py`` files under ``folder`` and the newest one's time: which code was measured."""
    import hashlib

    h, newest = hashlib.sha1(), 0.0
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, folder).encode())
                with open(path, "rb") as f:
                    h.update(f.read())
                newest = max(newest, os.path.getmtime(path))
    changed = time.strftime('%H:%M', time.localtime(newest))
    return f"sha1 {h.hexdigest()[:12]} of pyloader/**/*.py, newest file changed {changed}"


def _spin(n: int) -> None:
    s = 0
    for i in range(n):
        s += i


def effective_cores(n: int = 8_000_000) -> float:
    """How many cores this machine gives us right now: 2 x (time of one spinning
    process) / (time of two at once). 2.0 on an idle 2-core machine; less when
    other jobs share it."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")

    def timed(k: int) -> float:
        procs = [ctx.Process(target=_spin, args=(n,)) for _ in range(k)]
        t = time.perf_counter()
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        return time.perf_counter() - t

    one = timed(1)
    return 2 * one / timed(2)


def fmt_rate(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:,.0f}"


def fmt_mb(x: Optional[float]) -> str:
    return "-" if x is None else f"{x / MB:,.0f}"


def common_args(ap: Any, write_help: str, default_repeats: str, results_json: str) -> None:
    """The options both benchmark scripts take (and the hidden ones of their child runs)."""
    ap.add_argument("--quick", action="store_true", help="small data: a smoke run")
    ap.add_argument("--repeats", type=int, default=None, help=f"runs per entry (default {default_repeats})")
    ap.add_argument("--replot", action="store_true",
                    help=f"only redraw the plot from the results saved by the last --write ({results_json})")
    child_args(ap, 600, write_help)


def child_args(ap: Any, timeout: float, write_help: str = "write the results into benchmarks/README.md") -> None:
    """``--write``, ``--timeout`` (seconds per child run) and the hidden options of a child run: see
    ``run_child_if_asked``."""
    ap.add_argument("--write", action="store_true", help=write_help)
    ap.add_argument("--timeout", type=float, default=timeout, help="seconds per child run")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--cfg", help=argparse.SUPPRESS)


def run_child_if_asked(args: Any, child: Callable[[str, str, dict], None]) -> bool:
    """In a child run (``--child``), run its entry: True when that was the whole job."""
    if args.child:
        child(args.child, args.data, json.loads(args.cfg))
        return True
    return False


def child_or_replot(args: Any, child: Callable[[str, str, dict], None], results_json: str,
                    plot: Optional[Callable[[dict, dict, str], None]], image: Optional[str]) -> bool:
    """Run the child entry or redraw the plot when asked to; True when that was the whole job."""
    if run_child_if_asked(args, child):
        return True
    if args.replot and plot is not None and image is not None:
        with open(results_json) as f:
            saved = json.load(f)
        plot(saved["results"], saved["cfg"], image)
        print(f"redrew {os.path.relpath(image)}")
        return True
    return False


def write_results(section: str, markdown: str, results_json: str, payload: dict,
                  plot: Optional[Callable[[dict, dict, str], None]], image: Optional[str]) -> None:
    """``--write``: the README section, every figure as JSON, and the plot."""
    replace_section(os.path.normpath(os.path.join(os.path.dirname(results_json), "..", "README.md")), section, markdown)
    os.makedirs(os.path.dirname(results_json), exist_ok=True)
    with open(results_json, "w") as f:
        json.dump(payload, f, indent=1, sort_keys=True)
    if plot is None or image is None:
        print(f"\nwrote benchmarks/README.md ({section} section)")
        return
    os.makedirs(os.path.dirname(image), exist_ok=True)
    plot(payload["results"], payload["cfg"], image)
    print(f"\nwrote benchmarks/README.md ({section} section) and {os.path.relpath(image)}")
