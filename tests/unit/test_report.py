"""``lazarus report``'s data, from synthetic statuses and histories and from a released
history: one band per incident, phases in recovery order, the catch-up found on the
new generation's steps, and files that draw. No server."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from temporalio.client import WorkflowHistory
from typer.testing import CliRunner

from lazarus.app import cli, cli_report
from lazarus.app.client import StatusView
from lazarus.app.report import (
    MATPLOTLIB_MISSING,
    RECOVERY_PHASES,
    JobHistory,
    LaunchRecord,
    RecordedOutcome,
    ReportData,
    SeenCheckpoint,
    job_history,
    render_html,
    render_png,
    report_data,
)
from lazarus.domain.contracts import FailureReport, SuperviseOutcome
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.recovery_timeline import RecoveryTimeline
from workflows.playbook import Action
from workflows.state import Incident, JobStatus, Phase

T0 = 1_800_000_000.0
RELEASED = Path(__file__).resolve().parents[1] / "fixtures" / "histories" / "released"
CRASH_HISTORIES = sorted(RELEASED.glob("*/rank_crash_recovers_with_identical_weights.json"))


def incident(
    id: int,
    generation: int,
    fault: float,
    *,
    stopped: float | None,
    first_step: float | None,
    step_at_failure: int = 26,
    resumed_from: int = 20,
    action: Action = Action.RESTART,
    failure_class: FailureClass = FailureClass.KILLED,
) -> Incident:
    at = T0 + fault
    made = Incident.opened(
        id=id,
        generation=generation,
        kind="crash",
        failure_class=failure_class,
        fault_at=at,
        detected_at=at + 1.0,
        step_at_failure=step_at_failure,
    )
    made.action = action
    made.resumed_from_step = resumed_from
    made.steps_lost = step_at_failure - resumed_from
    made.stopped_at = None if stopped is None else T0 + stopped
    made.first_step_at = None if first_step is None else T0 + first_step
    if first_step is not None:
        made.recovery_s = first_step - fault
    made.timeline = RecoveryTimeline(
        fault_at=at,
        detected_at=at + 1.0,
        decided_at=at + 1.0,
        survivors_stopped_at=made.stopped_at,
        first_step_at=made.first_step_at,
    )
    return made


def status(incidents: list[Incident], phase: Phase = Phase.SUCCEEDED, **extra: Any) -> JobStatus:
    return JobStatus(
        job_id="tiny",
        phase=phase,
        generation=len(incidents) + 1,
        step=60,
        world_size=2,
        ranks=[],
        restarts=len(incidents),
        max_restarts=5,
        incidents=incidents,
        ettr=0.8,
        elapsed_s=100.0,
        mttr_s=5.0,
        steps_lost=sum(i.steps_lost or 0 for i in incidents),
        **extra,
    )


def outcome(
    kind: str, generation: int, at: float, step: int, *, first_step: bool = False
) -> RecordedOutcome:
    failure = None
    if kind == "failed":
        failure = FailureReport(
            kind="crash",
            failure_class=FailureClass.KILLED,
            rank=1,
            fault_at=T0 + at,
            detected_at=T0 + at + 1.0,
            step_at_failure=step,
        )
    return RecordedOutcome(
        outcome=SuperviseOutcome(
            kind=kind,  # type: ignore[arg-type]
            generation=generation,
            observed_at=T0 + at,
            step=step,
            first_step_at=T0 + at if first_step else None,
            seconds_per_step=0.5,
            failure=failure,
        ),
        recorded_at=T0 + at,
    )


def two_crash_history() -> JobHistory:
    """Gen 1 dies at step 26 (t=20), gen 2 at step 46 (t=50), gen 3 finishes at t=90."""
    return JobHistory(
        started_at=T0,
        closed_at=T0 + 100.0,
        launches=[
            LaunchRecord(generation=1, launched_at=T0 + 1, resume_step=None),
            LaunchRecord(generation=2, launched_at=T0 + 24, resume_step=20),
            LaunchRecord(generation=3, launched_at=T0 + 54, resume_step=40),
        ],
        outcomes=[
            outcome("failed", 1, 20, 26),
            outcome("first_step", 2, 28, 21, first_step=True),
            outcome("failed", 2, 50, 46),
            outcome("first_step", 3, 58, 41, first_step=True),
            outcome("succeeded", 3, 90, 60),
        ],
        checkpoints=[
            SeenCheckpoint(step=20, seen_at=T0 + 15, tier="local", source="watch"),
            SeenCheckpoint(step=20, seen_at=T0 + 17, tier="durable", source="upload"),
            SeenCheckpoint(step=40, seen_at=T0 + 45, tier="local", source="watch"),
        ],
    )


def two_crash_status() -> JobStatus:
    return status(
        [
            incident(1, 1, 20, stopped=22, first_step=28, step_at_failure=26, resumed_from=20),
            incident(2, 2, 50, stopped=52, first_step=58, step_at_failure=46, resumed_from=40),
        ]
    )


def phases(data: ReportData) -> list[list[str]]:
    return [[band.phase for band in i.bands] for i in data.incidents]


def test_one_band_per_incident_with_phases_in_recovery_order() -> None:
    data = report_data(two_crash_status(), two_crash_history())
    assert [i.id for i in data.incidents] == [1, 2]
    assert phases(data) == [list(RECOVERY_PHASES)] * 2
    for report in data.incidents:
        edges = [(band.start_s, band.end_s) for band in report.bands]
        flat = [t for edge in edges for t in edge]
        assert flat == sorted(flat), f"phases overlap or run backwards: {edges}"
        assert all(band.complete and not band.estimated for band in report.bands)
        assert report.bands[0].start_s == report.fault_s
    first = data.incidents[0].bands
    assert (first[0].start_s, first[0].end_s) == (20.0, 21.0)  # detecting
    assert (first[1].end_s, first[2].end_s) == (22.0, 28.0)  # stopped, first new step


def test_catch_up_ends_where_the_new_generation_is_back_at_the_failed_step() -> None:
    data = report_data(two_crash_status(), two_crash_history())
    catch_up = data.incidents[0].bands[-1]
    # gen 2: step 21 at t=28, step 46 at t=50; step 26 is a fifth of the way.
    assert catch_up.phase == "catching_up"
    assert catch_up.end_s == pytest.approx(28 + (26 - 21) / (46 - 21) * 22)


def test_the_series_has_one_line_per_generation_starting_at_its_resume_step() -> None:
    data = report_data(two_crash_status(), two_crash_history())
    lines = data.generations()
    assert sorted(lines) == [1, 2, 3]
    assert [lines[g][0].step for g in (1, 2, 3)] == [0, 20, 40]
    assert [p.source for p in lines[2]] == ["launch", "first_step", "failure"]
    assert lines[3][-1].step == 60 and lines[3][-1].source == "end"


def test_summary_counts_incidents_by_class_including_dropped_ones() -> None:
    job = two_crash_status().model_copy(
        update={"incidents_dropped": 3, "dropped_by_class": {"hang": 2, "killed": 1}}
    )
    data = report_data(job, two_crash_history())
    summary = data.summary
    assert summary.incidents == 5
    assert summary.incidents_by_class == {"hang": 2, "killed": 3}
    assert summary.incidents_by_action == {"restart": 2}
    assert (summary.ettr, summary.mttr_s, summary.steps_lost) == (0.8, 5.0, 12)
    assert summary.local_checkpoints == 2 and summary.durable_checkpoints == 1
    assert summary.phase_totals_s["detecting"] == pytest.approx(2.0)
    assert any("3 older incidents" in note for note in data.notes)


def test_an_incident_superseded_before_its_first_step_is_cut_at_the_next_fault() -> None:
    job = status(
        [
            incident(1, 1, 20, stopped=22, first_step=None),
            incident(2, 2, 30, stopped=31, first_step=40, step_at_failure=20, resumed_from=20),
        ]
    )
    history = two_crash_history().model_copy(update={"outcomes": []})
    data = report_data(job, history)
    assert phases(data) == [list(RECOVERY_PHASES[:3])] * 2
    relaunching = data.incidents[0].bands[-1]
    assert relaunching.end_s == 30.0 and not relaunching.complete
    assert data.incidents[1].bands[-1].complete, "nothing lost: no catching up"


def test_an_escalation_waiting_for_an_operator_runs_to_the_end_of_the_report() -> None:
    job = status(
        [incident(1, 1, 20, stopped=22, first_step=None, action=Action.NEEDS_OPERATOR)],
        phase=Phase.NEEDS_OPERATOR,
    )
    history = two_crash_history().model_copy(update={"closed_at": None})
    data = report_data(job, history)
    [report] = data.incidents
    assert report.action == "needs_operator"
    assert [b.phase for b in report.bands] == ["detecting", "stopping", "relaunching"]
    assert report.bands[-1].end_s == 100.0 and not report.bands[-1].complete
    assert data.duration_s == 100.0, "an open job's report ends at its elapsed time"


def test_catch_up_is_estimated_from_the_step_time_when_no_step_reached_it() -> None:
    job = status([incident(1, 1, 20, stopped=22, first_step=28)])
    history = two_crash_history().model_copy(
        update={
            "outcomes": [
                outcome("failed", 1, 20, 26),
                outcome("first_step", 2, 28, 21, first_step=True),
            ]
        }
    )
    [report] = report_data(job, history).incidents
    catch_up = report.bands[-1]
    assert catch_up.estimated
    assert catch_up.end_s == pytest.approx(28 + 6 * 0.5)  # 6 steps lost at 0.5 s a step


@pytest.mark.parametrize("path", CRASH_HISTORIES, ids=[p.parent.name for p in CRASH_HISTORIES])
def test_a_released_crash_history_gives_one_band_with_all_four_phases(path: Path) -> None:
    history = job_history([WorkflowHistory.from_json(path.stem, path.read_text())])
    assert history.final_status is not None and history.unreadable == 0
    assert [launch.generation for launch in history.launches] == [1, 2]
    assert history.launches[1].resume_step == 20
    data = report_data(history.final_status, history)
    assert phases(data) == [list(RECOVERY_PHASES)]
    assert data.summary.incidents == 1 and data.summary.phase == "SUCCEEDED"
    assert [c.source for c in data.checkpoints] == ["resume"]
    assert data.points[0].t_s > 0 and data.duration_s >= data.points[-1].t_s


def test_a_continued_as_new_run_leaves_the_job_open() -> None:
    [path] = sorted(RELEASED.glob("4251617/continue_as_new_adopts_live_ranks.json"))
    history = job_history([WorkflowHistory.from_json(path.stem, path.read_text())])
    assert history.runs == 1 and history.events > 0


def test_an_empty_history_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        job_history([])


@pytest.mark.slow  # renders a PNG with matplotlib
def test_the_png_and_the_self_contained_page(tmp_path: Path) -> None:
    data = report_data(two_crash_status(), two_crash_history())
    data = data.model_copy(update={"job": "<tiny>"})
    png = render_png(data, tmp_path / "deep" / "report.png")
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert (tmp_path / "deep" / "report.png").read_bytes() == png
    page = render_html(data, png)
    assert base64.b64encode(png).decode() in page
    assert "&lt;tiny&gt;" in page and "<tiny>" not in page
    assert "catching up" in page and "ETTR" in page and "killed 2" in page
    assert "http" not in page, "the page must load nothing from the network"


def test_the_terminal_tables_render() -> None:
    data = report_data(two_crash_status(), two_crash_history())
    console = Console(width=160, record=True)
    console.print(cli_report.render_report(data))
    text = console.export_text()
    assert "ETTR" in text and "catching up" in text and "80.0%" in text


class _StubJobs:
    """Just what ``gather_report`` calls: a finished job whose worker is gone."""

    def __init__(self, runs: list[WorkflowHistory]) -> None:
        self.runs = runs

    async def status(self, job: str) -> StatusView:
        return StatusView(workflow_id=f"lazarus-{job}", execution_status="COMPLETED", note="gone")

    async def history(self, job: str) -> list[WorkflowHistory]:
        return self.runs


async def test_a_finished_job_reports_from_its_final_result_without_a_worker() -> None:
    path = CRASH_HISTORIES[0]
    jobs: Any = _StubJobs([WorkflowHistory.from_json(path.stem, path.read_text())])
    data = await cli_report.gather_report(jobs, "tiny")
    assert len(data.incidents) == 1 and data.summary.phase == "SUCCEEDED"
    with pytest.raises(cli_report.ReportUnavailable, match="empty"):
        await cli_report.gather_report(_StubJobs([]), "tiny")  # type: ignore[arg-type]


def test_bad_output_paths_are_refused_before_anything_is_contacted(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli.app,
        ["--address", "127.0.0.1:1", "report", "tiny", "--out", str(tmp_path)],
    )
    assert result.exit_code == 2
    assert f"--out {tmp_path}: is a directory" in result.output


def test_without_matplotlib_the_message_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cli_report.importlib.util, "find_spec", lambda name: None)
    assert cli_report.output_problems(tmp_path / "r.png", None) == [MATPLOTLIB_MISSING]
    assert cli_report.output_problems(None, None) == [], "--json alone needs no matplotlib"
    assert "lazarus-train[report]" in MATPLOTLIB_MISSING
