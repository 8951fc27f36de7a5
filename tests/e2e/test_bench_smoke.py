"""The recovery benchmark harness runs every scenario once and writes well-formed JSON.

Only the shape of the output is checked, never a timing: the numbers of a
``--quick`` run on a busy CI machine mean nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = ["clean", "crash", "hang", "worker_kill"]
COMMON_METRICS = {
    "completed",
    "weights_ok",
    "generations",
    "incidents",
    "max_live_ranks",
    "history_events",
    "workflow_runs",
    "history_events_per_generation",
}
SCENARIO_METRICS = {
    "clean": set(),
    "crash": {
        "fault_step",
        "detection_s",
        "recovery_s",
        "steps_lost",
        "recovery_outside_s",
        "named_rank_ok",
    },
    "hang": {
        "fault_step",
        "detection_s",
        "detection_from_injection_s",
        "recovery_s",
        "named_rank_ok",
    },
    "worker_kill": {"fault_step", "steps_lost", "duplicate_ranks", "worker_down_s"},
}
STAT_KEYS = {"median", "min", "max", "n"}

pytestmark = pytest.mark.e2e


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(f"{cmdline.parent.name}: {args}")
    return found


@pytest.mark.timeout(300)
def test_quick_benchmark_writes_expected_json(tmp_path: Path) -> None:
    out = tmp_path / "recovery.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "recovery",
            "--quick",
            "--repeats",
            "1",
            "--scenarios",
            ",".join(SCENARIOS),
            "--json-out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.stdout.startswith("| scenario | metric | median | min | max | n |")

    # Everything it started is gone, and so is its temporary state.
    match = re.search(r"state in (\S+);", proc.stderr)
    assert match, proc.stderr[-2000:]
    workdir = match.group(1)
    assert not Path(workdir).exists()
    assert _processes_mentioning(workdir) == []

    data = json.loads(out.read_text())
    assert data["benchmark"] == "recovery"
    assert {"date", "cpu_count", "python", "torch", "temporalio"} <= data["machine"].keys()
    assert data["config"]["repeats"] == 1
    assert data["config"]["scenarios"] == SCENARIOS

    assert [r["scenario"] for r in data["runs"]] == SCENARIOS
    for run in data["runs"]:
        assert run["error"] is None
        expected = COMMON_METRICS | SCENARIO_METRICS[run["scenario"]]
        assert expected <= run["metrics"].keys(), run["scenario"]
        assert "incidents" in run["details"]

    assert set(data["summary"]) == set(SCENARIOS)
    for scenario, metrics in data["summary"].items():
        assert (COMMON_METRICS | SCENARIO_METRICS[scenario]) <= metrics.keys(), scenario
        for stats in metrics.values():
            assert stats.keys() >= STAT_KEYS
