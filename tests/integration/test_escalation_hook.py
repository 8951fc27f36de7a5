"""The on_escalation hook runs once, gets the incident on stdin, and fails loudly."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from activities.escalation import run_hook
from lazarus.domain.contracts import EscalationHookRequest


def hook(tmp_path: Path, script: str) -> EscalationHookRequest:
    return EscalationHookRequest(
        command=[sys.executable, "-c", script],
        workdir=str(tmp_path),
        payload=json.dumps({"job_id": "j", "reason": "crash loop"}),
        marker=str(tmp_path / "escalations" / "00001.done"),
    )


COPY_STDIN = "import sys, pathlib; pathlib.Path('got.json').write_text(sys.stdin.read())"


def test_hook_gets_the_incident_on_stdin_and_runs_once(tmp_path: Path) -> None:
    request = hook(tmp_path, COPY_STDIN + "; open('count', 'a').write('x')")
    assert run_hook(request).ran
    assert json.loads((tmp_path / "got.json").read_text())["reason"] == "crash loop"
    again = run_hook(request)  # a retried attempt after the command already succeeded
    assert not again.ran
    assert (tmp_path / "count").read_text() == "x"


def test_a_failing_hook_raises_a_retryable_error_with_its_output(tmp_path: Path) -> None:
    request = hook(tmp_path, "import sys; print('webhook down'); sys.exit(3)")
    with pytest.raises(ApplicationError, match="exited 3: webhook down") as raised:
        run_hook(request)
    assert not raised.value.non_retryable
    assert not Path(request.marker).exists()


def test_a_missing_program_is_not_retried(tmp_path: Path) -> None:
    request = hook(tmp_path, "").model_copy(update={"command": ["/nonexistent/pager"]})
    with pytest.raises(ApplicationError, match="cannot run") as raised:
        run_hook(request)
    assert raised.value.non_retryable
