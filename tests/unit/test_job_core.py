"""The job core stays small and its message handlers stay safe (issue 27).

Read from the source (AST), no server: ``workflows/job.py`` keeps the handlers and
the turn loop within its budget, pool edits that cross an ``await`` hold the one pool
lock, ``run`` waits for every handler before it returns, and the job spec is
assigned in one place only (nodes that change at runtime live in ``JobState``).
"""

from __future__ import annotations

import ast
from pathlib import Path

WORKFLOWS = Path(__file__).resolve().parents[2] / "workflows"
JOB = WORKFLOWS / "job.py"

MAX_JOB_LINES = 600
MAX_JOB_METHODS = 30
MAX_PRODUCT_LINES = 900


def _job_class() -> ast.ClassDef:
    tree = ast.parse(JOB.read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "JobWorkflow")


def _method(name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    return next(
        n
        for n in _job_class().body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
    )


def _names(node: ast.AST) -> set[str]:
    """Every attribute and name mentioned under ``node``."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute):
            found.add(sub.attr)
        elif isinstance(sub, ast.Name):
            found.add(sub.id)
    return found


def _locked_calls(node: ast.AST) -> set[str]:
    """Methods called inside an ``async with`` on the pool lock under ``node``."""
    calls: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.AsyncWith) and any(
            {"pool_lock", "editing_pool"} & _names(item.context_expr) for item in sub.items
        ):
            for inner in ast.walk(sub):
                if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute):
                    calls.add(inner.func.attr)
    return calls


def test_the_job_core_is_small() -> None:
    lines = len(JOB.read_text().splitlines())
    methods = [
        n for n in _job_class().body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    assert lines <= MAX_JOB_LINES, f"workflows/job.py has {lines} lines"
    assert len(methods) <= MAX_JOB_METHODS, f"JobWorkflow has {len(methods)} methods"


def test_no_workflow_module_is_over_the_product_limit() -> None:
    for path in WORKFLOWS.glob("*.py"):
        lines = len(path.read_text().splitlines())
        assert lines <= MAX_PRODUCT_LINES, f"{path.name}: {lines} lines"


def test_pool_edits_across_an_await_hold_the_pool_lock() -> None:
    """``return`` fences then releases; a recovery stops then swaps; a launch's
    preflight swaps; the fleet's retry takes spares: each holds the lock."""
    assert {"stop_all", "release"} <= _locked_calls(_method("return_node"))
    core = _locked_calls(_job_class())
    for step in ("recover", "forced", "straggler_swap", "on_preempted", "ask_again"):
        assert step in core, f"{step} runs without the pool lock"
    assert "_launch_next" in _locked_calls(_method("_turn"))


def test_run_waits_for_every_handler_before_it_returns() -> None:
    run = _method("run")
    returns = [n for n in run.body if isinstance(n, ast.Return)]
    assert returns, "run ends with a return"
    before = run.body[: run.body.index(returns[-1])]
    waits = [
        call
        for stmt in before
        for call in ast.walk(stmt)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "wait_condition"
        and "all_handlers_finished" in _names(call)
    ]
    assert waits, "run returns without waiting for all_handlers_finished"


def test_continue_as_new_waits_for_every_handler() -> None:
    tree = ast.parse((WORKFLOWS / "hand_over.py").read_text())
    hop = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.AsyncFunctionDef) and n.name == "maybe_continue_as_new"
    )
    assert "all_handlers_finished" in _names(hop)


def test_the_job_spec_is_assigned_in_one_place() -> None:
    """``self._spec =`` only where a run begins: runtime nodes live in the state."""
    sites = [
        f"{path.name}:{node.lineno}"
        for path in sorted(WORKFLOWS.glob("*.py"))
        if path.name != "housekeeping.py"  # its own snapshot, taken at the run's start
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute)
        and target.attr == "_spec"
        and isinstance(node.value, ast.Name)
    ]
    assert len(sites) == 1, sites
