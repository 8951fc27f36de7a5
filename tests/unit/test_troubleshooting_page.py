"""``docs/troubleshooting.md`` quotes every NEEDS_OPERATOR reason the workflow can give,
so the page cannot go stale: a new escalation, or a reason reworded, fails here.

Pure file reads (``ast`` over ``workflows/``), no processes, well under a second.

The reasons are found in the code, not listed by hand:

- every call of ``needs_operator(reason)`` / ``_needs_operator(reason, guard)``;
- every ``Decision(action=Action.NEEDS_OPERATOR, reason=...)``;
- the ``return`` strings of the functions whose text is forwarded as a reason
  (:data:`REASON_SOURCES`).

A reason written in place (a string or an f-string) must appear in the page with every
fixed word of it. A reason passed on by name must be one :data:`FORWARDED` knows, so a
new path into NEEDS_OPERATOR cannot slip past. The guard names (``budget``,
``crash_loop``...) an incident shows as its strategy must appear too, and so must every
place that sets the phase without ``needs_operator``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "troubleshooting.md"
WORKFLOWS = REPO / "workflows"

ESCALATIONS = {"needs_operator", "_needs_operator"}
"""Calls whose first argument is a NEEDS_OPERATOR reason."""

REASON_SOURCES = {
    ("workflows/stops.py", "_quarantine_unkillable"),
    ("workflows/operator_requests.py", "reopen_pool"),
}
"""Functions whose returned text becomes a reason elsewhere (``stuck``, ``short``)."""

FORWARDED = {
    ("workflows/playbook.py", "_needs_operator", "reason"),
    ("workflows/recovery_steps.py", "*", "decision.reason"),
    ("workflows/recovery_steps.py", "*", "stuck"),
    ("workflows/stop_steps.py", "*", "stuck"),
    ("workflows/job.py", "*", "stuck"),
}
"""Reasons passed on by name, with where their text is made: ``decision.reason`` comes
from a playbook ``Decision`` (checked), ``stuck`` from ``_quarantine_unkillable``
(checked), ``reason`` from ``_needs_operator``'s callers (checked)."""

DIRECT_PHASE_SETS = {
    ("workflows/run_context.py", "needs_operator"),
    ("workflows/job.py", "_wait_for_operator"),
}
"""Where ``set_phase(Phase.NEEDS_OPERATOR)`` is called: ``needs_operator`` itself, and
the resume that finds too few nodes (its reason is ``reopen_pool``'s)."""

MIN_WORDS_CHARS = 4
"""Fixed fragments shorter than this (``" on "``, ``": "``) are joints, not wording."""


@dataclass(frozen=True)
class Reason:
    where: str
    function: str
    line: int
    expr: ast.expr

    def label(self) -> str:
        return f"{self.where}:{self.line} ({self.function})"


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node


def _call_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _is_needs_operator(expr: ast.expr | None) -> bool:
    return isinstance(expr, ast.Attribute) and expr.attr == "NEEDS_OPERATOR"


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(WORKFLOWS.rglob("*.py")):
        yield str(path.relative_to(REPO)), ast.parse(path.read_text())


def _innermost_function(tree: ast.AST) -> dict[int, str]:
    """Each node's id -> the name of the innermost function that holds it."""
    owner: dict[int, str] = {}
    for name, function in _functions(tree):
        for node in ast.walk(function):
            owner[id(node)] = name  # inner functions are walked later and win
    return owner


def _says_something(value: ast.expr | None) -> bool:
    return value is not None and not (isinstance(value, ast.Constant) and value.value is None)


