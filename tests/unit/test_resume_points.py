"""Untrusted checkpoints and rollbacks are recorded on incidents by pure functions."""

from __future__ import annotations

from lazarus.domain.contracts import (
    CheckpointRef,
    CheckpointSearch,
    FailureReport,
    FindVerifiedCheckpointRequest,
    SkippedCheckpoint,
)
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.timeline import RetiredCheckpoint, TimelineCut, off_timeline_reason
from workflows.playbook import Action
from workflows.resume_points import FALLBACK_STRATEGY, record_rollback, record_skipped
from workflows.state import Incident, JobState

SEARCH = CheckpointSearch(
    chosen=CheckpointRef(step=20, path="/c/20"),
    skipped=[
        SkippedCheckpoint(step=40, path="/c/40", problems=["torn", "no marker"]),
        SkippedCheckpoint(step=30, path="s3://b/30", location="durable", problems=["crc"]),
    ],
)


def crashed(state: JobState) -> Incident:
    failure = FailureReport(
        kind="crash",
        failure_class=FailureClass.UNKNOWN,
        rank=0,
        fault_at=1.0,
        detected_at=2.0,
        evidence=["exit 1"],
    )
    return state.add_incident(
        Incident.from_failure(failure, id=state.next_incident_id, generation=state.generation)
    )


def test_skipped_checkpoints_go_on_the_open_incident_with_their_cost() -> None:
    state = JobState()
    incident = crashed(state)
    record_skipped(state, SEARCH, SEARCH.chosen, now=9.0)
    assert len(state.incidents) == 1
    assert incident.skipped_checkpoints == [
        "skipped local checkpoint step 40: torn; no marker",
        "skipped durable checkpoint step 30: crc",
    ]
    assert incident.fallback_steps == 20
    assert incident.evidence == [
        "exit 1",
        *incident.skipped_checkpoints,
        "fell back to step 20: 20 steps older than the newest",
    ]


def test_with_no_recovery_open_a_fallback_opens_its_own_storage_incident() -> None:
    state = JobState(generation=2, step=41)
    record_skipped(state, SEARCH, None, now=9.0)
    [incident] = state.incidents
    assert (incident.kind, incident.failure_class) == ("checkpoint", FailureClass.STORAGE)
    assert (incident.fault_at, incident.detected_at, incident.step_at_failure) == (9.0, 9.0, 41)
    assert incident.action == Action.FALLBACK and incident.strategy == FALLBACK_STRATEGY
    assert incident.reason == "newest checkpoint failed verification: resuming from scratch"
    assert incident.fallback_steps == 40
    assert incident.evidence[-1] == "fell back to scratch: 40 steps older than the newest"
    assert state.open_incident == incident.id


def test_a_rollback_retires_steps_for_good_and_says_so() -> None:
    """Checkpoints whose writer is unknown (an older worker's answer) are retired by
    number, as before; the bound is the lowest retired step, recorded at once."""
    state = JobState(retired_steps=[50])
    incident = crashed(state)
    retired = [CheckpointRef(step=70, path="/c/.rolled-back/70"), CheckpointRef(step=60, path="/p")]
    record_rollback(state, retired)
    assert state.retired_steps == [50, 60, 70] and state.retired == []
    assert state.rollback_below == 60
    assert state.timeline_cuts == [TimelineCut(generation=1, step=59)]
    assert incident.evidence[-2:] == [
        "rolled back past checkpoint step 70 (kept at /c/.rolled-back/70)",
        "rolled back past checkpoint step 60 (kept at /p)",
    ]
    nothing = JobState()
    record_rollback(nothing, [])
    assert nothing.rollback_below is None and nothing.timeline_cuts == []


def test_a_rollback_retires_a_checkpoint_by_identity_not_its_step_number() -> None:
    """N10: generation 3's own fresh checkpoint of the rolled-back step is another
    state: only generation 2's copies of step 150 (moved aside, uploaded) are refused."""
    state = JobState(generation=2, retired_steps=[50])
    record_rollback(state, [CheckpointRef(step=150, path="/c/.rolled-back/150", generation=2)])
    assert state.retired == [RetiredCheckpoint(step=150, generation=2)]
    assert state.retired_steps == [50] and state.retired_step_numbers == [50, 150]
    request = FindVerifiedCheckpointRequest(
        checkpoint_dir="/c", retired=state.retired, timeline=state.timeline_cuts
    )
    assert request.off_timeline(2, 150) is not None
    assert request.off_timeline(3, 150) is None
    state.cut_timeline(CheckpointRef(step=100, path="/c/100"))
    assert state.rollback_below is None
    assert off_timeline_reason(2, 150, state.timeline_cuts, []) is not None
    assert off_timeline_reason(3, 150, state.timeline_cuts, state.retired) is None
