"""The loader's options are declared once (``pyloader._options``): the signature, the docs,
the attributes, the checks and the resume fingerprint agree with that declaration."""
from __future__ import annotations

import inspect
import os
import pydoc
import re
import subprocess
import sys
import typing
import warnings
from pathlib import Path

import pytest
from conftest import IdReader, ListCollator, ids_of, write_chunks

import pyloader as pl
from pyloader._checks import declared
from pyloader._options import OPTIONS, SIGNATURE, Options

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[1]
OPTIONS_PAGE = ROOT / "docs" / "options.md"
POSITIONAL = ["datareader", "dataset", "datacollator", "data_dir", "num_epoch", "max_queue_size", "shuffle",
              "random_seed"]


def loader(folder: Path, **kwargs) -> pl.DataLoader:
    return pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(folder), **kwargs)


def readme_section() -> str:
    """The docs' page of options (it was the README's section)."""
    text = OPTIONS_PAGE.read_text()
    start = text.index("## `DataLoader(")
    end = text.find("\n## ", start)
    return text[start:] if end == -1 else text[start:end]


def as_written(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def test_the_readme_table_lists_exactly_the_declared_options():
    rows = re.findall(r"^\| (`[^|]*`) \|", readme_section(), re.M)
    named = [name for row in rows for name in re.findall(r"`(\w+)`", row)]
    assert sorted(named) == sorted(OPTIONS)
    assert len(named) == len(set(named))


def test_the_readme_shows_the_signature_and_every_default_as_declared():
    section = readme_section()
    params = inspect.signature(pl.DataLoader).parameters.values()
    positional = ", ".join(p.name if p.default is p.empty else f"{p.name}={as_written(p.default)}"
                           for p in params if p.kind is not p.KEYWORD_ONLY)
    assert section.startswith(f"## `DataLoader({positional}, *, ...)`")
    written = re.search(r"Keyword arguments after `random_seed`: `(.*?)`\.", section, re.S).group(1)
    declared = ", ".join(f"{p.name}={as_written(p.default)}" for p in params if p.kind is p.KEYWORD_ONLY)
    assert " ".join(written.split()) == declared


def test_the_signature_and_help_show_every_option_with_its_default_and_doc():
    params = inspect.signature(pl.DataLoader).parameters
    assert list(params) == list(OPTIONS)
    assert [n for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD] == POSITIONAL
    assert params["num_epoch"].default == 1 and params["random_seed"].default == 42
    assert params["workers"].default == "auto" and params["order"].default == pl.Order()
    assert params["progress"].annotation is bool
    keyword_only = {n: p.default for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    assert pl.DataLoader.__init__.__kwdefaults__ == keyword_only
    text = pydoc.render_doc(pl.DataLoader, renderer=pydoc.plaintext)
    assert "workers: Union[int, str, pyloader._groups.Workers] = 'auto'" in text and "progress: bool = False" in text
    for name, option in OPTIONS.items():
        assert option.doc and option.doc in " ".join(text.split()), name
    for group in (pl.Stream, pl.Ranks, pl.Storage, pl.Rotation, pl.Bucket, pl.OnError, pl.Workers, pl.Device,
                  pl.Order):
        for name, option in declared(group).items():
            assert f"{group.__name__}.{name}" in text and option.doc in " ".join(text.split()), name


def test_the_written_signature_is_the_declared_one_with_its_types_in_at_most_21_parameters():
    written = pl.DataLoader.__init__.__wrapped__  # as the source spells it: what mypy, IDEs and the API reference read
    params = [p for p in inspect.signature(written).parameters.values() if p.name != "self"]
    assert [(p.name, p.kind, p.default) for p in params] == [
        (p.name, p.kind, p.default) for p in SIGNATURE.parameters.values()]
    hints, declared_hints = typing.get_type_hints(written), typing.get_type_hints(Options)
    assert {n: hints[n] for n in OPTIONS} == {n: declared_hints[n] for n in OPTIONS}
    assert len(params) <= 21  # 20 after the groups of issue 47, then pack= (issue 49 allows one or two more)


def test_tools_reading_the_source_see_every_option_typed_and_keyword_only_after_the_original_ones():
    griffe = pytest.importorskip("griffe")
    init = griffe.load("pyloader", search_paths=[str(ROOT)], resolve_aliases=True)["DataLoader"].members["__init__"]
    params = [p for p in init.parameters if p.name != "self"]
    assert [p.name for p in params] == list(OPTIONS)
    assert [p.name for p in params if p.kind is not griffe.ParameterKind.keyword_only] == POSITIONAL
    assert all(p.annotation is not None for p in params)
    assert str(init.parameters["workers"].annotation) == "Union[int, str, Workers]"


def test_the_original_pyloaders_positional_call_still_works_without_a_warning(tmp_path):
    write_chunks(tmp_path, [3, 3])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        made = pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(tmp_path), 2, 5, True)
    assert (made.num_epoch, made.max_queue_size, made.shuffle) == (2, 5, True)
    assert sorted(ids_of(made)) == sorted(list(range(6)) * 2)


def test_an_unknown_keyword_raises_a_type_error_naming_it_and_the_nearest_option(tmp_path):
    write_chunks(tmp_path, [4])
    with pytest.raises(TypeError, match=r"DataLoader\(\) got an unexpected keyword argument 'wokers'; "
                                        r"did you mean 'workers'\?"):
        loader(tmp_path, wokers=2)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'colour'$"):
        loader(tmp_path, colour="red")
    with pytest.raises(TypeError, match=r"DataLoader\(\): too many positional arguments"):
        pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator(), str(tmp_path), 1, 10, False, 42, 0)
    with pytest.raises(TypeError, match=r"DataLoader\(\): missing a required argument: 'data_dir'"):
        pl.DataLoader(IdReader(2), pl.IdentityDataset(), ListCollator())


