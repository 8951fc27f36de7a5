"""Handing a job over: continue-as-new to a fresh run, and escalation hook delivery.

A job's history grows with every supervision report; when it is long (or the
deployment's target version changed) the run continues as new, carrying
:class:`~workflows.state.JobState`, and the next run adopts the live ranks.
Escalation hooks are delivered beside the state machine, retried without limit: one
still in flight at the hop stays in ``pending_hooks`` and the next run delivers it.

Both are here because they meet at the hop: continue-as-new must be the run's last
command, so it first waits for every handler, the housekeeping loop and the hook
deliveries (cancelled, and carried over) to end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from lazarus.domain.activity_refs import RUN_ESCALATION_HOOK
    from lazarus.domain.contracts import EscalationHookRequest
    from workflows.activity_calls import HOOK_RETRY, cause, execute
    from workflows.escalation import hook_failed, hook_finished, hook_ran
    from workflows.patches import PATCH_HOOK_SURVIVES_CONTINUE_AS_NEW
    from workflows.run_context import JobRun
    from workflows.state import JobInput


class HandOver:
    """When and how a run continues as new."""

    def __init__(self, run: JobRun, continue_as_new_after: int, busy: Callable[[], bool]) -> None:
        self.run = run
        self.continue_as_new_after = continue_as_new_after
        """History length (events) past which the run hops."""
        self._busy = busy
        """Whether operator messages are still being handled: they finish in this run."""
        self.hooks: list[asyncio.Task[None]] = []
        """Escalation hook deliveries in flight."""
        self.handing_over = False
        """Set when this run cancels its hook deliveries to continue as new."""
        run.escalate = self.deliver_later

    def deliver_later(self, request: EscalationHookRequest) -> None:
        """Deliver an escalation hook beside the state machine (it may retry for long)."""
        self.hooks.append(asyncio.create_task(self._deliver(request)))

    def due(self) -> bool:
        """History is long enough to hop: checked in every phase (while supervising,
        paused or waiting for an operator), not only between supervision reports."""
        if not self.run.continue_anywhere:
            return False
        return self.history_is_long()

    def history_is_long(self) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self.continue_as_new_after
            or info.is_target_worker_deployment_version_changed()
        )

    async def maybe_continue_as_new(self) -> None:
        """Hop to a new run carrying the state; the new run adopts the live ranks.
        Also how a pinned job moves to a new controller version: when the deployment's
        target version changes, the next run starts on it (AUTO_UPGRADE)."""
        if not self.history_is_long():
            return
        if self._busy():
            return  # finish handling operator messages in this run first
        if self.run.continue_anywhere:
            # Undelivered hooks travel in ``pending_hooks``: one that always fails must
            # not pin the job to a history that only grows.
            await workflow.wait_condition(workflow.all_handlers_finished)
        elif any(not hook.done() for hook in self.hooks):
            return  # released behaviour: wait for the hook's delivery first
        # The next run starts its own housekeeping (uploads resume). Wait for this one
        # (and any hook still being delivered, which pending_hooks carries over) to end:
        # continue-as-new must be the run's last command.
        if self.run.housekeeper is not None:
            await self.run.housekeeper.stopped()
        self.handing_over = True
        for hook in self.hooks:
            hook.cancel()
        for hook in self.hooks:
            with contextlib.suppress(asyncio.CancelledError, ActivityError):
                await hook
        self.run.state.runs += 1
        workflow.continue_as_new(
            JobInput(
                spec=self.run.intent,
                state=self.run.state,
                continue_as_new_after_events=self.continue_as_new_after,
                strict_phases=self.run.strict_phases,
            ),
            initial_versioning_behavior=workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE,
        )

    async def _deliver(self, request: EscalationHookRequest) -> None:
        """Deliver one hook, retried without limit (a person must hear of it); it
        stays in ``pending_hooks`` until it ran, so continue-as-new carries it."""
        try:
            result = await execute(
                RUN_ESCALATION_HOOK,
                request,
                start_to_close_timeout=timedelta(seconds=request.timeout_s + 30),
                retry_policy=HOOK_RETRY,
                summary=f"on_escalation: {' '.join(request.command)[:80]}",
            )
        except ActivityError as err:
            if self.handing_over and workflow.patched(PATCH_HOOK_SURVIVES_CONTINUE_AS_NEW):
                return  # cancelled by the hop, not failed: the next run delivers it
            hook_finished(self.run.state, request, hook_failed(cause(err)))
            return
        hook_finished(self.run.state, request, hook_ran(result.ran))
