"""``benchmarks/bench_real.py`` runs (a smoke run on its smallest data; the full run is a benchmark, not a test)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[1]


def test_bench_real_times_the_plain_loop_and_pyloader_and_checks_every_sample_count():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_real.py"), "--quick", "--workload", "text",
                          "--contender", "plain", "--contender", "pyloader"],
                         capture_output=True, text=True, timeout=100, env=env, cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| text ")]
    assert len(rows) == 2, out.stdout  # the time table's row, then the memory table's
    times, memory = ([c.strip() for c in row.split("|")[2:4]] for row in rows)
    # a time (and the ratio to pyloader's) in every cell; the process tree's peaks, summed RSS / summed PSS
    assert all(re.fullmatch(r"[\d.]+ s( \([\d.]+x\))?", c) for c in times), rows[0]
    assert all(re.fullmatch(r"[\d,]+ / [\d,]+", c) for c in memory), rows[1]
    assert "count" not in rows[0], rows[0]  # every run delivered the data's samples
    assert "text/plain" in out.stdout and "WRONG COUNT" not in out.stdout
