"""A slow node the supervisor reported: what the swap-or-not decision weighs, the
record the status shows, and the incident a swap opens.

Pure functions of the spec, the state and the report (``tests/unit/test_straggler_turn.py``);
``playbook.straggler_decision`` decides, the workflow carries the swap out.
"""

from __future__ import annotations

from lazarus.domain.contracts import StragglerReport
from lazarus.domain.spec import JobSpec
from workflows.playbook import Decision, StragglerContext
from workflows.state import (
    MAX_RECORDS,
    Incident,
    JobState,
    PlannedMove,
    StragglerRecord,
)


def straggler_context(spec: JobSpec, state: JobState, report: StragglerReport) -> StragglerContext:
    """The swap pays off when the time it saves over the rest of the job beats a
    restart, priced at the last measured recovery (else the spec's default)."""
    measured = [i.recovery_s for i in state.incidents if i.recovery_s is not None]
    remaining = spec.total_steps - (state.step or 0) if spec.total_steps is not None else None
    return StragglerContext(
        node=report.node,
        rank=report.rank,
        slowdown=report.slowdown,
        seconds_per_step=state.seconds_per_step,
        remaining_steps=remaining,
        restart_cost_s=measured[-1] if measured else spec.straggler.default_restart_cost_s,
        spares_left=len(state.pool.spares),
        swap_allowed=spec.straggler.swap,
    )


def record_straggler(state: JobState, report: StragglerReport, decision: Decision) -> None:
    """Keep the report and what was decided (newest last, bounded)."""
    state.stragglers = [
        *state.stragglers,
        StragglerRecord(
            generation=state.generation,
            node=report.node,
            rank=report.rank,
            slowdown=report.slowdown,
            compute_s=report.compute_s,
            peers_compute_s=report.peers_compute_s,
            slow_since=report.slow_since,
            detected_at=report.detected_at,
            detection_s=max(0.0, report.detected_at - report.slow_since),
            action=decision.action,
            reason=decision.reason,
        ),
    ][-MAX_RECORDS:]


def open_straggler_incident(
    state: JobState, report: StragglerReport, decision: Decision
) -> Incident:
    """The incident of a swap off a slow node: a planned move, found when the node
    first ran slow, with the measurement as its evidence."""
    incident = state.add_incident(
        Incident.opened(
            id=state.next_incident_id,
            generation=state.generation,
            kind="straggler",
            failure_class=PlannedMove.STRAGGLER,
            rank=report.rank,
            node=report.node,
            fault_at=report.slow_since,
            detected_at=report.detected_at,
            step_at_failure=state.step,
            evidence=[
                f"rank {report.rank} compute {report.compute_s * 1000:.1f} ms/step vs peers "
                f"{report.peers_compute_s * 1000:.1f} ms/step over {report.samples} samples"
            ],
        )
    )
    incident.apply(decision)
    return incident
