"""The ``on_escalation`` hook: what it is told when the job escalates, and what became
of its delivery.

Pure functions of the spec and the state (``tests/unit/test_escalation_payload.py``);
the workflow only runs the hook activity. The payload is the hook's stdin contract: a
person's pager or chat bridge reads it, so its keys are stable.
"""

from __future__ import annotations

import json

from lazarus.domain.contracts import EscalationHookRequest
from lazarus.domain.spec import JobSpec
from workflows.playbook import SUGGESTED_OPERATOR_ACTIONS
from workflows.state import Incident, JobState, Phase

PENDING = "pending"
"""``Incident.escalation_hook`` from the escalation until its hook has run."""


def escalation_payload(
    spec: JobSpec, state: JobState, reason: str, incident: Incident | None
) -> dict[str, object]:
    """The JSON document the hook gets on stdin."""
    return {
        "job_id": spec.job_id,
        "phase": Phase.NEEDS_OPERATOR.value,
        "reason": reason,
        "escalation": state.escalations,
        "generation": state.generation,
        "step": state.step,
        "suggested_actions": list(SUGGESTED_OPERATOR_ACTIONS),
        "incident": incident.model_dump(mode="json", by_alias=True) if incident else None,
    }


def queue_escalation(
    spec: JobSpec, state: JobState, reason: str, run_root: str
) -> EscalationHookRequest | None:
    """Count the escalation and queue its hook in ``state.pending_hooks`` (carried by
    continue-as-new until it ran); None when the spec has no hook. The hook's marker,
    numbered by escalation, makes a repeated delivery a no-op."""
    command = spec.on_escalation
    if command is None:
        return None
    state.escalations += 1
    incident = state.incidents[-1] if state.incidents else None
    if incident is not None:
        incident.escalation_hook = PENDING
    request = EscalationHookRequest(
        command=command,
        workdir=spec.workdir,
        payload=json.dumps(escalation_payload(spec, state, reason, incident), sort_keys=True),
        marker=f"{run_root}/escalations/{state.escalations:05d}.done",
        incident=incident.id if incident else None,
    )
    state.pending_hooks = [*state.pending_hooks, request]
    return request


def hook_ran(ran: bool) -> str:
    """The delivery's outcome: this attempt ran it, or an earlier one already had."""
    return "ran" if ran else "ran (earlier attempt)"


def hook_failed(why: str) -> str:
    return f"failed: {why}"


def hook_finished(state: JobState, request: EscalationHookRequest, outcome: str) -> None:
    """The hook's delivery is over (``outcome``: :func:`hook_ran` or :func:`hook_failed`):
    say so on its incident, if still kept in full, and stop carrying it."""
    incident = state.incident(request.incident)
    if incident is not None:
        incident.escalation_hook = outcome
    state.pending_hooks = [h for h in state.pending_hooks if h != request]
