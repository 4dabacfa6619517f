"""Property tests: exactly once, full batches, determinism and resume, over random layouts and settings."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from conftest import IdReader, ListCollator, wait_no_threads, write_chunks
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import pyloader as pl

pytestmark = pytest.mark.timeout(120)

# derandomize: the same examples on every run (no flaky CI), database=None: nothing written to the repo
FAST = settings(max_examples=15, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


@st.composite
def configs(draw, min_files: int = 1, min_samples: int = 0, shuffled: bool = False) -> Dict[str, Any]:
    return {
        "sizes": draw(st.lists(st.integers(min_samples, 40), min_size=min_files, max_size=12)),
        "batch_size": draw(st.integers(1, 9)),
        "drop_last": draw(st.just(False) if shuffled else st.booleans()),
        "shuffle": draw(st.just(True) if shuffled else st.booleans()),
        "reader_shuffle": draw(st.booleans()),
        "shuffle_buffer": draw(st.one_of(st.just(0), st.integers(1, 30))),
        "num_epoch": draw(st.integers(1, 2)),
        "seed": draw(st.integers(0, 2**31 - 1)),
        "max_queue_size": draw(st.integers(1, 4)),
        "prefetch_files": draw(st.integers(1, 3)),
    }


def make(folder: Path, cfg: Dict[str, Any], seed: int) -> pl.DataLoader:
    reader = IdReader(cfg["batch_size"], shuffle=cfg["reader_shuffle"], random_seed=seed + 1000)
    return pl.DataLoader(reader, pl.IdentityDataset(), ListCollator(), str(folder),
                         num_epoch=cfg["num_epoch"], max_queue_size=cfg["max_queue_size"],
                         shuffle=cfg["shuffle"], random_seed=seed, shuffle_buffer=cfg["shuffle_buffer"],
                         drop_last=cfg["drop_last"], prefetch_files=cfg["prefetch_files"])


def run(loader: pl.DataLoader) -> List[Tuple[int, List[int]]]:
    out = []
    for batch in loader:
        out.append((loader.epoch, list(batch["id"])))
    return out


def check_epochs(cfg: Dict[str, Any], batches: List[Tuple[int, List[int]]]) -> None:
    total, bs = sum(cfg["sizes"]), cfg["batch_size"]
    epochs = [e for e, _ in batches]
    assert epochs == sorted(epochs), "epochs come in order"
    assert set(epochs) <= set(range(cfg["num_epoch"]))
    for epoch in range(cfg["num_epoch"]):
        sizes = [len(ids) for e, ids in batches if e == epoch]
        got = [i for e, ids in batches if e == epoch for i in ids]
        assert len(got) == len(set(got)), f"epoch {epoch}: a sample came twice"
        assert set(got) <= set(range(total))
        if cfg["drop_last"]:
            assert len(got) == total - total % bs
            assert all(n == bs for n in sizes), sizes
        else:
            assert sorted(got) == list(range(total)), f"epoch {epoch}: samples lost"
            assert all(n == bs for n in sizes[:-1]), sizes
            assert all(1 <= n <= bs for n in sizes[-1:]), sizes
        assert total - len(got) < bs or total == 0 and not got
    if not (cfg["shuffle"] or cfg["reader_shuffle"] or cfg["shuffle_buffer"]):
        expected = list(range(total - total % bs if cfg["drop_last"] else total))
        for epoch in range(cfg["num_epoch"]):
            assert [i for e, ids in batches if e == epoch for i in ids] == expected


@FAST
@given(cfg=configs())
def test_exactly_once_full_batches_and_determinism(cfg):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "data"
        write_chunks(folder, cfg["sizes"])
        first = run(make(folder, cfg, cfg["seed"]))
        check_epochs(cfg, first)

        assert run(make(folder, cfg, cfg["seed"])) == first, "same seed, same batches"

        nonempty_files = len(cfg["sizes"]) >= 6 and all(n >= 1 for n in cfg["sizes"])
        # drop_last is left out: what differs may lie entirely in a dropped tail
        if cfg["shuffle"] and nonempty_files and not cfg["drop_last"]:
            other = run(make(folder, cfg, cfg["seed"] + 1))
            check_epochs(cfg, other)
            assert other != first, "another seed, another order"
            event("another seed compared")
    assert wait_no_threads() == []


@settings(FAST, max_examples=12)
@given(cfg=configs(min_files=6, min_samples=1, shuffled=True))
def test_another_seed_gives_another_order(cfg):
    """With the file order shuffled and at least 6 files of at least one sample, the seed matters."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "data"
        write_chunks(folder, cfg["sizes"])
        first = run(make(folder, cfg, cfg["seed"]))
        other = run(make(folder, cfg, cfg["seed"] + 1))
        check_epochs(cfg, first)
        check_epochs(cfg, other)
        assert other != first
        assert run(make(folder, cfg, cfg["seed"] + 1)) == other
    assert wait_no_threads() == []


@FAST
@given(cfg=configs(), where=st.floats(0, 1))
def test_resume_anywhere_matches_the_uninterrupted_run(cfg, where):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "data"
        write_chunks(folder, cfg["sizes"])
        uninterrupted = make(folder, cfg, cfg["seed"])
        full, second = run(uninterrupted), run(uninterrupted)
        k = round(where * len(full))

        loader = make(folder, cfg, cfg["seed"])
        it = iter(loader)
        head = []
        for _ in range(k):
            ids = list(next(it)["id"])
            head.append((loader.epoch, ids))
        state = json.loads(json.dumps(loader.state_dict()))
        loader.close()

        resumed = make(folder, cfg, cfg["seed"])
        resumed.load_state_dict(state)
        if k < len(full) or not full:
            assert head + run(resumed) == full
            assert run(resumed) == second  # the next iteration goes on with the next epochs
        else:  # saved after the last batch, before the end was seen: that iteration is over
            assert run(resumed) == second
            assert run(resumed) == run(uninterrupted)  # its third iteration
    assert wait_no_threads() == []
