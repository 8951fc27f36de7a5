"""The status view is a pure function of spec and state: checked without a server."""

from __future__ import annotations

from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.spec import JobSpec
from workflows.playbook import SUGGESTED_OPERATOR_ACTIONS
from workflows.state import (
    MAX_INCIDENTS,
    Incident,
    JobState,
    NodePool,
    Phase,
    PlannedMove,
)
from workflows.status import job_status

SPEC = JobSpec.model_validate(
    {"name": "j", "command": ["python", "t.py"], "workdir": "/w", "nproc_per_node": 2}
)


def test_status_reports_the_state_and_stops_the_clock_at_the_end() -> None:
    state = JobState(
        phase=Phase.SUCCEEDED,
        started_at=100.0,
        finished_at=200.0,
        pool=NodePool(active=["a", "b"], spares=["c"]),
    )
    status = job_status(SPEC, state, now=500.0, run_dir="/w/.lazarus/runs/j/run-1")
    assert status.elapsed_s == 100.0 and status.ettr == 1.0
    assert status.world_size == 4 and status.nodes.spares == ["c"]
    assert status.run_dir == "/w/.lazarus/runs/j/run-1"
    assert status.suggested_actions == [] and status.mttr_s is None


def test_a_job_waiting_for_an_operator_suggests_what_to_do() -> None:
    state = JobState(phase=Phase.NEEDS_OPERATOR, started_at=0.0, operator_reason="why")
    state.add_incident(
        Incident.opened(
            id=1,
            generation=1,
            kind="operator",
            failure_class=PlannedMove.OPERATOR,
            fault_at=10.0,
            detected_at=10.0,
        )
    ).steps_lost = 7
    status = job_status(SPEC, state, now=50.0, run_dir="/r")
    assert status.suggested_actions == list(SUGGESTED_OPERATOR_ACTIONS)
    assert status.steps_lost == 7 and status.operator_reason == "why"
    assert status.elapsed_s == 50.0


def test_incidents_dropped_from_the_bounded_list_still_count() -> None:
    """A long job keeps only the newest MAX_INCIDENTS incidents; its ETTR, MTTR and
    steps lost must still count the older ones (the 54-day simulation reported 99%
    ETTR against 89% before)."""
    state = JobState(phase=Phase.RUNNING, started_at=0.0, seconds_per_step=1.0)
    count = MAX_INCIDENTS + 30
    for n in range(count):
        incident = state.add_incident(
            Incident.opened(
                id=state.next_incident_id,
                generation=n + 1,
                kind="crash",
                failure_class=FailureClass.UNKNOWN,
                fault_at=100.0 * n,
                detected_at=100.0 * n,
            )
        )
        incident.recovery_s, incident.steps_lost = 10.0, 5
        state.open_incident = None
    status = job_status(SPEC, state, now=100.0 * count, run_dir="/r")
    assert status.incidents_dropped == 30 and len(status.incidents) == MAX_INCIDENTS
    assert status.steps_lost == 5 * count
    assert status.mttr_s == 10.0
    # Each incident cost 10 s of outage and 5 steps of 1 s: 15 of every 100 s.
    assert status.ettr is not None and abs(status.ettr - 0.85) < 1e-9
