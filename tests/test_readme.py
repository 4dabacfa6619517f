"""The README's quick-usage example runs as written (on data made here)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)
README = Path(__file__).resolve().parents[1] / "README.md"


def python_block(after_heading: str) -> str:
    text = README.read_text()
    section = text[text.index(after_heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_quick_usage_example_runs(tmp_path):
    for i in range(3):
        (tmp_path / f"chunk-{i}.tsv").write_text("".join(f"{j % 2}\tsample {i}-{j}\n" for j in range(20)))
    code = python_block("## Quick usage").replace('"YOUR_DATA_DIR"', repr(str(tmp_path)))
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    loader = namespace["train_loader"]
    assert loader.stats["batches"] == 5 * 4  # 60 samples, batch 16: 4 batches per epoch
    assert loader.epoch == 4


def test_the_check_resume_example_runs_on_the_quick_usage_classes(tmp_path):
    for i in range(3):
        (tmp_path / f"chunk-{i}.tsv").write_text("".join(f"{j % 2}\tsample {i}-{j}\n" for j in range(7)))
    namespace: dict = {}
    classes = python_block("## Quick usage").split("train_loader = ")[0]
    exec(compile(classes, "README.md", "exec"), namespace)
    code = python_block("**Checking your own loader.**").replace('"small_data/"', repr(str(tmp_path)))
    code = code.replace("check_resume(", "checked = check_resume(", 1)
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["checked"] == 6  # 21 samples in batches of 4


def test_ci_runs_the_readme_test_command():
    ci = (README.parent / ".ci" / "run").read_text()
    assert "test-command" in ci and "<!-- test-command -->" in README.read_text()


def test_the_images_and_augmentation_example_runs_on_generated_shards(tmp_path):
    pytest.importorskip("torch", reason="torch is the torch extra's")
    import importlib.util

    spec = importlib.util.spec_from_file_location("image_augment_readme",
                                                  README.parent / "examples" / "image_augment.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.write_shards(str(tmp_path), shards=2, per_shard=16)
    code = python_block("### Images and augmentation").replace('"SHARDS_DIR"', repr(str(tmp_path)))
    code = code.replace("num_workers=2", "num_workers=0")  # Jitter is defined in exec's namespace, not importable
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert tuple(namespace["images"].shape) == (16, 3, 32, 32) and namespace["labels"].tolist()[0] in (0, 1)
    assert namespace["loader"].stats["batches"] == 4
