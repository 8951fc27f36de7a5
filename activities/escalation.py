"""The ``on_escalation`` hook: tell a person (or their pager) the job needs them.

Runs the spec's command on the controller's machine with the incident as JSON on
stdin. A non-zero exit raises, so Temporal retries it durably (a webhook that is
down for an hour still fires when it comes back). A marker file written after
success makes it run once per escalation even when a worker dies between the
command finishing and Temporal recording the result.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.command_policy import CommandNotAllowed, enforce
from lazarus.domain.checkpoint_layout import temp_path_for
from lazarus.domain.contracts import EscalationHookRequest, EscalationHookResult

OUTPUT_TAIL_CHARS = 2000


def run_hook(request: EscalationHookRequest) -> EscalationHookResult:
    # The hook runs here with this worker's environment (where a webhook token can
    # live, out of history), so the worker's allow-list decides, not the client.
    try:
        enforce(
            "on_escalation",
            request.command,
            workdir=request.workdir,
            search_path=os.environ.get("PATH"),
        )
    except CommandNotAllowed as exc:
        raise exc.application_error() from None
    marker = Path(request.marker)
    if marker.exists():
        return EscalationHookResult(ran=False, exit_code=0, output_tail="already ran")
    try:
        completed = subprocess.run(
            request.command,
            input=request.payload,
            capture_output=True,
            text=True,
            cwd=request.workdir,
            timeout=request.timeout_s,
            check=False,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise ApplicationError(
            f"on_escalation: cannot run {request.command[0]!r}: {exc.strerror}", non_retryable=True
        ) from None
    except subprocess.TimeoutExpired:
        raise ApplicationError(
            f"on_escalation: {request.command[0]} ran longer than {request.timeout_s:.0f} s"
        ) from None
    tail = (completed.stdout + completed.stderr)[-OUTPUT_TAIL_CHARS:]
    if completed.returncode != 0:
        raise ApplicationError(
            f"on_escalation: {request.command[0]} exited {completed.returncode}: {tail.strip()}"
        )
    marker.parent.mkdir(parents=True, exist_ok=True)
    temp = temp_path_for(marker)
    temp.write_text(tail)
    os.replace(temp, marker)
    return EscalationHookResult(ran=True, exit_code=0, output_tail=tail)


@activity.defn(name="run_escalation_hook")
async def run_escalation_hook(request: EscalationHookRequest) -> EscalationHookResult:
    return await asyncio.to_thread(run_hook, request)
