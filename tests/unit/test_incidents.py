"""Incident bookkeeping on the job state is pure: checked here without a server."""

from __future__ import annotations

import json

import pytest

from lazarus.domain.contracts import CheckpointRef, FailureReport
from lazarus.domain.evidence import MAX_EVIDENCE_LINES
from lazarus.domain.failure_classes import FailureClass
from workflows.playbook import Action, Decision
from workflows.state import (
    MAX_INCIDENTS,
    TRANSITIONS,
    Incident,
    JobState,
    JobStatus,
    Phase,
    PlannedMove,
)


def failure(**overrides: object) -> FailureReport:
    base: dict[str, object] = {
        "kind": "crash",
        "failure_class": "nccl_timeout",
        "rank": 1,
        "node": "b",
        "exit_code": 1,
        "fault_at": 100.0,
        "detected_at": 102.5,
        "step_at_failure": 40,
        "evidence": ["exit 1"],
        "collateral_ranks": [0],
    }
    return FailureReport.model_validate({**base, **overrides})


def opened(state: JobState, **overrides: object) -> Incident:
    return state.add_incident(
        Incident.from_failure(
            failure(**overrides), id=state.next_incident_id, generation=state.generation
        )
    )


def test_from_failure_copies_the_report_and_derives_detection() -> None:
    incident = Incident.from_failure(failure(), id=7, generation=3)
    assert (incident.id, incident.generation, incident.kind) == (7, 3, "crash")
    assert incident.failure_class is FailureClass.NCCL_TIMEOUT
    assert (incident.rank, incident.node, incident.exit_code) == (1, "b", 1)
    assert incident.collateral_ranks == [0] and incident.evidence == ["exit 1"]
    assert incident.detection_s == 2.5 and incident.step_at_failure == 40
    assert incident.action == "" and incident.stopped_at is None


def test_opened_bounds_evidence_and_never_has_negative_detection() -> None:
    incident = Incident.opened(
        id=1,
        generation=1,
        kind="operator",
        failure_class=PlannedMove.OPERATOR,
        fault_at=10.0,
        detected_at=9.0,
        evidence=[f"line {i}" for i in range(MAX_EVIDENCE_LINES + 20)],
    )
    assert incident.detection_s == 0.0
    assert len(incident.evidence) == MAX_EVIDENCE_LINES + 1
    assert incident.evidence[-1] == "[20 more lines left out]"


def test_apply_copies_the_decision() -> None:
    incident = Incident.from_failure(failure(), id=1, generation=1)
    incident.apply(Decision(action=Action.ROLLBACK, reason="why", strategy="rollback"))
    assert (incident.action, incident.reason, incident.strategy) == (
        Action.ROLLBACK,
        "why",
        "rollback",
    )


@pytest.mark.parametrize(
    ("before", "last_step", "after"),
    [(40, None, 40), (40, 43, 43), (40, 38, 40), (None, 12, 12), (None, None, None)],
)
def test_record_stop_keeps_the_furthest_step(
    before: int | None, last_step: int | None, after: int | None
) -> None:
    incident = Incident.from_failure(failure(step_at_failure=before), id=1, generation=1)
    incident.record_stop(200.0, last_step)
    assert incident.stopped_at == 200.0 and incident.step_at_failure == after


def test_add_evidence_appends_within_the_bound() -> None:
    incident = Incident.from_failure(failure(), id=1, generation=1)
    incident.add_evidence(["more"])
    assert incident.evidence == ["exit 1", "more"]
    incident.add_evidence([f"x{i}" for i in range(MAX_EVIDENCE_LINES * 2)])
    assert len(incident.evidence) == MAX_EVIDENCE_LINES + 1
    assert incident.evidence[-1].endswith("more lines left out]")


def test_the_open_incident_is_the_current_one_until_closed() -> None:
    state = JobState(generation=2)
    assert state.current_incident is None
    first = opened(state)
    assert (first.id, first.generation) == (1, 2)
    assert state.current_incident is first and state.incident(1) is first
    state.consecutive_failures = 2
    state.close_incident(first_step_at=130.0)
    assert state.current_incident is None and state.open_incident is None
    assert first.recovery_s == 30.0 and first.first_step_at == 130.0
    assert state.consecutive_failures == 0
    state.close_incident(first_step_at=140.0)  # nothing open: only the count resets
    assert first.recovery_s == 30.0


def test_a_new_incident_supersedes_one_still_open() -> None:
    state = JobState()
    first = opened(state)
    first.reason = "restart"
    second = opened(state, fault_at=110.0, detected_at=111.0)
    assert second.id == 2 and state.current_incident is second
    assert first.reason == "restart (superseded: failed again before the first step)"
    assert first.recovery_s is None


