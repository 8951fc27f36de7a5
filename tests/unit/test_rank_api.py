"""``lazarus.rank`` exports exactly its ``__all__``, and the docs' Python API page
lists exactly those names: no facade of private names (issue 40)."""

from __future__ import annotations

import re
import types
from pathlib import Path

import lazarus.rank

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "reference" / "python-api.md"


def test_the_package_exports_only_its_all() -> None:
    exported = {
        name
        for name, value in vars(lazarus.rank).items()
        if not name.startswith("__")
        and not isinstance(value, types.ModuleType)
        and name != "annotations"  # ``from __future__ import annotations``
    }
    assert exported == set(lazarus.rank.__all__)


def test_the_python_api_page_lists_the_all() -> None:
    text = PAGE.read_text()
    section = text[text.index("## The rank helper: `lazarus.rank`") :]
    table = [line for line in section.splitlines() if line.startswith("| `")]
    listed = {
        name
        for row in table
        for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)[`(]", row.split("|")[1])
    }
    assert listed == set(lazarus.rank.__all__)
