"""The distributions as a user gets them.

The sdist is built from a copy of this checkout (so the checkout gets no build/ or
egg-info), unpacked, and the wheel is built from the unpacked sdist, as ``python -m
build`` does. Both builds run without build isolation (the ``test`` extra installs
setuptools), so nothing is downloaded. The wheel is then installed into a fresh
virtual environment that sees this interpreter's packages (numpy, torch, mypy) but
not this checkout, and pyloader is run from there.
"""
from __future__ import annotations

import ast
import email.parser
import json
import os
import re
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from email.message import Message
from importlib.metadata import version as installed_version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[1]
USER_EXTRAS = {"torch", "tensorflow", "remote", "parquet", "fast", "compression", "progress", "image"}


@dataclass(frozen=True)
class Built:
    sdist: Path
    unpacked: Path  # the unpacked sdist's project folder
    wheel: Path
    venv_python: Path  # a fresh virtual environment with the wheel installed
    venv: Path


def run(cmd: Sequence[str], cwd: Path, timeout: float = 120) -> str:
    """Run cmd without this process's PYTHONPATH/MYPYPATH (they could point at the checkout); its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    done = subprocess.run(list(cmd), check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def source_version() -> str:
    """pyloader.__version__ as written in this checkout (what the build reads)."""
    tree = ast.parse((ROOT / "pyloader" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("pyloader/__init__.py sets no __version__")


def skip_outside_the_source(folder: str, names: list[str]) -> set[str]:
    """copytree filter: caches and build outputs anywhere; at the top, dot folders (.git, .venv...) but .ci."""
    skipped = {n for n in names if n in ("__pycache__", "build", "dist") or n.endswith(".egg-info")}
    if Path(folder) == ROOT:
        skipped |= {n for n in names if n.startswith(".") and n != ".ci"}
    return skipped


def make_venv(folder: Path) -> Path:
    """A virtual environment without pip that sees this interpreter's packages; its python."""
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(folder)], cwd=folder.parent)
    python = folder / ("Scripts" if os.name == "nt" else "bin") / "python"
    purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=folder).strip()
    # --system-site-packages reaches the base interpreter only: when this one is itself a venv, add its packages
    # too; after the new venv's own site-packages, so the wheel's pyloader comes first.
    (Path(purelib) / "_outer_site_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    # pyproject.toml's build-system requirement; the test extra installs it (no download without isolation)
    assert Version(installed_version("setuptools")) >= Version("77"), "pip install -e '.[test]' installs setuptools>=77"
    work = tmp_path_factory.mktemp("packaging")
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=skip_outside_the_source)
    dist = work / "dist"
    build_sdist = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    name = run([sys.executable, "-c", build_sdist, str(dist)], cwd=source).strip().splitlines()[-1]
    sdist = dist / name
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(work / "unpacked", filter="data")
        else:  # pragma: no cover - Python without the extraction filters
            tar.extractall(work / "unpacked")
    unpacked = work / "unpacked" / name[: -len(".tar.gz")]
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir",
         "-w", str(dist), str(unpacked)], cwd=work)
    (wheel,) = dist.glob("*.whl")
    venv = work / "venv"
    python = make_venv(venv)
    run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "--no-cache-dir",
         str(wheel)], cwd=work)
    return Built(sdist=sdist, unpacked=unpacked, wheel=wheel, venv_python=python, venv=venv)


def wheel_metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(zf.read(name).decode("utf-8"))


def requirements_of(metadata: Message, extra: str) -> dict[str, Requirement]:
    reqs = [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]
    return {r.name: r for r in reqs if r.marker is not None and r.marker.evaluate({"extra": extra})}


def test_the_sdist_carries_the_license_and_everything_its_tests_need(built: Built) -> None:
    with tarfile.open(built.sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    needed = {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "setup.py", "pytest.ini", "constraints.txt",
              ".ci/run", "pyloader/py.typed", "tests/conftest.py", "tests/worker_helpers.py", "tests/ddp_train.py",
              "examples/stream_letters.py", "examples/stream_gru.py", "examples/demo.py", "examples/image_augment.py",
              "mkdocs.yml", "docs/hooks.py", "docs/getting-started.md", "docs/reference/pyloader.md"}
    assert needed <= names, sorted(needed - names)
    tracked_tests = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("*.py")}
    assert tracked_tests <= names, sorted(tracked_tests - names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_tests_run_from_the_unpacked_sdist(built: Built) -> None:
    """Its conftest.py, worker_helpers.py and pytest.ini are there, and the pyloader imported is the sdist's."""
    out = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_readme.py",
               "tests/test_semantics.py::test_tail_of_one_file_joins_the_next",
               "tests/test_groups.py::test_a_failed_batch_mid_group_raises_after_the_batches_before_it"],
              cwd=built.unpacked, timeout=180)
    passed = re.search(r"\b(\d+) passed\b", out)
    assert passed and int(passed.group(1)) >= 3 and not re.search(r"\b\d+ (failed|errors?)\b", out), out[-2000:]


