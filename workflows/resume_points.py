"""Where a relaunch resumes from: the search it asks for (within the timeline the
state records), and, as the incident records it, newer checkpoints that could not be
trusted and checkpoints a numerical rollback retired.

Pure functions of the state and the checkpoint activities' results
(``tests/unit/test_resume_points.py``); the workflow only runs the activities.
"""

from __future__ import annotations

from lazarus.domain.contracts import (
    CheckpointRef,
    CheckpointSearch,
    FindVerifiedCheckpointRequest,
    NodeAccess,
)
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.memory_tier import memory_checkpoint_dir
from lazarus.domain.spec import JobSpec
from lazarus.domain.timeline import RetiredCheckpoint
from workflows.placement import active_nodes, run_root
from workflows.playbook import Action
from workflows.state import JobState

FALLBACK_STRATEGY = "verified_checkpoints_only"
"""The strategy of an incident opened because the newest checkpoints failed verification."""


def search_request(
    spec: JobSpec, state: JobState, include_durable: bool
) -> FindVerifiedCheckpointRequest:
    """The resume-point search for the nodes active now, within the timeline the state
    records: its cuts, the checkpoints rollbacks retired, and a pending rollback's
    bound (below it, and without the memory tier, until a launch spends it)."""
    below_step = state.rollback_below
    return FindVerifiedCheckpointRequest(
        checkpoint_dir=spec.checkpoint_dir,
        checkpoints=spec.checkpoints,
        include_durable=include_durable,
        below_step=below_step,
        exclude_steps=state.retired_steps,
        retired=state.retired,
        timeline=state.timeline_cuts,
        job_id=spec.job_id,
        trusted=state.verified_checkpoints,
        memory_dir=(
            memory_checkpoint_dir(spec.job_id, run_root(spec, state))
            if spec.checkpoints.memory_every_steps is not None and below_step is None
            else None
        ),
        access=NodeAccess.of(spec, active_nodes(spec, state.pool)),
    )


def record_skipped(
    state: JobState, search: CheckpointSearch, resume: CheckpointRef | None, now: float
) -> None:
    """Say which checkpoints could not be trusted and what falling back cost, on the
    open incident; with none open (a clean relaunch, a resume), on a new one."""
    lines = [
        f"skipped {s.location} checkpoint step {s.step}: {'; '.join(s.problems)}"
        for s in search.skipped
    ]
    resumed = resume.step if resume else 0
    cost = max(0, max(s.step for s in search.skipped) - resumed)
    origin = f"step {resumed}" if resume else "scratch"
    incident = state.current_incident
    if incident is None:
        incident = state.open_incident_now(
            "checkpoint",
            FailureClass.STORAGE,
            now,
            action=Action.FALLBACK,
            strategy=FALLBACK_STRATEGY,
            reason=f"newest checkpoint failed verification: resuming from {origin}",
        )
    incident.skipped_checkpoints = lines
    incident.fallback_steps = cost
    incident.add_evidence([*lines, f"fell back to {origin}: {cost} steps older than the newest"])


def record_rollback(state: JobState, retired: list[CheckpointRef]) -> None:
    """Keep the checkpoints a numerical rollback retired out of every later search,
    by identity where the activity read who wrote them (by number otherwise, as
    before), say so on the open incident, and bound the relaunch below the lowest
    retired step (a durable copy, if tiered, holds the same divergence)."""
    for ref in retired:
        if ref.generation is None:
            state.retired_steps = sorted({*state.retired_steps, ref.step})
            continue
        identity = RetiredCheckpoint(step=ref.step, generation=ref.generation)
        if identity not in state.retired:
            state.retired.append(identity)
    incident = state.current_incident
    if incident is not None:
        incident.add_evidence(
            [f"rolled back past checkpoint step {r.step} (kept at {r.path})" for r in retired]
        )
    if retired:
        state.bound_rollback(min(r.step for r in retired))
