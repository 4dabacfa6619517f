"""Every Python example in README.md and docs/ runs, as written, on small data made here.

The collector (see docs/contributing.md, *Examples in the docs*):

* A block fenced as ```` ```python ```` runs; every other fence must name its language (``bash``,
  ``text``, ``console``, ...) and does not run. A bare fence, or ``py``/``python3``/``pycon``, is an
  error, so no Python block can be left out by accident.
* The blocks of one page run in order in one namespace (a page reads as one session), in a fresh
  folder holding the files the examples name (``data/``, ``texts/``, ``shards/``, ...: ``make_data``),
  with the default settings a reader gets (``num_workers="auto"``: usually worker processes).
* ``<!-- example: gpu -->`` on the line before a block: it needs CUDA. It runs in a test of its own
  (after the page's other blocks before it), skipped with the reason where CUDA is missing.
* ``<!-- example: s3 -->``: it reads ``s3://bucket/...``; the page then runs against the suite's
  moto S3 server (``conftest.moto_server``), which holds the same files under ``s3://bucket/``.
"""
from __future__ import annotations

import csv
import importlib.util
import inspect
import json
import re
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest

from pyloader import DataLoader

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
KINDS = {"gpu", "s3"}
RUN = "python"
NOT_PYTHON = {"py", "python3", "pycon", "ipython"}  # spelled so, a Python block would silently not run
MARKER = re.compile(r"^<!-- example: ([\w-]+) -->$")
FENCE = re.compile(r"^(\s*)(`{3,})(.*)$")
TENSORFLOW = ("tensorflow", "TFCollator", "to_tf_dataset")
EXAMPLE_MODULE = "__docs_example__"  # the examples' __name__: the module a warning at their lines names

pytestmark = pytest.mark.timeout(300)


@dataclass(frozen=True)
class Block:
    page: str  # the file holding it
    line: int  # the fence's line, 1-based
    code: str
    kind: Optional[str]  # a marker's kind, or None
    owner: Optional[str] = None  # the public name whose docstring holds it

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def note(self) -> str:
        if self.owner:
            return f"in the docstring example of {self.owner} at {self.where}"
        return f"in the example at {self.where}"


def blocks(path: Path, name: Optional[str] = None) -> List[Block]:
    """The Python blocks of a Markdown page; ``ValueError`` (naming the line) for a fence without a
    language, a Python block spelled otherwise, or an unknown or misplaced marker."""
    return parse(path.read_text(encoding="utf-8").splitlines(), name or str(path.relative_to(ROOT)))


def parse(lines: List[str], name: str, first: int = 1, owner: Optional[str] = None) -> List[Block]:
    """The Python blocks of ``lines`` (Markdown) whose first line is line ``first`` of the file ``name``."""
    found: List[Block] = []
    i = 0
    while i < len(lines):
        at = first + i  # the file's line number of lines[i]
        marker = MARKER.match(lines[i].strip())
        if marker and marker.group(1) not in KINDS:
            raise ValueError(f"{name}:{at}: unknown example marker {marker.group(1)!r} (known: {sorted(KINDS)})")
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, ticks, info = fence.groups()
        lang = info.strip().split(" ")[0] if info.strip() else ""
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == ticks), None)
        if end is None:
            raise ValueError(f"{name}:{at}: a code block that never ends")
        if not lang or lang in NOT_PYTHON:
            raise ValueError(f"{name}:{at}: a code block must name its language: ```python to run it, "
                             f"```bash, ```text, ```console ... for what does not run (got {lang or 'none'!r})")
        before = lines[i - 1].strip() if i else ""
        kind = MARKER.match(before).group(1) if MARKER.match(before) else None  # type: ignore[union-attr]
        if kind and lang != RUN:
            raise ValueError(f"{name}:{at - 1}: an example marker before a {lang!r} block, which does not run")
        if lang == RUN:
            code = "\n".join(line[len(indent):] for line in lines[i + 1:end])
            found.append(Block(name, at, "\n" * at + code + "\n", kind, owner))  # line numbers as in the file
        i = end + 1
    return found


