"""The option groups (``pyloader._groups``): each checks its own values, and the flat keywords of 0.1
(``_options.MOVED``) still work, moved into their groups with a ``FutureWarning``."""
from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
from conftest import IdReader, ListCollator, ids_of, write_chunks

import pyloader as pl
from pyloader._options import MOVED, OLD_KEYWORDS, moved_to

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[1]


def loader(folder: Path, **kwargs: Any) -> pl.DataLoader:
    return pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(folder), **kwargs)


def worker_init(worker_id: int) -> None:
    """Does nothing, in each worker."""


def odd_ids(sample: Dict[str, Any]) -> bool:
    return sample["id"] % 2 == 1


def reversed_files(files: List[str], epoch: int, rng: Any) -> List[str]:
    return list(reversed(files))


def batches(made: pl.DataLoader) -> List[Dict[str, list]]:
    with made:
        return [{k: np.asarray(v).tolist() for k, v in b.items()} for b in made]


def id_length(sample: Dict[str, Any]) -> int:
    return sample["id"] % 3


@pytest.mark.parametrize("make, error, message", [
    (lambda: pl.Stream(seq_len=0), ValueError, r"Stream.seq_len must be an integer >= 1, got 0"),
    (lambda: pl.Stream(padding_mode="mirror"), ValueError, r"Stream.padding_mode must be one of .*'mirror'"),
    (lambda: pl.Stream(time_major=True), ValueError, r"Stream.time_major=True .* needs seq_len"),
    (lambda: pl.Ranks(rank=-1), ValueError, r"Ranks.rank must be an integer >= 0, got -1"),
    (lambda: pl.Ranks(world_size=0), ValueError, r"Ranks.world_size must be an integer >= 1, got 0"),
    (lambda: pl.Ranks(rank=2, world_size=2), ValueError, r"Ranks needs 0 <= rank < world_size, got rank=2"),
    (lambda: pl.Ranks(even_batches="trim"), ValueError, r"Ranks.even_batches must be one of .*'trim'"),
    (lambda: pl.Storage(retries=-1), ValueError, r"Storage.retries must be an integer >= 0, got -1"),
    (lambda: pl.Storage(readahead_bytes=1.5), ValueError, r"Storage.readahead_bytes must be an integer >= 0"),
    (lambda: pl.Storage(cache_dir=3), TypeError, r"Storage.cache_dir must be a folder's path, got 3"),
    (lambda: pl.Storage(cache_limit=10), ValueError, r"Storage.cache_limit sizes the disk cache: it needs cache_dir"),
    (lambda: pl.Rotation(1), ValueError, r"Rotation.times must be an integer >= 2 .*got 1"),
    (lambda: pl.Rotation(3, size=2), ValueError, r"Rotation.size .* must be >= times \(3\), got 2"),
    (lambda: pl.Bucket(3), TypeError, r"Bucket.by must be a field name or a callable .*got 3"),
    (lambda: pl.Bucket("text", buffer=0), ValueError, r"Bucket.buffer must be an integer >= 1, got 0"),
    (lambda: pl.OnError("ignore"), ValueError, r"OnError.policy must be 'raise', 'skip' or a callable"),
    (lambda: pl.OnError("skip", max_errors=-1), ValueError, r"OnError.max_errors must be an integer >= 0, got -1"),
])
def test_each_group_refuses_a_bad_value_with_a_message_naming_its_field(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_a_group_is_frozen_keyword_only_after_its_first_field_and_shows_the_fields_given():
    assert repr(pl.Stream(seq_len=8)) == "Stream(seq_len=8)" and repr(pl.Ranks()) == "Ranks()"
    assert repr(pl.OnError("skip", max_errors=10)) == "OnError('skip', max_errors=10)"
    assert pl.Stream() == pl.Stream(padding_mode="zeros") and hash(pl.Rotation(2)) == hash(pl.Rotation(2))
    with pytest.raises(TypeError):
        pl.Bucket("text", 64)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        pl.Stream().seq_len = 2  # type: ignore[misc]


def test_a_bad_group_given_to_the_loader_is_a_type_error_naming_the_keyword(tmp_path):
    write_chunks(tmp_path, [4])
    with pytest.raises(TypeError, match=r"ranks must be a pyloader.Ranks, got Storage"):
        loader(tmp_path, ranks=pl.Storage())
    with pytest.raises(TypeError, match=r"stream must be True, False or a pyloader.Stream, got 8"):
        loader(tmp_path, stream=8)


def test_the_rules_between_a_group_and_other_options_are_checked_when_the_loader_is_made(tmp_path):
    write_chunks(tmp_path, [4])
    with pytest.raises(ValueError, match=r"Bucket.buffer must be an integer >= batch_size \(2\), got 1"):
        loader(tmp_path, bucket=pl.Bucket("id", buffer=1))
    with pytest.raises(ValueError, match="rotation re-batches samples"):
        loader(tmp_path, rotation=pl.Rotation(2), bucket=pl.Bucket(id_length))
    with pytest.raises(ValueError, match="stream mode keeps each row in file order: shuffle_buffer must be 0"):
        loader(tmp_path, stream=pl.Stream(seq_len=2), shuffle_buffer=4)


@pytest.mark.parametrize("old, new", [
    ({"stream": True, "seq_len": 2, "padding_mode": "edge"}, {"stream": pl.Stream(seq_len=2, padding_mode="edge")}),
    ({"stream": True, "seq_len": 2, "time_major": True}, {"stream": pl.Stream(seq_len=2, time_major=True)}),
    ({"rank": 1, "world_size": 2, "even_batches": "drop"}, {"ranks": pl.Ranks(rank=1, world_size=2,
                                                                             even_batches="drop")}),
    ({"retries": 0, "readahead_bytes": 0}, {"storage": pl.Storage(retries=0, readahead_bytes=0)}),
    ({"rotation": 3, "rotation_size": 12}, {"rotation": pl.Rotation(3, size=12)}),
    ({"bucket_by": id_length, "bucket_buffer": 4}, {"bucket": pl.Bucket(id_length, buffer=4)}),
    ({"on_error": "skip", "max_errors": 3}, {"on_error": pl.OnError("skip", max_errors=3)}),
    ({"num_workers": 2, "num_threads": 2, "persistent_workers": True, "start_method": "fork",
      "worker_init_fn": worker_init},
     {"workers": pl.Workers(2, threads=2, persistent=True, start_method="fork", init_fn=worker_init)}),
    ({"num_workers": 0, "num_threads": 3}, {"workers": pl.Workers(0, threads=3)}),
    ({"pin_memory": True}, {"device": pl.Device(pin_memory=True)}),
    ({"shuffle_buffer": 5, "filter_fn": odd_ids, "stop": "all_exhausted"},
     {"order": pl.Order(shuffle_buffer=5, filter_fn=odd_ids, stop="all_exhausted")}),
    ({"file_order": reversed_files}, {"order": pl.Order(file_order=reversed_files)}),
    ({"prefetch_files": 1}, {"storage": pl.Storage(prefetch_files=1)}),
])
def test_an_old_keyword_gives_the_batches_and_state_of_its_group_with_a_warning_naming_the_new_form(
        tmp_path, old, new):
    write_chunks(tmp_path, [5, 3, 4])
    shuffle = "file_order" not in old  # file_order replaces shuffle
    grouped = loader(tmp_path, shuffle=shuffle, **{"workers": 0, **new})
    with pytest.warns(FutureWarning) as caught:
        flat = loader(tmp_path, shuffle=shuffle, **({} if "workers" in new else {"workers": 0}), **old)
    (keyword, group), = new.items()
    shown = f"is now {keyword}={flat.__getattribute__(keyword)!r}"
    assert any(shown in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert getattr(flat, keyword) == getattr(grouped, keyword)
    assert batches(flat) == batches(grouped)
    assert flat.state_dict() == grouped.state_dict()


def test_an_old_keyword_warns_at_the_users_call(tmp_path):
    write_chunks(tmp_path, [4])
    with pytest.warns(FutureWarning, match=r"seq_len=2 is now stream=Stream\(seq_len=2\)") as caught:
        loader(tmp_path, stream=True, seq_len=2)
    assert caught[0].filename == __file__  # through ``loader`` above: the frame that called DataLoader


def test_an_old_keyword_at_its_default_without_its_group_is_left_out_with_a_warning(tmp_path):
    write_chunks(tmp_path, [4])
    with pytest.warns(FutureWarning, match=r"rotation=1 is now left out \(no effect with rotation=None\)"):
        made = loader(tmp_path, rotation=1, num_workers=0)
    assert made.rotation is None and sorted(ids_of(batches(made))) == list(range(4))
    with pytest.warns(FutureWarning, match=r"padding_mode='zeros' is now left out"):
        assert loader(tmp_path, padding_mode="zeros").stream is False


@pytest.mark.parametrize("given, message", [
    ({"seq_len": 4}, r"seq_len=4 has no effect without stream: write stream=Stream\(seq_len=4\)"),
    ({"bucket_buffer": 8}, r"bucket_buffer=8 has no effect without bucket: write bucket=Bucket\(by, buffer=8\)"),
    ({"rotation_dir": "/tmp/r"}, r"write rotation=Rotation\(times, folder='/tmp/r'\)"),
])
def test_an_old_keyword_without_its_feature_is_a_value_error_naming_the_new_form(tmp_path, given, message):
    write_chunks(tmp_path, [4])
    with warnings.catch_warnings(), pytest.raises(ValueError, match=message):
        warnings.simplefilter("ignore", FutureWarning)
        loader(tmp_path, **given)


@pytest.mark.parametrize("given, message", [
    ({"stream": pl.Stream(), "seq_len": 2}, r"got seq_len=2 and stream=Stream\(\): give seq_len inside the Stream"),
    ({"ranks": pl.Ranks(rank=0), "world_size": 2}, r"got world_size=2 and ranks=Ranks\(rank=0\)"),
    ({"on_error": pl.OnError("skip"), "max_errors": 1}, r"got max_errors=1 and on_error=OnError\('skip'\)"),
    ({"bucket": pl.Bucket("id"), "bucket_buffer": 8}, r"got bucket_buffer=8 and bucket=Bucket\('id'\)"),
    ({"storage": pl.Storage(prefetch_files=2), "prefetch_files": 1},
     r"got prefetch_files=1 and storage=Storage\(prefetch_files=2\)"),
    ({"storage": pl.Storage(retries=1), "retries": 2}, r"got retries=2 and storage=Storage\(retries=1\)"),
])
def test_an_old_keyword_together_with_its_group_is_a_type_error(tmp_path, given, message):
    write_chunks(tmp_path, [4])
    with pytest.raises(TypeError, match=message):
        loader(tmp_path, **given)


def test_prefetch_files_given_beside_a_storage_as_before_joins_it_with_a_warning(tmp_path):
    write_chunks(tmp_path, [4])
    with pytest.warns(FutureWarning, match=r"prefetch_files=1 is now storage=Storage\(retries=0, prefetch_files=1\)"):
        made = loader(tmp_path, prefetch_files=1, storage=pl.Storage(retries=0), workers=0)
    assert made.storage == pl.Storage(retries=0, prefetch_files=1) and ids_of(batches(made)) == [0, 1, 2, 3]


def test_a_typo_of_an_old_keyword_names_its_new_form(tmp_path):
    write_chunks(tmp_path, [4])
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'seq_lne'; did you mean "
                                        r"stream=Stream\(seq_len=\.\.\.\)\?"):
        loader(tmp_path, seq_lne=2)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'rankz'; did you mean 'ranks'\?"):
        loader(tmp_path, rankz=pl.Ranks())


def test_the_signature_has_at_most_21_parameters_and_keeps_the_original_ones():
    params = inspect.signature(pl.DataLoader).parameters
    assert len(params) <= 21  # 42 before the groups, 29 before the workers, device and order; then pack= (issue 49)
    assert list(params)[:8] == ["datareader", "dataset", "datacollator", "data_dir", "num_epoch", "max_queue_size",
                                "shuffle", "random_seed"]
    assert not set(params) & (set(OLD_KEYWORDS) - set(MOVED))


def test_the_groups_are_public_with_a_docstring_and_an_example_each():
    for group in {m.group for m in MOVED.values()}:
        assert group.__name__ in pl.__all__ and getattr(pl, group.__name__) is group
        assert "Example:" in (group.__doc__ or ""), group


def test_loader_shard_keeps_the_ranks_settings_it_does_not_replace(tmp_path):
    write_chunks(tmp_path, [4, 4])
    made = loader(tmp_path, ranks=pl.Ranks(rank=0, world_size=2, even_batches="drop"), num_workers=0)
    assert made.shard(1, 2).ranks == pl.Ranks(rank=1, world_size=2, even_batches="drop")


def test_the_changelog_lists_every_moved_keyword_with_its_new_form():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    listed = re.findall(r"^  - `(\w+)=` → `(.*)`$", text, re.M)
    assert sorted(listed) == sorted((old, moved_to(old)) for old in OLD_KEYWORDS)


KEYS = ["files", "num_files", "batch_size", "shuffle", "random_seed", "reader_shuffle", "reader_seed", "shuffle_buffer",
        "drop_last", "stream", "seq_len", "padding_mode", "rank", "world_size", "even_batches", "filter_fn",
        "file_order", "time_major", "bucket_by", "bucket_buffer", "mix", "cache_encoded", "rotation", "rotation_size",
        "pack"]


@pytest.mark.parametrize("given, recorded", [
    ({"stream": pl.Stream(seq_len=2, padding_mode="edge", time_major=True),
      "ranks": pl.Ranks(rank=0, world_size=2, even_batches="drop")},
     {"stream": True, "seq_len": 2, "padding_mode": "edge", "time_major": True, "rank": 0, "world_size": 2,
      "even_batches": "drop", "bucket_by": None, "rotation": None, "cache_encoded": None}),
    ({"bucket": pl.Bucket("id", buffer=4), "cache_encoded": {"dir": "CACHE", "update_every": 2}},
     {"stream": False, "seq_len": None, "padding_mode": "zeros", "time_major": None, "bucket_by": "id",
      "bucket_buffer": 4, "cache_encoded": {"update_every": 2}, "rotation": None, "rotation_size": None}),
    ({"rotation": pl.Rotation(3, size=12), "storage": pl.Storage(retries=0), "on_error": pl.OnError("skip")},
     {"rotation": 3, "rotation_size": 12, "bucket_by": None, "bucket_buffer": None, "rank": 0, "world_size": 1}),
    ({"pack": pl.Pack("id", seq_len=8), "ranks": pl.Ranks(rank=3, world_size=4, replication=2)},
     {"pack": "Pack('id', seq_len=8)", "rank": 1, "world_size": 2, "rotation": None}),
])
def test_a_state_records_each_group_under_the_keys_and_values_older_states_recorded(tmp_path, given, recorded):
    write_chunks(tmp_path / "data", [4, 4])
    if "cache_encoded" in given:
        given = {**given, "cache_encoded": {**given["cache_encoded"], "dir": str(tmp_path / "cache")}}
    settings = pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(tmp_path / "data"),
                             num_workers=0, **given).state_dict()["settings"]
    assert sorted(settings) == sorted(KEYS)
    assert {k: settings[k] for k in recorded} == recorded
