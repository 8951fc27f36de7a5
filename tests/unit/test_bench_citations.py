"""What the docs cite from ``bench/`` exists (issue 40).

- Every ``bench/results/<file>`` that ``README.md``, ``bench/README.md`` or a page
  under ``docs/`` names is there: ``bench/results/`` is not committed
  (``.gitignore``), so a cited file must be added with ``git add -f``.
- Every result file in git is cited by a ``docs/results/`` page (by name, or by a
  name with ``<...>`` in place of the part that varies; a ``.png`` with its ``.json``):
  the rest of a run's output stays out of git.
- Every ``python -m bench <command>`` they cite is a command of ``python -m bench``
  (its parser's subcommands), and ``lazarus simulate``, the simulator's verb, exists.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import typer

from bench.__main__ import COST_COMMANDS, build_parser
from lazarus.app.cli import app

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "bench" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
RESULT = re.compile(r"bench/results/([\w.+-]+\.(?:json|png|txt|csv))")
COMMAND = re.compile(r"python -m bench ([a-z][a-z-]*)")
RETIRED_AT = "35cdd3d"
"""The commit (on main) that still has ``replica-cost``, ``snapshot-cost`` and ``replica-push-cost``
(which ``state-scale`` superseded) and ``state-costs`` (which timed replaced code
against its replacement)."""
MOVED = {
    "chaos": "python -m tests.chaos",
    "replica-cost": RETIRED_AT,
    "snapshot-cost": RETIRED_AT,
    "replica-push-cost": RETIRED_AT,
    "state-costs": RETIRED_AT,
}
"""Commands that left ``python -m bench``, and what a page citing one (a dated run made
with it) must name too: the command's new name, or the commit it was retired after."""


def cited(pattern: re.Pattern[str]) -> dict[str, list[str]]:
    """Each match of ``pattern`` in the pages, with the pages that cite it."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for match in pattern.finditer(page.read_text()):
            found.setdefault(match.group(1), []).append(str(page.relative_to(REPO)))
    return found


def bench_commands() -> set[str]:
    """The subcommands of ``python -m bench``, from its parser."""
    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(commands.choices)


def test_the_walk_finds_the_commands() -> None:
    """Guards the guard: the commands the docs lean on most are found, and every cost
    command's parser has the name its dispatch table gives it."""
    assert {"compare", "recovery", "simulate", "checkpoints", "state-scale"} <= bench_commands()
    assert set(COST_COMMANDS) <= bench_commands()


def test_every_cited_bench_command_exists() -> None:
    commands = bench_commands()
    missing = {
        command: [p for p in pages if MOVED.get(command, "\0") not in (REPO / p).read_text()]
        for command, pages in cited(COMMAND).items()
        if command not in commands
    }
    missing = {command: pages for command, pages in missing.items() if pages}
    assert not missing, (
        f"pages cite python -m bench commands that do not exist: {missing} "
        "(name the new command or the commit it was retired after on the page, or keep an "
        "alias)"
    )


def test_lazarus_simulate_exists() -> None:
    group = typer.main.get_command(app)
    assert "simulate" in getattr(group, "commands", {})


def test_every_cited_result_file_exists() -> None:
    results = REPO / "bench" / "results"
    missing = {
        name: pages for name, pages in cited(RESULT).items() if not (results / name).is_file()
    }
    assert not missing, (
        f"cited result files missing from bench/results/: {missing} "
        "(bench/results/ is ignored: git add -f the file a page cites)"
    )


CITED_NAME = re.compile(r"bench/results/([\w.+<>|-]+)")
"""A results file a page names, perhaps as a pattern: ``seed<1|2|3>``, ``<10|54>d``; a
placeholder stands for one part of the name, without a ``-`` (so ``simulate-<time>.json``,
a page's description of the naming, cites no dated file)."""


@pytest.mark.slow  # asks git for the committed files: the fast tier starts no process
def test_every_committed_result_file_is_cited_by_a_results_page() -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "bench/results"], cwd=REPO, capture_output=True, text=True, check=True
    )
    text = "\n".join(page.read_text() for page in sorted((REPO / "docs" / "results").glob("*.md")))
    patterns = [
        re.compile(re.sub(r"<[^>]*>", r"[\\w.+]+", re.escape(name)) + "$")
        for name in CITED_NAME.findall(text)
    ]
    uncited = [
        name
        for name in (Path(path).name for path in listed.stdout.split())
        if not any(p.match(name) or p.match(name.rsplit(".", 1)[0] + ".json") for p in patterns)
    ]
    assert not uncited, (
        f"result files in git that no docs/results/ page cites: {uncited} "
        "(git rm --cached them, or cite them from the page their figures are on)"
    )
