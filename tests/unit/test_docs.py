"""The docs build strictly: links resolve, pages stay short, the map reaches every page,
the architecture page names every module, and the generated reference is current.

Pure file reads, no server, well under a second. What is checked:

- ``README.md`` is the front door: at most 250 lines, ``make demo`` and ``make test``
  first;
- every relative link in ``README.md``, ``bench/README.md`` and ``docs/**/*.md``
  names a file that exists, and a heading anchor that exists (GitHub's slugs);
- no page under ``docs/`` is over 500 lines;
- every page under ``docs/`` is reachable from ``docs/README.md`` by links;
- ``docs/architecture.md`` names every module of ``workflows/`` and ``lazarus/domain/``,
  and names no module that is gone;
- ``docs/reference/job-spec.md`` is what ``lazarus.domain.spec_reference`` writes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from lazarus.domain import spec_reference

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
README_MAX_LINES = 250
PAGE_MAX_LINES = 500

PENDING_PAGES: dict[str, str] = {}
"""Pages linked before they land on this branch. A link to one passes only while the
file is absent; once it exists it is checked like any other page."""

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def markdown_files() -> list[Path]:
    pages = [REPO / "README.md", REPO / "bench" / "README.md", *sorted(DOCS.rglob("*.md"))]
    return [page for page in pages if page.exists()]


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """Lines outside fenced code blocks, with their numbers."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            continue
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            continue
        yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    for _, line in prose_lines(path.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = counts.get(base, 0)
        counts[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in prose_lines(path.read_text()):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            target = match.group(1)
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, mailto: ...
                continue
            yield number, target


def resolve(page: Path, target: str) -> tuple[Path, str]:
    path, _, fragment = target.partition("#")
    return ((page.parent / path).resolve() if path else page), fragment


def where(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_the_readme_is_a_short_front_door() -> None:
    text = (REPO / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, over {README_MAX_LINES}: move the section into "
        "a page under docs/ and link it"
    )
    first_block = text.split("```")[1] if "```" in text else ""
    before = text.split("```")[0]
    assert "make demo" in first_block and "make test" in first_block and "##" not in before, (
        "README.md must open with the make demo / make test block, before any section"
    )


def test_every_relative_link_resolves() -> None:
    problems = []
    anchor_cache: dict[Path, set[str]] = {}
    for page in markdown_files():
        for line, target in links(page):
            path, fragment = resolve(page, target)
            label = f"{where(page)}:{line}: {target}"
            if not path.exists():
                try:
                    pending = where(path) in PENDING_PAGES
                except ValueError:
                    pending = False
                if not pending:
                    problems.append(f"{label}: no such file")
                continue
            if fragment and path.suffix == ".md":
                if path not in anchor_cache:
                    anchor_cache[path] = anchors(path)
                if fragment not in anchor_cache[path]:
                    problems.append(f"{label}: no heading with anchor #{fragment} in {where(path)}")
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_no_docs_page_is_over_the_limit() -> None:
    long = [
        f"{where(page)}: {count} lines"
        for page in sorted(DOCS.rglob("*.md"))
        if (count := len(page.read_text().splitlines())) > PAGE_MAX_LINES
    ]
    assert not long, f"pages over {PAGE_MAX_LINES} lines (split them):\n" + "\n".join(long)


def test_every_docs_page_is_reachable_from_the_map() -> None:
    start = (DOCS / "README.md").resolve()
    seen = {start}
    todo = [start]
    while todo:
        page = todo.pop()
        for _, target in links(page):
            path, _ = resolve(page, target)
            if (
                path.suffix == ".md"
                and path.is_relative_to(DOCS)
                and path.exists()
                and path not in seen
            ):
                seen.add(path)
                todo.append(path)
    unreachable = [where(page) for page in sorted(DOCS.rglob("*.md")) if page.resolve() not in seen]
    assert not unreachable, "pages no link from docs/README.md reaches:\n" + "\n".join(unreachable)


def package_modules(*candidates: str) -> tuple[str, list[str]]:
    """The modules of a package folder (its real folder, wherever the tree keeps it)."""
    for candidate in candidates:
        folder = REPO / candidate
        if folder.is_dir() and not folder.is_symlink():
            names = sorted(
                str(path.relative_to(folder))
                for path in folder.rglob("*.py")
                if path.name != "__init__.py"
            )
            return candidate, names
    raise AssertionError(f"none of {candidates} is a folder")


ARCHITECTURE_TABLES = {
    "workflows": ("## The workflows floor", ("workflows", "lazarus/workflows")),
    "domain": ("## The domain floor", ("lazarus/domain",)),
}


def named_in_table(text: str, heading: str) -> set[str]:
    """The module names in the first column of the table under ``heading``."""
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([\w/]+\.py)` \|", section, flags=re.MULTILINE))


@pytest.mark.parametrize("floor", sorted(ARCHITECTURE_TABLES))
def test_the_architecture_page_names_every_module(floor: str) -> None:
    heading, candidates = ARCHITECTURE_TABLES[floor]
    folder, modules = package_modules(*candidates)
    named = named_in_table((DOCS / "architecture.md").read_text(), heading)
    missing = [f"{folder}/{module}" for module in modules if module not in named]
    gone = [f"{folder}/{module}" for module in sorted(named) if module not in modules]
    assert not missing and not gone, (
        f"docs/architecture.md, table under {heading!r}: "
        + (f"add a one-line row for {', '.join(missing)}" if missing else "")
        + ("; " if missing and gone else "")
        + (f"remove the row of {', '.join(gone)} (no such module)" if gone else "")
    )


def test_the_job_spec_reference_is_current() -> None:
    page = DOCS / "reference" / "job-spec.md"
    assert page.exists() and page.read_text() == spec_reference.render(), (
        f"docs/reference/job-spec.md is not what JobSpec gives; regenerate it: "
        f"{spec_reference.COMMAND}"
    )


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Lazarus vs torchrun", "lazarus-vs-torchrun"),
        (
            "The fault \N{MULTIPLICATION SIGN} phase chaos matrix (`python -m bench chaos`)",
            "the-fault--phase-chaos-matrix-python--m-bench-chaos",
        ),
        (
            "Checkpoint interval by Young\N{EN DASH}Daly (`checkpoints.interval: auto`)",
            "checkpoint-interval-by-youngdaly-checkpointsinterval-auto",
        ),
    ],
)
def test_anchors_follow_github(heading: str, expected: str) -> None:
    assert slug(heading) == expected
