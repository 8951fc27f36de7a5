"""What the docs cite from ``bench/`` exists (issue 40).

- Every ``bench/results/<file>`` that ``README.md``, ``bench/README.md`` or a page
  under ``docs/`` names is there: ``bench/results/`` is not committed
  (``.gitignore``), so a cited file must be added with ``git add -f``.
- Every result file in git is cited by a ``docs/results/`` page (by name, or by a
  name with ``<...>`` in place of the part that varies; a ``.png`` with its ``.json``):
  the rest of a run's output stays out of git.
- Every ``python -m bench <command>`` they cite is a command of ``python -m bench``
  (its parser's subcommands), every ``python -m bench.<module>`` a module, every
  scenario of a cited ``--scenarios`` a registered scenario, and ``lazarus simulate``,
  the simulator's verb, exists.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import typer

from bench import catalog
from bench.__main__ import COST_COMMANDS, build_parser
from lazarus.app.cli import app

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "bench" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
RESULT = re.compile(r"bench/results/([\w.+-]+\.(?:json|png|txt|csv))")
COMMAND = re.compile(r"python -m bench ([a-z][a-z-]*)")
MODULE = re.compile(r"python -m (bench(?:\.\w+)+)")
SCENARIOS = re.compile(r"python -m bench [a-z-]+ [^`\n]*?--scenarios[ =]([a-z_,]+)")
RETIRED_AT = "35cdd3d"
"""The commit (on main) that still has what bench/README.md lists as retired after it:
commands that ``state-scale`` superseded or that timed replaced code against its
replacement, and scenarios and a module whose figures are dated history."""
MOVED = {
    "chaos": "python -m tests.chaos",
    "bench.peers.install_nvrx": "python -m infra.install_nvrx",
    **dict.fromkeys(
        [
            *("replica-cost", "snapshot-cost", "replica-push-cost", "state-costs"),
            *("bench.metrics_scrape", "ssh_poll", "controller_cpu", "schedule"),
        ],
        RETIRED_AT,
    ),
}
"""Commands, modules and scenarios that left ``bench``, and what a page citing one (a
dated run made with it) must name too: the new name, or the commit it was retired after."""


def cited(pattern: re.Pattern[str], split: bool = False) -> dict[str, list[str]]:
    """Each match of ``pattern`` in the pages (``split``: each name of a comma list),
    with the pages that cite it."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for match in pattern.finditer(page.read_text()):
            for name in match.group(1).split(",") if split else [match.group(1)]:
                found.setdefault(name, []).append(str(page.relative_to(REPO)))
    return found


def not_moved(names: dict[str, list[str]], existing: set[str]) -> dict[str, list[str]]:
    """The cited names that do not exist, with the pages that cite one without naming
    where it went (:data:`MOVED`)."""
    missing = {
        name: [p for p in pages if MOVED.get(name, "\0") not in (REPO / p).read_text()]
        for name, pages in names.items()
        if name not in existing
    }
    return {name: pages for name, pages in missing.items() if pages}


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


def test_every_cited_bench_command_module_and_scenario_exists() -> None:
    modules = {name for name in cited(MODULE) if (REPO / f"{name.replace('.', '/')}.py").is_file()}
    missing = {
        **not_moved(cited(COMMAND), bench_commands()),
        **not_moved(cited(MODULE), modules),
        **not_moved(cited(SCENARIOS, split=True), set(catalog.load())),
    }
    assert not missing, (
        f"pages cite python -m bench commands, modules or scenarios that do not exist: "
        f"{missing} (name the new name or the commit it was retired after on the page, or "
        "keep an alias)"
    )


def test_the_walk_finds_modules_and_scenarios() -> None:
    """Guards the guard: a module and the scenarios of a ``--scenarios`` list are found."""
    assert "bench.peers.install_nvrx" in cited(MODULE)
    assert {"crash", "hang", "node_loss", "multinode_node_loss"} <= cited(
        SCENARIOS, split=True
    ).keys()


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
