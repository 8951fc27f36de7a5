"""Checkpoint steps: the durable sequences around the job's checkpoints.

- the resume point: the newest committed *and* verified checkpoint, restored from the
  durable tier when only it holds one, with the untrusted ones skipped and recorded;
- the checkpoint watch restarted lower after a rollback or a fallback (retier);
- the just-in-time checkpoint before a planned stop, and the planned stop itself;
- the rollback of a diverged checkpoint;
- ``checkpoints.interval: auto``: Young-Daly intervals sent to the ranks.

What each step decides with is pure (``resume_points``, ``checkpoint_tuning``,
``housekeeping.must_rewatch``, ``stops.record_planned_stop``); here are the activity
calls, in the order the workflow has always issued them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from lazarus.domain.activity_refs import (
        CHECKPOINT_NOW,
        FIND_VERIFIED_CHECKPOINT,
        RESTORE_CHECKPOINT,
        ROLL_BACK_CHECKPOINT,
        SET_CHECKPOINT_INTERVAL,
    )
    from lazarus.domain.contracts import (
        CheckpointNowRequest,
        CheckpointRef,
        CheckpointSearch,
        NodeAccess,
        RestoreCheckpointRequest,
        RollbackRequest,
        SuperviseOutcome,
    )
    from workflows.activity_calls import (
        NO_RETRY,
        QUICK_RETRY,
        cause,
        execute,
        worker_loss_timeout,
    )
    from workflows.checkpoint_tuning import (
        describe,
        interval_in_force,
        interval_request,
        record_sent,
        retune,
    )
    from workflows.housekeeping import must_rewatch
    from workflows.patches import (
        PATCH_CHECKPOINT_INTERVAL_AUTO,
        PATCH_PREFLIGHT_BESIDE_SEARCH,
        PATCH_RETIER_AFTER_FALLBACK,
    )
    from workflows.placement import active_nodes, generation_dir
    from workflows.resume_points import record_rollback, record_skipped, search_request
    from workflows.routing import route
    from workflows.run_context import JobRun
    from workflows.state import Phase, PlannedStop
    from workflows.stop_steps import StopSteps
    from workflows.stops import record_planned_stop


@dataclass(frozen=True)
class SearchedBeside:
    """What :meth:`CheckpointSteps.search_beside` found beside the preflight. A
    rollback it ran left its bound in the state (``JobState.rollback_below``), not
    here: a launch the preflight sends back must not forget it (issue 37, N1)."""

    search: CheckpointSearch | None
    """The search, or None when the preflight changed the nodes it was made for: the
    resume point is then searched again, on the nodes that launch."""


class CheckpointSteps:
    """The checkpoint steps of one run; planned stops go through ``stops``."""

    def __init__(self, run: JobRun, stops: StopSteps) -> None:
        self.run = run
        self.stops = stops

    async def search_beside(
        self, preflight: Callable[[], Awaitable[bool]]
    ) -> tuple[bool, SearchedBeside | None]:
        """Run ``preflight`` and the resume-point search (after the rollback, when one
        is pending) at once; returns the preflight's answer and the search. Histories
        from before ``PATCH_PREFLIGHT_BESIDE_SEARCH`` run the preflight alone (None:
        :meth:`resume_point` then rolls back and searches after it, as they did).

        Both take a round trip to every node, and on the relaunch after a node loss
        nothing but this pair stands between the stop and the launch (issue 28). The
        search is made for the nodes active now, which are the ones that launch unless
        the preflight swaps one out (then shrink, spare or ``slurm.grow``): that case
        is rare, and its search is simply thrown away (:attr:`SearchedBeside.search`
        None) and made again on the new nodes, so the memory tier is still searched
        on exactly the nodes that launch (issue 26). What a thrown-away search did on
        a node that then left is harmless: a replica copied into the run's memory
        directory there goes with the run's end, and a corrupt disk checkpoint moved
        aside would be moved by any search. Both coroutines are awaited to their end
        before anything is raised, so no activity of either is left running unseen."""
        if not workflow.patched(PATCH_PREFLIGHT_BESIDE_SEARCH):
            return await preflight(), None
        made_for = self.search_access()

        async def search() -> CheckpointSearch:
            if self.run.state.rollback_pending:
                await self.roll_back()
            return await self.find_verified(include_durable=True)

        checked, found = await asyncio.gather(preflight(), search(), return_exceptions=True)
        if isinstance(checked, BaseException):
            raise checked
        if isinstance(found, BaseException):
            raise found
        current = found if self.search_access() == made_for else None
        return checked, SearchedBeside(search=current)

    async def resume_point(self, beside: SearchedBeside | None) -> CheckpointRef | None:
        """The launch's resume point: from the search made beside the preflight, or
        (none made: an older history, or a launch without a preflight first) after
        the rollback, when one is pending, and a search now."""
        if beside is not None:
            return await self.find_resume_point(beside.search)
        if self.run.state.rollback_pending:
            await self.roll_back()
        return await self.find_resume_point()

    def search_access(self) -> NodeAccess:
        """The nodes a resume-point search asks: the ones the launch will run on."""
        spec = self.run.spec
        return NodeAccess.of(spec, active_nodes(spec, self.run.state.pool))

    async def find_resume_point(
        self, found: CheckpointSearch | None = None
    ) -> CheckpointRef | None:
        """The newest checkpoint that is committed *and* verified, restored from the
        durable tier when only it holds one (a spare replacing a dead node). Newer
        checkpoints that fail verification are skipped and recorded. ``found`` is a
        search already made for these nodes (:meth:`search_beside`)."""
        spec = self.run.spec
        search = found if found is not None else await self.find_verified(include_durable=True)
        resume = search.chosen
        if resume is not None and search.location == "durable":
            try:
                resume = await execute(
                    RESTORE_CHECKPOINT,
                    RestoreCheckpointRequest(
                        uri=resume.path,
                        checkpoint_dir=spec.checkpoint_dir,
                        checkpoints=spec.checkpoints,
                    ),
                    start_to_close_timeout=timedelta(hours=6),
                    heartbeat_timeout=worker_loss_timeout(self.run.spec),
                    retry_policy=RetryPolicy(maximum_attempts=5),
                    summary=f"restore step {resume.step} from {resume.path}",
                    **route(RESTORE_CHECKPOINT, self.run.state.host_task_queue),
                )
            except ActivityError as err:
                workflow.logger.warning("restore failed, using local only: %s", cause(err))
                search = await self.find_verified(include_durable=False)
                resume = search.chosen
        if search.skipped:
            record_skipped(self.run.state, search, resume, self.run.now())
        return resume

    async def find_verified(self, include_durable: bool) -> CheckpointSearch:
        """Search every tier for the resume point (``resume_points.search_request``)."""
        spec = self.run.spec
        return await execute(
            FIND_VERIFIED_CHECKPOINT,
            search_request(spec, self.run.state, include_durable),
            start_to_close_timeout=timedelta(minutes=30),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=QUICK_RETRY,
            **route(FIND_VERIFIED_CHECKPOINT, self.run.state.host_task_queue),
            summary=(
                "find the newest verified checkpoint"
                + (
                    " (local and durable)"
                    if include_durable and spec.checkpoints.durable_uri
                    else ""
                )
            ),
        )

    def retier_from(self, resume: CheckpointRef | None) -> None:
        """After a rollback or a fallback the job resumes below the newest tiered step:
        restart the checkpoint watch there (``housekeeping.must_rewatch``)."""
        if not must_rewatch(self.run.state.housekept_step, resume):
            return
        if not workflow.patched(PATCH_RETIER_AFTER_FALLBACK):
            return
        assert self.run.housekeeper is not None, "housekeeping starts with the run"
        self.run.housekeeper.restart_from(resume.step if resume is not None else None)

    async def checkpoint_before(self, why: str) -> CheckpointRef | None:
        """Ask the live ranks to save now and wait (bounded) for the commit; None when
        it did not arrive in time: the caller goes ahead and the steps lost are counted."""
        spec = self.run.spec
        state = self.run.state
        if not state.generation_live:
            return None
        state.checkpoint_requests += 1
        timeout = spec.checkpoints.jit_timeout_s
        try:
            result = await execute(
                CHECKPOINT_NOW,
                CheckpointNowRequest(
                    run_dir=generation_dir(spec, state),
                    access=NodeAccess.of(spec, active_nodes(spec, state.pool)),
                    request_id=state.checkpoint_requests,
                    checkpoint_dir=spec.checkpoint_dir,
                    timeout_s=timeout,
                    checkpoint_every_steps=interval_in_force(spec, state),
                    memory_every_steps=spec.checkpoints.memory_every_steps,
                ),
                start_to_close_timeout=timedelta(seconds=timeout + 60),
                heartbeat_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=f"just-in-time checkpoint before {why}",
                **route(CHECKPOINT_NOW, state.host_task_queue),
            )
        except ActivityError as err:
            workflow.logger.warning("just-in-time checkpoint failed: %s", cause(err))
            return None
        return result.checkpoint

    async def planned_stop(self, reason: str) -> PlannedStop:
        """Checkpoint just in time, then stop: a planned stop should cost no steps, and
        when it does (the save did not arrive in time) the cost is recorded."""
        requested_at = self.run.now()
        saved = await self.checkpoint_before(reason)
        saved_at = self.run.now()
        stopped = await self.stops.stop_all(reason)
        if stopped.last_step is not None:
            self.run.set_step(stopped.last_step)
        return record_planned_stop(
            self.run.state,
            reason,
            requested_at=requested_at,
            saved=saved,
            saved_at=saved_at,
            stopped=stopped,
            stopped_at=self.run.now(),
        )

    async def roll_back(self) -> None:
        """Retire the newest checkpoint so the relaunch resumes from the one before it.
        What it retired goes into the state as the activity answers, before anything
        else (a preflight beside it that escalates) can happen: the retired identity,
        and the bound every search then stays below (its durable copy, if tiered, holds
        the same divergence) until a launch records its cut. Failed, the bound set when
        the rollback was decided (the failure's step) still holds."""
        state = self.run.state
        state.rollback_pending = False
        try:
            result = await execute(
                ROLL_BACK_CHECKPOINT,
                RollbackRequest(
                    checkpoint_dir=self.run.spec.checkpoint_dir,
                    reason="numerical",
                    job_id=self.run.spec.job_id,
                ),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=NO_RETRY,
                summary="roll back: retire the newest checkpoint",
                **route(ROLL_BACK_CHECKPOINT, state.host_task_queue),
            )
        except ActivityError as err:
            workflow.logger.warning(
                "rollback failed, resuming from the newest below step %s: %s",
                state.rollback_below,
                cause(err),
            )
            return
        record_rollback(state, result.retired)

    async def tune_interval(self, outcome: SuperviseOutcome) -> None:
        """Young-Daly: send the ranks a new interval when it changed enough
        (``workflows/checkpoint_tuning.py``). A failed send changes nothing: the
        next report tries again."""
        state = self.run.state
        change = retune(self.run.spec, state, outcome, self.run.now())
        if change is None or state.phase != Phase.RUNNING:
            return
        if not workflow.patched(PATCH_CHECKPOINT_INTERVAL_AUTO):
            return
        try:
            await execute(
                SET_CHECKPOINT_INTERVAL,
                interval_request(self.run.spec, state, change),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=QUICK_RETRY,
                summary=describe(state.checkpoint_interval, change),
                **route(SET_CHECKPOINT_INTERVAL, state.host_task_queue),
            )
        except ActivityError as err:
            workflow.logger.warning("checkpoint interval not sent: %s", cause(err))
            return
        workflow.logger.info(describe(record_sent(state, change, self.run.now()), change))
