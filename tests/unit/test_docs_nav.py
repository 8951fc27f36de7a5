"""``mkdocs.yml``'s ``nav`` lists every page under ``docs/``, and only pages that exist.

The strict build (``tests/integration/test_docs_build.py``) fails on a page missing from
the nav too; this says so in the fast tier, naming the page. Pure file reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


class _Loader(yaml.SafeLoader):
    """Reads mkdocs.yml without importing what its ``!!python/name`` tags name."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def nav_pages(entries: Any) -> Iterator[str]:
    if isinstance(entries, str):
        yield entries
    elif isinstance(entries, list):
        for entry in entries:
            yield from nav_pages(entry)
    elif isinstance(entries, dict):
        for value in entries.values():
            yield from nav_pages(value)


def test_the_nav_lists_every_docs_page_once() -> None:
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=_Loader)
    listed = list(nav_pages(config["nav"]))
    pages = sorted(str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md"))
    missing = [page for page in pages if page not in listed]
    gone = [page for page in listed if page not in pages]
    twice = sorted({page for page in listed if listed.count(page) > 1})
    assert not missing, f"add these pages to mkdocs.yml's nav, in their group: {missing}"
    assert not gone, f"mkdocs.yml's nav lists pages that do not exist: {gone}"
    assert not twice, f"mkdocs.yml's nav lists these pages twice: {twice}"
    assert listed[0] == "README.md" and listed[1] == "getting-started.md", listed[:2]
