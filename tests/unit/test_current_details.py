"""What the Web UI shows about a job is a pure function of spec and state."""

from __future__ import annotations

from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.spec import JobSpec, NodeSpec
from workflows.current_details import (
    REASON_LIMIT,
    current_details,
    failure_class_attribute,
    start_details,
    start_summary,
    waiting_for,
)
from workflows.playbook import Action
from workflows.state import Incident, JobState, NodePool, Phase

SPEC = JobSpec.model_validate(
    {
        "name": "llama",
        "command": ["python", "t.py", "--token", "not-for-the-ui"],
        "workdir": "/w",
        "nproc_per_node": 2,
        "nodes": [{"name": "a"}, {"name": "b"}],
        "spares": [{"name": "c"}],
        "health": {"report_interval_s": 30},
    }
)


def _crash(state: JobState, *, at: float = 40.0) -> Incident:
    incident = state.add_incident(
        Incident.opened(
            id=state.next_incident_id,
            generation=state.generation,
            kind="crash",
            failure_class=FailureClass.KILLED,
            fault_at=at,
            detected_at=at + 1,
            rank=1,
            node="b",
            signal="SIGKILL",
            step_at_failure=27,
        )
    )
    incident.action = Action.RESTART
    incident.reason = "first crash after progress: restart in place"
    return incident


def _running(**changes: object) -> JobState:
    state = JobState(
        phase=Phase.RUNNING,
        generation=1,
        step=25,
        started_at=0.0,
        pool=NodePool(active=["a", "b"], spares=["c"]),
    )
    return state.model_copy(update=changes)


def test_a_healthy_job_says_phase_generation_step_ettr_and_what_it_waits_for() -> None:
    text = current_details(SPEC, _running(), now=100.0)
    headline = text.splitlines()[0]
    assert headline == "**RUNNING** · generation 1 · step 25 · ETTR 100.0% · restarts 0 of 5"
    assert "incident" not in text.lower()
    assert "**Waiting for:** the supervisor of generation 1 (a, b)" in text
    assert "progress every 30 s" in text


def test_an_open_incident_shows_its_class_and_the_decision() -> None:
    state = _running(phase=Phase.LAUNCHING)
    _crash(state)
    text = current_details(SPEC, state, now=100.0)
    assert (
        "**Open incident** #1 crash (class `killed`): rank 1 on `b` (SIGKILL) at step 27, "
        "generation 1" in text
    )
    assert "**Decision** `restart`: first crash after progress: restart in place" in text
    assert "generation 2 to launch on a, b from scratch" in text
    assert "ETTR 40.0%" in text, "the open incident costs the time since its fault"


def test_the_decision_says_when_survivors_rejoin_in_place() -> None:
    state = _running(phase=Phase.LAUNCHING)
    _crash(state)
    incident = state.incidents[-1]
    incident.restart_path = "rejoin"
    text = current_details(SPEC, state, now=100.0)
    assert "**Decision** `restart`, survivors rejoin in place: first crash" in text


def test_a_recovered_incident_stays_visible_as_the_last_one() -> None:
    state = _running(generation=2)
    incident = _crash(state)
    state.close_incident(first_step_at=46.5)
    text = current_details(SPEC, state, now=100.0)
    assert "**Open incident**" not in text
    assert f"Last incident: #{incident.id} crash (class `killed`)" in text
    assert "recovered in 6.5 s" in text


def test_the_first_step_after_a_relaunch_ends_the_recovery() -> None:
    state = _running(generation=2)
    _crash(state)
    assert waiting_for(SPEC, state) == "the first step of generation 2 (the recovery ends there)"


def test_a_job_waiting_for_an_operator_names_the_reason_and_the_commands() -> None:
    state = _running(phase=Phase.NEEDS_OPERATOR, operator_reason="x" * 1000)
    text = waiting_for(SPEC, state)
    assert text.startswith("an operator (" + "x" * 10)
    assert "`lazarus resume`" in text and "`lazarus cancel`" in text
    assert len(text) < REASON_LIMIT + 200, "the reason is clipped: status has it in full"


def test_every_phase_says_what_it_waits_for() -> None:
    for phase in Phase:
        assert waiting_for(SPEC, _running(phase=phase))
    assert waiting_for(SPEC, _running(phase=Phase.SUCCEEDED)) == (
        "nothing: the job ended (SUCCEEDED)"
    )


def test_a_finished_job_keeps_its_final_ettr() -> None:
    state = _running(phase=Phase.SUCCEEDED, finished_at=50.0)
    _crash(state, at=40.0)
    state.close_incident(first_step_at=45.0)
    assert "ETTR 90.0%" in current_details(SPEC, state, now=10_000.0)


def test_the_start_summary_and_details_name_the_shape_not_the_command() -> None:
    assert start_summary(SPEC) == "Lazarus job llama: 4 ranks on 2 node(s)"
    details = start_details(SPEC)
    assert "**World size** 4 (2 node(s) x 2 rank(s))" in details
    assert "`a` (local), `b` (local)" in details and "**Spares** `c`" in details
    assert "not-for-the-ui" not in details and "t.py" not in details
    ssh = SPEC.model_copy(update={"nodes": [NodeSpec(name="n1", launcher="ssh", host="h")]})
    assert "`n1` (ssh)" in start_details(ssh)


def test_the_failure_class_attribute_is_the_newest_incidents_class() -> None:
    state = _running()
    assert failure_class_attribute(state) is None
    _crash(state)
    assert failure_class_attribute(state) == "killed"
