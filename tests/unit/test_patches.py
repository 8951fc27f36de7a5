"""The patch table (``workflows/patches.py``) is the only source of patch ids.

Every ``workflow.patched(...)`` (and ``deprecate_patch``) under ``workflows/`` must name a
constant imported from ``patches``, so one module says what each patch changes and
when it goes; ids are unique and never change, since every history that took a new
path carries the id as its marker.
"""

from __future__ import annotations

import ast
from pathlib import Path

from workflows import patches
from workflows.patches import PATCHES

WORKFLOWS = Path(__file__).resolve().parents[2] / "workflows"

RELEASED_IDS = {
    "PATCH_RUN_DIRECTORY": "run-directory-per-start",
    "PATCH_CONTINUE_AS_NEW_ANY_PHASE": "continue-as-new-in-every-phase",
    "PATCH_RETIER_AFTER_FALLBACK": "retier-after-fallback",
    "PATCH_FAST_RECOVERY": "fast-recovery",
    "PATCH_SLURM_PREEMPTION": "slurm-preemption",
    "PATCH_SLURM_ALLOCATION": "slurm-allocation-changes",
    "PATCH_CHECKPOINT_INTERVAL_AUTO": "checkpoint-interval-auto",
    "PATCH_FLEET": "fleet",
    "PATCH_SEARCH_ATTRIBUTES_V2": "search-attributes-v2",
    "PATCH_HOST_TASK_QUEUE": "host-task-queue",
    "PATCH_REJOIN": "rejoin-in-place",
    "PATCH_HOUSEKEEPING_STOPS": "housekeeping-stops-when-told",
    "PATCH_HOOK_SURVIVES_CONTINUE_AS_NEW": "escalation-hook-survives-continue-as-new",
    "PATCH_FLEET_HAND_BACK": "fleet-hand-back",
    "PATCH_FLEET_WAIT_FOR_NODE": "fleet-wait-for-node",
    "PATCH_NODES_BEFORE_RESUME": "node-set-before-resume-point",
    "PATCH_SLURM_OWN_JOBS": "slurm-own-jobs",
    "PATCH_END_OF_RUN_EVERY_NODE": "end-of-run-every-node",
    "PATCH_FLEET_WAITS_ONLY_FOR_NODES": "fleet-waits-only-for-nodes",
}
"""Ids that histories in the wild may carry: each must stay, spelled as it is."""


def _constants() -> dict[str, str]:
    return {
        name: value
        for name, value in vars(patches).items()
        if name.startswith("PATCH_") and isinstance(value, str)
    }


def _patch_calls(tree: ast.AST) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("patched", "deprecate_patch")
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "workflow"
    ]


def _imported_from_patches(tree: ast.AST) -> set[str]:
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "workflows.patches"
        for alias in node.names
    }


def test_every_patched_call_names_a_constant_of_the_table() -> None:
    constants = _constants()
    calls = 0
    for path in sorted(WORKFLOWS.glob("*.py")):
        if path.name == "patches.py":
            continue
        tree = ast.parse(path.read_text())
        imported = _imported_from_patches(tree)
        for call in _patch_calls(tree):
            calls += 1
            where = f"{path.name}:{call.lineno}"
            assert len(call.args) == 1 and not call.keywords, where
            (arg,) = call.args
            assert isinstance(arg, ast.Name), f"{where}: pass a PATCH_ constant, not an expression"
            assert arg.id in imported, f"{where}: {arg.id} is not imported from patches"
            assert arg.id in constants, f"{where}: {arg.id} is not in the patch table"
    assert calls >= len(RELEASED_IDS)


def test_no_patch_id_is_defined_outside_the_table() -> None:
    for path in sorted(WORKFLOWS.glob("*.py")):
        if path.name == "patches.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assert not target.id.startswith("PATCH_"), f"{path.name}: {target.id}"


def test_ids_are_unique_and_every_constant_has_a_row() -> None:
    constants = _constants()
    assert len(set(constants.values())) == len(constants)
    assert set(constants.values()) == set(PATCHES)
    for row in PATCHES.values():
        assert row.owner and row.changes and row.introduced and row.retire, row.id


def test_released_ids_never_change() -> None:
    constants = _constants()
    for name, id_ in RELEASED_IDS.items():
        assert constants.get(name) == id_, f"{name} must stay {id_!r}"
