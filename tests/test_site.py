"""The built docs site: every image, stylesheet, script and internal link of every page resolves to a file
of the site. ``mkdocs build --strict`` checks the Markdown links of the pages, not raw HTML nor what the
hooks (``docs/hooks.py``) write into them. The site is built once per session, or the ``site/`` that
``mkdocs build`` left is used when it is newer than everything it is made from (CI builds it first)."""
from __future__ import annotations

import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import List, Tuple
from urllib.parse import unquote, urljoin, urlsplit

import pytest

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[1]
REFERENCES = {"img": "src", "script": "src", "a": "href", "link": "href"}


def sources() -> List[Path]:
    """What the site is made from: the config, the pages and hooks, the figures, the code's docstrings."""
    found = [ROOT / "mkdocs.yml", ROOT / "README.md", ROOT / "benchmarks" / "README.md"]
    for folder in ("docs", "img", "pyloader"):
        found += [p for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return found


def built_fresh(site: Path) -> bool:
    index = site / "index.html"
    return index.exists() and index.stat().st_mtime >= max(p.stat().st_mtime for p in sources())


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if built_fresh(ROOT / "site"):
        return ROOT / "site"
    pytest.importorskip("mkdocs", reason="the docs extra builds the site")
    out = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "-q", "--site-dir", str(out)], cwd=ROOT, check=True,
                   timeout=280, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True)
    return out


class References(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: List[Tuple[str, str]] = []  # (tag, reference)

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, str | None]]) -> None:
        wanted = REFERENCES.get(tag)
        self.found += [(tag, value) for name, value in attrs if name == wanted and value]


def broken(site: Path) -> List[str]:
    """Every reference of a page of ``site`` to a file of the site that is missing, as ``page: <tag> ref``."""
    missing = []
    for page in sorted(site.rglob("*.html")):
        parser = References()
        parser.feed(page.read_text(encoding="utf-8"))
        url = "/" + page.relative_to(site).as_posix()
        for tag, ref in parser.found:
            parts = urlsplit(urljoin(url, ref))
            if parts.scheme or parts.netloc or not parts.path or ref.startswith("#"):
                continue  # another site, or a place on this page
            target = site / unquote(parts.path).lstrip("/")
            if parts.path.endswith("/"):
                target = target / "index.html"
            if not target.is_file():
                missing.append(f"{page.relative_to(site)}: <{tag}> {ref}")
    return missing


def test_every_image_and_internal_link_of_the_built_site_resolves(site: Path) -> None:
    assert (site / "benchmarks" / "index.html").exists()
    assert broken(site) == []


def test_the_check_finds_a_missing_image_and_a_link_to_a_missing_page(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(b"")
    (tmp_path / "guide").mkdir()
    (tmp_path / "guide" / "index.html").write_text(
        '<img src="../img/a.png"><img src="img/a.png"><a href="../">home</a><a href="#top">top</a>'
        '<a href="https://example.com/x">out</a><a href="../other/#part">other</a>')
    (tmp_path / "index.html").write_text('<a href="guide/">guide</a><link href="img/a.png">')
    assert broken(tmp_path) == ["guide/index.html: <img> img/a.png", "guide/index.html: <a> ../other/#part"]
