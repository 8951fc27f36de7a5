"""Issue 12 §1: an incident's recovery timeline is shown by ``incidents`` (a phase
table), ``incidents --json`` (the timeline and its durations) and ``status`` (the
last recovery on one line)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from lazarus.app import cli, cli_render
from lazarus.domain.recovery_timeline import RecoveryTimeline
from workflows.playbook import Action
from workflows.state import Incident, JobStatus, Phase

TIMELINE = RecoveryTimeline(
    fault_at=1000.0,
    detected_at=1000.25,
    decided_at=1000.30,
    survivors_stopped_at=1000.55,
    resume_chosen_at=1000.70,
    launch_requested_at=1000.75,
    rank_started_at=1000.90,
    framework_imported_at=1003.10,
    process_group_ready_at=1003.60,
    checkpoint_loaded_at=1003.80,
    first_step_at=1004.40,
)


def incident(id: int, timeline: RecoveryTimeline | None) -> Incident:
    found = Incident.opened(
        id=id,
        generation=id,
        kind="crash",
        failure_class="unknown",  # type: ignore[arg-type]
        fault_at=1000.0,
        detected_at=1000.25,
        rank=1,
    )
    found.timeline = timeline
    found.action = Action.RESTART
    return found


def status(incidents: list[Incident]) -> JobStatus:
    fields: dict[str, Any] = {
        "job_id": "tiny",
        "phase": Phase.RUNNING,
        "generation": 2,
        "step": 40,
        "world_size": 2,
        "ranks": [],
        "restarts": 1,
        "max_restarts": 5,
        "incidents": incidents,
        "ettr": None,
        "elapsed_s": 600.0,
    }
    return JobStatus(**fields)


def text(renderable: Any) -> str:
    console = Console(width=160, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_incidents_prints_a_phase_table() -> None:
    out = text(cli_render.render_incidents([incident(1, TIMELINE)]))
    assert "incident #1: recovery phases" in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") >= 4}
    assert "0.25" in rows["detected"] and "survivors stopped" in rows
    # "framework imported": 2.20 s after the rank started, 3.10 s after the fault.
    assert "2.20" in rows["framework imported"] and "3.10" in rows["framework imported"]
    assert "4.40" in rows["first new step"]


def test_only_reached_phases_are_listed_and_old_incidents_still_render() -> None:
    partial = RecoveryTimeline(fault_at=1000.0, detected_at=1000.5, survivors_stopped_at=1001.0)
    out = text(cli_render.render_incidents([incident(1, None), incident(2, partial)]))
    assert "incident #1: recovery phases" not in out, "no timeline: no table"
    assert "incident #2: recovery phases" in out
    assert "framework imported" not in out and "survivors stopped" in out


def test_incidents_json_has_the_timeline_and_its_durations() -> None:
    [body] = cli_render.incidents_json([incident(1, TIMELINE)])
    assert body["timeline"]["first_step_at"] == 1004.40
    phases = {p["phase"]: p for p in body["phases"]}
    assert list(phases) == [d.phase for d in TIMELINE.durations()]
    assert phases["survivors stopped"] == {
        "phase": "survivors stopped",
        "seconds": 0.25,
        "since_fault_s": 0.55,
    }
    [old] = cli_render.incidents_json([incident(2, None)])
    assert old["timeline"] is None and old["phases"] == []


def test_status_shows_the_last_recovery_compactly() -> None:
    view = cli_render.StatusView(
        "lazarus-tiny", "RUNNING", status([incident(1, None), incident(2, TIMELINE)])
    )
    out = text(cli_render.render_status(view))
    line = " ".join(out[out.index("last recovery") :].split())
    assert line.startswith("last recovery #2: 4.40s to first new step = detect 0.25, "), line
    assert "import 2.20" in line and line.endswith("step 0.60")
    body = cli_render.status_json(view)
    assert body["incidents"][1]["phases"][-1]["since_fault_s"] == 4.4


def test_status_without_timelines_shows_no_breakdown() -> None:
    view = cli_render.StatusView("lazarus-tiny", "RUNNING", status([incident(1, None)]))
    assert "last recovery" not in text(cli_render.render_status(view))


@pytest.mark.parametrize("as_json", [False, True])
def test_the_incidents_command_renders_the_timeline(
    monkeypatch: pytest.MonkeyPatch, as_json: bool
) -> None:
    monkeypatch.setattr(cli, "_with_client", lambda ctx, action: [incident(1, TIMELINE)])
    args = ["incidents", "tiny", *(["--json"] if as_json else [])]
    result = CliRunner().invoke(cli.app, args, env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    if as_json:
        [body] = json.loads(result.output)
        assert body["phases"][0]["phase"] == "detected"
    else:
        assert "recovery phases" in result.output and "first new step" in result.output


def test_the_incidents_table_says_how_the_ranks_restarted() -> None:
    """Issue 16: a job with ``rejoin`` shows whether survivors kept their process."""
    kept = incident(1, None)
    kept.restart_path = "rejoin"
    whole = incident(2, None)
    whole.restart_path = "whole_generation"
    plain = incident(3, None)
    console = Console(width=160, record=True)
    console.print(cli_render.incidents_table([kept, whole, plain]))
    text = console.export_text()
    assert f"{kept.action} (rejoin)" in text
    assert f"{whole.action} (whole generation)" in text
    assert "(rejoin)" not in text.splitlines()[-2]
    kept_again = Incident.model_validate(json.loads(kept.model_dump_json(by_alias=True)))
    assert kept_again.restart_path == "rejoin"
