"""Slurm allocation changes, as steps of a run: the first submit, preemption,
resubmission, growth.

- submit mode (``slurm.nodes``, no ``slurm.job_id``): the run's first step submits the
  allocation, waits for Slurm to run it and records it in ``JobState.roster``; a
  refusal fails the job with Slurm's answer, and a job cancelled while it waits
  gives back what it submitted;
- a preemption notice (Slurm takes the allocation away): a just-in-time checkpoint
  while the ranks still run, a stop, then PAUSED, or (``slurm.resubmit``) a new
  allocation with the same options and LAUNCHING there;
- ``slurm.grow``: a lost node with no spare is replaced by a node Slurm adds.

The decisions and records are pure (``preemption``); each change is a retry-safe
activity here, behind ``PATCH_SLURM_PREEMPTION``, ``PATCH_SLURM_ALLOCATION`` and
``PATCH_SLURM_FIRST_SUBMIT``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from lazarus.domain.activity_refs import (
        CANCEL_ALLOCATION,
        GROW_ALLOCATION,
        SUBMIT_ALLOCATION,
    )
    from lazarus.domain.contracts import (
        FailureReport,
        GrowAllocationRequest,
        SubmitAllocationRequest,
    )
    from lazarus.domain.spec import SlurmSpec, slurm_node
    from workflows.activity_calls import (
        END_OF_RUN_RETRY,
        QUICK_RETRY,
        cause,
        execute,
        worker_loss_timeout,
    )
    from workflows.checkpoint_steps import CheckpointSteps
    from workflows.patches import (
        PATCH_SLURM_ALLOCATION,
        PATCH_SLURM_FIRST_SUBMIT,
        PATCH_SLURM_OWN_JOBS,
    )
    from workflows.playbook import Action
    from workflows.preemption import (
        allocation_mismatch,
        first_submission,
        move_to_allocation,
        open_preemption,
        record_preemption,
        record_resubmission,
        record_resubmission_refused,
        resubmission,
    )
    from workflows.run_context import JobRun
    from workflows.state import Incident, Phase
    from workflows.stop_steps import StopSteps

SLURM_QUEUE_MARGIN = timedelta(minutes=2)
"""Beyond ``slurm.wait_s``: the Slurm calls around the queue wait."""


class SlurmSteps:
    """The Slurm steps of one run; a preemption's stop goes through ``checkpoints``."""

    def __init__(self, run: JobRun, stops: StopSteps, checkpoints: CheckpointSteps) -> None:
        self.run = run
        self.stops = stops
        self.checkpoints = checkpoints

    async def submit_first(self) -> bool:
        """Submit mode: the job's first allocation, before anything else runs. Submitted
        under this run's own name, waited for (at most ``slurm.wait_s``, the
        resubmission's wait) and recorded in the state's roster: the job then
        launches there. Slurm's refusal (or an allocation that does not run in time)
        fails the job with the reason, nothing started. A job cancelled while it
        waits gives back what it submitted, then ends CANCELLED. Jobs started in an
        allocation (every history before ``PATCH_SLURM_FIRST_SUBMIT``) never ask.
        False when the job failed here (it has no allocation to run in)."""
        request = first_submission(self.run.spec, self.run.state.run_key)
        if request is None or not workflow.patched(PATCH_SLURM_FIRST_SUBMIT):
            return True
        self.run.explain()  # the Web UI says what it waits for from the start
        try:
            granted = await execute(
                SUBMIT_ALLOCATION,
                request,
                start_to_close_timeout=timedelta(seconds=request.slurm.wait_s) + SLURM_QUEUE_MARGIN,
                heartbeat_timeout=worker_loss_timeout(self.run.spec),
                retry_policy=QUICK_RETRY,
                summary=f"submit the allocation: {request.holder_name}",
            )
        except (asyncio.CancelledError, ActivityError) as err:
            # The job's cancellation reaches this await as the activity's cancellation.
            if is_cancelled_exception(err) and workflow.cancellation_reason() is not None:
                await self.give_back_first(request)
                raise
            if not isinstance(err, ActivityError):
                raise
            self.run.fail(f"slurm: the allocation was not granted: {cause(err)}")
            return False
        mismatch = allocation_mismatch(self.run.spec, granted)
        if mismatch is not None:
            self.run.fail(f"slurm: {mismatch}")
            return False
        self.run.move_to(move_to_allocation(self.run.spec, self.run.state, granted))
        workflow.logger.info(
            "Slurm job %d runs the job's allocation on %s (waited %.0f s)",
            granted.job_id,
            ", ".join(granted.nodes),
            granted.waited_s,
        )
        return True

    async def give_back_first(self, request: SubmitAllocationRequest) -> None:
        """The compensation of a first submit the job's cancellation interrupted: this
        user's job of the holder's name, if Slurm has one, is cancelled; the job ends
        CANCELLED (it never launched: nothing to stop)."""
        try:
            cancelled = await execute(
                CANCEL_ALLOCATION,
                request,
                start_to_close_timeout=timedelta(minutes=2),
                heartbeat_timeout=worker_loss_timeout(self.run.spec),
                retry_policy=END_OF_RUN_RETRY,
                summary=f"give back the allocation: {request.holder_name}",
            )
        except ActivityError as err:
            workflow.logger.warning(
                "could not give back %s: %s; cancel it by hand (scancel --name=%s)",
                request.holder_name,
                cause(err),
                request.holder_name,
            )
        else:
            workflow.logger.info("gave back Slurm job(s) %s", cancelled.job_ids)
        self.run.state.finished_at = self.run.now()
        self.run.set_phase(Phase.CANCELLED)

    async def on_preempted(self, notice: FailureReport) -> None:
        """Slurm is taking the allocation away: save the ranks just in time while they
        still run (a notice from the holder), stop them, and pause (``slurm.resubmit:
        false``, the default until resubmission exists). An allocation already gone
        took its ranks with it: only the stop (the fence) is left to do."""
        state = self.run.state
        self.run.set_phase(Phase.RECOVERING)
        incident = open_preemption(state, notice)
        if any(r.alive for r in state.ranks) and state.generation_live:
            planned = await self.checkpoints.planned_stop(
                f"incident {incident.id}: Slurm preemption"
            )
            last_step, saved = planned.step_at_stop, planned.checkpoint_step
        else:
            last_step = (
                await self.stops.stop_all(f"incident {incident.id}: allocation ended")
            ).last_step
            saved = None
        if last_step is not None:
            self.run.set_step(last_step)
        record_preemption(incident, self.run.now(), last_step, saved)
        # The run key and known job ids are activity input only (no new command):
        # Temporal's replay does not compare activity inputs, and an activity that gets
        # an older request without them still looks only at this user's jobs.
        request = resubmission(self.run.spec, incident, state.run_key)
        if request is not None and workflow.patched(PATCH_SLURM_ALLOCATION):
            try:
                granted = await execute(
                    SUBMIT_ALLOCATION,
                    request,
                    start_to_close_timeout=timedelta(seconds=request.slurm.wait_s)
                    + SLURM_QUEUE_MARGIN,
                    heartbeat_timeout=worker_loss_timeout(self.run.spec),
                    retry_policy=QUICK_RETRY,
                    summary=f"resubmit the allocation (incident {incident.id})",
                )
            except ActivityError as err:
                record_resubmission_refused(incident, cause(err))
            else:
                mismatch = allocation_mismatch(self.run.spec, granted)
                if mismatch is not None and workflow.patched(PATCH_SLURM_OWN_JOBS):
                    record_resubmission_refused(incident, mismatch)
                    self.run.set_phase(Phase.PAUSED)
                    return
                self.run.move_to(move_to_allocation(self.run.spec, state, granted))
                record_resubmission(incident, granted)
                self.run.set_phase(Phase.LAUNCHING)
                return
        self.run.set_phase(Phase.PAUSED)

    async def maybe_grow(self, lost: str, incident: Incident | None) -> None:
        """``lost`` is about to leave the pool with no spare to take its slot: with
        ``slurm.grow``, ask Slurm for one first; on success it is the spare the swap
        then uses. A refusal is evidence, and the swap shrinks or asks a person as it
        would without ``slurm.grow``."""
        spec = self.run.spec
        pool = self.run.state.pool
        if spec.slurm is None or not spec.slurm.grow or pool.spares or lost not in pool.active:
            return
        if workflow.patched(PATCH_SLURM_ALLOCATION):
            await self.grow_allocation(spec.slurm, lost, incident)

    async def grow_allocation(self, slurm: SlurmSpec, lost: str, incident: Incident | None) -> None:
        spec = self.run.spec
        known = [n.name for n in (*spec.nodes, *spec.spares)]
        request = GrowAllocationRequest(
            job_name=spec.name,
            slurm=spec.slurm,
            known_nodes=known,
            exclude=[lost],
            token=f"g{self.run.state.generation}",
            run_key=self.run.state.run_key,
            known_job_ids=[slurm.allocation_id],
        )
        try:
            granted = await execute(
                GROW_ALLOCATION,
                request,
                start_to_close_timeout=timedelta(seconds=slurm.wait_s) + SLURM_QUEUE_MARGIN,
                heartbeat_timeout=worker_loss_timeout(spec),
                retry_policy=QUICK_RETRY,
                summary=f"grow the allocation: replace {lost}",
            )
        except ActivityError as err:
            workflow.logger.warning("slurm.grow: Slurm added no node: %s", cause(err))
            if incident is not None:
                incident.evidence.append(f"slurm.grow: Slurm added no node: {cause(err)}")
                left = len(self.run.state.pool.active) - 1
                shrinks = spec.min_nodes is not None and left >= spec.min_nodes
                incident.action = Action.SHRINK if shrinks else Action.NEEDS_OPERATOR
            return
        added = [name for name in granted.nodes if name not in known]
        self.run.move_to(
            spec.model_copy(
                update={"spares": [*spec.spares, *(slurm_node(name) for name in added)]}
            )
        )
        self.run.state.pool.spares.extend(added)
        if incident is not None:
            incident.evidence.append(f"slurm.grow: Slurm job {granted.job_id} grew by {added}")
            incident.action = Action.GROW
