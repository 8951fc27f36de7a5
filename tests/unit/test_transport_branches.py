"""The transport is chosen once, in the node layer: no code outside ``activities/nodes/``
branches on a node's launcher or on an agent's class (issue 40).

What a caller needs to know about a node's transport is a capability: on a node
spec, :attr:`~lazarus.domain.spec_nodes.NodeSpec.transport` (the table in
:mod:`lazarus.domain.transports`); on an agent, a method or property of
:class:`~activities.nodes.agent.NodeAgent`. The walk reads the source with :mod:`ast`,
so a comparison counts however it is spelled (``==``, ``!=``, ``in``, ``match``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECKED = ("lazarus", "workflows", "activities", "workers", "infra", "bench", "examples")
NODE_LAYER = REPO / "activities" / "nodes"
TRANSPORT_TABLE = REPO / "lazarus" / "domain" / "transports.py"
"""The one place outside the node layer that maps launcher names to capabilities."""


def _is_launcher(node: ast.expr) -> bool:
    """``x.launcher`` or a bare ``launcher``."""
    return (isinstance(node, ast.Attribute) and node.attr == "launcher") or (
        isinstance(node, ast.Name) and node.id == "launcher"
    )


def _is_agent_class(node: ast.expr) -> bool:
    """A name (or attribute) ending in ``Agent``, or a tuple holding one."""
    if isinstance(node, ast.Tuple):
        return any(_is_agent_class(e) for e in node.elts)
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return isinstance(name, str) and name.endswith("Agent")


def branches(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every transport branch in ``tree``: (line, what)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            if any(_is_launcher(side) for side in (node.left, *node.comparators)):
                yield node.lineno, "a comparison on a launcher"
        elif isinstance(node, ast.Match) and _is_launcher(node.subject):
            yield node.lineno, "a match on a launcher"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"isinstance", "issubclass"}
            and len(node.args) == 2
            and _is_agent_class(node.args[1])
        ):
            yield node.lineno, f"{node.func.id} on an agent class"


def found_outside_the_node_layer() -> list[str]:
    found: list[str] = []
    for folder in CHECKED:
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.is_relative_to(NODE_LAYER) or path == TRANSPORT_TABLE:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            found += [f"{path.relative_to(REPO)}:{line}: {what}" for line, what in branches(tree)]
    return found


def test_no_transport_branch_outside_the_node_layer() -> None:
    found = found_outside_the_node_layer()
    assert not found, (
        "transport branches outside activities/nodes/ (ask NodeSpec.transport or a "
        "NodeAgent method instead):\n" + "\n".join(found)
    )


def test_the_walk_sees_every_spelling() -> None:
    source = """
if node.launcher == "local": pass
if "ssh" != spec.nodes[0].launcher: pass
if launcher in ("ssh", "slurm"): pass
match node.launcher:
    case "slurm": pass
if isinstance(agent, LocalAgent): pass
if isinstance(agent, (int, nodes.SlurmAgent)): pass
"""
    assert sorted(line for line, _ in branches(ast.parse(source))) == [2, 3, 4, 5, 7, 8]


def test_capabilities_are_not_branches() -> None:
    source = """
if node.transport.runs_here: pass
names = {n.launcher for n in nodes}
agent = agent_for(node, ssh)
if isinstance(agent, NodeAgentError): pass
"""
    assert list(branches(ast.parse(source))) == []


def test_every_launcher_has_a_transport() -> None:
    from typing import get_args

    from lazarus.domain.spec_nodes import NodeSpec
    from lazarus.domain.transports import TRANSPORTS, Launcher

    assert set(TRANSPORTS) == set(get_args(Launcher))
    assert set(get_args(NodeSpec.model_fields["launcher"].annotation)) == set(TRANSPORTS)
    assert [k for k, t in TRANSPORTS.items() if t.runs_here] == ["local"]
