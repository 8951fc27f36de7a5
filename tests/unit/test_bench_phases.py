"""Issue 12 §1, bench side: the crash scenario's per-phase figures, and the phase
table the report prints (medians per system, torchrun's phases where it has them)."""

from __future__ import annotations

from bench import report
from bench.__main__ import tables
from bench.harness import BenchConfig, BenchRun, Plan, RunRecord
from bench.jobs import JobShape
from bench.metrics import PHASE_METRICS, lookup
from bench.scenarios import phase_metrics
from bench.systems import System
from lazarus.domain.recovery_timeline import PHASES, RecoveryTimeline

LAZARUS = RecoveryTimeline(
    fault_at=100.0,
    detected_at=100.2,
    decided_at=100.25,
    survivors_stopped_at=100.5,
    resume_chosen_at=100.6,
    launch_requested_at=100.7,
    rank_started_at=100.8,
    framework_imported_at=103.0,
    process_group_ready_at=103.5,
    checkpoint_loaded_at=103.7,
    first_step_at=104.2,
)
TORCHRUN = RecoveryTimeline(
    fault_at=100.0, detected_at=100.4, rank_started_at=101.4, first_step_at=104.9
)


def test_every_phase_has_a_defined_metric() -> None:
    assert len(PHASE_METRICS) == len(PHASES) - 1
    for name, label in PHASE_METRICS:
        definition = lookup(name)
        assert definition.unit == "s" and label in definition.meaning


def test_phase_metrics_are_the_timelines_legs() -> None:
    metrics = phase_metrics(LAZARUS)
    assert metrics["phase_detected_s"] == 0.2
    assert metrics["phase_framework_imported_s"] == 2.2
    assert metrics["phase_first_step_s"] == 0.5
    rejoin_only = {"phase_survivors_torn_down_s", "phase_rejoin_received_s"}
    assert set(metrics) == {name for name, _ in PHASE_METRICS} - rejoin_only
    # torchrun: what its output allows, each leg from the previous phase it reached.
    assert phase_metrics(TORCHRUN) == {
        "phase_detected_s": 0.4,
        "phase_rank_started_s": 1.0,
        "phase_first_step_s": 3.5,
    }
    assert phase_metrics(None) == {}


def _run(per_system: dict[System, list[RecoveryTimeline]]) -> BenchRun:
    records = [
        RunRecord("crash", i, 0.0, 1.0, {**phase_metrics(t), "weights_ok": True}, {}, system=s)
        for s, timelines in per_system.items()
        for i, t in enumerate(timelines)
    ]
    plan = Plan(scenarios=["crash"], systems=list(per_system), repeats=3)
    run = BenchRun(config=BenchConfig.recovery(JobShape.quick()), plan=plan, started_at=0.0)
    run.records = records
    return run


def test_the_report_prints_median_phases_side_by_side() -> None:
    slower = LAZARUS.model_copy(update={"first_step_at": 105.2})
    run = _run({"lazarus": [LAZARUS, slower, LAZARUS], "torchrun": [TORCHRUN] * 3})
    table = report.phase_table(report.summary(run))
    assert table is not None
    lines = table.splitlines()
    assert lines[2] == "| phase | Lazarus | torchrun |"
    assert "| detected | 0.20 | 0.40 |" in lines
    assert "| decision | 0.05 | - |" in lines, "torchrun has no decision to time"
    assert "| first new step | 0.50 | 3.50 |" in lines, "medians, not means"
    assert lines[-1] == "| sum of medians | 4.20 | 4.90 |"
    assert table in tables(run, report.summary(run), "compare")
    assert table in tables(run, report.summary(run), "recovery")


def test_no_phase_figures_no_table() -> None:
    run = _run({"lazarus": []})
    assert report.phase_table(report.summary(run)) is None
