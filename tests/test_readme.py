"""The README is the landing page: its quick-usage examples run as written (on data made here),
it stays short, its links into the docs resolve, and it holds the test command CI runs."""
from __future__ import annotations

import re
from pathlib import Path
from typing import List, Tuple

import pytest

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def section_of(heading: str) -> str:
    text = README.read_text()
    section = text[text.index(heading):]
    return section[:section.find("\n## ", 1)]


def python_blocks(after_heading: str) -> list:
    return re.findall(r"```python\n(.*?)```", section_of(after_heading), re.S)


def shown_data(heading: str) -> List[Tuple[str, List[str]]]:
    """Each ``$ head -n N PATH`` console block of a section: the file it shows, and its lines."""
    return [(m.group(1), m.group(2).splitlines())
            for m in re.finditer(r"```console\n\$ head -n \d+ (\S+)\n(.*?)```", section_of(heading), re.S)]


def write_tsv(folder: Path, rows: int) -> None:
    folder.mkdir()
    for i in range(3):
        (folder / f"chunk-{i}.tsv").write_text("".join(f"{j % 2}\tsample {i}-{j}\n" for j in range(rows)))


def test_quick_usage_subclass_example_runs(tmp_path, monkeypatch):
    write_tsv(tmp_path / "texts", 20)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(python_blocks("## Quick usage")[1], "README.md", "exec"), namespace)
    loader = namespace["train_loader"]
    assert loader.stats["batches"] == 5 * 4  # 60 samples, batch 16: 4 batches per epoch
    assert loader.epoch == 4


def test_each_quick_usage_example_shows_its_data_and_runs_on_files_of_those_lines(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    shown, blocks = shown_data("## Quick usage"), python_blocks("## Quick usage")
    assert [path for path, _ in shown] == ["data/part-0.jsonl", "texts/chunk-0.tsv"]  # one before each example
    monkeypatch.chdir(tmp_path)
    ran = []
    for (path, lines), code in zip(shown, blocks):
        folder, name = path.split("/")
        assert f'"{folder}/"' in code  # the example reads the folder shown
        (tmp_path / folder).mkdir()
        for i in range(3):  # files of the lines shown, as many as a batch needs
            (tmp_path / folder / name.replace("0", str(i), 1)).write_text("\n".join(lines * 8) + "\n")
        namespace: dict = {}
        exec(compile(code, "README.md", "exec"), namespace)
        ran.append(namespace)
    with ran[0]["loader"] as loader:
        batch = next(iter(loader))
    assert batch["x"].dtype == torch.float32 and tuple(batch["x"].shape) == (16, 4)  # as the example's comment says
    assert batch["y"].dtype == torch.int64 and tuple(batch["y"].shape) == (16,)
    assert ran[1]["train_loader"].stats["batches"] == 5 * 3  # 48 lines in batches of 16, 5 epochs


def test_the_check_resume_example_runs_on_the_quick_usage_classes(tmp_path):
    write_tsv(tmp_path / "small_data", 7)
    from pyloader import DataLoader, Order
    from pyloader.testing import check_resume

    namespace: dict = {}
    classes = python_blocks("## Quick usage")[1].split("train_loader = ")[0]
    exec(compile(classes, "README.md", "exec"), namespace)
    checked = check_resume(lambda: DataLoader(namespace["TheDataReader"](batch_size=4), namespace["TheDataset"](),
                                              namespace["TheDataCollator"](), str(tmp_path / "small_data"),
                                              shuffle=True, order=Order(shuffle_buffer=8), workers=0))
    assert checked == 6  # 21 samples in batches of 4


def test_ci_runs_the_readme_test_command_which_builds_the_docs_strictly_before_the_tests():
    ci = (ROOT / ".ci" / "run").read_text()
    text = README.read_text()
    assert "test-command" in ci and "<!-- test-command -->" in text
    command = text[text.index("<!-- test-command -->"):text.index("<!-- /test-command -->")]
    assert re.search(r'"\.\[[\w,]*\bdocs\b[\w,]*\]"', command)
    assert command.index("mkdocs build --strict") < command.index("python -m pytest")


def test_the_readme_is_a_landing_page_under_250_lines():
    assert len(README.read_text().splitlines()) < 250


def test_every_relative_link_of_the_readme_resolves():
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    relative = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert relative and [t for t in relative if not (ROOT / t).exists()] == []
    docs = {t for t in relative if t.startswith("docs/")}
    assert {"docs/getting-started.md", "docs/loader.md", "docs/reference/pyloader.md"} <= docs