@pytest.mark.parametrize("num_workers", [0, 2])
def test_options_read_back_as_given_or_resolved_and_cannot_be_reassigned(tmp_path, num_workers):
    write_chunks(tmp_path, [4, 4])
    made = loader(tmp_path, workers=num_workers, shuffle=1, storage=pl.Storage(prefetch_files=3),
                  bucket=pl.Bucket("id"), stream=False, on_error="skip", device="cpu")
    assert made.shuffle is True and made.workers.processes == num_workers and made.storage.prefetch_files == 3
    assert made.workers.threads == 3 + 2  # one per file read ahead and per group being encoded
    assert made.bucket == pl.Bucket("id", buffer=32 * 2)  # 32 batches
    assert made.on_error == pl.OnError("skip") and made.stream is False and made.ranks == pl.Ranks()
    assert made.device == pl.Device("cpu") and loader(tmp_path).device == pl.Device()
    assert loader(tmp_path).bucket is None and loader(tmp_path, workers=pl.Workers(threads=1)).workers.threads == 1
    assert loader(tmp_path, stream=True).stream == pl.Stream()
    with pytest.raises(AttributeError, match="workers"):
        made.workers = 1  # type: ignore[misc]
    assert sorted(ids_of(made)) == list(range(8))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_state_records_the_settings_older_states_recorded(tmp_path, num_workers):
    write_chunks(tmp_path, [4, 4])
    made = loader(tmp_path, workers=num_workers, ranks=pl.Ranks(rank=1, world_size=2), shuffle=True)
    settings = made.state_dict()["settings"]
    assert sorted(settings) == sorted([
        "files", "num_files", "batch_size", "shuffle", "random_seed", "reader_shuffle", "reader_seed",
        "shuffle_buffer", "drop_last", "stream", "seq_len", "padding_mode", "rank", "world_size", "even_batches",
        "filter_fn", "file_order", "time_major", "bucket_by", "bucket_buffer", "mix", "cache_encoded", "rotation",
        "rotation_size", "pack"])
    assert {k: settings[k] for k in ("shuffle", "rank", "world_size", "even_batches", "time_major", "bucket_buffer",
                                      "filter_fn", "mix", "cache_encoded", "rotation", "rotation_size", "pack")} == {
        "shuffle": True, "rank": 1, "world_size": 2, "even_batches": "pad", "time_major": None,
        "bucket_buffer": None, "filter_fn": None, "mix": None, "cache_encoded": None, "rotation": None,
        "rotation_size": None, "pack": None}


def test_mypy_checks_the_keywords_and_types_users_pass_and_the_options_they_assign(tmp_path):
    user = tmp_path / "user.py"
    user.write_text(
        "import pyloader as pl\n\n\n"
        "def make(reader: pl.DataReader, dataset: pl.Dataset, collator: pl.DataCollator) -> int:\n"
        "    loader = pl.DataLoader(reader, dataset, collator, 'data', 2, wokers=2, drop_last='x')\n"
        "    loader.workers = 3\n"
        "    return loader.max_queue_size + loader.storage.prefetch_files\n")
    # torch, which pyloader imports inside functions, is not followed: 1,400 of mypy's 2,350 modules otherwise,
    # four fifths of its time, and none in the signatures checked here
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n[mypy-torch.*]\nfollow_imports = skip\n")
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), "--follow-imports=silent", "--no-incremental",
         "--ignore-missing-imports", "--cache-dir", str(tmp_path / "cache"), str(user)],
        cwd=tmp_path, env={**os.environ, "MYPYPATH": str(ROOT)}, capture_output=True, text=True, timeout=110)
    errors = [line for line in out.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 3, out.stdout + out.stderr
    assert 'Unexpected keyword argument "wokers"' in errors[0] and 'did you mean "workers"' in errors[0]
    assert 'Argument "drop_last"' in errors[1] and 'expected "bool"' in errors[1]
    assert '"workers"' in errors[2] and "read-only" in errors[2]
