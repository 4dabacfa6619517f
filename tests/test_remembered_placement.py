"""``num_workers="auto"``: the next run of the same code on the same data starts where the last one kept
its files, without a trial (``_execution.remembered``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List

import pytest
from conftest import write_chunks

from pyloader._execution import remembered
from pyloader._execution.auto_workers import cpu_share
from pyloader._execution.measured import HERE, SPLIT, THERE, Measured

REPO = Path(__file__).resolve().parents[1]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def short(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows measured over a few batches, so that one window is about one file here."""
    monkeypatch.setattr(Measured, "TRIAL_S", 0.05)
    monkeypatch.setattr(Measured, "STEADY_S", 0.1)
    monkeypatch.setattr(Measured, "MIN_BATCHES", 4)


def run(m: Measured, clock: Clock, speed: Dict[str, float], files: int) -> List[str]:
    """The places of ``files`` files of 20 batches, each batch taking ``speed[place]`` seconds."""
    places = []
    for k in range(files):
        place = m.place(0, f"f{k}")
        places.append(place)
        for _ in range(20):
            clock.now += speed[place]
            m.handed(0, (f"f{k}",), 10)
    return places


def test_a_remembered_place_is_where_a_run_starts_and_its_first_window_confirms_it_without_a_trial(
        short: None) -> None:
    clock, kept = Clock(), []
    m = Measured(clock, remembered=SPLIT, keep=kept.append)
    m.new_run()
    assert m.first_place() == SPLIT
    places = run(m, clock, {HERE: 0.02, THERE: 0.02, SPLIT: 0.01}, 4)
    assert places == [SPLIT] * 4 and m.kept == SPLIT and m.changes == [] and kept == []
    assert m.report()["remembered"] == SPLIT and m.report()["trial_over"]


def test_a_remembered_place_that_became_slower_is_left_at_a_probe_and_the_new_one_remembered(short: None) -> None:
    clock, kept = Clock(), []
    m = Measured(clock, remembered=HERE, keep=kept.append)
    m.new_run()
    places = run(m, clock, {HERE: 0.02, THERE: 0.01, SPLIT: 0.03, "workers, batches spread": 0.03,
                            "workers, one fewer": 0.03}, 24)
    assert places[0] == HERE and m.kept == THERE
    assert [c["by"] for c in m.changes] == ["probe"] and kept == [THERE]


@pytest.mark.parametrize("threads_per_batch,left", [(0.011, THERE), (0.005, HERE)])
def test_a_run_ending_before_its_trial_leaves_the_first_place_unless_another_was_clearly_faster(
        short: None, threads_per_batch: float, left: str) -> None:
    """Six files of an epoch: the threads' window takes the last ones (no window after it could measure as
    much before the end), so the trial never ends; what it measured is left for the next run."""
    clock, kept = Clock(), []
    m = Measured(clock, keep=kept.append)
    m.new_run(epoch_files=3)
    for k in range(3):
        place = m.place(0, f"f{k}", pos=k)
        for _ in range(20):
            clock.now += threads_per_batch if place == HERE else 0.01
            m.handed(0, (f"f{k}",), 10)
    assert m.kept is None and kept[-1] == left


@pytest.mark.parametrize("name", ["the moon", ["workers"], None])
def test_a_remembered_name_that_is_no_place_is_ignored(name: Any) -> None:
    m = Measured(Clock(), remembered=name)
    m.new_run()
    assert m.remembered is None and m.kept is None and m.first_place() == THERE


