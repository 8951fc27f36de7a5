"""The on_escalation hook's payload and delivery record are pure: no server."""

from __future__ import annotations

import json

from lazarus.domain.spec import JobSpec
from workflows.escalation import (
    PENDING,
    hook_failed,
    hook_finished,
    hook_ran,
    queue_escalation,
)
from workflows.playbook import SUGGESTED_OPERATOR_ACTIONS, Action
from workflows.state import JobState, PlannedMove

BASE = {"name": "j", "command": ["python", "t.py"], "workdir": "/w"}
HOOKED = JobSpec.model_validate({**BASE, "on_escalation": ["notify", "--page"]})


def state_with_incident() -> JobState:
    state = JobState(generation=3, step=120)
    state.open_incident_now("operator", PlannedMove.OPERATOR, 1.0, action=Action.RESTART, reason="")
    return state


def test_no_hook_no_escalation_counted() -> None:
    state = state_with_incident()
    assert queue_escalation(JobSpec.model_validate(BASE), state, "why", "/r") is None
    assert state.escalations == 0 and state.pending_hooks == []
    assert state.incidents[0].escalation_hook is None


def test_the_hook_gets_the_job_the_reason_and_the_incident_and_is_carried() -> None:
    state = state_with_incident()
    request = queue_escalation(HOOKED, state, "crash loop", "/runs/j/run-1")
    assert request is not None
    assert request.command == ["notify", "--page"] and request.workdir == "/w"
    assert request.marker == "/runs/j/run-1/escalations/00001.done"
    assert request.incident == 1 and state.pending_hooks == [request]
    assert state.escalations == 1 and state.incidents[0].escalation_hook == PENDING
    payload = json.loads(request.payload)
    assert payload["job_id"] == "j" and payload["phase"] == "NEEDS_OPERATOR"
    assert (payload["reason"], payload["escalation"]) == ("crash loop", 1)
    assert (payload["generation"], payload["step"]) == (3, 120)
    assert payload["suggested_actions"] == list(SUGGESTED_OPERATOR_ACTIONS)
    assert payload["incident"]["class"] == "operator"  # the wire name, for scripts
    assert request.payload == json.dumps(payload, sort_keys=True)


def test_each_escalation_has_its_own_marker_and_an_escalation_without_incident() -> None:
    state = JobState()
    first = queue_escalation(HOOKED, state, "a", "/r")
    second = queue_escalation(HOOKED, state, "b", "/r")
    assert first is not None and second is not None
    assert second.marker.endswith("00002.done") and second.incident is None
    assert json.loads(second.payload)["incident"] is None
    assert state.pending_hooks == [first, second]


def test_a_finished_delivery_is_recorded_and_no_longer_carried() -> None:
    state = state_with_incident()
    request = queue_escalation(HOOKED, state, "why", "/r")
    assert request is not None
    hook_finished(state, request, hook_ran(False))
    assert state.incidents[0].escalation_hook == "ran (earlier attempt)"
    assert state.pending_hooks == []
    assert hook_ran(True) == "ran" and hook_failed("exit 3") == "failed: exit 3"


def test_a_delivery_for_a_dropped_incident_only_stops_being_carried() -> None:
    state = JobState(incidents_dropped=5)
    request = queue_escalation(HOOKED, state, "why", "/r")
    assert request is not None
    hook_finished(state, request.model_copy(update={"incident": 2}), hook_failed("x"))
    assert state.pending_hooks == [request]  # a different request: still carried
    hook_finished(state, request, hook_failed("x"))
    assert state.pending_hooks == []