def test_incidents_are_bounded_and_the_dropped_counted_by_class() -> None:
    state = JobState()
    for n in range(MAX_INCIDENTS + 3):
        opened(state, failure_class="hang" if n < 2 else "nccl_timeout")
    assert len(state.incidents) == MAX_INCIDENTS and state.incidents_dropped == 3
    assert state.dropped_by_class == {"hang": 2, "nccl_timeout": 1}
    assert all(type(key) is str for key in state.dropped_by_class)
    assert state.incident(1) is None  # dropped
    newest = state.incidents[-1]
    assert newest.id == MAX_INCIDENTS + 3 == state.next_incident_id - 1
    assert state.incident(newest.id) is newest and state.current_incident is newest
    assert state.incident(None) is None and state.incident(newest.id + 1) is None


@pytest.mark.parametrize(
    ("resume", "resumed", "lost"),
    [(CheckpointRef(step=30, path="/c/30"), 30, 10), (None, 0, 40)],
)
def test_account_resume_fills_in_the_steps_lost(
    resume: CheckpointRef | None, resumed: int, lost: int
) -> None:
    state = JobState()
    incident = opened(state)
    state.account_resume(resume)
    assert (incident.resumed_from_step, incident.steps_lost) == (resumed, lost)


def test_account_resume_without_an_open_incident_does_nothing() -> None:
    state = JobState()
    incident = opened(state)
    state.close_incident(150.0)
    state.account_resume(CheckpointRef(step=30, path="/c/30"))
    assert incident.resumed_from_step is None


def test_past_failures_leave_out_planned_moves() -> None:
    state = JobState()
    opened(state, failure_class="hang", node="a", step_at_failure=5)
    for kind, move in (("operator", PlannedMove.OPERATOR), ("straggler", PlannedMove.STRAGGLER)):
        state.add_incident(
            Incident.opened(
                id=state.next_incident_id,
                generation=0,
                kind=kind,  # type: ignore[arg-type]
                failure_class=move,
                fault_at=1.0,
                detected_at=1.0,
            )
        )
    [past] = state.past_failures()
    assert (past.failure_class, past.node, past.step, past.at) == ("hang", "a", 5, 102.5)


def test_enums_serialize_to_the_strings_recorded_histories_carry() -> None:
    # Continue-as-new and queries carry the state as JSON: enum members must write
    # the same strings the plain-string fields did, and read them back.
    state = JobState()
    incident = opened(state)
    incident.apply(Decision(action=Action.REPLACE_NODE, reason="r", strategy="replace_node"))
    state.add_incident(
        Incident.opened(
            id=state.next_incident_id,
            generation=0,
            kind="checkpoint",
            failure_class=FailureClass.STORAGE,
            fault_at=1.0,
            detected_at=1.0,
        )
    ).action = Action.FALLBACK
    dumped = json.loads(state.model_dump_json(by_alias=True))
    assert [(i["class"], i["action"]) for i in dumped["incidents"]] == [
        ("nccl_timeout", "replace_node"),
        ("storage", "fallback"),
    ]
    again = JobState.model_validate_json(state.model_dump_json())
    assert again == state
    assert again.incidents[1].action is Action.FALLBACK


def test_released_incident_json_still_decodes() -> None:
    # As a released controller wrote it (plain strings, no action yet on the first).
    raw = {
        "id": 1,
        "generation": 1,
        "kind": "operator",
        "class": "operator",
        "fault_at": 1.0,
        "detected_at": 1.0,
        "detection_s": 0.0,
    }
    incident = Incident.model_validate(raw)
    assert incident.failure_class is PlannedMove.OPERATOR and incident.action == ""
    assert incident.model_dump(mode="json", by_alias=True)["class"] == "operator"


def test_every_phase_appears_in_the_state_machine_diagram() -> None:
    diagram = Phase.__doc__ or ""
    assert all(phase.value in diagram for phase in Phase)
    # _turn acts on a pause from every phase but PAUSED, NEEDS_OPERATOR and the ends.
    for before in (Phase.PENDING, Phase.LAUNCHING, Phase.RUNNING, Phase.RECOVERING):
        assert (before, Phase.PAUSED) in TRANSITIONS, before


def test_status_decodes_incidents_of_every_class() -> None:
    classes = [*FailureClass, *PlannedMove]
    incidents = [
        {
            "id": n,
            "generation": 1,
            "kind": "crash",
            "class": c.value,
            "fault_at": 0.0,
            "detected_at": 0.0,
            "detection_s": 0.0,
            "action": "restart",
        }
        for n, c in enumerate(classes, 1)
    ]
    status = JobStatus.model_validate(
        {
            "job_id": "j",
            "phase": "RUNNING",
            "generation": 1,
            "step": None,
            "world_size": 1,
            "ranks": [],
            "restarts": 0,
            "max_restarts": 3,
            "incidents": incidents,
            "ettr": None,
            "elapsed_s": 0.0,
        }
    )
    assert [i.failure_class for i in status.incidents] == classes
