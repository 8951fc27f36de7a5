"""A straggler's context, record and swap incident are pure functions: no server."""

from __future__ import annotations

from lazarus.domain.contracts import StragglerReport
from lazarus.domain.spec import JobSpec
from workflows.playbook import Action, Decision
from workflows.state import MAX_RECORDS, JobState, NodePool, PlannedMove
from workflows.stragglers import (
    open_straggler_incident,
    record_straggler,
    straggler_context,
)

BASE = {"name": "j", "command": ["python", "t.py"], "workdir": "/w"}
REPORT = StragglerReport(
    rank=3,
    node="b",
    slowdown=1.8,
    compute_s=0.0362,
    peers_compute_s=0.02,
    samples=40,
    slow_since=100.0,
    detected_at=112.0,
)
SWAP = Decision(action=Action.REPLACE_NODE, reason="pays off", strategy="straggler_swap")


def test_the_context_prices_a_restart_at_the_last_measured_recovery() -> None:
    spec = JobSpec.model_validate({**BASE, "total_steps": 1000})
    state = JobState(step=400, seconds_per_step=0.5, pool=NodePool(active=["a"], spares=["s"]))
    context = straggler_context(spec, state, REPORT)
    assert context.restart_cost_s == spec.straggler.default_restart_cost_s
    assert (context.remaining_steps, context.spares_left, context.swap_allowed) == (600, 1, True)
    assert (context.node, context.rank, context.slowdown) == ("b", 3, 1.8)
    incident = state.open_incident_now(
        "operator", PlannedMove.OPERATOR, 0.0, action=Action.RESTART, reason=""
    )
    incident.recovery_s = 12.0
    assert straggler_context(spec, state, REPORT).restart_cost_s == 12.0
    open_ended = straggler_context(JobSpec.model_validate(BASE), state, REPORT)
    assert open_ended.remaining_steps is None


def test_every_report_is_recorded_with_its_decision_bounded() -> None:
    state = JobState(generation=4)
    for _ in range(MAX_RECORDS + 1):
        record_straggler(state, REPORT, SWAP)
    assert len(state.stragglers) == MAX_RECORDS
    record = state.stragglers[-1]
    assert (record.generation, record.node, record.rank) == (4, "b", 3)
    assert (record.detection_s, record.action, record.reason) == (
        12.0,
        Action.REPLACE_NODE,
        "pays off",
    )


def test_a_swap_opens_a_planned_incident_from_when_the_node_ran_slow() -> None:
    state = JobState(generation=2, step=77)
    incident = open_straggler_incident(state, REPORT, SWAP)
    assert state.open_incident == incident.id == 1
    assert (incident.kind, incident.failure_class) == ("straggler", PlannedMove.STRAGGLER)
    assert (incident.rank, incident.node, incident.step_at_failure) == (3, "b", 77)
    assert (incident.fault_at, incident.detection_s) == (100.0, 12.0)
    assert (incident.action, incident.strategy) == (Action.REPLACE_NODE, "straggler_swap")
    assert incident.evidence == [
        "rank 3 compute 36.2 ms/step vs peers 20.0 ms/step over 40 samples"
    ]
