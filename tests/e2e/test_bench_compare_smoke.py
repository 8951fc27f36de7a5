"""``python -m bench compare`` runs fault scenarios under both systems and writes
well-formed results; so does the soak, and the overhead microbenchmark works.

Only the shape of the output is checked, never a timing: a ``--quick`` run's
numbers on a busy machine mean nothing. Every run starts torch several times
(ranks, torchrun's agent), a few seconds of CPU each, so to keep the suite under
20 minutes it runs the scenario at the heart of the comparison, ``crash``, under
both systems (a torchrun restart and a Lazarus recovery), and a short soak.
``make test-all`` adds ``hang`` (torchrun's bounded hang wait),
``controller_crash``, ``pause_resume`` (with torchrun's "not possible" record),
``clean`` and ``straggler``, which ``make bench`` runs in full; ``node_loss`` is
the recovery benchmark's scenario, smoke-tested in ``test_bench_smoke``; the
overhead's CPU jobs use the same job helpers and run in the full benchmark.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness import BenchConfig, BenchRun, Plan, RunRecord
from bench.measure import StepTrace
from bench.metrics import lookup
from bench.overhead import heartbeat_micro
from bench.report import compare_table, summary
from bench.soak import _assess, schedule
from bench.soak_results import SoakIncident
from bench.systems import System
from tests import tiers
from tests.chaos.invariants import processes_mentioning

REPO = Path(__file__).resolve().parents[2]
FAULTS = ["crash"]
if tiers.ALL:
    FAULTS += ["hang", "controller_crash", "pause_resume", "clean", "straggler"]
SYSTEMS: list[System] = ["lazarus", "torchrun"]
SHARED = {"completed", "weights_ok"}
EXPECTED: dict[str, set[str]] = {
    "clean": SHARED | {"wall_s", "steps_per_s"},
    "crash": SHARED
    | {"detected", "detection_from_injection_s", "recovery_outside_s", "steps_lost", "wall_s"},
    "hang": SHARED | {"detected", "detection_from_injection_s", "recovery_outside_s", "steps_lost"},
    "controller_crash": SHARED
    | {"training_survived", "steps_lost", "duplicate_ranks", "supervised_after"},
    "straggler": SHARED | {"stretch_s", "stretch_steps_per_s", "straggler_detected", "wall_s"},
    "pause_resume": SHARED | {"pause_to_paused_s", "resume_to_first_step_s", "steps_lost"},
}

pytestmark = pytest.mark.e2e


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
    assert processes_mentioning(workdir) == []
    return proc


@pytest.mark.timeout(600)
@tiers.only_in_test_all("the compare harness (every fault under both systems)")
def test_quick_compare_runs_faults_under_both_systems(tmp_path: Path) -> None:
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
        timeout_s=570,
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
            assert run["status"] == "not_possible" and run["not_possible"]
            continue
        assert run["status"] == "ok", (scenario, system, run["error"])
        if (scenario, system) == ("hang", "torchrun"):
            continue  # never detected: no recovery, no weights, by design
        assert EXPECTED[scenario] <= run["metrics"].keys(), (scenario, system)
        for name in run["metrics"]:
            lookup(name)  # every metric has its one meaning in bench.metrics
    if "hang" in FAULTS:
        assert runs[("hang", "torchrun")]["metrics"]["detected"] is False
        assert "not detected within" in runs[("hang", "torchrun")]["note"]
    for scenario in FAULTS:
        assert set(data["summary"][scenario]) == set(SYSTEMS)


@pytest.mark.timeout(300)
@tiers.only_in_test_all("the chaos soak harness (its counting has unit tests)")
def test_quick_soak_writes_json_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    plot = tmp_path / "soak.png"
    proc = _run(
        [
            "soak",
            "--quick",
            "--soak-minutes",
            "0.25",
            "--systems",
            ",".join(SYSTEMS),
            "--json-out",
            str(out),
            "--plot-out",
            str(plot),
        ],
        timeout_s=270,
    )
    assert "| soak | ETTR |" in proc.stdout
    assert plot.read_bytes().startswith(b"\x89PNG")
    data = json.loads(out.read_text())
    assert data["benchmark"] == "soak"
    soak = data["soak"]
    assert soak["plot"] == str(plot)
    assert set(soak["systems"]) == set(SYSTEMS)
    for result in soak["systems"].values():
        assert 0.0 <= result["ettr"] <= 1.0
        # A loaded machine may not get a 15 s job past its start-up: no progress
        # is then a legitimate answer, not a harness failure.
        assert isinstance(result["trace"], list)
        assert {"incident_count", "unhandled", "mttr_s", "incidents"} <= result.keys()


def test_heartbeat_microbenchmark_reports_costs() -> None:
    costs = heartbeat_micro(calls=20_000, writes=20)
    assert set(costs) == {"empty_ns", "heartbeat_ns", "write_ns"}
    assert all(value > 0 for value in costs.values())


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
    run = BenchRun(
        config=BenchConfig.quick(),
        plan=Plan(scenarios=["crash", "pause_resume"], systems=SYSTEMS, repeats=1),
        started_at=0.0,
    )
    pairs: list[tuple[System, float]] = [("lazarus", 4.0), ("torchrun", 8.0)]
    for system, recovery in pairs:
        run.records.append(
            RunRecord(
                scenario="crash",
                system=system,
                repeat=0,
                started_at=0.0,
                wall_clock_s=1.0,
                metrics={"recovery_outside_s": recovery, "weights_ok": True},
                details={},
            )
        )
    run.records.append(
        RunRecord(
            scenario="pause_resume",
            system="torchrun",
            repeat=0,
            not_possible="no pause",
            started_at=0.0,
            wall_clock_s=0.0,
            metrics={},
            details={},
        )
    )
    table = compare_table(summary(run))
    assert "| crash | recovery_outside_s | 4 | 8 | 0.50 |" in table
    assert "no pause" in table
