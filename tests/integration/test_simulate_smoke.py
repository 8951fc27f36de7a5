"""``lazarus simulate --quick`` (alias ``python -m bench simulate``) end to end: the real
``JobWorkflow`` on the time-skipping test server meets a seeded burst of failures on 32
simulated nodes for 12 simulated hours. Recovery, spares running out (the simulated
operator returns the repaired node and resumes), ``checkpoints.interval: auto`` and
continue-as-new all happen, the lemon rows lease from the real fleet workflow, and every
run ends succeeded. No timing or ETTR is asserted: those are the bench's to report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_quick_simulation_runs_through_failures_operator_and_continue_as_new(
    tmp_path: Path,
) -> None:
    out = tmp_path / "simulate.json"
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "lazarus"),
            "simulate",
            "--quick",
            "--json-out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {row["variant"]: row for row in result["rows"]}
    assert set(rows) == {
        "fixed",
        "auto+lemon",
        "auto+lemon spares 0%",
        "memory+lemon",
        "rejoin+memory+lemon",
    }
    for row in rows.values():
        assert row["phase"] == "SUCCEEDED", row
        assert row["interruptions"] > 0 and row["restarts"] > 0
        assert row["continue_as_new"] >= 1
        assert 0 < row["ettr"] < 1
    assert rows["auto+lemon"]["interval_changes"] > 0  # the workflow tuned it
    # Lemon rows lease from the real fleet workflow, report to it, release at the end.
    assert rows["fixed"]["fleet"] is None
    for name in ("auto+lemon", "auto+lemon spares 0%"):
        updates = rows[name]["fleet"]["updates"]
        assert updates["lease"] == 1 and updates["release"] == 1, updates
        assert updates.get("report_quarantine", 0) >= 1, updates
    assert rows["auto+lemon spares 0%"]["fleet"]["updates"].get("replace", 0) >= 1
    assert rows["auto+lemon"]["tuning"]["checkpoint_save_s"] == pytest.approx(20.0)
    assert "resume" in rows["auto+lemon spares 0%"]["operator_log"]
    assert not any("failed" in action for action in rows["auto+lemon spares 0%"]["operator_log"])
    # The memory tier (from the spec): crashes and hangs resume from every node's own
    # snapshot, lost nodes from the buddy's replica; far fewer steps lost than disk.
    memory = rows["memory+lemon"]
    assert memory["resumes_by_tier"].get("memory", 0) >= 1, memory["resumes_by_tier"]
    assert memory["resumes_by_tier"].get("replica", 0) >= 1, memory["resumes_by_tier"]
    assert memory["steps_lost"] < rows["auto+lemon"]["steps_lost"]
    assert memory["time_by_phase_s"]["memory_snapshots"] > 0
    # Rejoin: the launches after a crash or a replaced node carry the survivors, and
    # the replaced nodes go back to the fleet (no page the row without rejoin avoids).
    rejoin = rows["rejoin+memory+lemon"]
    assert rejoin["launches_by_path"].get("rejoin", 0) >= 1, rejoin["launches_by_path"]
    assert len(rejoin["pages"]) <= len(memory["pages"]), rejoin["pages"]
    assert out.with_suffix(".png").stat().st_size > 0
    assert "| fixed |" in done.stdout
