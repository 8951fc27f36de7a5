"""Slurm preemption (issue 13): what the workflow records when Slurm takes the
allocation away, and which notice it has already handled.

Pure functions of the state (``tests/unit/test_preemption.py``); the workflow runs
the activities (the just-in-time checkpoint, the stop, the resubmission).

A preempted job goes one of two ways:

- ``slurm.resubmit: true`` (an allocation Lazarus submitted): the old allocation is
  released, a new one with the same options is submitted, and once it runs the
  job relaunches there from the just-in-time checkpoint: same workflow, next
  generation, the incident closed at the first step in the new allocation;
- otherwise it pauses: an operator resumes it in the same allocation (a notice
  with time left) or starts it again in a new one.

A resubmission Slurm refuses (or that does not run within ``slurm.wait_s``)
pauses the job too, with Slurm's answer in the incident.
"""

from __future__ import annotations

from lazarus.domain.contracts import AllocationGranted, FailureReport, SubmitAllocationRequest
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.spec import JobSpec
from workflows.playbook import Action
from workflows.state import Incident, JobState, NodePool
from workflows.stops import checkpoint_evidence

PAUSE_STRATEGY = "slurm_resubmit_off"
"""The incident's strategy: the ``slurm.resubmit: false`` behaviour, the default."""
RESUBMIT_STRATEGY = "slurm_resubmit"
"""The incident's strategy when the job goes on in a new allocation."""


def preempt_marker_for(spec: JobSpec) -> str | None:
    """The holder's notice file supervision watches; None without an allocation (a
    spec whose allocation was never submitted has none to be preempted from)."""
    if spec.slurm is None or spec.slurm.submits:
        return None
    return str(spec.slurm.preempt_marker(spec.run_dir))


def handled_preemption_at(state: JobState) -> float | None:
    """When the newest preemption notice the job already handled was given: supervision
    ignores a notice file no newer than this (the holder's file stays where it is)."""
    times = [i.fault_at for i in state.incidents if i.failure_class == FailureClass.PREEMPTED]
    return max(times) if times else None


def open_preemption(state: JobState, notice: FailureReport) -> Incident:
    """The ``preempted`` incident for a notice: paused, not a failure of the job, so it
    counts toward no restart budget."""
    incident = state.add_incident(
        Incident.from_failure(notice, id=state.next_incident_id, generation=state.generation)
    )
    incident.action = Action.PAUSE
    incident.strategy = PAUSE_STRATEGY
    return incident


def record_preemption(
    incident: Incident, stopped_at: float, last_step: int | None, checkpoint_step: int | None
) -> None:
    """What the preemption cost: the ranks' last step against the just-in-time
    checkpoint (None: no checkpoint, the allocation was already gone or the save did
    not arrive: the resume fills in the cost once it knows its checkpoint)."""
    incident.record_stop(stopped_at, last_step)
    incident.evidence.append(checkpoint_evidence(checkpoint_step))
    if checkpoint_step is not None:
        incident.resumed_from_step = checkpoint_step
        if incident.step_at_failure is not None:
            incident.steps_lost = max(0, incident.step_at_failure - checkpoint_step)
    saved = (
        f"checkpointed step {checkpoint_step}"
        if checkpoint_step is not None
        else "no just-in-time checkpoint"
    )
    incident.reason = (
        f"Slurm is taking the allocation away: {saved}, ranks stopped, job paused "
        "(slurm.resubmit is false). Resume it in the same allocation if time is left, "
        "or start it again in a new one."
    )


def resubmission(
    spec: JobSpec, incident: Incident, run_key: str | None = None
) -> SubmitAllocationRequest | None:
    """What to ask Slurm for when the job goes on in a new allocation; None when it
    pauses instead (``slurm.resubmit`` off, or an allocation Lazarus did not submit).
    ``run_key`` (the workflow run's) makes the new holder's name this run's own, and
    the allocation being released is named as known, never to be adopted (issue 26)."""
    if spec.slurm is None or not spec.slurm.resubmits:
        return None
    return SubmitAllocationRequest(
        job_name=spec.name,
        run_dir=spec.run_dir,
        slurm=spec.slurm,
        token=f"i{incident.id}",
        run_key=run_key,
        known_job_ids=[spec.slurm.allocation_id],
    )


FIRST_SUBMIT_TOKEN = "start"
"""The token of a job's first allocation: its holder is ``lazarus-<job>-<run tag>-start``."""


def first_submission(spec: JobSpec, run_key: str | None) -> SubmitAllocationRequest | None:
    """The job's first allocation, when it has none yet (submit mode: ``slurm.nodes``
    and no ``slurm.job_id``); None otherwise. Nothing to release, nothing known."""
    if spec.slurm is None or not spec.slurm.submits:
        return None
    return SubmitAllocationRequest(
        job_name=spec.name,
        run_dir=spec.run_dir,
        slurm=spec.slurm,
        token=FIRST_SUBMIT_TOKEN,
        release_old=False,
        run_key=run_key,
    )


def allocation_mismatch(spec: JobSpec, granted: AllocationGranted) -> str | None:
    """Why the granted allocation cannot hold the job (fewer nodes than its nodes and
    spares), or None. Checked before :func:`move_to_allocation`, which cannot place
    the job on too few nodes: an exception there, in workflow code, would fail the
    workflow task again on every retry and wedge the job in RECOVERING. The worker's
    activity refuses such an allocation itself (issue 26); this is the workflow's
    own guard, whatever the activity answered."""
    assert spec.slurm is not None and spec.slurm.nodes is not None
    wanted = spec.slurm.nodes + spec.slurm.spares
    if len(granted.nodes) >= wanted:
        return None
    return (
        f"Slurm job {granted.job_id} holds {len(granted.nodes)} node(s), not the {wanted} "
        f"asked for (slurm.nodes + slurm.spares); it is not used. Cancel it (scancel "
        f"{granted.job_id}) if nothing else needs it"
    )


def move_to_allocation(spec: JobSpec, state: JobState, granted: AllocationGranted) -> JobSpec:
    """The job in its new allocation: the spec names it, and the pool is its nodes
    (Slurm vouches for them; the old allocation's quarantine does not carry over,
    since those nodes are not the job's any more). Raises ValueError for an
    allocation :func:`allocation_mismatch` refuses: check that first."""
    moved = spec.in_allocation(granted.job_id, granted.nodes)
    state.pool = NodePool(
        active=[n.name for n in moved.nodes], spares=[n.name for n in moved.spares]
    )
    return moved


def record_resubmission(incident: Incident, granted: AllocationGranted) -> None:
    incident.action = Action.RESUBMIT
    incident.strategy = RESUBMIT_STRATEGY
    incident.evidence.append(
        f"resubmitted: Slurm job {granted.job_id} on {', '.join(granted.nodes)} "
        f"(waited {granted.waited_s:.0f} s in the queue)"
    )
    incident.reason = (
        f"Slurm took the allocation away: checkpointed, resubmitted as Slurm job "
        f"{granted.job_id}, relaunching there (slurm.resubmit)"
    )


def record_resubmission_refused(incident: Incident, why: str) -> None:
    incident.evidence.append(f"resubmission failed: {why}")
    incident.reason = (
        f"Slurm took the allocation away and the resubmission failed ({why}): job paused; "
        "start it again when Slurm can run it"
    )
