"""MkDocs hooks: pages made at build time from files the repository already has, so no text is copied by hand.

* ``<!-- benchmarks-readme -->`` on a page: ``benchmarks/README.md`` as it is (its headings one level
  down, its figures as Markdown images of the site's ``img/``, so that MkDocs writes their paths
  relative to the page and ``--strict`` checks them, as it does not check a raw ``<img src>``);
* ``img/*.png``: the repository's figures (the README's and the benchmarks'), served by the site;
* ``<!-- options-table -->`` on a page: the table of ``DataLoader`` options, from ``pyloader._options``
  (name, default, the line of doc each option declares, and each group's fields), so it follows the code.
"""
from __future__ import annotations

import re
import sys
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]


def on_files(files: Files, config: Any) -> Files:
    site = config["site_dir"]
    for figure in sorted((ROOT / "img").glob("*.png")):
        files.append(File(f"img/{figure.name}", str(ROOT), site, config["use_directory_urls"]))
    return files


def benchmarks_readme() -> str:
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    text = re.sub(r"^(#+) ", r"#\1 ", text, flags=re.M)  # its code blocks have no line starting with "#"
    text = text.replace("## Benchmarks\n", "## The benchmarks in full (`benchmarks/README.md`)\n", 1)
    text = re.sub(r'<p align="center"><img src="\.\./img/([^"]+)" width="([^"]+)" /></p>',
                  r'![\1](img/\1){ width="\2" }', text)
    if "<img" in text:
        raise ValueError("benchmarks/README.md: a figure as raw HTML the site cannot place: write it as "
                         '<p align="center"><img src="../img/NAME.png" width="W" /></p>')
    return text.replace("](../img/", "](img/")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if "<!-- benchmarks-readme -->" in markdown:
        markdown = markdown.replace("<!-- benchmarks-readme -->", benchmarks_readme())
    return markdown.replace("<!-- options-table -->", options_table())


def options_table() -> str:
    if str(ROOT) not in sys.path:  # the checkout being built, whichever pyloader is installed
        sys.path.insert(0, str(ROOT))
    from pyloader._checks import declared
    from pyloader._options import OPTIONS, Options, group_of

    rows = ["| option | default | what it does |", "| --- | --- | --- |"]
    for f in fields(Options):
        rows.append(_row(f"`{f.name}`", f.default, OPTIONS[f.name].doc))
        group = group_of(f.name)
        if group is not None:  # its fields, one row each
            rows += [_row(f"&nbsp;&nbsp;`{group.__name__}.{g.name}`", g.default, declared(group)[g.name].doc)
                     for g in fields(group)]
    return "\n".join(rows)


def _row(name: str, default: Any, doc: str) -> str:
    shown = "(required)" if default is MISSING else f"`{default!r}`"
    return f"| {name} | {shown} | {doc.replace('|', '&#124;')} |"