SMOKE = """
import json, sys
from importlib import metadata, resources
from pathlib import Path

import pyloader
from pyloader.collators import NumpyCollator
from pyloader.readers import JsonLinesReader

folder = Path(sys.argv[1])
for i in range(3):
    (folder / f"part-{i}.jsonl").write_text("".join(json.dumps({"id": 10 * i + j}) + "\\n" for j in range(5)))
loader = pyloader.DataLoader(JsonLinesReader(batch_size=4), pyloader.IdentityDataset(), NumpyCollator(), str(folder))
with loader:
    batches = [batch["id"].tolist() for batch in loader]
dist = metadata.distribution("pyloader-ml")
print(json.dumps({"file": pyloader.__file__, "version": pyloader.__version__, "dist_version": dist.version,
                  "batches": batches, "typed": resources.files("pyloader").joinpath("py.typed").is_file(),
                  "license_files": [str(f) for f in dist.files or [] if "licenses" in str(f)]}))
"""


def test_the_wheel_runs_a_loader_from_a_fresh_virtual_environment(built: Built, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    out = run([str(built.venv_python), "-I", "-c", SMOKE, str(data)], cwd=tmp_path, timeout=120)
    got = json.loads(out.strip().splitlines()[-1])
    assert Path(got["file"]).resolve().is_relative_to(built.venv.resolve()), got["file"]
    assert got["version"] == got["dist_version"] == source_version()
    assert got["batches"] == [[0, 1, 2, 3], [4, 10, 11, 12], [13, 14, 20, 21], [22, 23, 24]]
    assert got["typed"] is True
    assert [Path(f).name for f in got["license_files"]] == ["LICENSE"]


def test_mypy_reads_the_installed_package_as_typed(built: Built, tmp_path: Path) -> None:
    user = tmp_path / "user_code"
    user.mkdir()
    (user / "train.py").write_text("import pyloader\nimport pyloader.collators\nimport pyloader.readers\n")
    # skip: check that the imports resolve to a typed package, without type-checking pyloader itself (fast)
    out = run([str(built.venv_python), "-m", "mypy", "--follow-imports=skip", "--no-incremental",
               "--cache-dir", str(tmp_path / "mypy_cache"), "train.py"], cwd=user, timeout=120)
    assert "Success" in out, out


def test_the_wheel_states_the_spdx_license_with_its_file_and_no_license_classifier(built: Built) -> None:
    metadata = wheel_metadata(built.wheel)
    assert metadata["Name"] == "pyloader-ml"
    assert metadata["Version"] == source_version()
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert not [c for c in metadata.get_all("Classifier") or [] if c.startswith("License ::")]
    assert "Typing :: Typed" in (metadata.get_all("Classifier") or [])
    with zipfile.ZipFile(built.wheel) as zf:
        names = set(zf.namelist())
        license_text = zf.read(next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))).decode()
    assert "pyloader/py.typed" in names
    assert not [n for n in names if n.startswith("tests/")]
    assert license_text == (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text


def test_the_wheel_offers_the_user_extras_and_the_test_extra_installs_every_tool(built: Built) -> None:
    metadata = wheel_metadata(built.wheel)
    assert USER_EXTRAS | {"test"} <= set(metadata.get_all("Provides-Extra") or [])
    assert {"parquet": "pyarrow", "fast": "orjson", "compression": "zstandard", "progress": "tqdm"} == {
        extra: next(iter(requirements_of(metadata, extra))) for extra in ("parquet", "fast", "compression", "progress")}
    tools = {"lightning", "pyarrow", "zstandard", "orjson", "tqdm", "mypy", "ruff", "radon", "pytest", "setuptools"}
    assert tools <= set(requirements_of(metadata, "test")), sorted(tools - set(requirements_of(metadata, "test")))
    # constraints.txt decides which torch: no requirement may cap it or pin it
    torch_specs = [s for extra in metadata.get_all("Provides-Extra") or []
                   for name, req in requirements_of(metadata, extra).items() if name == "torch" for s in req.specifier]
    assert torch_specs and all(s.operator == ">=" for s in torch_specs)


def test_the_long_description_has_no_image_or_link_that_only_resolves_in_the_repository(built: Built) -> None:
    metadata = wheel_metadata(built.wheel)
    description = str(metadata.get_payload())
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert "## Quick usage" in description and "## How it works" in description
    assert "img/" not in description
    relative_targets = [t for t in re.findall(r"\]\(([^)]*)\)", description) if not t.startswith(("http", "#"))]
    assert relative_targets == []
    assert "[PyLoader](https://github.com/iwangjian/pyloader)" in description


def test_the_readme_installs_only_extras_that_exist_and_the_wheel_the_build_makes(built: Built) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = [line for block in re.findall(r"```bash\n(.*?)```", readme, re.DOTALL) for line in block.splitlines()
                if "pip install" in line]
    named = {e for line in commands for group in re.findall(r'(?:"\.|\.whl)\[([\w,-]+)\]', line)
             for e in group.split(",")}
    assert named and named <= set(wheel_metadata(built.wheel).get_all("Provides-Extra") or [])
    wheels = {w for line in commands for w in re.findall(r"dist/([\w.+-]+\.whl)", line)}
    assert wheels == {built.wheel.name}
    # nothing is published: no install of the distribution by name from an index
    assert not [line for line in commands if re.search(r'pip install[^#]*[\s"]pyloader-ml\b', line)]
    assert all("-c constraints.txt" in line for line in commands if "torch" in line)
