"""Document packing (``pack=Pack(...)``) end to end: every token once per epoch, in sequences of
``seq_len``, resumable at any batch under 0 and 2 workers, and under ranks in equal steps."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
from conftest import spread_positions

import pyloader as pl
from pyloader.collators import NumpyCollator
from pyloader.readers import JsonLinesReader
from pyloader.testing import check_resume

pytestmark = pytest.mark.timeout(120)


def write_documents(folder: Path, files: int = 3, per_file: int = 15, seed: int = 0) -> List[List[int]]:
    """JSON lines of documents whose tokens are distinct integers; the documents, in file order."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    docs, first = [], 1
    for f in range(files):
        lines = []
        for _ in range(per_file):
            n = int(rng.integers(1, 40))
            docs.append(list(range(first, first + n)))
            lines.append(json.dumps({"tokens": docs[-1], "title": f"doc {first}"}))
            first += n
        (folder / f"part-{f}.jsonl").write_text("\n".join(lines) + "\n")
    return docs


def loader_of(data: Path, batch_size: int = 6, **kwargs) -> pl.DataLoader:
    kwargs.setdefault("pack", pl.Pack("tokens", seq_len=16))
    return pl.DataLoader(JsonLinesReader(batch_size=batch_size), pl.IdentityDataset(), NumpyCollator(), str(data),
                         **kwargs)


def trained_tokens(batches: List[Dict[str, np.ndarray]]) -> List[int]:
    """The tokens a model learns from (loss mask 1), over the batches."""
    return [t for b in batches for t in b["tokens"][b["loss_mask"]].tolist()]


@pytest.mark.parametrize("method", ["concat", "first_fit", "best_fit"])
@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_of_packed_sequences_holds_every_token_once(tmp_path, method, workers):
    docs = write_documents(tmp_path)
    loader = loader_of(tmp_path, pack=pl.Pack("tokens", seq_len=16, method=method), num_workers=workers)
    batches = list(loader)
    assert len(batches) == len(loader) == 8  # 45 documents, batches of 6
    assert sorted(trained_tokens(batches)) == [t for d in docs for t in d]
    for b in batches:
        assert set(b) == {"tokens", "segment_ids", "positions", "loss_mask"}
        assert b["tokens"].shape[1] == 16 and all(v.shape == b["tokens"].shape for v in b.values())
        assert ((b["segment_ids"] > 0) == b["loss_mask"]).all()
    loader.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_packing_resumes_exactly_at_any_batch(tmp_path, workers):
    write_documents(tmp_path)
    n = check_resume(lambda: loader_of(tmp_path, shuffle=True, num_epoch=2, num_workers=workers, shuffle_buffer=10,
                                       pack=pl.Pack("tokens", seq_len=16, method="best_fit", rows=12)),
                     positions=spread_positions if workers == 0 else [0, 3, 8, 9, 16])
    assert n == 16


@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_take_equal_steps_and_together_train_on_every_token_once(tmp_path, workers):
    docs = write_documents(tmp_path, files=4, per_file=10)  # 40 documents: shares of 13, 13, 14: 3 steps
    runs = []
    for rank in range(3):
        loader = loader_of(tmp_path, num_workers=workers, ranks=pl.Ranks(rank=rank, world_size=3),
                           pack=pl.Pack("tokens", seq_len=16, method="first_fit"))
        runs.append(list(loader))
        loader.close()
    assert [len(r) for r in runs] == [3, 3, 3]
    assert sorted(t for r in runs for t in trained_tokens(r)) == [t for d in docs for t in d], \
        "the documents repeated to even the steps out are not trained on"
    assert any((b["segment_ids"] > 0).sum() > b["loss_mask"].sum() for r in runs for b in r), "some were repeated"
    assert all(b["__padding__"].tolist() == [False] for r in runs for b in r), "one flag per batch: none repeats"


