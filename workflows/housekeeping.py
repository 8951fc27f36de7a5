"""Checkpoint housekeeping: tiering to the durable store and retention, beside training.

The job workflow starts one :class:`Housekeeper` per run. Its loop waits for each new
committed checkpoint (at most one per ``checkpoints.housekeeping_interval_s``), copies
it to the durable tier and verifies it there, then collects old checkpoints. Nothing
here ever blocks training or a recovery: a failed upload or collection is logged and
the next checkpoint tries again.

The decisions (which steps count as durable, which are protected from collection, when
the watch must restart lower) are pure functions, unit-tested without a server in
``tests/unit/test_housekeeping.py``; the loop only sequences the activities.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from lazarus.domain.activity_refs import COLLECT_GARBAGE, UPLOAD_CHECKPOINT, WATCH_CHECKPOINTS
    from lazarus.domain.contracts import (
        CheckpointRef,
        GarbageCollectionRequest,
        UploadCheckpointRequest,
        WatchCheckpointsRequest,
    )
    from lazarus.domain.spec import CheckpointsSpec, JobSpec
    from workflows.activity_calls import (
        QUICK_RETRY,
        UPLOAD_RETRY,
        cause,
        execute,
        worker_loss_timeout,
    )
    from workflows.patches import PATCH_HOUSEKEEPING_STOPS
    from workflows.routing import route
    from workflows.state import JobState

# ------------------------------------------------------------------ decisions


def durable_after_upload(durable_steps: list[int], step: int, keep_durable: int) -> list[int]:
    """The verified durable steps once ``step`` is verified too: newest last, at most
    ``keep_durable`` of them (at least one: the newest is never forgotten)."""
    return [*durable_steps, step][-max(1, keep_durable) :]


def protected_steps(found_step: int, resume: CheckpointRef | None) -> list[int]:
    """Steps collection must keep: the checkpoint just found, and the one the current
    generation resumed from (a relaunch may need it again)."""
    return [found_step, *([resume.step] if resume else [])]


def must_rewatch(housekept_step: int | None, resume: CheckpointRef | None) -> bool:
    """After a rollback or a fallback the job resumes below the newest tiered step and
    its next checkpoints reuse lower step numbers: the watch must restart at the resume
    point (from scratch: at None), or they would never be tiered."""
    if housekept_step is None:
        return False
    return resume is None or resume.step < housekept_step


def collection_summary(checkpoints: CheckpointsSpec) -> str:
    """What one garbage collection keeps, for the Web UI."""
    kept = (
        f" and {checkpoints.keep_durable} durable checkpoints"
        if checkpoints.durable_uri
        else " checkpoints"
    )
    return f"keep the newest {checkpoints.keep_local} local{kept}"


# ----------------------------------------------------------------------- loop


class Housekeeper:
    """The housekeeping loop of one workflow run, as a task beside the state machine.

    It reads and writes only ``housekept_step`` and ``durable_steps`` of the state (and
    reads ``phase`` and ``resume``), so it needs no lock: the workflow's event loop runs
    one coroutine at a time."""

    def __init__(self, spec: JobSpec, state: JobState) -> None:
        self._spec = spec
        self._state = state
        self._task: asyncio.Task[None] | None = None
        self._loops = 0
        """Loops started so far; each knows its number."""
        self._halted = 0
        """Every loop numbered up to this one was told to stop."""

    def start(self) -> None:
        self._loops += 1
        self._task = asyncio.create_task(self._run(self._loops))

    def stop(self) -> None:
        """Cancel the loop (an upload in flight is cancelled; the next run resumes it).

        An activity cancelled under TRY_CANCEL reaches the loop as an ``ActivityError``,
        which the loop otherwise takes for a failed upload or collection and goes on
        from: so the loop also checks it was told to stop (:meth:`_told_to_stop`)."""
        self._halted = self._loops
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def ended(self) -> None:
        """At the end of a run: wait for the loop to end before the run completes, so
        no command of it follows the completion (histories from before
        PATCH_HOUSEKEEPING_STOPS only cancel it, and replay as they ran)."""
        if workflow.patched(PATCH_HOUSEKEEPING_STOPS):
            await self.stopped()
        else:
            self.stop()

    async def stopped(self) -> None:
        """Cancel the loop and wait until it has ended: continue-as-new must be the last
        command of a run, so nothing of this loop may still run after it (a watch that
        completed in the same activation would otherwise schedule the next call after
        the continue-as-new, which the server rejects)."""
        self.stop()
        if self._task is not None:
            # A watch cancelled under TRY_CANCEL ends the loop with ActivityError, not
            # CancelledError (seen at continue-as-new in `python -m bench simulate`).
            with contextlib.suppress(asyncio.CancelledError, ActivityError):
                await self._task

    def restart_from(self, step: int | None) -> None:
        """Watch again from ``step`` (None: every checkpoint), in a fresh loop."""
        self._state.housekept_step = step
        self.stop()
        self.start()

    def _told_to_stop(self, loop: int) -> bool:
        """Whether loop number ``loop`` must end now that an activity of it failed:
        when the job has ended (as before), or when it was told to stop. Before
        PATCH_HOUSEKEEPING_STOPS a loop went on after a cancelled collection
        (and a continue-as-new waiting for it waited forever): histories recorded then
        keep that path on replay."""
        if self._state.phase.is_terminal:
            # The run is ending (its completion may be in this very activation, and no
            # command may follow it): end as the loop always did, recording nothing.
            return True
        return loop <= self._halted and workflow.patched(PATCH_HOUSEKEEPING_STOPS)

    async def _run(self, loop: int) -> None:
        spec = self._spec
        state = self._state
        checkpoints = spec.checkpoints
        while not state.phase.is_terminal:
            found = await execute(
                WATCH_CHECKPOINTS,
                WatchCheckpointsRequest(
                    checkpoint_dir=spec.checkpoint_dir,
                    newer_than_step=state.housekept_step,
                    min_interval_s=checkpoints.housekeeping_interval_s,
                    verify=checkpoints.verify_hashes,
                ),
                start_to_close_timeout=timedelta(hours=2),
                heartbeat_timeout=worker_loss_timeout(spec),
                retry_policy=QUICK_RETRY,
                summary="watch for new checkpoints",
                **route(WATCH_CHECKPOINTS, state.host_task_queue),
            )
            if loop <= self._halted and workflow.patched(PATCH_HOUSEKEEPING_STOPS):
                # The watch completed in the activation that stopped the loop: the SDK
                # then hands back its result instead of the cancellation.
                return
            if found is None:
                continue
            state.housekept_step = found.step
            if found.verified is not None:
                state.remember_verified(found.verified, keep=checkpoints.keep_local + 1)
            if checkpoints.durable_uri is not None:
                try:
                    uploaded = await execute(
                        UPLOAD_CHECKPOINT,
                        UploadCheckpointRequest(checkpoint=found, checkpoints=checkpoints),
                        start_to_close_timeout=timedelta(hours=6),
                        heartbeat_timeout=worker_loss_timeout(spec),
                        retry_policy=UPLOAD_RETRY,
                        summary=f"tier step {found.step} to {checkpoints.durable_uri}",
                        **route(UPLOAD_CHECKPOINT, state.host_task_queue),
                    )
                except ActivityError as err:
                    if self._told_to_stop(loop):
                        return
                    workflow.logger.warning("step %d not tiered: %s", found.step, cause(err))
                    continue
                if uploaded.verified:
                    state.durable_steps = durable_after_upload(
                        state.durable_steps, found.step, checkpoints.keep_durable
                    )
            try:
                await execute(
                    COLLECT_GARBAGE,
                    GarbageCollectionRequest(
                        checkpoint_dir=spec.checkpoint_dir,
                        checkpoints=checkpoints,
                        protect_steps=protected_steps(found.step, state.resume),
                        job_id=spec.job_id,
                    ),
                    start_to_close_timeout=timedelta(minutes=30),
                    heartbeat_timeout=timedelta(seconds=30),
                    retry_policy=RetryPolicy(maximum_attempts=3),
                    summary=collection_summary(checkpoints),
                    **route(COLLECT_GARBAGE, state.host_task_queue),
                )
            except ActivityError as err:
                if self._told_to_stop(loop):
                    return
                workflow.logger.warning("garbage collection failed: %s", cause(err))
