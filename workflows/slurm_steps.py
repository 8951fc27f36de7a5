"""Slurm allocation changes, as steps of a run: preemption, resubmission, growth.

- a preemption notice (Slurm takes the allocation away): a just-in-time checkpoint
  while the ranks still run, a stop, then PAUSED, or (``slurm.resubmit``) a new
  allocation with the same options and LAUNCHING there;
- ``slurm.grow``: a lost node with no spare is replaced by a node Slurm adds.

The decisions and records are pure (``preemption``); each change is a retry-safe
activity here, behind ``PATCH_SLURM_PREEMPTION`` and ``PATCH_SLURM_ALLOCATION``.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from lazarus.domain.activity_refs import GROW_ALLOCATION, SUBMIT_ALLOCATION
    from lazarus.domain.contracts import FailureReport, GrowAllocationRequest
    from lazarus.domain.spec import SlurmSpec, slurm_node
    from lazarus.workflows.activity_calls import QUICK_RETRY, cause, execute, worker_loss_timeout
    from lazarus.workflows.checkpoint_steps import CheckpointSteps
    from lazarus.workflows.patches import PATCH_SLURM_ALLOCATION, PATCH_SLURM_OWN_JOBS
    from lazarus.workflows.playbook import Action
    from lazarus.workflows.preemption import (
        allocation_mismatch,
        move_to_allocation,
        open_preemption,
        record_preemption,
        record_resubmission,
        record_resubmission_refused,
        resubmission,
    )
    from lazarus.workflows.run_context import JobRun
    from lazarus.workflows.state import Incident, Phase
    from lazarus.workflows.stop_steps import StopSteps

SLURM_QUEUE_MARGIN = timedelta(minutes=2)
"""Beyond ``slurm.wait_s``: the Slurm calls around the queue wait."""


class SlurmSteps:
    """The Slurm steps of one run; a preemption's stop goes through ``checkpoints``."""

    def __init__(self, run: JobRun, stops: StopSteps, checkpoints: CheckpointSteps) -> None:
        self.run = run
        self.stops = stops
        self.checkpoints = checkpoints

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
