"""What the status query (and the workflow's result) returns: a pure view of the state.

Kept out of the workflow class so it reads as the state machine, and so the view is
checked without a server (``tests/unit/test_status.py``).
"""

from __future__ import annotations

from lazarus.domain.spec import JobSpec
from workflows.accounting import (
    effective_training_time_ratio,
    mean_time_to_recover,
    steps_lost,
)
from workflows.checkpoint_tuning import status_view
from workflows.playbook import SUGGESTED_OPERATOR_ACTIONS
from workflows.state import JobState, JobStatus, Phase


def job_status(spec: JobSpec, state: JobState, now: float, run_dir: str) -> JobStatus:
    """The job as a person or a script sees it at ``now`` (workflow time). A finished
    job's clock stops at its end: its ETTR and elapsed time no longer change."""
    end = state.finished_at if state.finished_at is not None else now
    return JobStatus(
        job_id=spec.job_id,
        phase=state.phase,
        generation=state.generation,
        step=state.step,
        world_size=len(state.pool.active) * spec.nproc_per_node,
        ranks=state.ranks,
        restarts=state.restarts,
        max_restarts=spec.recovery.max_restarts,
        incidents=state.incidents,
        ettr=effective_training_time_ratio(state, end),
        elapsed_s=max(0.0, end - state.started_at),
        operator_reason=state.operator_reason,
        suggested_actions=(
            list(SUGGESTED_OPERATOR_ACTIONS) if state.phase == Phase.NEEDS_OPERATOR else []
        ),
        resume_step=state.resume.step if state.resume else None,
        runs=state.runs,
        nodes=state.pool,
        mttr_s=mean_time_to_recover(state),
        steps_lost=steps_lost(state),
        checkpoint_dir=spec.checkpoint_dir,
        stragglers=state.stragglers,
        planned_stops=state.planned_stops,
        durable_checkpoint_uri=spec.checkpoints.durable_uri,
        durable_steps=state.durable_steps,
        incidents_dropped=state.incidents_dropped,
        dropped_by_class=state.dropped_by_class,
        ignored_messages=state.ignored_messages,
        retired_steps=state.retired_step_numbers,
        progress_signal=state.progress_signal,
        run_dir=run_dir,
        slurm_job_id=spec.slurm.job_id if spec.slurm is not None else None,
        fleet=spec.fleet.name if spec.fleet is not None else None,
        fleet_notes=state.fleet_notes,
        checkpoint_interval=status_view(spec, state, end),
        host_task_queue=state.host_task_queue,
        cleanup_unreached=state.cleanup_unreached,
    )
