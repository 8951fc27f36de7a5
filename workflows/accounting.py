"""Goodput accounting: how much of the wall time trained the model.

ETTR (effective training time ratio) is productive time over wall time. A
failure costs two things: the outage itself (fault until the first step of the
new generation) and the work redone (steps lost since the checkpoint, at the
measured seconds per step). An incident still open costs the time since its fault.
Incidents dropped from the bounded list still count (``JobState.dropped_totals``).
"""

from __future__ import annotations

from workflows.state import JobState


def unproductive_s(state: JobState, now: float) -> float:
    per_step = state.seconds_per_step or 0.0
    total = state.dropped_totals.recovery_s + state.dropped_totals.redone_s
    for incident in state.incidents:
        if incident.recovery_s is not None:
            total += incident.recovery_s
        elif incident.id == state.open_incident:
            total += max(0.0, now - incident.fault_at)
        total += (incident.steps_lost or 0) * per_step
    return total


def effective_training_time_ratio(state: JobState, now: float) -> float | None:
    elapsed = now - state.started_at
    if elapsed <= 0:
        return None
    return max(0.0, min(1.0, (elapsed - unproductive_s(state, now)) / elapsed))


def mean_time_to_recover(state: JobState) -> float | None:
    recovered = [i.recovery_s for i in state.incidents if i.recovery_s is not None]
    dropped = state.dropped_totals
    count = len(recovered) + dropped.recoveries
    return (sum(recovered) + dropped.recovery_s) / count if count else None


def steps_lost(state: JobState) -> int:
    """Every incident's, the dropped ones included."""
    return state.dropped_totals.steps_lost + sum(i.steps_lost or 0 for i in state.incidents)
