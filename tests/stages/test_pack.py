"""``_stages.pack``: the packers alone — where each document goes, and what a packed sequence carries."""
from __future__ import annotations

from typing import List

import numpy as np
import pytest

from pyloader._stages.pack import METHODS, PackSpec, _best_fit, _first_fit, documents, fill, layout, pack_columns

pytestmark = pytest.mark.timeout(30)


def random_docs(seed: int, n: int, longest: int) -> List[List[int]]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, longest + 1, n)
    first = np.cumsum(lengths) - lengths
    return [list(range(1000 + a, 1000 + a + k)) for a, k in zip(first.tolist(), lengths.tolist())]


def packed(docs, seq_len, method, **kwargs):
    tokens, lengths = documents(docs, "tokens")
    return fill(tokens, lengths, layout(lengths, seq_len, method), seq_len, **kwargs)


def segments_of(out) -> List[List[int]]:
    """Each segment's tokens, sequence by sequence, in the order of their ids."""
    got = []
    for row, ids in zip(out["tokens"], out["segment_ids"]):
        for s in range(1, int(ids.max(initial=0)) + 1):
            got.append(row[ids == s].tolist())
    return got


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed, n, longest, seq_len", [(0, 50, 20, 16), (1, 200, 90, 32), (2, 7, 3, 8),
                                                      (3, 30, 64, 64), (4, 1, 100, 7)])
def test_every_token_is_packed_once_and_each_segment_is_a_run_of_one_document(method, seed, n, longest, seq_len):
    docs = random_docs(seed, n, longest)
    out = packed(docs, seq_len, method)
    real = out["segment_ids"] > 0
    assert sorted(out["tokens"][real].tolist()) == sorted(t for d in docs for t in d)
    assert (out["loss_mask"] == real).all(), "the loss mask is 0 exactly on padding"
    assert (out["tokens"][~real] == 0).all()
    for segment in segments_of(out):
        assert segment == list(range(segment[0], segment[0] + len(segment))), "a segment is consecutive tokens"
    for ids, pos in zip(out["segment_ids"], out["positions"]):
        for s in range(1, int(ids.max(initial=0)) + 1):
            assert pos[ids == s].tolist() == list(range((ids == s).sum())), "positions restart per segment"
        used = ids > 0
        assert not (used[1:] & ~used[:-1]).any(), "padding only after a sequence's last segment"


@pytest.mark.parametrize("method", ["first_fit", "best_fit"])
def test_fit_methods_cut_a_document_only_where_it_is_longer_than_a_sequence(method):
    docs = random_docs(5, 300, 40)
    out = packed(docs, 32, method)
    pieces = {}
    for segment in segments_of(out):
        doc = next(d for d in docs if d and d[0] <= segment[0] <= d[-1])
        pieces.setdefault(doc[0], []).append(len(segment))
    for doc in docs:
        if doc:
            expected = [32] * (len(doc) // 32) + ([len(doc) % 32] if len(doc) % 32 else [])
            assert sorted(pieces[doc[0]], reverse=True) == expected


def test_concat_lays_the_documents_end_to_end_in_order_and_cuts_every_seq_len():
    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11], [12]]
    out = packed(docs, 4, "concat")
    assert out["tokens"].tolist() == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    assert out["segment_ids"].tolist() == [[1, 1, 1, 2], [1, 2, 2, 2], [1, 1, 1, 2]]
    assert out["positions"].tolist() == [[0, 1, 2, 0], [0, 0, 1, 2], [0, 1, 2, 0]]


def test_best_fit_puts_a_document_where_it_leaves_the_least_room():
    # longest first: 6, 5 open two sequences (room 4 and 5); 4 fills the first exactly (first fit would too);
    # 3 goes where 5 is (room 5 -> 2), 2 then fills it
    docs = [list(range(100 * k, 100 * k + n)) for k, n in enumerate([5, 3, 6, 2, 4], 1)]
    out = packed(docs, 10, "best_fit")
    assert [sorted(len(s) for s in segments_of({k: v[[r]] for k, v in out.items()})) for r in range(2)] == \
        [[4, 6], [2, 3, 5]]
    # in arrival order: 5 and 7 open two sequences (room 5 and 3); 3 fills the second, where first fit takes the first
    assert _best_fit(np.array([5, 7, 3]), 10)[0].tolist() == [0, 1, 1]
    assert _first_fit(np.array([5, 7, 3]), 10)[0].tolist() == [0, 1, 0]


def test_fit_methods_fill_sequences_about_as_tightly_as_concat_which_cuts_documents_anywhere():
    lengths = np.array([len(d) for d in random_docs(9, 400, 30)])
    concat = layout(lengths, 128, "concat").rows
    for method in ("first_fit", "best_fit"):
        assert layout(lengths, 128, method).rows <= concat + 1


def test_a_window_packs_its_documents_apart_and_keeps_every_token():
    docs = random_docs(11, 100, 30)
    tokens, lengths = documents(docs, "tokens")
    whole, windowed = layout(lengths, 32, "best_fit"), layout(lengths, 32, "best_fit", window=10)
    assert windowed.rows >= whole.rows
    out = fill(tokens, lengths, windowed, 32)
    assert sorted(out["tokens"][out["segment_ids"] > 0].tolist()) == sorted(tokens.tolist())


def test_masked_documents_keep_their_tokens_with_a_loss_mask_of_zero_and_rows_pad_to_a_fixed_shape():
    spec = PackSpec("ids", 8, "best_fit", -1, 4)
    out = pack_columns({"ids": [[1, 2, 3], [4, 5], [6]], "text": ["a", "b", "c"]}, spec,
                       masked=np.array([False, True, False]))
    assert list(out) == ["ids", "segment_ids", "positions", "loss_mask"], "the other fields are not kept"
    assert out["ids"].shape == (4, 8)
    assert out["ids"][0].tolist() == [1, 2, 3, 4, 5, 6, -1, -1]
    assert out["loss_mask"][0].tolist() == [1, 1, 1, 0, 0, 1, 0, 0]
    assert not out["loss_mask"][1:].any() and (out["ids"][1:] == -1).all()


@pytest.mark.parametrize("columns, spec, error, match", [
    ({"text": ["a"]}, PackSpec("ids", 8, "concat", 0, None), ValueError, r"Pack.field 'ids' is not among .*'text'"),
    ({"ids": [[1.5, 2.0]]}, PackSpec("ids", 8, "concat", 0, None), TypeError, r"integer tokens, got dtype float64"),
    ({"ids": [[[1, 2]]]}, PackSpec("ids", 8, "concat", 0, None), ValueError, r"a document is not 1-D"),
    ({"ids": 5}, PackSpec("ids", 8, "concat", 0, None), TypeError, r"each document's tokens"),
    ({"ids": [[1] * 9]}, PackSpec("ids", 8, "best_fit", 0, 1), ValueError, r"need 2 sequences .* Pack.rows \(1\)"),
])
def test_a_batch_that_cannot_be_packed_is_an_error_saying_why(columns, spec, error, match):
    with pytest.raises(error, match=match):
        pack_columns(columns, spec)


def test_documents_of_one_length_as_a_2d_array_and_empty_documents_pack():
    out = pack_columns({"ids": np.arange(12).reshape(3, 4)}, PackSpec("ids", 8, "first_fit", 0, None))
    assert out["ids"].tolist() == [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 0, 0, 0, 0]]
    empty = pack_columns({"ids": [[], [7]]}, PackSpec("ids", 4, "concat", 0, None))
    assert empty["ids"].tolist() == [[7, 0, 0, 0]] and empty["ids"].dtype.kind == "i"
