"""The README's relative links resolve (it is read on GitHub and PyPI, outside the site,
whose own links `mkdocs build --strict` checks)."""

from __future__ import annotations

import pathlib
from urllib.parse import unquote, urlparse

from markdown_it import MarkdownIt

ROOT = pathlib.Path(__file__).resolve().parents[2]


def relative_links(text: str) -> list[str]:
    """The targets of the links and images of Markdown `text` that point into the
    repository (no scheme, not a bare #anchor), without their #anchor."""
    found = []
    tokens = MarkdownIt("commonmark").parse(text)
    for token in tokens:
        for child in token.children or []:
            target = child.attrs.get("href") or child.attrs.get("src")
            if not target or urlparse(target).scheme or target.startswith("#"):
                continue
            found.append(unquote(target.split("#")[0]))
    return found


def test_the_readme_links_resolve():
    links = relative_links((ROOT / "README.md").read_text(encoding="utf-8"))
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing


def test_a_broken_link_is_found(tmp_path):
    links = relative_links("See [a](docs/index.md#top), [b](https://x.org/a.md), [c](#here)"
                           " and ![d](docs/nothing.png).")
    assert links == ["docs/index.md", "docs/nothing.png"]
