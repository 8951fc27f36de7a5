"""The ``Phase`` diagram is the state machine the code runs (issue 27, item 5).

Two checks hold the ``A -> B: why`` lines of :class:`Phase` (``TRANSITIONS``) against
the code:

- here, statically: every phase change in ``workflows/`` (``set_phase(Phase.X)``,
  ``needs_operator``, ``fail``) is found by AST, with the phases its function can be
  in when it runs (declared below, narrowed by an unconditional ``set_phase`` earlier
  in the same function); each such move must be drawn, and each drawn move made;
- at run time: ``JobRun.set_phase`` checks every change against ``TRANSITIONS``; the
  workflow tests start their jobs with ``JobInput.strict_phases``, so a move the
  diagram misses fails the job there (in production it is logged).
"""

from __future__ import annotations

import ast
from pathlib import Path

from workflows.state import (
    TRANSITIONS,
    JobInput,
    Phase,
    drawn_transitions,
    undrawn_transition,
)

WORKFLOWS = Path(__file__).resolve().parents[2] / "workflows"

LIVE = frozenset(p for p in Phase if not p.is_terminal)
P = Phase

ENTRY: dict[tuple[str, str], frozenset[Phase]] = {
    ("job.py", "run"): LIVE,  # cancelled in any phase
    ("job.py", "_turn"): frozenset({P.RECOVERING}),  # its last branch only
    ("job.py", "_launch_next"): frozenset({P.PENDING, P.LAUNCHING}),
    ("job.py", "_supervise"): frozenset({P.RUNNING}),
    ("job.py", "_on_outcome"): frozenset({P.RUNNING}),
    ("job.py", "_pause"): LIVE - {P.PAUSED, P.NEEDS_OPERATOR},  # operator_requests.WAITING
    ("job.py", "_wait_for_operator"): frozenset({P.PAUSED, P.NEEDS_OPERATOR}),
    ("fleet_steps.py", "lease"): frozenset({P.PENDING}),
    ("fleet_steps.py", "ask_again"): frozenset({P.NEEDS_OPERATOR}),
    ("preflight_steps.py", "check_active_nodes"): frozenset({P.LAUNCHING}),
    ("recovery_steps.py", "recover"): frozenset({P.RUNNING, P.LAUNCHING}),
    ("recovery_steps.py", "forced"): frozenset({P.RUNNING}),
    ("recovery_steps.py", "straggler_swap"): frozenset({P.RUNNING}),
    ("recovery_steps.py", "drop_rejoin"): frozenset({P.LAUNCHING}),  # guarded by the phase
    ("slurm_steps.py", "submit_first"): frozenset({P.PENDING}),
    ("slurm_steps.py", "give_back_first"): frozenset({P.PENDING}),
    ("slurm_steps.py", "on_preempted"): frozenset({P.RUNNING}),
    ("stop_steps.py", "swap_out"): frozenset({P.LAUNCHING, P.RECOVERING}),
    ("stop_steps.py", "fence_a_stuck_carry"): frozenset({P.LAUNCHING}),  # from _launch_next
}
"""The phases each phase-changing function can be in when it is called."""

PRIMITIVES = {("run_context.py", name) for name in ("set_phase", "fail", "needs_operator")}


def _target(call: ast.Call) -> Phase | None:
    """The phase a call moves to, if it is a phase change."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    if func.attr == "set_phase" and call.args:
        arg = call.args[0]
        if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name):
            assert arg.value.id == "Phase", f"set_phase of {arg.value.id} at line {call.lineno}"
            return Phase(arg.attr)
        raise AssertionError(f"set_phase with a computed phase at line {call.lineno}")
    return {"needs_operator": P.NEEDS_OPERATOR, "fail": P.FAILED}.get(func.attr)


def _moves() -> dict[tuple[Phase, Phase], list[str]]:
    """Every (from, to) the code can make, with where."""
    moves: dict[tuple[Phase, Phase], list[str]] = {}
    for path in sorted(WORKFLOWS.glob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            key = (path.name, fn.name)
            unconditional = {id(stmt.value) for stmt in fn.body if isinstance(stmt, ast.Expr)}
            sites = sorted(
                (
                    node
                    for node in ast.walk(fn)
                    if isinstance(node, ast.Call) and _target(node) is not None
                ),
                key=lambda node: node.lineno,
            )
            if not sites or key in PRIMITIVES:
                continue
            assert key in ENTRY, f"{path.name}:{fn.name} changes the phase: declare it in ENTRY"
            phases = ENTRY[key]
            for call in sites:
                target = _target(call)
                assert target is not None
                for before in phases:
                    if before != target:
                        where = f"{path.name}:{call.lineno}"
                        moves.setdefault((before, target), []).append(where)
                if id(call) in unconditional:
                    phases = frozenset({target})  # the phase from here on
    return moves


def test_every_phase_change_in_the_code_is_drawn() -> None:
    undrawn = {
        f"{a.value} -> {b.value}": where
        for (a, b), where in _moves().items()
        if (a, b) not in TRANSITIONS
    }
    assert not undrawn, f"phase changes missing from the Phase diagram: {undrawn}"


def test_every_drawn_transition_is_made_by_the_code() -> None:
    made = _moves()
    stale = [f"{a.value} -> {b.value}" for a, b in TRANSITIONS if (a, b) not in made]
    assert not stale, f"drawn but never made: {stale}"


def test_the_diagram_draws_preemption_and_the_fleets_resume() -> None:
    assert (P.RECOVERING, P.PAUSED) in TRANSITIONS
    assert (P.RECOVERING, P.LAUNCHING) in TRANSITIONS
    assert (P.NEEDS_OPERATOR, P.LAUNCHING) in TRANSITIONS
    assert all(not a.is_terminal for a, _ in TRANSITIONS), "terminal phases are final"


def test_the_transition_lines_parse() -> None:
    doc = "x\n    RUNNING -> PAUSED: a pause\n    PENDING -> LAUNCHING -> RUNNING\n"
    assert drawn_transitions(doc) == {(P.RUNNING, P.PAUSED): "a pause"}


def test_an_undrawn_change_is_reported_and_strict_only_when_the_input_asks() -> None:
    assert undrawn_transition(P.RUNNING, P.RUNNING) is None
    assert undrawn_transition(P.RUNNING, P.RECOVERING) is None
    assert undrawn_transition(P.SUCCEEDED, P.RUNNING) is not None
    # Strictness is part of the job's input (its history), never the worker's
    # environment (issue 37, N12): an input from before the field replays lenient.
    spec = {"name": "j", "command": ["python", "t.py"]}
    assert not JobInput.model_validate({"spec": spec}).strict_phases
    assert JobInput.model_validate({"spec": spec, "strict_phases": True}).strict_phases