def test_packing_resumes_exactly_under_ranks(tmp_path):
    write_documents(tmp_path, files=3, per_file=13)
    check_resume(lambda: loader_of(tmp_path, num_workers=0, num_epoch=2, shuffle=True,
                                   ranks=pl.Ranks(rank=1, world_size=3)), positions=[0, 1, 3, 4, 6])


def test_rows_give_every_batch_one_shape(tmp_path):
    write_documents(tmp_path)
    loader = loader_of(tmp_path, num_workers=0, pack=pl.Pack("tokens", seq_len=32, rows=10, pad_value=-1))
    shapes = {b["tokens"].shape for b in loader}
    assert shapes == {(10, 32)}
    loader.close()


def test_a_batch_without_the_field_fails_at_stage_pack_naming_its_file(tmp_path):
    write_documents(tmp_path, files=1)
    loader = loader_of(tmp_path, num_workers=0, pack=pl.Pack("ids"))
    with pytest.raises(pl.PipelineError, match=r"(?s)pack.*part-0.jsonl.*Pack.field 'ids' is not among"):
        list(loader)
    loader.close()
    skipping = loader_of(tmp_path, num_workers=0, pack=pl.Pack("ids"), on_error="skip")
    assert list(skipping) == [] and skipping.stats["skipped_batches"] == 3
    skipping.close()


def test_packing_follows_rotation(tmp_path):
    docs = write_documents(tmp_path)
    loader = loader_of(tmp_path, num_workers=0, rotation=pl.Rotation(2))
    assert sorted(trained_tokens(list(loader))) == sorted([t for d in docs for t in d] * 2)
    loader.close()


@pytest.mark.parametrize("kwargs, match", [
    ({"stream": True}, r"pack packs each batch's documents .* stream mode"),
    ({"cache_encoded": {"dir": "CACHE", "update_every": 2}}, r"pack and cache_encoded do not go together"),
])
def test_pack_refuses_the_options_it_does_not_go_with(tmp_path, kwargs, match):
    write_documents(tmp_path / "data", files=1)
    kwargs = {k: ({**v, "dir": str(tmp_path / "cache")} if isinstance(v, dict) else v) for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=match):
        pl.DataLoader(JsonLinesReader(batch_size=4, shuffle=False), pl.IdentityDataset(), NumpyCollator(),
                      str(tmp_path / "data"), pack=pl.Pack("tokens"), **kwargs)


def test_a_pack_group_checks_its_fields_and_shows_the_ones_given():
    with pytest.raises(ValueError, match=r"Pack.method must be one of \('concat', 'first_fit', 'best_fit'\)"):
        pl.Pack("tokens", method="next_fit")
    with pytest.raises(ValueError, match=r"Pack.seq_len must be an integer >= 1, got 0"):
        pl.Pack("tokens", seq_len=0)
    with pytest.raises(TypeError, match=r"Pack.field must be the name of the field"):
        pl.Pack(3)  # type: ignore[arg-type]
    assert repr(pl.Pack("tokens", seq_len=8)) == "Pack('tokens', seq_len=8)"


def test_a_state_saved_without_packing_does_not_resume_a_packed_loader(tmp_path):
    write_documents(tmp_path)
    plain = loader_of(tmp_path, num_workers=0, pack=None)
    it = iter(plain)
    next(it)
    state = plain.state_dict()
    it.close()
    plain.close()
    packed = loader_of(tmp_path, num_workers=0)
    with pytest.raises(ValueError, match="pack"):
        packed.load_state_dict(state)
    packed.close()


def test_under_ranks_a_skipped_batch_is_replaced_by_a_copy_flagged_as_padding(tmp_path):
    write_documents(tmp_path, files=3, per_file=12)
    (tmp_path / "part-1.jsonl").write_text('{"tokens": "not tokens"}\n' * 12)  # rank 0: batch 2 from part-1
    loader = loader_of(tmp_path, num_workers=0, on_error="skip", ranks=pl.Ranks(rank=0, world_size=2))
    batches = list(loader)
    assert len(batches) == len(loader) == 3
    assert [b["__padding__"].tolist() for b in batches] == [[False], [False], [True]]
    loader.close()