def test_a_place_is_remembered_by_name_only_and_a_damaged_record_is_none(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(remembered.ENV, str(tmp_path))
    assert remembered.recall("k1") is None
    remembered.remember("k1", THERE)
    assert remembered.recall("k1") == THERE
    (tmp_path / "placement" / "k2.json").write_text("{not json")
    (tmp_path / "placement" / "k3.json").write_text(json.dumps(["workers"]))
    assert remembered.recall("k2") is None and remembered.recall("k3") is None
    monkeypatch.setenv(remembered.ENV, "off")
    remembered.remember("k4", HERE)
    assert remembered.recall("k1") is None and not (tmp_path / "placement" / "k4.json").exists()


def test_only_the_latest_places_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(remembered.ENV, str(tmp_path))
    monkeypatch.setattr(remembered, "KEEP", 3)
    for k in range(5):
        remembered.remember(f"k{k}", HERE)
        os.utime(tmp_path / "placement" / f"k{k}.json", (k + 1, k + 1))
    assert sorted(p.name for p in (tmp_path / "placement").iterdir()) == ["k2.json", "k3.json", "k4.json"]


def test_a_folder_that_cannot_be_written_leaves_the_run_as_it_was(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a file").write_text("")
    monkeypatch.setenv(remembered.ENV, str(tmp_path / "a file"))
    remembered.remember("k", HERE)
    assert remembered.recall("k") is None


IDENTITY = """
import sys
sys.path.insert(0, {tests!r})
import pyloader as pl
from pyloader._execution import remembered

class Reader(pl.DataReader):
    def read_file(self, path):
        return {{"id": [{value}]}}, 1

def keep(sample):
    return sample["id"] % 2 == 0

print(remembered.identity([Reader(4), pl.IdentityDataset(), keep], ["a/1.txt", "a/2.txt"], 2, None))
print(remembered.identity([Reader(4), pl.IdentityDataset(), keep], ["a/1.txt", "a/3.txt"], 2, None))
"""


def _identities(tmp_path: Path, value: int, seed: str) -> List[str]:
    script = tmp_path / f"identity_{value}_{seed}.py"
    script.write_text(textwrap.dedent(IDENTITY.format(tests=str(Path(__file__).parent), value=value)))
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def test_the_identity_is_the_same_in_every_process_and_changes_with_the_code_and_the_data(tmp_path: Path) -> None:
    same, other_files = _identities(tmp_path, 1, "1")
    assert [same, other_files] == _identities(tmp_path, 1, "2")  # hashing of str differs between the two
    assert same != other_files
    assert _identities(tmp_path, 2, "1")[0] != same  # one constant of read_file changed


SCRIPT = """
import json, sys, time
import pyloader as pl

class SlowParse(pl.DataReader):
    def read_file(self, path):
        with open(path) as f:
            ids = [int(line) for line in f]
        end = time.perf_counter() + 0.002 * len(ids)
        while time.perf_counter() < end:  # Python holding the GIL, as a parse does
            pass
        return {"id": ids}, len(ids)

class Keep(pl.DataCollator):
    def collate_batch(self, features):
        return dict(features)

if __name__ == "__main__":
    loader = pl.DataLoader(SlowParse(8), pl.IdentityDataset(), Keep(), sys.argv[1])
    ids = sorted(i for batch in loader for i in batch["id"])
    measured = loader.stats["placement"].get("measured") or {}
    loader.close()
    print(json.dumps({"ids": ids, "remembered": measured.get("remembered"), "kept": measured.get("kept"),
                      "first": (measured.get("windows") or [{}])[0].get("place")}))
"""


def _run_script(folder: Path, cache: str) -> Dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYLOADER_NUM_WORKERS", "LOCAL_WORLD_SIZE")}
    env.update(PYTHONPATH=str(REPO), PYLOADER_CACHE_DIR=cache)
    done = subprocess.run([sys.executable, str(folder / "script.py"), str(folder / "data")], capture_output=True,
                          text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(cpu_share() < 2, reason="'auto' starts no worker on 1 CPU")
@pytest.mark.timeout(400)
def test_the_next_run_of_a_program_starts_where_the_last_one_kept_its_files(tmp_path: Path) -> None:
    sizes = [40] * 72
    write_chunks(tmp_path / "data", sizes)
    (tmp_path / "script.py").write_text(textwrap.dedent(SCRIPT))
    cache = str(tmp_path / "cache")
    first = _run_script(tmp_path, cache)
    assert first["ids"] == list(range(sum(sizes))) and first["remembered"] is None
    assert first["kept"] is not None, first  # the trial ended: 72 files of 5 batches are enough
    second = _run_script(tmp_path, cache)
    assert second["ids"] == first["ids"]
    assert second["remembered"] == first["kept"] and second["first"] == first["kept"]
