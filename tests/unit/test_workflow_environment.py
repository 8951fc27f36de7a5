"""No workflow code reads the worker's environment (issue 37, N12).

A workflow's decisions must come from its history: two workers with different
environments (one with ``LAZARUS_STRICT_PHASES=1``, one without) would otherwise
replay one history differently. What varies per job is in ``JobInput``; what the
worker knows is an activity's to read. Checked statically over every module of
``workflows/``: no ``os`` (``os.environ``, ``os.getenv``), no ``environ`` or
``getenv`` imported from anywhere."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

WORKFLOWS = Path(__file__).resolve().parents[2] / "workflows"
READS = {"environ", "environb", "getenv", "getenvb"}


def environment_reads(source: str) -> list[str]:
    """Where ``source`` imports ``os`` or reads an environment variable, one line each."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name == "os"]
        elif isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names if node.module == "os" or a.name in READS]
            found += [f"line {node.lineno}: from {node.module} import {n}" for n in names]
        elif isinstance(node, ast.Attribute) and node.attr in READS:
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


@pytest.mark.parametrize(
    ("source", "read"),
    [
        ("import os\nos.environ.get('X')", True),
        ("from os import environ", True),
        ("from os import getenv", True),
        ("import posix\nposix.environ", True),
        ("value = spec.env.get('X')", False),
    ],
)
def test_the_check_sees_an_environment_read(source: str, read: bool) -> None:
    assert bool(environment_reads(source)) is read


def test_no_workflow_module_reads_the_environment() -> None:
    modules = sorted(WORKFLOWS.rglob("*.py"))
    assert modules
    reads = [
        f"{path.relative_to(WORKFLOWS.parent)}: {line}"
        for path in modules
        for line in environment_reads(path.read_text())
    ]
    assert not reads, "workflow code reads the worker's environment:\n" + "\n".join(reads)
