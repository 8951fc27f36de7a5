"""``start`` and ``status`` say when hang detection is off (issue 10, defect 17)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from lazarus.app import cli, cli_render
from lazarus.domain.contracts import SupervisionProgress
from lazarus.domain.spec import parse_spec
from workflows.state import JobStatus, Phase

SPEC = """\
name: tiny
command: [python, train.py]
nproc_per_node: 1
checkpoint_dir: ckpt
"""


def _status(**overrides: Any) -> JobStatus:
    fields: dict[str, Any] = {
        "job_id": "tiny",
        "phase": Phase.RUNNING,
        "generation": 1,
        "step": None,
        "world_size": 1,
        "ranks": [],
        "restarts": 0,
        "max_restarts": 5,
        "incidents": [],
        "ettr": None,
        "elapsed_s": 600.0,
    }
    return JobStatus(**{**fields, **overrides})


def _text(view: cli_render.StatusView) -> str:
    console = Console(width=160, record=True, color_system=None)
    console.print(cli_render.render_status(view))
    return console.export_text()


@pytest.mark.parametrize(
    ("signal", "shown"), [("none", True), ("heartbeat", False), ("log", False), (None, False)]
)
def test_status_says_hang_detection_is_off_without_a_progress_signal(
    signal: str | None, shown: bool
) -> None:
    view = cli_render.StatusView("lazarus-tiny", "RUNNING", _status(progress_signal=signal))
    assert (cli_render.HANG_DETECTION_OFF in _text(view)) is shown


def test_status_falls_back_to_the_live_supervisor_of_this_generation() -> None:
    def live(generation: int) -> SupervisionProgress:
        return SupervisionProgress(
            generation=generation,
            step=None,
            alive=1,
            world_size=1,
            observed_at=1.0,
            progress_signal="none",
        )

    current = cli_render.StatusView("lazarus-tiny", "RUNNING", _status(), live=live(1))
    assert cli_render.HANG_DETECTION_OFF in _text(current)
    old = cli_render.StatusView("lazarus-tiny", "RUNNING", _status(generation=2), live=live(1))
    assert cli_render.HANG_DETECTION_OFF not in _text(old)


def test_start_notes_depend_on_progress_regex(tmp_path: Path) -> None:
    bare = parse_spec({"name": "a", "command": ["python", "t.py"]}, "<test>")
    assert cli_render.start_notes(bare) == [f"note: {cli_render.NO_PROGRESS_SIGNAL_NOTE}"]
    with_regex = parse_spec(
        {"name": "a", "command": ["python", "t.py"], "health": {"progress_regex": r"step (\d+)"}},
        "<test>",
    )
    assert cli_render.start_notes(with_regex) == []


def test_start_prints_the_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(SPEC)
    monkeypatch.setattr(cli, "_with_client", lambda ctx, action: "run-1")
    result = CliRunner().invoke(cli.app, ["start", str(spec_file)])
    assert result.exit_code == 0, result.output
    assert "hang detection needs lazarus.rank heartbeats or health.progress_regex" in " ".join(
        result.stdout.split()
    )


def test_status_lists_ignored_messages_and_the_dropped_incident_tail() -> None:
    """Issue 10, defects 5 and 18: what was ignored, and what is no longer listed."""
    from workflows.state import IgnoredMessage

    status = _status(
        ignored_messages=[
            IgnoredMessage(name="resume", at=1.0, phase=Phase.RUNNING, reason="the job is RUNNING")
        ],
        incidents_dropped=7,
        dropped_by_class={"killed": 5, "nccl_timeout": 2},
    )
    text = _text(cli_render.StatusView("lazarus-tiny", "RUNNING", status))
    assert "Ignored operator messages" in text and "the job is RUNNING" in text
    assert "7 older incidents not listed: 5 killed, 2 nccl_timeout" in text
