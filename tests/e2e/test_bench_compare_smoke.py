"""``python -m bench compare`` runs every scenario under both systems and writes
well-formed results; so do the soak and the overhead figures.

Only the shape of the output is checked, never a timing: a ``--quick`` run's
numbers on a busy machine mean nothing. ``node_loss`` is left out (it needs
root and network namespaces, and its Lazarus side is the recovery benchmark's
``node_loss``, smoke-tested in ``test_bench_smoke``), and so is torchrun's
default setup, which the full run gives a bounded wait to fail in.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.compare import CompareConfig, CompareRun, RunResult, ScenarioPlan
from bench.compare_report import markdown_table, summary
from bench.soak import SoakIncident, _assess, schedule
from bench.trace import StepTrace

REPO = Path(__file__).resolve().parents[2]
FAULTS = ["crash", "hang", "controller_crash", "straggler", "pause_resume"]
"""Run by the first test; ``clean`` runs with the soak and overhead in the second."""
SYSTEMS = ["lazarus", "torchrun"]
SHARED = {"completed", "weights_ok"}
EXPECTED: dict[str, set[str]] = {
    "clean": SHARED | {"wall_s", "steps_per_s"},
    "crash": SHARED | {"detected", "detection_s", "recovery_s", "steps_lost", "wall_s"},
    "hang": SHARED | {"detected", "detection_s", "recovery_s", "steps_lost"},
    "controller_crash": SHARED
    | {"training_survived", "steps_lost", "duplicate_ranks", "supervised_after"},
    "straggler": SHARED | {"stretch_s", "stretch_steps_per_s", "straggler_detected", "wall_s"},
    "pause_resume": SHARED | {"pause_to_paused_s", "resume_to_first_step_s", "steps_lost"},
}

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


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "bench", *args]
    with subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as child:
        try:
            stdout, stderr = child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # SIGTERM, not SIGKILL: the benchmark then stops everything it started.
            child.terminate()
            stdout, stderr = child.communicate(timeout=60)
            pytest.fail(f"the benchmark timed out after {timeout_s:.0f} s:\n{stderr[-4000:]}")
    proc = subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    match = re.search(r"state in (\S+);", proc.stderr)
    assert match, proc.stderr[-2000:]
    workdir = match.group(1)
    assert not Path(workdir).exists()
    assert _processes_mentioning(workdir) == []
    return proc


@pytest.mark.timeout(240)
def test_quick_compare_runs_every_fault_under_both_systems(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    proc = _run(
        [
            "compare",
            "--quick",
            "--repeats",
            "1",
            "--systems",
            ",".join(SYSTEMS),
            "--scenarios",
            ",".join(FAULTS),
            "--soak-minutes",
            "0",
            "--no-overhead",
            "--json-out",
            str(out),
        ],
        timeout_s=220,
    )
    assert proc.stdout.startswith("| scenario | metric | Lazarus | torchrun |")
    data = json.loads(out.read_text())
    assert data["benchmark"] == "compare"
    assert {"date", "cpu_count", "python", "torch", "temporalio"} <= data["machine"].keys()
    assert data["config"]["plan"] == {"scenarios": FAULTS, "systems": SYSTEMS, "repeats": 1}
    runs = {(r["scenario"], r["system"]): r for r in data["runs"]}
    assert set(runs) == {(s, system) for s in FAULTS for system in SYSTEMS}
    for (scenario, system), run in runs.items():
        if (scenario, system) == ("pause_resume", "torchrun"):
            assert run["status"] == "not_possible" and run["note"]
            continue
        assert run["status"] == "ok", (scenario, system, run["error"])
        if (scenario, system) == ("hang", "torchrun"):
            continue  # never detected: no recovery, no weights, by design
        assert EXPECTED[scenario] <= run["metrics"].keys(), (scenario, system)
    assert runs[("hang", "torchrun")]["metrics"]["detected"] is False
    assert "not detected within" in runs[("hang", "torchrun")]["note"]
    for scenario in FAULTS:
        assert set(data["summary"][scenario]) == set(SYSTEMS)


@pytest.mark.timeout(180)
def test_quick_clean_soak_and_overhead_write_json_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    plot = tmp_path / "soak.png"
    proc = _run(
        [
            "compare",
            "--quick",
            "--repeats",
            "1",
            "--systems",
            ",".join(SYSTEMS),
            "--scenarios",
            "clean",
            "--soak-minutes",
            "0.15",
            "--json-out",
            str(out),
            "--plot-out",
            str(plot),
        ],
        timeout_s=160,
    )
    assert "| soak | ETTR |" in proc.stdout and "| overhead |" in proc.stdout
    assert plot.read_bytes().startswith(b"\x89PNG")
    data = json.loads(out.read_text())
    clean = {r["system"]: r for r in data["runs"]}
    assert set(clean) == set(SYSTEMS)
    for run in clean.values():
        assert run["status"] == "ok", run["error"]
        assert EXPECTED["clean"] <= run["metrics"].keys()
    soak = data["soak"]
    assert soak["plot"] == str(plot)
    assert set(soak["systems"]) == set(SYSTEMS)
    for result in soak["systems"].values():
        assert 0.0 <= result["ettr"] <= 1.0
        assert result["trace"], "no progress recorded"
        assert {"incident_count", "unhandled", "mttr_s", "incidents"} <= result.keys()
    overhead = data["overhead"]
    for key in (
        "lazarus_cpu_s_per_hour",
        "torchrun_cpu_s_per_hour",
        "history_events_per_generation",
        "history_events_per_hour_default",
        "heartbeat_ns_per_call",
        "empty_loop_ns_per_call",
    ):
        assert isinstance(overhead[key], float | int), key


# --------------------------------------------------------------------------- pure logic


def test_productive_time_skips_outages_and_redone_steps() -> None:
    trace = StepTrace(started_at=0.0)
    for step in range(1, 11):  # generation 1: steps 1..10, one a second
        trace.add(float(step), 1, step)
    for i, step in enumerate(range(6, 16)):  # resumed from 5 at t=20: 6..10 are redone
        trace.add(20.0 + i, 2, step)
    # 9 s of generation 1 (its first point has no predecessor), then steps 11..15.
    assert trace.productive_seconds() == pytest.approx(9.0 + 5.0)
    first = trace.first_of_later_generation(1, after=10.5)
    assert first is not None and (first.t, first.step) == (20.0, 6)


def test_schedule_is_seeded_and_the_assessment_marks_operator_fixes() -> None:
    assert schedule(10, 60, seed=3, tail_s=75) == schedule(10, 60, seed=3, tail_s=75)
    plan = schedule(10, 60, seed=3, tail_s=75)
    assert 7 <= len(plan) <= 9 and plan[-1].at_s <= 525
    assert all(f.kind in {"crash", "hang", "controller_crash"} for f in plan)
    trace = StepTrace(started_at=0.0)
    trace.add(1.0, 1, 1)
    trace.add(30.0, 2, 2)  # after the operator restarted it at 25 s
    incidents = [
        SoakIncident(kind="hang", at_s=5.0, generation=1, step=1),
        SoakIncident(kind="operator", at_s=25.0, generation=1, step=1, handled=False),
    ]
    _assess(incidents, trace, started=0.0)
    assert incidents[0].recovery_s == pytest.approx(25.0)
    assert incidents[0].handled is False


def test_table_reports_not_possible_and_ratios() -> None:
    run = CompareRun(
        config=CompareConfig.quick(),
        plan=ScenarioPlan(scenarios=["crash", "pause_resume"], systems=SYSTEMS, repeats=1),
        started_at=0.0,
    )
    for system, recovery in (("lazarus", 4.0), ("torchrun", 8.0)):
        run.results.append(
            RunResult(
                scenario="crash",
                system=system,
                repeat=0,
                status="ok",
                started_at=0.0,
                wall_clock_s=1.0,
                metrics={"recovery_s": recovery, "weights_ok": True},
            )
        )
    run.results.append(
        RunResult(
            scenario="pause_resume",
            system="torchrun",
            repeat=0,
            status="not_possible",
            note="no pause",
            started_at=0.0,
            wall_clock_s=0.0,
        )
    )
    table = markdown_table(summary(run))
    assert "| crash | recovery_s | 4 | 8 | 0.50 |" in table
    assert "no pause" in table