def run_blocks(todo: List[Block], namespace: Optional[Dict[str, object]] = None) -> None:
    """Run ``todo`` in order in one namespace; an error is raised with a note naming its block. A
    ``FutureWarning`` raised at a line of an example (a keyword that goes, as pyloader's flat keywords of
    earlier releases) is such an error: the docs show the current names."""
    namespace = {"__name__": EXAMPLE_MODULE} if namespace is None else namespace
    for block in todo:
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("error", category=FutureWarning, module=re.escape(EXAMPLE_MODULE))
                exec(compile(block.code, block.page, "exec"), namespace)
        except BaseException as error:
            error.add_note(block.note)
            raise


# ---- the files the examples name ----

def jsonl(path: Path, rows: List[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def make_data(root: Path) -> None:
    """Small files, named as the examples name them."""
    gen = np.random.default_rng(0)
    for folder in ("tables", "tokens"):
        (root / folder).mkdir()
    for i in range(4):
        jsonl(root / "data" / f"part-{i}.jsonl",
              [{"x": gen.normal(size=4).round(3).tolist(), "y": (i + j) % 2, "text": f"sample {i}-{j}" * (j % 3),
                "tokens": list(range(j % 7 + 1)), "label": j % 2} for j in range(16)])
        jsonl(root / "web" / f"part-{i}.jsonl", [{"text": f"web {i}-{j}", "label": j % 2} for j in range(12)])
        with open(root / "tables" / f"part-{i}.csv", "w", newline="") as f:
            csv.writer(f).writerows([["text", "label"], *[[f"row {i}-{j}", j % 2] for j in range(8)]])
        np.save(root / "tokens" / f"part-{i}.npy", np.arange(40 + 9 * i) % 26)
    jsonl(root / "data" / "easy" / "part-0.jsonl",
          [{"x": [0.0] * 4, "y": 0, "text": "easy", "tokens": [1], "label": 0} for _ in range(8)])
    for folder, n, rows in (("texts", 3, 20), ("small_data", 3, 7)):
        (root / folder).mkdir()
        for i in range(n):
            (root / folder / f"chunk-{i}.tsv").write_text("".join(f"{j % 2}\tsample {i}-{j}\n" for j in range(rows)))
    write_parquet(root / "parquet")
    write_shards(root / "shards")


def write_parquet(folder: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(3):
        table = pa.table({"input_ids": [list(range(j % 5 + 1)) for j in range(20)],
                          "label": [j % 2 for j in range(20)]})
        pq.write_table(table, folder / f"part-{i}.parquet", row_group_size=8)
    (folder / "_SUCCESS").write_bytes(b"")


def write_shards(folder: Path) -> None:
    spec = importlib.util.spec_from_file_location("image_augment_docs", ROOT / "examples" / "image_augment.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.write_shards(str(folder), shards=2, per_shard=16)


def upload(root: Path) -> None:
    """The same files in the moto server's bucket ``bucket``: ``s3://bucket/train/`` holds ``parquet/``."""
    import boto3
    import fsspec
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # instances made against an earlier server's endpoint
    client = boto3.client("s3")
    client.create_bucket(Bucket="bucket")
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        key = str(path.relative_to(root))
        client.put_object(Bucket="bucket", Key=key, Body=path.read_bytes())
        if key.startswith("parquet/"):
            client.put_object(Bucket="bucket", Key="train/" + key.split("/", 1)[1], Body=path.read_bytes())
    fsspec.config.conf.pop("s3", None)


# ---- the tests ----

def all_blocks() -> Iterator[Block]:
    for path in PAGES:
        yield from blocks(path)


def page_params() -> List[object]:
    """One test per page (its blocks without a GPU), and one per GPU block."""
    by_page: Dict[str, List[Block]] = {}
    for block in all_blocks():
        by_page.setdefault(block.page, []).append(block)
    def marks(page: str) -> List[pytest.MarkDecorator]:  # TensorFlow imported: run last (see conftest.py)
        return [pytest.mark.tensorflow] if any(w in b.code for b in by_page[page] for w in TENSORFLOW) else []

    return [pytest.param(page, None, id=page, marks=marks(page)) for page in by_page] + [
        pytest.param(page, b.line, id=f"{b.where}-gpu", marks=marks(page))
        for page, bs in by_page.items() for b in bs if b.kind == "gpu"]


@pytest.fixture(scope="module")
def made_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs-data")
    make_data(root)
    return root


@pytest.fixture
def in_data_folder(made_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh copy of the files, as the current folder."""
    shutil.copytree(made_data, tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_page(page: str, root: Path, gpu_line: Optional[int] = None) -> None:
    todo = [b for b in blocks(ROOT / page) if b.kind != "gpu" or b.line == gpu_line]
    if gpu_line is not None:
        todo = [b for b in todo if b.line <= gpu_line]
    run_where_they_need(todo, root)


def run_where_they_need(todo: List[Block], root: Path, namespace: Optional[Dict[str, object]] = None) -> None:
    """Run ``todo``; against the moto S3 server holding ``root``'s files if one of them is marked ``s3``."""
    if any(b.kind == "s3" for b in todo):
        sys.path.insert(0, str(ROOT / "tests"))
        from conftest import moto_server

        with moto_server():
            upload(root)
            run_blocks(todo, namespace)
    else:
        run_blocks(todo, namespace)


def skip_without_cuda(where: str) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip(f"{where} needs a GPU: torch.cuda.is_available() is False here")


@pytest.mark.parametrize("page,gpu_line", page_params())
def test_the_examples_of_each_page_run_as_written(page: str, gpu_line: Optional[int], in_data_folder: Path) -> None:
    if gpu_line is not None:
        skip_without_cuda(f"{page}:{gpu_line}")
    run_page(page, in_data_folder, gpu_line)


def test_a_broken_example_fails_and_names_its_page_and_line(tmp_path: Path) -> None:
    page = tmp_path / "broken.md"
    page.write_text("# A page\n\n```python\nanswer = 41\n```\n\nSome text.\n\n```python\n\n"
                    "assert answer == 42, 'the docs are wrong'\n```\n")
    with pytest.raises(AssertionError, match="the docs are wrong") as caught:
        run_blocks(blocks(page, "broken.md"))
    assert caught.value.__notes__ == ["in the example at broken.md:9"]
    assert caught.traceback[-1].lineno + 1 == 11  # the traceback points at the page's own line


def test_an_example_that_raises_a_future_warning_fails_and_names_its_line(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("x\ny\n")
    page = tmp_path / "flat.md"
    data = str(tmp_path / "data")
    page.write_text("```python\nimport pyloader as pl\nfrom pyloader.collators import NumpyCollator\n"
                    "from pyloader.readers import TextLinesReader\n\n"
                    f"pl.DataLoader(TextLinesReader(2), pl.IdentityDataset(), NumpyCollator(), {data!r},\n"
                    "              rotation=2, rotation_size=4)\n```\n")
    with pytest.raises(FutureWarning, match=r"rotation=2, rotation_size=4 is now rotation=Rotation\(2, size=4\)") \
            as caught:
        run_blocks(blocks(page, "flat.md"))
    assert caught.value.__notes__ == ["in the example at flat.md:1"]
    assert [e.lineno + 1 for e in caught.traceback if str(e.path) == "flat.md"] == [6]  # the call, on the page


@pytest.mark.parametrize("text,message", [
    ("```\nprint(1)\n```\n", "must name its language"),
    ("```py\nprint(1)\n```\n", "must name its language"),
    ("<!-- example: later -->\n```python\nprint(1)\n```\n", "unknown example marker 'later'"),
    ("<!-- example: gpu -->\n```bash\nls\n```\n", "before a 'bash' block"),
    ("```python\nprint(1)\n", "never ends"),
])
def test_the_collector_refuses_a_block_it_could_not_run_or_skip_knowingly(tmp_path, text, message) -> None:
    page = tmp_path / "page.md"
    page.write_text(text)
    with pytest.raises(ValueError, match=message):
        blocks(page, "page.md")


def test_the_collector_finds_the_blocks_of_the_readme_and_the_docs_and_their_markers() -> None:
    found = list(all_blocks())
    assert {b.page for b in found} >= {"README.md", "docs/getting-started.md"}
    assert len(found) >= 25
    assert {b.kind for b in found} >= {"gpu", "s3"}


# ---- the docstring examples (the API reference) ----

def public_modules() -> List[ModuleType]:
    import pyloader
    import pyloader.collators
    import pyloader.readers
    import pyloader.testing

    return [pyloader, pyloader.readers, pyloader.collators, pyloader.testing]


def public_objects() -> Iterator[Tuple[str, object]]:
    for module in public_modules():
        for name in module.__all__:
            yield f"{module.__name__}.{name}", getattr(module, name)


def docstring_blocks(name: str, obj: object) -> List[Block]:
    """The Python blocks of ``obj``'s docstring, numbered by the lines of its source file."""
    doc = obj.__doc__ or ""
    try:
        source, start = inspect.getsourcelines(obj)  # type: ignore[arg-type]
        page = str(Path(inspect.getsourcefile(obj) or "").resolve().relative_to(ROOT))  # type: ignore[arg-type]
        first = start + next(i for i, line in enumerate(source) if '"""' in line or "'''" in line)
    except (OSError, TypeError, ValueError, StopIteration):  # not defined in a file of the repository
        page, first = f"<docstring of {name}>", 1
    return parse(doc.splitlines(), page, first, owner=name)


def docstring_namespace() -> Dict[str, object]:
    """What a docstring example may use without defining it (docs/contributing.md): the public names
    of ``pyloader``, ``pyloader.readers``, ``pyloader.collators`` and ``pyloader.testing``, the module
    ``pyloader``, and ``reader``, ``dataset``, ``collator``, ``loader`` (the four on ``data/``) and
    ``model`` (returns its input)."""
    import pyloader as pl
    from pyloader.collators import NumpyCollator
    from pyloader.readers import JsonLinesReader

    namespace: Dict[str, object] = {"__name__": EXAMPLE_MODULE, "pyloader": pl}
    for module in public_modules():
        namespace.update((name, getattr(module, name)) for name in module.__all__)
    reader, dataset, collator = JsonLinesReader(batch_size=16), pl.IdentityDataset(), NumpyCollator()
    namespace.update(reader=reader, dataset=dataset, collator=collator, model=lambda x: x,
                     loader=pl.DataLoader(reader, dataset, collator, "data/"))
    return namespace


def run_docstring(name: str, obj: object, root: Path) -> None:
    todo = docstring_blocks(name, obj)
    assert todo, f"{name}'s docstring has no example (an Example: section with a ```python block)"
    gpu = [b for b in todo if b.kind == "gpu"]
    if gpu:
        skip_without_cuda(f"the docstring example of {name} at {gpu[0].where}")
    namespace = docstring_namespace()
    try:
        run_where_they_need(todo, root, namespace)
    finally:
        for value in namespace.values():
            if isinstance(value, DataLoader):  # the examples' loaders too: nothing left running
                value.close()


@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name, _ in public_objects()])
def test_the_docstring_examples_of_each_public_name_run(name: str, in_data_folder: Path) -> None:
    run_docstring(name, dict(public_objects())[name], in_data_folder)


class Broken:
    """A public name whose example is wrong.

    Example:
        ```python
        answer = 41
        assert answer == 42, "the docstring is wrong"
        ```
    """


def test_a_broken_docstring_example_fails_and_names_its_object_and_line(in_data_folder: Path) -> None:
    with pytest.raises(AssertionError, match="the docstring is wrong") as caught:
        run_docstring("tests.Broken", Broken, in_data_folder)
    line = inspect.getsourcelines(Broken)[1] + 6
    where = f"tests/test_docs_examples.py:{line - 2}"
    assert caught.value.__notes__ == [f"in the docstring example of tests.Broken at {where}"]
    assert caught.traceback[-1].lineno + 1 == line  # the traceback points at the file's own line


def test_a_public_name_without_a_docstring_example_fails() -> None:
    class Bare:
        """No example."""

    with pytest.raises(AssertionError, match="Bare's docstring has no example"):
        run_docstring("Bare", Bare, ROOT)
