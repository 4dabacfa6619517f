"""The one piece of metadata pyproject.toml cannot state statically: the long description.

Everything else is in pyproject.toml. The README shows images and links files by
paths inside the repository, which break on a package index page, so the long
description is the README with those images dropped and those links reduced to
their text (the files they name ship in the sdist).
"""
import re
from pathlib import Path

from setuptools import setup

NOT_RELATIVE = r"(?!https?://|#)"
# an HTML paragraph holding an image the repository serves (the README's figure, with its caption)
HTML_FIGURE = re.compile(
    r"<p\b[^>]*>(?:(?!</p>).)*?<img\b[^>]*\bsrc=\"" + NOT_RELATIVE + r"(?:(?!</p>).)*</p>\n*", re.DOTALL)
MARKDOWN_IMAGE = re.compile(r"!\[[^\]]*\]\(" + NOT_RELATIVE + r"[^)]*\)\n*")
MARKDOWN_LINK = re.compile(r"\[([^\]]+)\]\(" + NOT_RELATIVE + r"[^)]*\)")


def index_description(readme: str) -> str:
    """The README as a package index shows it: no image or link that only resolves in the repository."""
    readme = HTML_FIGURE.sub("", readme)
    readme = MARKDOWN_IMAGE.sub("", readme)
    return MARKDOWN_LINK.sub(r"\1", readme)


setup(
    long_description=index_description((Path(__file__).resolve().parent / "README.md").read_text(encoding="utf-8")),
    long_description_content_type="text/markdown",
)