def escalation_reasons() -> list[Reason]:
    found: list[Reason] = []
    for where, tree in _modules():
        owner = _innermost_function(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            function = owner.get(id(node), "<module>")
            name = _call_name(node)
            if name in ESCALATIONS and node.args:
                found.append(Reason(where, function, node.lineno, node.args[0]))
            elif name == "Decision":
                keywords = {k.arg: k.value for k in node.keywords}
                if _is_needs_operator(keywords.get("action")) and "reason" in keywords:
                    found.append(Reason(where, function, node.lineno, keywords["reason"]))
        for source, body in _functions(tree):
            if (where, source) in REASON_SOURCES:
                for node in ast.walk(body):
                    if isinstance(node, ast.Return) and _says_something(node.value):
                        assert node.value is not None
                        found.append(Reason(where, source, node.lineno, node.value))
    return found


def fixed_text(expr: ast.expr) -> list[str] | None:
    """The literal fragments of a reason, or None when it is passed on by name."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return [expr.value]
    if isinstance(expr, ast.JoinedStr):
        return [
            v.value for v in expr.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
        ]
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        left, right = fixed_text(expr.left), fixed_text(expr.right)
        return [*(left or []), *(right or [])]
    if isinstance(expr, ast.Call):  # "; ".join(lines): no wording of its own
        return []
    return None


def wording(fragment: str) -> str:
    return " ".join(fragment.split()).strip(" :;,.()")


def page_text() -> str:
    return " ".join(PAGE.read_text().split())


def test_every_needs_operator_reason_is_in_the_troubleshooting_page() -> None:
    text = page_text()
    reasons = escalation_reasons()
    assert len(reasons) >= 10, f"found only {len(reasons)} reasons: is the scan broken?"
    missing: list[str] = []
    unknown: list[str] = []
    for reason in reasons:
        fragments = fixed_text(reason.expr)
        if fragments is None:
            source = ast.unparse(reason.expr)
            if not any(
                reason.where == where and function in ("*", reason.function) and source == name
                for where, function, name in FORWARDED
            ):
                unknown.append(f"{reason.label()}: passes on {source!r}")
            continue
        for fragment in map(wording, fragments):
            if len(fragment) >= MIN_WORDS_CHARS and fragment not in text:
                missing.append(f"{reason.label()}: {fragment!r}")
    assert not unknown, (
        "NEEDS_OPERATOR reasons passed on by name that this test does not know; add "
        "where their text is made to REASON_SOURCES or FORWARDED:\n" + "\n".join(unknown)
    )
    assert not missing, (
        "docs/troubleshooting.md does not quote these NEEDS_OPERATOR reasons (add each "
        "with its cause and fix):\n" + "\n".join(missing)
    )


def test_every_guard_name_is_in_the_page() -> None:
    text = page_text()
    guards = set()
    for _, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _call_name(node) == "_needs_operator":
                guard = node.args[1] if len(node.args) > 1 else None
                if isinstance(guard, ast.Constant) and isinstance(guard.value, str):
                    guards.add(guard.value)
    assert guards, "no guard found: is the scan broken?"
    missing = sorted(g for g in guards if f"`{g}`" not in text)
    assert not missing, f"docs/troubleshooting.md does not name the guards {missing}"


def test_the_phase_is_set_only_where_the_test_knows() -> None:
    sites = set()
    for where, tree in _modules():
        owner = _innermost_function(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and _call_name(node) == "set_phase"
                and node.args
                and _is_needs_operator(node.args[0])
            ):
                sites.add((where, owner.get(id(node), "<module>")))
    unknown = sorted(sites - DIRECT_PHASE_SETS)
    assert not unknown, (
        "set_phase(Phase.NEEDS_OPERATOR) outside needs_operator: say its reason in "
        f"docs/troubleshooting.md and add the site to DIRECT_PHASE_SETS: {unknown}"
    )


def test_the_suggested_actions_are_in_the_page() -> None:
    from workflows.playbook import SUGGESTED_OPERATOR_ACTIONS

    text = page_text()
    for action in SUGGESTED_OPERATOR_ACTIONS:
        verb = re.sub(r"\s+NODE$", "", action)
        assert f"lazarus {verb}" in text, f"docs/troubleshooting.md does not show 'lazarus {verb}'"
