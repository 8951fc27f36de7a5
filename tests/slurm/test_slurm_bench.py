"""Smoke test of ``python -m bench slurm``: one quick repeat of the node-loss scenario,
both systems, on test Slurm clusters of its own (``make test-all`` adds
``slurm_cpu``, the controller's CPU per node, which runs in the full benchmark). It
checks that the scenario runs and that the results file carries the figures the
README quotes; it asserts no timing (speed figures live in bench/results/, never in tests).

Why it is here: the scenarios drive a real Slurm (a node kill, a requeued batch
job), which only these tests' machines have; elsewhere it skips like the others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.__main__ import main
from infra.slurm import TestSlurm
from tests import tiers
from tests.slurm.conftest import require_slurm

pytestmark = [pytest.mark.e2e, tiers.only_in_test_all("the Slurm benchmark's harness")]

SCENARIOS = ["slurm_node_loss"]
if tiers.ALL:
    SCENARIOS += ["slurm_cpu"]


@pytest.mark.timeout(600)
def test_slurm_bench_runs_both_systems_and_writes_the_figures(tmp_path: Path) -> None:
    require_slurm()
    out = tmp_path / "slurm.json"
    scenarios = ",".join(SCENARIOS)
    code = main(
        ["slurm", "--quick", "--repeats", "1", "--scenarios", scenarios, "--json-out", str(out)]
    )
    data = json.loads(out.read_text())
    runs = {(r["scenario"], r["system"]): r for r in data["runs"]}
    # Only the clusters this run made: other test sessions may run their own.
    roots = {Path(r["details"]["cluster_root"]) for r in runs.values() if r["details"]}
    left = {root: TestSlurm(root=root).leftovers() for root in roots}
    assert len(roots) == len(runs) and not any(left.values()), f"test Slurm left behind: {left}"
    assert not any(root.exists() for root in roots), roots
    assert code == 0, [r.get("error") for r in runs.values()]
    assert data["benchmark"] == "slurm"

    lazarus = runs["slurm_node_loss", "lazarus"]
    for name in ("detection_from_kill_s", "recovery_from_kill_s", "steps_lost", "spare_used"):
        assert name in lazarus["metrics"], name
    assert lazarus["metrics"]["recovered"] is True
    assert any(m.startswith("phase_") for m in lazarus["metrics"])
    assert "SlurmdTimeout" in lazarus["details"]["settings"]["slurm"]

    plain = runs["slurm_node_loss", "slurm_requeue"]
    assert "SlurmdTimeout" in plain["details"]["settings"]["slurm"]
    assert plain["details"]["settings"]["sbatch"].startswith("--requeue")
    # Either the requeued job trained again, or the run says how Slurm ended it.
    assert plain["metrics"]["recovered"] is True or plain["note"], plain

    if "slurm_cpu" not in SCENARIOS:
        return
    cpu = runs["slurm_cpu", "lazarus"]["metrics"]
    for name in ("poll_interval_s", "slurm2_cpu_ms_per_s_per_node", "slurm3_cpu_ms_per_s_per_node"):
        assert isinstance(cpu[name], float), name
    assert runs["slurm_cpu", "slurm_requeue"]["not_possible"]
