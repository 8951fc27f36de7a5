"""The status view is a pure function of spec and state: checked without a server."""

from __future__ import annotations

from lazarus.domain.spec import JobSpec
from lazarus.workflows.playbook import SUGGESTED_OPERATOR_ACTIONS
from lazarus.workflows.state import Incident, JobState, NodePool, Phase, PlannedMove
from lazarus.workflows.status import job_status

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
